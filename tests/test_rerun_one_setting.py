"""`bertgpu tokenizer` and `bertgpu prepare` run again with exactly one other setting: each is
refused naming that setting, not taken for the same output ("already holds") — --seed and
--validation-fraction of an mlm set (whose plan leaves out only what changes no byte of it:
--short-seq-prob, --chunk-docs), --strip-accents and --limit-alphabet of a tokenizer."""

from __future__ import annotations

import pytest
from test_rerun import _prepare, _stamps, _tokenizer, corpus  # noqa: F401


@pytest.fixture(scope="module")
def made(corpus, tmp_path_factory):  # noqa: F811
    """A tokenizer and an mlm shard set made with the defaults."""
    folder = tmp_path_factory.mktemp("made")
    tok, data = folder / "tok", folder / "data"
    assert _tokenizer(corpus, tok) == 0 and _prepare(corpus, tok, data) == 0
    return tok, data


@pytest.mark.parametrize(("extra", "named"), [
    (("--seed", "7"), "with --seed 12345 (asked 7)"),
    (("--validation-fraction", "0.05"), "with --validation-fraction 0.01 (asked 0.05)"),
], ids=["seed", "validation-fraction"])
def test_prepare_with_one_other_setting_is_refused_naming_it(corpus, made, capsys, extra,  # noqa: F811
                                                             named):
    tok, data = made
    before = _stamps(data)
    capsys.readouterr()
    assert _prepare(corpus, tok, data, *extra) == 2
    captured = capsys.readouterr()
    assert "already holds" not in captured.out
    assert (f"{data}: holds a shard set prepared {named}; expected a new folder, or --overwrite "
            "to replace it") in captured.err
    assert _stamps(data) == before


@pytest.mark.parametrize(("extra", "named"), [
    (("--strip-accents", "yes"), "with --strip-accents auto (asked yes)"),
    (("--strip-accents", "no"), "with --strip-accents auto (asked no)"),
    (("--limit-alphabet", "500"), "with --limit-alphabet 1000 (asked 500)"),
], ids=["strip-accents-yes", "strip-accents-no", "limit-alphabet"])
def test_tokenizer_with_one_other_setting_is_refused_naming_it(corpus, made, capsys, extra,  # noqa: F811
                                                               named):
    tok, _ = made
    before = _stamps(tok)
    capsys.readouterr()
    assert _tokenizer(corpus, tok, *extra) == 2
    captured = capsys.readouterr()
    assert "already holds" not in captured.out
    assert (f"{tok}: holds a tokenizer trained {named}; expected a new output folder") \
        in captured.err
    assert _stamps(tok) == before


def test_the_same_commands_still_do_nothing(corpus, made, capsys):  # noqa: F811
    """(The refusals above are not every re-run's: the defaults again are the same output.)"""
    tok, data = made
    capsys.readouterr()
    assert _tokenizer(corpus, tok, "--strip-accents", "auto", "--limit-alphabet", "1000") == 0
    assert _prepare(corpus, tok, data, "--seed", "12345", "--validation-fraction", "0.01") == 0
    out = capsys.readouterr().out
    assert f"{tok} already holds this tokenizer" in out
    assert f"{data} already holds this shard set" in out
