"""The `bench model` chart of a report (here rows like `bench model --preset gpu-smoke`'s): 16
vertical bars under labels like "bert / bertgpu / 16 / full / padded / eager backend" tilted 20
degrees over each other, bare numbers ("bert / bertgpu / 2"), one colour for ours and
transformers, "471.0" beside "1,486", and a title without the device or dtype. Now: one
horizontal bar per row, labelled by the fields that differ, each named ("seq 16"), coloured by
implementation, whole numbers, and the device and dtype in the title."""

from __future__ import annotations

import json

from bertgpu.report import build_report


def _row(model: str, seq_len: int, compile_mode: str, tokens_per_s: float) -> dict:
    return {"bench": "model", "arch": "bert", "model": model, "size": "tiny", "micro_batch": 2,
            "seq_len": seq_len, "dtype": "fp32", "compile_mode": compile_mode,
            "padding": "padded", "lengths": "full", "tokens_per_s": tokens_per_s,
            "device": "cpu", "torch": "2.13.0+cpu", "time": 1795972466.7}


def _recorder(real, calls: list):
    def record(self, *args, **kwargs):
        calls.append((args, kwargs))
        return real(self, *args, **kwargs)
    return record


def test_bench_model_bars_are_named_coloured_by_model_and_titled_with_device(
        tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    drawn: dict[str, list] = {"set_title": [], "barh": [], "set_yticks": []}
    for method, calls in drawn.items():
        monkeypatch.setattr(Axes, method, _recorder(getattr(Axes, method), calls))
    bench = tmp_path / "smoke.jsonl"
    rows = [_row("bertgpu", 16, "off", 592.4), _row("transformers", 16, "off", 471.0),
            _row("bertgpu", 32, "eager backend", 1486.2)]
    bench.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    build_report([bench], tmp_path / "rep")
    assert drawn["set_title"][-1][0] == ("Throughput: smoke (cpu, fp32)",)
    # one bar per row, sideways (its label read untilted), coloured by implementation
    ((args, kwargs),) = drawn["barh"]
    assert list(args[1]) == [592.4, 471.0, 1486.2]
    assert kwargs["color"] == ["C0", "C1", "C0"]  # ours, transformers, ours
    ((ticks, _),) = drawn["set_yticks"]
    assert list(ticks[1]) == ["seq 16, compile off", "seq 16, compile off",
                              "seq 32, compile eager backend"]


def test_the_horizontal_chart_draws(tmp_path):
    from bertgpu.report.plots import hbar_chart

    name = hbar_chart(tmp_path, "bars.png", "Throughput", "tokens/s",
                      ["seq 16, compile off", "seq 32"], [592.4, None], ["bertgpu", "hf"])
    assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
