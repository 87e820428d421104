"""`report` on one `bench model --out FILE` that runs on two devices appended to: a table per
device, each under its own "Measured on" line and peak note. They had merged into one table
without a device column under "Measured on A, B", identical-looking rows and two peaks listed
without saying which rows each applied to."""

from __future__ import annotations

import json

from bertgpu.report import build_report


def _row(device_name: str, torch_version: str, peak: float, tokens_per_s: float) -> dict:
    return {"bench": "model", "arch": "bert", "model": "bertgpu", "size": "tiny",
            "micro_batch": 8, "seq_len": 128, "dtype": "bf16", "compile": True,
            "compile_mode": "default", "padding": "padded", "lengths": "full",
            "mean_length": 128.0, "iters": 2, "step_ms": 10.0, "tokens_per_s": tokens_per_s,
            "mfu": 0.3, "peak_tflops": peak, "peak_source": "table", "device": "cuda",
            "device_name": device_name, "torch": torch_version, "time": 1.0}


def test_rows_of_two_devices_get_a_table_each(tmp_path):
    rows = [_row("NVIDIA H100 80GB HBM3", "2.11.0", 989.0, 111.0),
            _row("NVIDIA A100-SXM4-80GB", "2.13.0", 312.0, 222.0)]
    bench = tmp_path / "model.jsonl"
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    md = (build_report([bench], tmp_path / "rep", "md") / "README.md").read_text()
    h100 = md.index("Measured on NVIDIA H100 80GB HBM3 (torch 2.11.0)")
    a100 = md.index("Measured on NVIDIA A100-SXM4-80GB (torch 2.13.0)")
    assert h100 < md.index("| 111 |") < md.index("989 TFLOP/s") < a100  # old code: one table
    assert a100 < md.index("| 222 |") < md.index("312 TFLOP/s")
    assert md.count("| arch | size |") == 2
