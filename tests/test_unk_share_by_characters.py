"""`bertgpu prepare` warns when much of the text becomes [UNK] even though few tokens do: BERT
encodes a word longer than 100 characters (a Thai sentence, which has no spaces) as ONE [UNK],
so a corpus whose Thai lines were 39% of its characters had 1.9% of its tokens [UNK] and
passed the 5% check on tokens without a word."""

from __future__ import annotations

import warnings

import pytest
from _text_fixtures import pydoc_documents, write_sentences

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer import train_tokenizer

THAI = "ภาษาไทยเป็นภาษาที่ใช้กันในประเทศไทยมาเป็นเวลานาน"  # 45 characters, no space


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    folder = tmp_path_factory.mktemp("english")
    corpus = write_sentences(folder / "corpus.txt", pydoc_documents(30))
    return train_tokenizer([corpus], folder / "tok", vocab_size=400, min_frequency=1)


def _english_lines(n: int) -> list[str]:
    sentences = [s for doc in pydoc_documents(30) for s in doc if 60 < len(s) < 200]
    return [sentences[i % len(sentences)] for i in range(n)]


def test_thai_runs_lost_to_unk_are_a_warning_though_few_tokens_are(english, tmp_path, capsys):
    lines = _english_lines(300)
    for i in range(0, len(lines), 4):  # every 4th line a run of 4 sentences without a space
        lines[i] = THAI * 4
    corpus = tmp_path / "enth.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code = cli_main(["prepare", "--corpus", str(corpus), "--format", "lines", "--tokenizer",
                     str(english), "--out", str(tmp_path / "d"), "--validation-fraction", "0",
                     "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 0 and err.count("\n") == 1, err
    assert "bertgpu prepare: warning: " in err and "of the text's characters are [UNK]" in err
    assert "though only" in err and "of the tokens are" in err
    assert f"the tokenizer {english} does not cover this text" in err


def test_english_with_a_rare_long_run_is_no_warning(english, tmp_path):
    """One run of 180 letters among 300 English lines is under 5% of the characters."""
    lines = _english_lines(300)
    lines[7] = THAI * 4
    corpus = tmp_path / "en.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare([corpus], english, tmp_path / "d", fmt="lines", workers=1)
    assert not [w for w in caught if "[UNK]" in str(w.message)]
