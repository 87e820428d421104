"""A missing optional package is one line naming how to install it, or (the bench commands,
whose table is the result) plots left out with a note; never a traceback, never a lost table.
Packages are hidden by a `sys.modules` entry of None (`import matplotlib` then raises
ImportError); nothing is uninstalled."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from bertgpu.bench import finetune_scaling as fs
from bertgpu.bench import model as bench_model
from bertgpu.cli import main


def _hide(monkeypatch, name: str) -> None:
    monkeypatch.setitem(sys.modules, name, None)


def _cell(workers: int, aggregation: int, rate: float) -> dict:
    """A finetune_scaling.jsonl row with the numbers the table and the time split read."""
    return {"bench": "finetune-scaling", "run_id": "2026-01-01T00:00:00", "task": "classify",
            "init": "tiny", "optimizer": "adamw", "lr_scaling": "none", "seed": 0,
            "workers": workers, "aggregation": aggregation, "global_batch": 4 * aggregation,
            "steps": 10, "peak_lr": 1e-3, "metric": "accuracy", "metric_value": 75.0,
            "train_seconds": 40.0 / rate, "train_examples_per_s": rate, "load_seconds": 1.0,
            "eval_seconds": 0.5, "data_wait_seconds": 0.1, "data_wait_share": 0.01,
            "eval_examples_per_s": 100.0, "seconds": 2.0 + 40.0 / rate,
            "wall_s": 4.0 + 40.0 / rate, "speedup": 1.0, "efficiency": 1.0 / workers}


def test_report_without_matplotlib_is_one_line_before_any_output(tmp_path, monkeypatch, capsys):
    """Without matplotlib a report that draws crashed in the plot code (ModuleNotFoundError,
    exit 1); now it is refused in one line, exit 2, no folder."""
    rows = tmp_path / "finetune_scaling.jsonl"
    rows.write_text("".join(json.dumps(_cell(1, a, 10.0)) + "\n" for a in (1, 2)))
    out = tmp_path / "rep"
    _hide(monkeypatch, "matplotlib")
    assert main(["report", str(rows), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == ("bertgpu report: error: report: the plots need matplotlib, which is not "
                   "installed; expected `pip install 'bertgpu[report]'`\n")
    assert not out.exists() and not out.with_name("rep.tmp").exists()


def test_a_fine_tuning_report_without_matplotlib_is_one_line(tmp_path, monkeypatch, capsys):
    """Its curves imported matplotlib.ticker before asking for pyplot: a traceback."""
    ft = tmp_path / "run"
    ft.mkdir()
    (ft / "results.json").write_text(json.dumps({
        "task": "sst2", "score": 75.0, "steps": 24,
        "epochs": [{"epoch": 1, "train_loss": 0.6, "score": 70.0},
                   {"epoch": 2, "train_loss": 0.5, "score": 75.0}]}))
    _hide(monkeypatch, "matplotlib")
    assert main(["report", str(ft), "--out", str(tmp_path / "rep")]) == 2
    assert capsys.readouterr().err.startswith("bertgpu report: error: report: the plots need "
                                              "matplotlib")
    assert not (tmp_path / "rep").exists() and not (tmp_path / "rep.tmp").exists()


def test_a_report_that_draws_no_plot_needs_no_matplotlib(tmp_path, monkeypatch):
    """`bench model --strategy` rows make a table only: refusing every report without
    matplotlib refused these too."""
    from bertgpu.report import build_report

    rows = tmp_path / "memory.jsonl"
    rows.write_text(json.dumps({
        "bench": "model_memory", "strategy": "ddp", "ranks": 1, "size": "small", "dtype": "fp32",
        "micro_batch": 8, "seq_len": 128, "params_bytes": 1, "grads_bytes": 1,
        "optimizer_bytes": 2, "total_bytes": 4, "step_ms": 3.0, "mem_peak_gib": None,
        "device": "cpu", "source": "measured"}) + "\n")
    _hide(monkeypatch, "matplotlib")
    out = build_report([rows], tmp_path / "rep")
    assert (out / "README.md").is_file()
    assert not list(out.glob("*.png"))


def test_bench_finetune_scaling_without_matplotlib_keeps_its_table(tmp_path, monkeypatch,
                                                                    capsys):
    """As bench quality and bench scaling: the table without plots, said before the cells
    train. It crashed after every cell had trained, with finetune_scaling.md never written."""
    rows = [_cell(1, 1, 10.0), _cell(1, 2, 10.0)]
    trained: list[bool] = []

    def study(plan, out: Path, base):  # the cells' rows, as run_study appends them
        trained.append(True)
        (out / "finetune_scaling.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return rows

    monkeypatch.setattr(fs, "make_plan", lambda args: SimpleNamespace(init="tiny", threads=1))
    monkeypatch.setattr(fs, "run_study", study)
    _hide(monkeypatch, "matplotlib")
    out = tmp_path / "out"
    assert main(["bench", "finetune-scaling", "--task", "classify", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    note = printed.index("note: matplotlib is not installed")
    assert "pip install 'bertgpu[report]'" in printed.splitlines()[0] and note == 0 and trained
    md = (out / "finetune_scaling.md").read_text()
    assert "| adamw |" in md and ".png" not in md
    assert not list(out.glob("*.png"))


def test_demo_without_transformers_is_refused_before_any_stage(tmp_path, monkeypatch, capsys):
    """Stage 4 (fill-mask) loads the export through transformers: without it the demo died
    there with a traceback, after the tokenizer, shards and pretraining. Now one line first."""
    _hide(monkeypatch, "transformers")
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "30", "--skip-finetune"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "pip install 'bertgpu[demo]'" in captured.err
    assert "transformers, which is not installed" in captured.err
    assert "===" not in captured.out and not out.exists()


def test_the_demo_extra_installs_transformers():
    """`pip install 'bertgpu[demo]'` then `bertgpu demo` failed: transformers was only in dev."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    demo = project["project"]["optional-dependencies"]["demo"]
    assert any(d.startswith("transformers") for d in demo)


def _bench_argv(*extra: str) -> list[str]:
    return ["bench", "model", "--size", "tiny", "--micro-batch", "1", "--seq-len", "8",
            "--iters", "1", "--warmup", "0", "--device", "cpu", *extra]


def test_bench_model_without_transformers(tmp_path, monkeypatch, capsys):
    """Without transformers `bench model` crashed building the models (model_runs.py imported
    it even for ours alone). The default (both models) is now one line before any model is
    built; --models bertgpu times ours without it."""
    _hide(monkeypatch, "transformers")
    built: list[str] = []
    real = bench_model.Models

    def counting(*a, **kw):
        built.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(bench_model, "Models", counting)
    assert main(_bench_argv()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not built
    assert "transformers is not installed" in err and "--models bertgpu" in err
    out = tmp_path / "rows.jsonl"
    assert main(_bench_argv("--models", "bertgpu", "--out", str(out))) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["model"] for r in rows] == ["bertgpu"] and rows[0]["transformers"] is None
    assert "| transformers - |" in capsys.readouterr().out
