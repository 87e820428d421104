"""Rows of two `bench model` runs appended to one --out file (on one device) read as one table
of identical-looking rows: they were grouped by device only. The rows of each time (a run
stamps its rows, part by part, with one) now have their own table, under a line naming that
time, as scaling files are grouped by run."""

from __future__ import annotations

import json
import time

from bertgpu.report import build_report


def _row(model: str, tokens_per_s: float, at: float) -> dict:
    return {"bench": "model", "arch": "bert", "model": model, "size": "tiny", "micro_batch": 4,
            "seq_len": 32, "dtype": "fp32", "compile_mode": "off", "padding": "padded",
            "lengths": "full", "tokens_per_s": tokens_per_s, "device": "cpu",
            "torch": "2.13.0+cpu", "time": at}


def test_two_runs_on_one_device_get_a_table_each(tmp_path):
    first, second = 1795971744.8, 1795971763.5
    bench = tmp_path / "twice.jsonl"
    rows = [_row("bertgpu", 447.0, first), _row("transformers", 268.0, first),
            _row("bertgpu", 1176.0, second), _row("transformers", 432.0, second)]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    md = (build_report([bench], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    when = [time.strftime("%H:%M:%S", time.localtime(t)) for t in (first, second)]
    a = md.index(f"Measured on cpu (torch 2.13.0+cpu) at {when[0]}; every field")
    b = md.index(f"Measured on cpu (torch 2.13.0+cpu) at {when[1]}; every field")
    assert a < md.index("| 447 |") < md.index("| 268 |") < b < md.index("| 1,176 |")
    assert md.count("| arch | size |") == 2
