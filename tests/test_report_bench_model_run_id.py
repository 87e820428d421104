"""A `bench model` run stamps its rows with one run_id: the parts of a preset, each stamped with
its own time, are one table of the report (a probe's --preset gpu-smoke run read as three tables,
one per part), while two runs appended to one file still get a table each."""

from __future__ import annotations

import json
import time

from test_report_bench_model_runs_apart import _row

from bertgpu.report import build_report


def test_the_parts_of_one_run_are_one_table_and_two_runs_two(tmp_path):
    first, later_part, second = 1795971744.8, 1795971750.1, 1795971763.5
    rows = [{**_row("bertgpu", 447.0, first), "run_id": "A"},
            {**_row("bertgpu", 300.0, later_part), "run_id": "A", "seq_len": 64},
            {**_row("bertgpu", 1176.0, second), "run_id": "B"}]
    bench = tmp_path / "runs.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    md = (build_report([bench], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    when = [time.strftime("%H:%M:%S", time.localtime(t)) for t in (first, later_part, second)]
    assert md.count("Measured on cpu") == 2 and f"at {when[1]}" not in md
    a = md.index(f"Measured on cpu (torch 2.13.0+cpu) at {when[0]}; every field")
    b = md.index(f"Measured on cpu (torch 2.13.0+cpu) at {when[2]}; every field")
    assert a < md.index("| 447 |") < md.index("| 300 |") < b < md.index("| 1,176 |")


def test_bench_model_stamps_one_run_id_on_its_rows(tmp_path):
    import pytest

    pytest.importorskip("transformers")
    from test_bench_model import parse, read_rows

    from bertgpu.bench import model as bench_model

    out = tmp_path / "results.jsonl"
    for _ in range(2):  # two runs appended to one file
        assert bench_model.main(parse(["--size", "tiny", "--micro-batch", "2", "--seq-len",
                                       "16,32", "--iters", "1", "--warmup", "0", "--models",
                                       "bertgpu", "--out", str(out)])) == 0
    rows = read_rows(out)
    assert len(rows) == 4 and all(r["run_id"] for r in rows)
    assert rows[0]["run_id"] == rows[1]["run_id"] != rows[2]["run_id"] == rows[3]["run_id"]
