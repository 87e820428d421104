"""Fixes found by a probe of `bertgpu report`, `bertgpu watch` and `bertgpu demo`: a fine-tuning
run in progress in the report, watch's elapsed time of a finished run, watch on a folder that is
not a run, plots embedded in the HTML page, and a demo stopped by a signal while fine-tuning."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest
from test_report import _write_jsonl

from bertgpu.cli import main as cli_main
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import SCRATCH_MARK
from bertgpu.report import build_report
from bertgpu.report.inputs import load_source
from bertgpu.telemetry.records import process_started


def _info(step: int, event: str, elapsed_s: float, **fields) -> dict:
    return {"step": step, "kind": "info", "time": 1.7e9 + elapsed_s, "elapsed_s": elapsed_s,
            "event": event, **fields}


def _ft_train(step: int) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step, "elapsed_s": 2.0 * step,
            "loss": 0.7 / step, "epoch": (step - 1) // 10 + 1, "lr": 1e-4,
            "tokens_per_s": 300.0, "tokens_per_s_per_device": 300.0, "tokens_seen": 500 * step}


def _ft_eval(step: int, score: float) -> dict:
    return {"step": step, "kind": "eval", "time": 1.7e9 + step, "elapsed_s": 2.0 * step + 0.5,
            "epoch": step // 10, "score": score, "dev_accuracy": score}


def _preempted_finetune(work: Path, pid: int = 1, pid_started: int | None = None) -> Path:
    """A fine-tuning run's OUT.tmp as `bertgpu finetune` leaves it when SIGTERM stopped it at
    step 25 of 30: scratch mark, metrics.jsonl (no results.json), a checkpoint's finetune.json."""
    work.mkdir(parents=True)
    (work / SCRATCH_MARK).touch()
    _write_jsonl(work / "metrics.jsonl", [
        _info(0, "start", 0.001, host="h", pid=pid, pid_started=pid_started, world_size=1,
              max_steps=30),
        _ft_train(10), _ft_eval(10, 62.5), _ft_train(20), _ft_eval(20, 75.0), _ft_train(25),
        _info(25, "end", 50.2, reason="preempted", world_size=1),
        _info(25, "checkpoint", 50.4, stall_s=0.2),
        _info(25, "preempted", 50.4, signal="SIGTERM", checkpoint=True)])
    step = work / "checkpoints" / "step_25"
    step.mkdir(parents=True)
    (step / "finetune.json").write_text(json.dumps({"task": "SST-2", "world_size": 1}),
                                        encoding="utf-8")
    return work


# --- 1. report: a fine-tuning run in progress --------------------------------------------------


def test_report_takes_a_finetuning_run_in_progress_from_out_and_files_it_as_finetuning(tmp_path):
    out = tmp_path / "sst2"
    work = _preempted_finetune(tmp_path / "sst2.tmp")
    for given in (out, work):  # OUT falls back on OUT.tmp, as bertgpu watch does
        source = load_source(given)
        assert (source.kind, source.name, source.path) == ("finetune", "sst2", work)
    md = (build_report([out], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "## Fine-tuning" in md and "## Pretraining" not in md
    assert "| sst2 | SST-2 | 75.0 | latest: dev_accuracy 75.0 | 2 | 25 of 30 |" in md
    assert (f"sst2 has not finished: it is in progress in `{work}` (stopped (preempted at step "
            "25 of 30; re-run the same command to resume)); its score is that of its latest "
            "evaluation (epoch 2, step 20)") in md
    # Without the scratch mark and the checkpoint, its eval records (a score) still tell it.
    (work / SCRATCH_MARK).unlink()
    (work / "checkpoints" / "step_25" / "finetune.json").unlink()
    assert load_source(out).kind == "finetune"
    # A run still going (no end record) is said to be so; a pretraining run stays one.
    lines = (work / "metrics.jsonl").read_text().splitlines()
    (work / "metrics.jsonl").write_text("\n".join(lines[:6]) + "\n")
    assert load_source(out).data["ended"] == "no end record (still running, or killed)"
    # The newest record is an epoch's evaluation after the train record before it: its step
    # counts (the steps were taken from train records alone: "10 of 30" beside step 20's score)
    _write_jsonl(work / "metrics.jsonl", [
        _info(0, "start", 0.001, host="h", pid=1, world_size=1, max_steps=30),
        _ft_train(10), _ft_train(20), _ft_eval(24, 75.0)])
    assert load_source(out).data["steps"] == 24
    (tmp_path / "gone.tmp").mkdir()
    with pytest.raises(BertgpuError, match=r"gone: does not exist, and .*gone.tmp \(a fine-tuning "
                                        r"run starting\) has no records yet"):
        load_source(tmp_path / "gone")


def test_a_pretraining_run_is_not_taken_for_a_finetuning_run(tmp_path):
    run = tmp_path / "base"
    run.mkdir()
    (run / "config.toml").write_text("seed = 0\n", encoding="utf-8")
    _write_jsonl(run / "metrics.jsonl", [
        _info(0, "start", 0.0, max_steps=30), _ft_train(10),
        {"step": 10, "kind": "eval", "elapsed_s": 21.0, "val_mlm_loss": 6.5}])
    assert load_source(run).kind == "pretrain"


# --- 2. watch: the elapsed time of a finished run ------------------------------------------------


def _frame(capsys, monkeypatch, folder: Path) -> str:
    monkeypatch.setenv("COLUMNS", "160")
    assert cli_main(["watch", str(folder), "--once"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_watch_shows_the_elapsed_time_of_the_newest_record(tmp_path, capsys, monkeypatch):
    """Probe: step 30 at 79 s, the final eval at 145.8 s, the end at 146.3 s; watch said 01:19,
    report 2 min 26 s."""
    run = tmp_path / "base"
    run.mkdir()
    train = [{"step": s, "kind": "train", "elapsed_s": 79.0 * s / 30, "loss": 8.0}
             for s in (10, 20, 30)]
    _write_jsonl(run / "metrics.jsonl", [
        _info(0, "start", 0.0, max_steps=30), *train,
        {"step": 30, "kind": "eval", "elapsed_s": 140.2, "val_mlm_loss": 7.5}])
    assert "step 30 / 30 (100.0%) · elapsed 02:20" in _frame(capsys, monkeypatch, run)  # running
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(_info(30, "end", 146.3, reason="max_steps")) + "\n")
    frame = _frame(capsys, monkeypatch, run)
    assert "finished (max_steps)" in frame and "elapsed 02:26" in frame
    assert "elapsed 01:19" not in frame


# --- 3. watch: a folder that is not a run --------------------------------------------------------


def test_watch_refuses_a_folder_that_is_not_a_run_and_waits_for_one_starting(
        tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "config.toml").write_text("seed = 0\n", encoding="utf-8")
    _preempted_finetune(runs / "c.tmp")  # a fine-tuning run in progress: the run c
    assert cli_main(["watch", str(runs), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"bertgpu watch: error: {runs}: not a run; it holds the runs a, b, c" in err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x", encoding="utf-8")
    assert cli_main(["watch", str(tmp_path / "notes")]) == 2  # not only with --once
    assert "notes: not a run folder (it holds todo.txt); expected a run folder" in (
        capsys.readouterr().err)
    # A run in its first seconds: pretrain's folder holds its lock file alone, a fine-tuning's
    # OUT.tmp its scratch mark alone; an empty folder is one about to start.
    starting = tmp_path / "base"
    starting.mkdir()
    assert "waiting for the first record" in _frame(capsys, monkeypatch, starting)
    (starting / ".bertgpu-run.lock").write_text("1 host\n", encoding="utf-8")
    assert "waiting for the first record" in _frame(capsys, monkeypatch, starting)
    (tmp_path / "ft.tmp").mkdir()
    (tmp_path / "ft.tmp" / SCRATCH_MARK).touch()
    frame = _frame(capsys, monkeypatch, tmp_path / "ft")
    assert f"{tmp_path / 'ft.tmp'} · waiting for the first record" in frame


# --- 4. the HTML page embeds its plots -----------------------------------------------------------


def test_the_html_page_embeds_its_plots_and_stands_alone(tmp_path):
    run = tmp_path / "base"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [
        {"step": s, "kind": "train", "elapsed_s": float(s), "loss": 9.0 - s, "lr": 1e-3,
         "tokens_per_s": 100.0 * s} for s in (1, 2, 3)])
    out = build_report([run], tmp_path / "rep", "both")
    md = (out / "README.md").read_text(encoding="utf-8")
    plots = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert plots and all((out / name).is_file() for name in plots)  # the markdown links them
    alone = tmp_path / "elsewhere.html"  # the page alone, copied away from its folder
    alone.write_bytes((out / "index.html").read_bytes())
    sources = re.findall(r'<img src="([^"]+)"', alone.read_text(encoding="utf-8"))
    assert len(sources) == len(plots)
    for name, src in zip(plots, sources, strict=True):
        assert src.startswith("data:image/png;base64,"), src[:40]
        assert base64.b64decode(src.split(",", 1)[1]) == (out / name).read_bytes()
    # about 4/3 of the PNGs, and no more
    size = alone.stat().st_size
    assert size < 1.4 * sum((out / name).stat().st_size for name in plots) + 10_000


# --- 5. the demo stopped by a signal -------------------------------------------------------------


def _demo_until_finetuning(monkeypatch, tmp_path: Path) -> None:
    """The demo's stages 1-4 as done (they have their own tests): no tokenizer, shards or
    pretraining here."""
    from bertgpu import demo, pretrain

    pytest.importorskip("gensim", reason="the demo reads gensim's test data")
    monkeypatch.setattr(demo, "_tokenizer_and_shards", lambda *a, **k: None)
    monkeypatch.setattr(pretrain, "run", lambda cfg: pretrain.RunResult(
        Path(cfg.out), 3, export_dir=tmp_path / "hf"))
    monkeypatch.setattr(demo, "_pretraining_table", lambda run_dir: "")
    monkeypatch.setattr(demo, "fill_mask", lambda hf_dir, sentences: [])


def _fake_finetune(stop_at_seed: int | None, pid_started: int | None = None):
    """`finetune_examples` as it behaves: a seed's run finishes (results.json), or SIGTERM stops
    it (a preemption checkpoint in OUT.tmp, the records, no results.json) and it returns."""
    def run(task, train, dev, init, out, **kwargs):
        out = Path(out)
        seed = int(kwargs["overrides"][kwargs["overrides"].index("--seed") + 1])
        if seed == stop_at_seed:
            _preempted_finetune(out.with_name(out.name + ".tmp"), os.getpid(), pid_started)
            return {"preempted": True, "step": 25, "exit_status": 143}
        out.mkdir(parents=True)
        (out / "results.json").write_text(json.dumps(
            {"score": 75.0, "metrics": {"dev": {"accuracy": 75.0}}}), encoding="utf-8")
        return {}
    return run


def test_a_demo_stopped_while_finetuning_ends_as_a_stop(tmp_path, capsys, monkeypatch):
    from bertgpu import finetune

    _demo_until_finetuning(monkeypatch, tmp_path)
    monkeypatch.setattr(finetune, "finetune_examples",
                        _fake_finetune(1, process_started(os.getpid())))
    out = tmp_path / "demo"
    assert cli_main(["demo", "--out", str(out), "--seeds", "0", "1", "--fresh"]) == 143
    err = capsys.readouterr().err
    work = out / "finetune" / "modern-tiny" / "pretrained" / "polarity" / "seed_1.tmp"
    assert err == (f"bertgpu demo: stopped by SIGTERM in stage 5 (bertgpu finetune: the "
                   f"fine-tuning modern-tiny/pretrained/polarity/seed_1 at step 25, in {work}); "
                   "run the same bertgpu demo command again (without --fresh) to resume: the "
                   "stages done are kept\n")


def test_a_demo_whose_finetuning_failed_still_says_so(tmp_path, capsys, monkeypatch):
    """No stop of this process's fine-tuning: the error stays an error, even beside a run that
    an earlier demo's stop left (another process's)."""
    from bertgpu import finetune

    _demo_until_finetuning(monkeypatch, tmp_path)
    out = tmp_path / "demo"
    _preempted_finetune(out / "finetune" / "modern-tiny" / "pretrained" / "polarity"
                        / "seed_7.tmp", pid=os.getpid() + 1)

    def fails(task, train, dev, init, out, **kwargs):
        return {}  # no results.json: the run failed somewhere without saying so

    monkeypatch.setattr(finetune, "finetune_examples", fails)
    assert cli_main(["demo", "--out", str(out), "--seeds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertgpu demo: error: ") and "did the fine-tuning run fail?" in err


def test_a_demo_stopped_while_pretraining_ends_as_a_stop(tmp_path, capsys, monkeypatch):
    from bertgpu import demo, pretrain

    _demo_until_finetuning(monkeypatch, tmp_path)
    monkeypatch.setattr(pretrain, "run", lambda cfg: pretrain.RunResult(
        Path(cfg.out), 2, preempted=True, exit_status=130))

    def not_reached(*a, **k):
        raise AssertionError("the demo went on after its pretraining was stopped")

    monkeypatch.setattr(demo, "fill_mask", not_reached)
    out = tmp_path / "demo"
    assert cli_main(["demo", "--out", str(out), "--skip-finetune"]) == 130
    assert capsys.readouterr().err == (
        f"bertgpu demo: stopped by SIGINT in stage 3 (bertgpu pretrain: pretraining at step 2, "
        f"in {out / 'run'}); run the same bertgpu demo command again to resume: the stages done "
        "are kept\n")


def test_a_demo_stopped_between_runs_says_which_stage(tmp_path, capsys, monkeypatch):
    """SIGTERM outside a training loop (here while the tokenizer trains) raises Terminated."""
    from bertgpu import demo
    from bertgpu.errors import Terminated

    _demo_until_finetuning(monkeypatch, tmp_path)

    def tokenizer_stopped(wiki, tok_dir, data_dir, vocab_size, begun):
        demo._stage(f"1. bertgpu tokenizer --vocab-size {vocab_size}", begun)
        raise Terminated()

    monkeypatch.setattr(demo, "_tokenizer_and_shards", tokenizer_stopped)
    assert cli_main(["demo", "--out", str(tmp_path / "demo")]) == 143
    assert capsys.readouterr().err.startswith(
        "bertgpu demo: stopped by SIGTERM in stage 1 (bertgpu tokenizer); run the same bertgpu "
        "demo command again to resume")
