"""Faults injected end to end through `bertgpu pretrain` (CPU, gloo): each ends with one clear
line, loses nothing, and a re-run (or the launcher's restart) ends bitwise equal to a run that
never failed. Fault injection: BERTGPU_FAULTS (testing/faults.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from _e2e import (
    STEPS,
    args,
    assert_bitwise_equal,
    bertgpu,
    bertgpu_here,
    bertgpu_started,
    e2e_shards,
    final_weights,
    reference_run,
)
from _toy import cpu_fp16_available


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return e2e_shards(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """reference(nproc): the final weights of the uninterrupted run a fault test must match, on
    the same number of processes (with dropout on, each rank has its own noise stream)."""

    def get(nproc: int = 1) -> dict:
        return final_weights(reference_run(shards, tmp_path_factory, nproc))

    return get


def last_line(text: str) -> str:
    return [line for line in text.strip().splitlines() if line.strip()][-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nproc", [1, 2])
def test_sigterm_to_the_process_group_with_loader_workers(shards, tmp_path, reference, nproc):
    """A scheduler's preemption: SIGTERM to every process, loader workers included."""
    run = tmp_path / "run"
    extra = ["--impl.num_workers", "1", *(["--nproc", "2"] if nproc == 2 else [])]
    # slow steps, so the signal lands mid-run
    proc = bertgpu_started(args(shards, run, *extra), faults="delay_rank=0:0.2")
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (time.monotonic() < deadline
           and not (metrics.exists() and metrics.read_text().count('"train"') >= 2)):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "DataLoader worker" not in err
    ckpts = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert ckpts and ckpts[-1] < STEPS and not (run / "hf").exists()
    # the stop said once (rank 0's line; under --nproc the launcher no longer repeats it)
    assert last_line(err).startswith("bertgpu pretrain: SIGTERM: "), err[-2000:]
    assert last_line(err).endswith(f"re-running the same command resumes from step {ckpts[-1]} "
                                   f"({run / 'checkpoints' / f'step_{ckpts[-1]}'})"), err[-2000:]
    assert "stopped by SIGTERM" not in err, err[-2000:]
    again = bertgpu_here(args(shards, run, *extra))
    assert again.returncode == 0, again.stderr[-2000:]
    assert_bitwise_equal(reference(nproc), final_weights(run))


@pytest.mark.timeout(300)
def test_disk_full_mid_save_then_rerun(shards, tmp_path, reference):
    run = tmp_path / "run"
    # Every save writes 9 files (weights, state, config.toml, config.json, the tokenizer's
    # four, checksums): the 12th write is inside the second checkpoint (step 8).
    failed = bertgpu(args(shards, run), faults="enospc_write=12")
    assert failed.returncode == 2
    line = last_line(failed.stderr)
    assert "No space left on device" in line and "checkpoints" in line and "free" in line, line
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_4"]  # the partial step_8.tmp is gone, step_4 intact
    again = bertgpu_here(args(shards, run))
    assert again.returncode == 0, again.stderr[-2000:]
    assert_bitwise_equal(reference(), final_weights(run))


@pytest.mark.timeout(300)
def test_truncated_newest_checkpoint_falls_back(shards, tmp_path, reference):
    run = tmp_path / "run"
    killed = bertgpu(args(shards, run), faults="kill_rank=0@step=10")
    assert killed.returncode == -signal.SIGKILL
    newest = run / "checkpoints" / "step_8" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    again = bertgpu_here(args(shards, run))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "step_8" in again.stderr and "truncated" in again.stderr
    assert "resumed from" in again.stdout and "step_4" in again.stdout
    assert_bitwise_equal(reference(), final_weights(run))


@pytest.mark.timeout(300)
def test_killed_rank_restarts_by_itself(shards, tmp_path, reference):
    run = tmp_path / "run"
    done = bertgpu_here(args(shards, run, "--nproc", "2", "--max-restarts", "1"),
                        faults="kill_rank=1@step=6")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SIGKILL rank 1 at step 6" in done.stderr and "resumed from" in done.stdout
    assert_bitwise_equal(reference(2), final_weights(run))


@pytest.mark.timeout(300)
def test_killed_rank_without_restarts_says_who_and_how_to_resume(shards, tmp_path):
    run = tmp_path / "run"
    failed = bertgpu_here(args(shards, run, "--nproc", "2"), faults="kill_rank=1@step=6")
    assert failed.returncode != 0
    assert last_line(failed.stderr) == ("bertgpu pretrain: rank 1 died of SIGKILL (exit code -9); "
                                        "re-running the same command resumes from step 4 "
                                        f"({run / 'checkpoints' / 'step_4'})")


@pytest.mark.timeout(300)
def test_hung_rank_ends_the_job_at_the_timeout_and_says_how_to_resume(shards, tmp_path):
    """Rank 1 stops answering at step 6 (it sleeps 200 s); rank 0's all-reduce gives up after
    distributed.timeout_minutes (6 s here) instead of waiting for ever, and the job ends with the
    line that names the rank and the step a re-run resumes from. (The hung rank then gets
    torchrun's SIGTERM and leaves within checkpoint.grace_s: 3 s here, not the default 25.)"""
    run = tmp_path / "run"
    t0 = time.monotonic()
    failed = bertgpu_here(args(shards, run, "--nproc", "2", "--distributed.timeout_minutes", "0.1",
                               "--checkpoint.grace_s", "3"),
                          faults="delay_rank=1:200@step=6")
    assert failed.returncode != 0
    assert time.monotonic() - t0 < 150, "the job waited for the hung rank instead of timing out"
    line = last_line(failed.stderr)
    assert line.startswith("bertgpu pretrain: rank ") and line.endswith(
        f"re-running the same command resumes from step 4 ({run / 'checkpoints' / 'step_4'})"), line


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hook", ["powersgd", "bf16"])
def test_compression_hook_recovers_from_one_nonfinite_step(shards, tmp_path, hook):
    run = tmp_path / "run"
    # PowerSGD compresses from its 10th step on; the NaN comes after, on one rank only.
    done = bertgpu_here(args(shards, run, "--nproc", "2", "--distributed.comm_hook", hook,
                             "--train.max_steps", "30", "--optim.lr", "3e-3",
                             "--schedule.warmup_fraction", "0"),
                        faults="nonfinite_rank=1@step=14")
    assert done.returncode == 0, done.stderr[-3000:]
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert train[-1]["skipped_steps"] == 1
    losses = [r["loss"] for r in train if r["step"] != 14]
    assert all(x == x and abs(x) != float("inf") for x in losses)
    after = [r["loss"] for r in train if r["step"] > 14]
    assert sum(after[-5:]) / 5 < sum(after[:5]) / 5  # training goes on and the loss keeps falling


@pytest.mark.timeout(300)
def test_repeated_nonfinite_steps_stop_with_the_message(shards, tmp_path):
    from bertgpu.train.engine import Engine

    precision = "fp16" if cpu_fp16_available() else "bf16"
    run = tmp_path / "run"
    failed = bertgpu_here(args(shards, run, "--train.precision", precision,
                               "--train.max_nonfinite_steps", "3"),
                          faults="nonfinite_rank=0@step=3-")
    assert failed.returncode == 2
    line = last_line(failed.stderr)
    assert "training diverged: 3 steps in a row with non-finite loss or gradients" in line, line
    assert "resume from the last checkpoint" in line and Engine is not None


@pytest.mark.timeout(300)
def test_changed_mask_rate_on_resume_is_an_error(shards, tmp_path):
    run = tmp_path / "run"
    first = bertgpu_here(args(shards, run, "--train.max_steps", "4"))
    assert first.returncode == 0, first.stderr[-2000:]
    changed = bertgpu_here(args(shards, run, "--train.max_steps", "8", "--data.mask_rate", "0.3"))
    assert changed.returncode == 2
    line = last_line(changed.stderr)
    assert ("resuming with changed data: mask_rate 0.15 -> 0.3" in line
            and "--allow-data-change" in line), line
    allowed = bertgpu_here(args(shards, run, "--train.max_steps", "8", "--data.mask_rate", "0.3",
                                "--allow-data-change"))
    assert allowed.returncode == 0, allowed.stderr[-2000:]
