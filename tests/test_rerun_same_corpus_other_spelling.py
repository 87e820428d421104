"""A re-run of `bertgpu tokenizer` or `bertgpu prepare` names the same corpus file another way
(``corpus.txt``, ``./corpus.txt``, ``$PWD/corpus.txt``, ``../corpus.txt`` from a subfolder): it
was refused as "from another corpus: corpus.txt, where this one has /abs/corpus.txt". Local
files are compared by their resolved paths (`rerun.resolved_paths`); another file is still
another corpus, and a record of an older bertgpu (paths as written) still matches the same
command run from the same folder."""

from __future__ import annotations

import json

import pytest
from _text_fixtures import pydoc_documents, write_sentences

from bertgpu.cli import main as cli_main


@pytest.fixture
def here(tmp_path, monkeypatch):
    """tmp_path as the current folder, with corpus.txt, a copy other.txt and a subfolder."""
    write_sentences(tmp_path / "corpus.txt", pydoc_documents(30))
    (tmp_path / "other.txt").write_bytes((tmp_path / "corpus.txt").read_bytes() + b"\nMore.\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _tokenizer(corpus, out):
    return cli_main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "300", "--out",
                     str(out)])


def _prepare(corpus, tok, out):
    return cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(out), "--seq-len", "32", "--workers", "1"])


def test_the_same_file_named_another_way_is_the_same_corpus(here, monkeypatch, capsys):
    assert _tokenizer("corpus.txt", "tok") == 0 and _prepare("corpus.txt", "tok", "data") == 0
    capsys.readouterr()
    for corpus in ("./corpus.txt", here / "corpus.txt"):
        assert _tokenizer(corpus, "tok") == 0 and _prepare(corpus, "tok", "data") == 0
        out = capsys.readouterr().out
        assert "already holds this tokenizer" in out and "already holds this shard set" in out
    monkeypatch.chdir(here / "sub")
    assert _tokenizer("../corpus.txt", "../tok") == 0
    assert _prepare("../corpus.txt", "../tok", "../data") == 0
    out = capsys.readouterr().out
    assert "already holds this tokenizer" in out and "already holds this shard set" in out

    # another file is still another corpus, named by where it is
    assert _tokenizer("../other.txt", "../tok") == 2
    err = capsys.readouterr().err
    assert (f"holds a tokenizer trained from another corpus: {here / 'corpus.txt'}, where this "
            f"one has {here / 'other.txt'}") in err, err
    assert _prepare("../other.txt", "../tok", "../data") == 2
    assert "holds a shard set prepared from another corpus" in capsys.readouterr().err


def test_an_older_record_of_relative_paths_is_read_against_the_current_folder(here, monkeypatch,
                                                                             capsys):
    """An older bertgpu recorded the paths as written: the same command from the same folder
    still does nothing; from another folder, where the path names no file, the refusal names it
    as written (as it did)."""
    assert _tokenizer("corpus.txt", "tok") == 0 and _prepare("corpus.txt", "tok", "data") == 0
    for record in (here / "tok" / "trained-from.json", here / "data" / "prepared-from.json"):
        old = json.loads(record.read_text())
        old.pop("read_from", None)
        (version,) = old["versions"].values()
        old["versions"] = {"corpus.txt": version}
        for unit in old.get("units", []):
            for piece in unit:
                piece["src"] = "corpus.txt"
        record.write_text(json.dumps(old))
    capsys.readouterr()
    assert _tokenizer(here / "corpus.txt", "tok") == 0
    assert _prepare(here / "corpus.txt", "tok", "data") == 0
    assert capsys.readouterr().out.count("already holds this") == 2

    monkeypatch.chdir(here / "sub")
    assert _tokenizer("../corpus.txt", "../tok") == 2
    assert (f"from another corpus: corpus.txt, where this one has {here / 'corpus.txt'}"
            in capsys.readouterr().err)
