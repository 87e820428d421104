"""Re-running `bertgpu pretrain` on a run folder that already holds checkpoints: a budget run
that finished says so and changes nothing, a resume never starts past train.max_steps, and the
console ETA of a budget run with a step cap counts the budget."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_pretrain import ROOT, _args  # the tiny model and run every test here uses

from bertgpu.cli import main
from bertgpu.telemetry.records import read_metrics
from bertgpu.train.run_folder import LOCK_FILE

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _folder(run: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every file of `run` with its mtime, and the text files' contents; not the run folder's
    lock file, which every run takes (and names itself in) before it looks at the folder."""
    return {str(p.relative_to(run)): (p.stat().st_mtime_ns,
                                      p.read_bytes() if p.suffix in (".jsonl", ".toml") else None)
            for p in sorted(run.rglob("*")) if p.is_file() and p.name != LOCK_FILE}


@pytest.mark.timeout(120)
def test_rerunning_a_finished_budget_run_says_so_and_changes_nothing(shards: Path, tmp_path: Path,
                                                                    capsys) -> None:
    """The same command again after a run ended on its budget used to resume, print the start-up
    table, evaluate again, rewrite hf/ and append a second start, eval and end record; now it is
    one line and the folder is left as it was, with or without a step cap. A larger budget
    trains on."""
    run = tmp_path / "r"
    budget = ["--train.budget_hours", "0.0002", "--checkpoint.every_steps", "0"]
    assert main(_args(shards, run, "--train.max_steps", "0", *budget)) == 0
    end = [r for r in read_metrics(run) if r.get("event") == "end"][-1]
    assert end["reason"] == "budget"
    step, before = end["step"], _folder(run)
    for cap in ("0", "100000"):  # no step limit, and a cap the budget ended the run before
        capsys.readouterr()
        assert main(_args(shards, run, "--train.max_steps", cap, *budget)) == 0
        out = capsys.readouterr().out
        assert out.strip() == (f"{run}: finished at step {step} (train.budget_hours 0.0002 "
                               f"spent); nothing to train. Its Hugging Face export: {run / 'hf'} "
                               "(raise --train.budget_hours to train on)"), out
        assert _folder(run) == before
    assert main(_args(shards, run, "--train.max_steps", "0", "--train.budget_hours", "0.0004",
                      "--checkpoint.every_steps", "0")) == 0
    ends = [r for r in read_metrics(run) if r.get("event") == "end"]
    assert len(ends) == 2 and ends[-1]["reason"] == "budget" and ends[-1]["step"] > step


@pytest.mark.timeout(180)
def test_resuming_past_max_steps_is_refused_and_the_run_is_left_as_it_was(
        shards: Path, tmp_path: Path, capsys, no_faults) -> None:
    """A run killed after its step-2 checkpoint, resumed with train.max_steps 1, used to take
    no step and then evaluate, export and write an end record "max_steps" at step 2 ("eval step
    2/1"), as if it had finished; now it is a one-line error before anything is written, also
    with --nproc (before any worker starts). max_steps 2 finishes it at its checkpoint."""
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "BERTGPU_FAULTS": "kill_rank=0@step=4"}
    cmd = [sys.executable, "-m", "bertgpu", *_args(shards, run, "--train.max_steps", "20",
                                                    "--checkpoint.every_steps", "2")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == -9, proc.stderr
    assert (run / "checkpoints" / "step_2").is_dir() and not (run / "hf").exists()
    before = _folder(run)
    for extra in ([], ["--nproc", "2"]):
        capsys.readouterr()
        rc = main(_args(shards, run, "--train.max_steps", "1", "--checkpoint.every_steps", "2",
                        *extra))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert (f"{run}: the newest checkpoint is step 2, past train.max_steps 1; give "
                "train.max_steps of at least 2 to go on") in err, err
        assert f"bertgpu export {run} --step 2 --out DIR" in err, err
        assert _folder(run) == before, extra
    assert main(_args(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "2")) == 0
    end = [r for r in read_metrics(run) if r.get("event") == "end"][-1]
    assert end["reason"] == "max_steps" and end["step"] == 2 and (run / "hf").is_dir()


@pytest.mark.timeout(120)
def test_the_console_eta_of_a_budget_run_with_a_step_cap_is_the_budget_left(
        shards: Path, tmp_path: Path, capsys) -> None:
    """A budget run of 0.72 s capped at 100,000 steps used to show the ETA of the steps (hours
    at a few ms a step) on every console line; now it is the budget left, at most a second."""
    assert main(_args(shards, tmp_path / "r", "--train.max_steps", "100000",
                      "--train.budget_hours", "0.0002", "--checkpoint.every_steps", "0")) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("train step ")]
    etas = [re.search(r"ETA (\S+)", line) for line in lines]
    assert lines and all(etas), lines
    assert {m.group(1) for m in etas if m} <= {"00:00", "00:01"}, lines


@pytest.mark.timeout(120)
def test_a_run_resumed_at_its_evaluated_final_checkpoint_does_not_evaluate_it_again(
        shards: Path, tmp_path: Path) -> None:
    """A run killed after its final checkpoint but before its export (here: hf/ removed) is
    resumed by the same command: it used to evaluate the final step a second time (the same
    numbers, a second eval record, the time of an evaluation lost) because the resumed loop did
    not know the checkpoint came after that evaluation; now it only exports. The checkpoint
    holds that evaluation's numbers, which the resumed run returns as its last ones."""
    import shutil

    import torch

    run = tmp_path / "r"
    cmd = _args(shards, run, "--train.max_steps", "4", "--checkpoint.every_steps", "2")
    assert main(cmd) == 0
    evals = [r for r in read_metrics(run) if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == [4]
    state = torch.load(run / "checkpoints" / "step_4" / "train_state.pt", weights_only=True)
    assert state["evaluated_at"] == 4
    logged = {k: v for k, v in evals[0].items() if k.startswith("val_")}  # rounded to 6 digits
    assert state["last_eval"] == pytest.approx(logged, rel=1e-5), (state["last_eval"], logged)
    shutil.rmtree(run / "hf")
    assert main(cmd) == 0
    records = read_metrics(run)
    assert [r["step"] for r in records if r.get("kind") == "eval"] == [4], records
    assert (run / "hf" / "model.safetensors").is_file()
    assert [r["reason"] for r in records if r.get("event") == "end"] == ["max_steps"] * 2
