"""One report at a time writes an --out (locks.output_lock, as export, finetune and glue do): a
probe started two reports into one --out; in every try one crashed with a 40-line
FileNotFoundError traceback ('OUT.tmp/finetune.png'), and in 2 of 4 the report left was one's
README.md beside the other's plots."""

from __future__ import annotations

import os
import socket

from test_report import _write_jsonl

from bertgpu.cli import main as cli
from bertgpu.locks import output_lock
from bertgpu.report import build_report

_RECORDS = [{"step": 0, "kind": "info", "event": "start", "elapsed_s": 0.0, "host": "h", "pid": 1,
             "world_size": 1, "max_steps": 10},
            {"step": 10, "kind": "train", "elapsed_s": 5.0, "loss": 7.0, "steps_per_s": 2.0,
             "tokens_per_s": 5000.0}]


def test_a_report_into_an_out_being_written_is_refused_in_one_line(tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "rep"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", _RECORDS)
    with output_lock(out, "bertgpu report"):
        assert cli(["report", str(run), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"bertgpu report: error: {out}: another bertgpu report (pid {os.getpid()} on "
        f"{socket.gethostname()}) is writing this output; wait for it to end or stop it, or give "
        "another --out\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written, no lock left
    build_report([run], out)  # and once the other has ended, it is written
    assert (out / "README.md").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep", "run"]
