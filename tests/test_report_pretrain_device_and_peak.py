"""The pretraining section names where a run was measured and the peak its MFU is over: a CPU
run with BERTGPU_PEAK_TFLOPS=0.2 showed "MFU 4.9 %" against nothing said, while `bench model`
reports name both. The start record carries them (telemetry/metrics.device_fields); a run of
an older version, without them, gets no row rather than a guess."""

from __future__ import annotations

from test_report import _table_rows, _write_jsonl

from bertgpu.report import build_report


def _run(tmp_path, name: str, start_extra: dict) -> object:
    run = tmp_path / name
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [
        {"step": 0, "kind": "info", "event": "start", "host": "h", "pid": 1, "world_size": 1,
         **start_extra},
        {"step": 10, "kind": "train", "elapsed_s": 5.0, "loss": 7.0, "tokens_per_s": 5000.0,
         "steps_per_s": 2.0, "mfu": 0.049},
    ])
    return run


def test_device_and_mfu_peak_are_named_and_older_runs_say_nothing(tmp_path):
    new = _run(tmp_path, "new", {"device": "cpu", "device_name": None, "torch": "2.13.0+cpu",
                                 "peak_tflops": 0.2, "peak_source": "BERTGPU_PEAK_TFLOPS"})
    old = _run(tmp_path, "old", {})
    md = (build_report([new, old], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["measured on"] == ["cpu (torch 2.13.0+cpu)", ""]
    assert rows["MFU (weighted by interval time)"] == ["4.9 %", "4.9 %"]
    assert rows["MFU is over the peak of one device"] == [
        "0.2 TFLOP/s (BERTGPU_PEAK_TFLOPS)", ""]


def test_the_start_record_holds_the_device_and_the_peak(tmp_path, monkeypatch):
    import json

    import torch

    from bertgpu.telemetry.metrics import MetricsLogger

    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", "0.2")
    log = MetricsLogger(tmp_path, is_main=True, tensorboard=False, progress=False,
                        device=torch.device("cpu"))
    log.log_config({"train": {"precision": "fp32"}})
    log.log(0, "info", event="start", host="h", pid=1)
    log.close()
    start = json.loads((tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert start["device"] == "cpu" and start["torch"] == torch.__version__
    assert "device_name" not in start  # None on CPU: left out, as every None field is
    assert start["peak_tflops"] == 0.2 and start["peak_source"] == "BERTGPU_PEAK_TFLOPS"
