"""`bertgpu prepare` whose stderr is not a terminal (a batch job's log, nohup): it showed its
progress bar on a terminal only, so a 200 MB corpus printed nothing for two minutes and a large
one nothing for hours. It now prints a plain line every PROGRESS_LINE_S there."""

from __future__ import annotations

import re

from bertgpu.cli import main
from bertgpu.data import engines

pytestmark = __import__("pytest").mark.usefixtures("one_thread")


def test_prepare_off_a_terminal_prints_plain_progress_lines(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"Sentence {i} of the corpus is here.\n\n" for i in range(4000)),
                      encoding="utf-8")
    assert main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "60", "--out",
                 str(tmp_path / "tok")]) == 0
    capsys.readouterr()
    monkeypatch.setattr(engines, "PROGRESS_LINE_S", 0.0, raising=False)  # each update
    assert main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "tok"),
                 "--seq-len", "32", "--out", str(tmp_path / "d"), "--unit-bytes", "16384"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("prepare: ")]
    assert lines, "no progress line"
    pattern = (r"prepare: \d+% of [\d.]+k?B, \d+/\d+ units, [\d.]+k?M? ?tokens/s, "
               r"\S+ elapsed(, ETA \S+)?")
    assert all(re.fullmatch(pattern, x) for x in lines), lines
    assert lines[-1].startswith("prepare: 100% of")
