"""`bench scaling` and `bench model --strategy` rows were dumped as raw tables: 19 snake_case
columns, "2317" and an efficiency of "0.3255" where the bench's scaling.md shows "2,317" and
"0.33", params_bytes "17736968" where the console showed 16.9 MiB, and the run's id and time
on every row. They now have the bench's own columns, readable numbers, and what every row
shares said once."""

from __future__ import annotations

from test_report import _table_rows, _write_jsonl

from bertgpu.report import build_report

_RUN = {"device": "cpu", "seq_len": 32, "micro_batch_size": 4, "recipe": "tiny (built in)",
        "data": "synthetic", "run_id": "2026-11-29T17:03:00", "time": "2026-11-29T17:04:12"}


def _scaling(workers: int, tps: float, efficiency: float) -> dict:
    return {"workers": workers, "accumulation": 1, "global_batch": 4 * workers, "wall_s": 9.3,
            "tokens_per_s": tps, "step_time_s": 0.05525, "steps_measured": 4,
            "comm_share": 0.3966 if workers > 1 else 0.0, "data_wait_share": 0.2531,
            "tokens_per_s_per_device": tps / workers, "speedup": efficiency * workers,
            "efficiency": efficiency, **_RUN}


def _memory(strategy: str, ranks: int, params: int, step_ms: float | None) -> dict:
    return {"bench": "model_memory", "strategy": strategy, "ranks": ranks, "size": "tiny",
            "dtype": "fp32", "micro_batch": 8, "seq_len": 128, "params_bytes": params,
            "grads_bytes": params, "optimizer_bytes": 2 * params, "total_bytes": 4 * params,
            "step_ms": step_ms, "mem_peak_gib": None, "device": "cpu",
            "source": "measured" if step_ms else "predicted", "time": 1795972352.6489 + ranks}


def test_scaling_rows_read_as_the_bench_prints_them(tmp_path):
    path = _write_jsonl(tmp_path / "scaling.jsonl", [_scaling(1, 2316.74, 1.0),
                                                     _scaling(2, 1508.1, 0.32547)])
    md = (build_report([path], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["workers"] == ["accumulation", "global batch", "tokens/s", "tokens/s per device",
                               "speedup", "efficiency", "comm share", "data wait share"]
    assert rows["2"] == ["1", "8", "1,508", "754", "0.65", "0.33", "0.397", "0.253"]
    assert md.count("2026-11-29T17:03:00") == 1  # the run, once, not on every row
    assert ("Every row: device cpu; micro batch 4; sequence length 32; recipe tiny (built in); "
            "data synthetic; run 2026-11-29T17:03:00; measured 2026-11-29T17:04:12.") in md


def test_strategy_rows_show_bytes_in_mib_and_their_shared_settings_once(tmp_path):
    path = _write_jsonl(tmp_path / "strategy.jsonl", [
        _memory("ddp", 1, 17736968, 3934.56), _memory("fsdp", 2, 8868484, None)])
    md = (build_report([path], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["strategy"] == ["ranks", "params MiB", "grads MiB", "optimizer MiB",
                                "total MiB", "step ms", "source"]
    assert rows["ddp"] == ["1", "16.9", "16.9", "33.8", "67.7", "3,935", "measured"]
    assert rows["fsdp"] == ["2", "8.5", "8.5", "16.9", "33.8", "", "predicted"]
    assert "Every row: bench model_memory; device cpu; size tiny; dtype fp32; micro batch 8; " \
           "sequence length 128; measured " in md
