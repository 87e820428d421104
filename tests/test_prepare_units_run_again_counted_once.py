"""A unit run again for --validation-docs (a file read in parts and skipped by --skip-bad: the
units after it hold other documents of the first N) is one unit done and its bytes read once:
the progress line counted it at each run ("10/8 units", 130%). And a unit an earlier run
finished but this one ran again is not "finished by an earlier run and kept" (all were, and
the run's rate was of "the 0 tokens of the units this run tokenized")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _text_fixtures import pydoc_documents, train_small_tokenizer

from bertgpu.cli import main as cli_main


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """a.jsonl (4 units' parts, a bad line 301), b.jsonl and c.txt: 8 units of 50000 bytes."""
    sentences = [s for doc in pydoc_documents() for s in doc]
    docs = [" ".join(sentences[i:i + 4]) for i in range(0, 4 * 700, 4)]
    lines = [json.dumps({"text": d}) + "\n" for d in docs]
    lines[300] = "{oops\n"
    folder = tmp_path_factory.mktemp("bad")
    (folder / "a.jsonl").write_text("".join(lines[:400]))
    (folder / "b.jsonl").write_text("".join(lines[400:]))
    (folder / "c.txt").write_text("".join(d + "\n\n" for d in docs[:40]))
    return folder


def _run(tok: Path, corpus: Path, out: Path) -> int:
    return cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(out), "--seq-len", "64", "--unit-bytes", "50000", "--workers", "1",
                     "--validation-docs", "200", "--skip-bad"])


def _ran(monkeypatch) -> list[int]:
    """The indexes of the units this process runs, one entry per run."""
    from bertgpu.data import engines

    ran: list[int] = []
    run_unit = engines.run_unit

    def counting(job, unit, *args, **kwargs):
        ran.append(unit.index)
        return run_unit(job, unit, *args, **kwargs)

    monkeypatch.setattr(engines, "run_unit", counting)
    return ran


def test_the_progress_line_counts_a_unit_run_again_once(tok, corpus, tmp_path, capsys,
                                                        monkeypatch):
    monkeypatch.setattr("bertgpu.data.engines.PROGRESS_LINE_S", 0.0)  # a line at each report
    ran = _ran(monkeypatch)
    assert _run(tok, corpus, tmp_path / "data") == 0
    assert len(ran) > len(set(ran)) == 8  # (the case: some unit ran again)
    lines = [line for line in capsys.readouterr().err.splitlines() if " units, " in line]
    shown = [re.search(r"prepare: (\d+)% of .*, (\d+)/(\d+) units", line).groups()
             for line in lines]
    assert shown and all(int(done) <= int(total) == 8 and int(share) <= 100
                         for share, done, total in shown), lines
    assert shown[-1] == ("100", "8", "8")


def test_a_unit_of_an_earlier_run_run_again_is_not_counted_as_kept(tok, corpus, tmp_path, capsys,
                                                                   monkeypatch):
    """A run stopped just as a finished unit was to run again: the next run keeps the other
    finished units and runs that one again (and the kept count says so)."""
    from bertgpu.data.output import WorkFolder

    forget = WorkFolder.forget

    def stopping(self, unit):
        if self._record(f"units/{unit:05d}.json") is not None:  # a unit run again
            raise KeyboardInterrupt  # (before its earlier record is removed)
        forget(self, unit)

    with monkeypatch.context() as patch:
        patch.setattr(WorkFolder, "forget", stopping)
        assert _run(tok, corpus, tmp_path / "data") == 130
    finished = {p.name for p in (tmp_path / "data.tmp" / "units").glob("*.json")}
    capsys.readouterr()
    ran = _ran(monkeypatch)
    assert _run(tok, corpus, tmp_path / "data") == 0
    kept = 8 - len(set(ran))
    assert 0 < kept < len(finished)  # (the case: a finished unit ran again)
    out = capsys.readouterr().out
    assert (f"8 work units on the local engine, {kept} of them finished by an earlier run and "
            "kept") in out
    assert "(the 0 tokens of the units this run tokenized)" not in out  # (those run again)
