"""`bertgpu tokenizer --sample-bytes` on a corpus of one sentence per line without blank lines.

Such a file is one document to the paragraph formats. A sample's windows started only after a
blank line, so every window but the first was empty: 1 MB asked trained on the first 16 kB of
the file, and a gzip file's one document was cut at its start. A sample now reads such files a
line at a time.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from bertgpu.data.corpus import CorpusStats
from bertgpu.data.tokenizer import _document_parts
from bertgpu.errors import BertgpuError


def _halves(path: Path, lines: int = 3000) -> Path:
    """English sentences, then Chinese ones: one per line, no blank line anywhere."""
    r = random.Random(3)
    en = "the quick brown fox jumps over the lazy dog while seven wizards hex bankers".split()
    zh = "北京是中国的首都上海是一个大城市我们今天去公园散步"
    text = "".join(" ".join(r.choice(en) for _ in range(12)) + " .\n" for _ in range(lines))
    text += "".join("".join(r.choice(zh) for _ in range(30)) + "。\n" for _ in range(lines))
    path.write_text(text, encoding="utf-8")
    return path


def _sample(path: Path, sample_bytes: int, fmt: str = "auto") -> str:
    parts = _document_parts([path], fmt, "text", False, CorpusStats(), sample_bytes)
    return "\n".join(s for sentences, _ in parts for s in sentences)


@pytest.mark.parametrize("fmt", ["auto", "sentences", "text"])
def test_a_sample_of_a_file_without_blank_lines_has_the_asked_size_from_all_of_it(tmp_path, fmt):
    path = _halves(tmp_path / "sents.txt")
    asked = 40_000
    assert path.stat().st_size > 5 * asked
    text = _sample(path, asked, fmt)
    assert 0.95 * asked <= len(text.encode("utf-8")) <= 1.05 * asked  # old code: 13,530 bytes
    assert "fox" in text and "北京" in text, "the sample is the file's start alone"


def test_a_sample_of_a_compressed_file_without_blank_lines_reaches_its_end(tmp_path):
    path = _halves(tmp_path / "sents.txt")
    gz = tmp_path / "sents.txt.gz"
    gz.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    text = _sample(gz, 40_000)
    assert 40_000 / 3 <= len(text.encode("utf-8")) <= 40_000
    assert "fox" in text and "北京" in text, "the one document cut at its start"


def test_a_sampled_txt_of_json_lines_is_still_refused(tmp_path):
    """The check that a .txt is not JSON Lines sees the sample's first window too."""
    path = tmp_path / "c.txt"
    path.write_text("".join(f'{{"text": "line {i} of some text"}}\n' for i in range(20000)),
                    encoding="utf-8")
    with pytest.raises(BertgpuError, match="first line is a JSON object"):
        _sample(path, 40_000)


def test_the_summary_line_says_how_much_text_the_sample_trained_on(tmp_path, capsys):
    import warnings

    from bertgpu.cli import main as cli_main

    path = _halves(tmp_path / "sents.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fewer pieces than asked: not the point here
        code = cli_main(["tokenizer", "--corpus", str(path), "--vocab-size", "300",
                         "--sample-bytes", "40000", "--out", str(tmp_path / "tok")])
    assert code == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "(a sample: 4" in line and " kB of text)" in line, line
    # no count of documents: a sample reads paragraphs a line at a time (it said 6,000)
    assert "from 1 file (a sample: " in line and "document" not in line, line
