"""Stop signals end to end through `bertgpu pretrain` (CPU, gloo): the run ends within
checkpoint.grace_s whatever it was doing, a second signal ends it at once, background
checkpoints survive a SIGKILL during their write, and every re-run ends bitwise equal to the run
that never stopped (test_faults_e2e.py's, whose checkpoints are written in the background).
Faults: BERTGPU_FAULTS (testing/faults.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _e2e import (
    args,
    assert_bitwise_equal,
    bertgpu,
    bertgpu_here,
    bertgpu_started,
    e2e_shards,
    final_weights,
    reference_run,
)
from safetensors.torch import load_file


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return e2e_shards(tmp_path_factory)


def _start(shards: Path, run: Path, *extra: str, faults: str) -> subprocess.Popen:
    return bertgpu_started(args(shards, run, *extra), faults=faults)


def _until(cond, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.02)


def _trained(run: Path, step: int) -> bool:
    path = run / "metrics.jsonl"
    return path.exists() and f'{{"step": {step}, "kind": "train"' in path.read_text()


def _stop(proc: subprocess.Popen, *signals_at: float) -> tuple[str, float]:
    """Send SIGTERM at each of these times (seconds from now); (stderr, seconds from the last
    signal to the exit)."""
    t0 = time.monotonic()
    for at in signals_at:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        os.killpg(proc.pid, signal.SIGTERM)
    last = time.monotonic()
    _, err = proc.communicate(timeout=120)
    return err, time.monotonic() - last


def _last_line(text: str) -> str:
    return [line for line in text.strip().splitlines() if line.strip()][-1]


def _rerun(shards: Path, run: Path, *extra: str) -> None:
    """The same command again, to its end, in this process (one thread, as the subprocesses run:
    the `one_thread` fixture); with `--nproc`, its launcher and workers are processes of their
    own (_e2e.bertgpu_here)."""
    if "--nproc" in extra:
        done = bertgpu_here(args(shards, run, *extra))
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        from bertgpu.cli import main

        assert main(args(shards, run, *extra)) == 0


def _same_checkpoint(a: Path, b: Path) -> None:
    """The same weights, optimizer state, counters and data cursor (clocks aside)."""
    import torch

    assert_bitwise_equal(load_file(str(a / "model.safetensors")),
                         load_file(str(b / "model.safetensors")))
    sa, sb = (torch.load(p / "train_state.pt", weights_only=True) for p in (a, b))
    oa, ob = sa["optimizer"]["state"], sb["optimizer"]["state"]
    assert oa.keys() == ob.keys() and all(torch.equal(oa[i][k], ob[i][k])
                                          for i in oa for k in oa[i])
    assert (sa["step"], sa["engine"], sa["loader"]) == (sb["step"], sb["engine"], sb["loader"])


def _left_behind(run: Path) -> list[str]:
    """Processes still running for this run folder (workers, loader workers)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(run) in (proc / "cmdline").read_text():
                found.append(proc.name)
        except OSError:
            pass
    return found


@pytest.mark.timeout(300)
def test_a_slow_step_on_two_ranks_with_loader_workers_ends_within_the_grace(shards, tmp_path,
                                                                           tmp_path_factory):
    """Rank 0's step 6 takes 120 s (it cannot be interrupted, like a step that compiles): every
    process of the job is gone within grace_s + 5 s of SIGTERM, without a preemption checkpoint
    (no safe point came), and the re-run resumes from step 4. It writes its checkpoints in place:
    they hold the same state as the background ones of the run that never stopped."""
    run = tmp_path / "run"
    extra = ["--nproc", "2", "--impl.num_workers", "1"]
    proc = _start(shards, run, *extra, "--checkpoint.grace_s", "3",
                  faults="delay_rank=0:120@step=6")
    _until(lambda: _trained(run, 5))
    time.sleep(0.3)
    signalled = time.monotonic()
    err, _ = _stop(proc, 0.0)
    _until(lambda: not _left_behind(run), timeout=10)
    assert time.monotonic() - signalled < 3 + 5  # every process, loader workers included
    assert proc.returncode == 143, err[-2000:]
    # said once: rank 0's line names the checkpoint a re-run resumes from (the launcher's own
    # "stopped by SIGTERM; re-running ..." repeated it)
    assert _last_line(err).startswith(
        "bertgpu pretrain: SIGTERM: the grace of 3 s ran out in step 6; stopped without a "
        "preemption checkpoint; re-running the same command resumes from step 4"), err[-2000:]
    assert "stopped by SIGTERM" not in err, err[-2000:]
    assert "SignalException" not in err, err[-2000:]  # the launcher's own traceback
    _rerun(shards, run, *extra, "--checkpoint.async_save", "false")
    ref = reference_run(shards, tmp_path_factory, 2)
    assert_bitwise_equal(final_weights(ref), final_weights(run))
    for step in (8, 12):
        _same_checkpoint(ref / "checkpoints" / f"step_{step}", run / "checkpoints" / f"step_{step}")


@pytest.mark.timeout(300)
def test_sigterm_during_an_evaluation_stops_it_and_writes_the_checkpoint(
        shards, tmp_path, tmp_path_factory, one_thread, no_faults):
    """The evaluation of step 4 would take 60 s: SIGTERM cuts it short and the checkpoint of
    step 4 is written. The re-run writes its checkpoints in place: the same state as the
    background ones of the run that never stopped."""
    run = tmp_path / "run"
    extra = ["--train.eval_every_steps", "4"]
    proc = _start(shards, run, *extra, faults="slow_eval=60")
    _until(lambda: _trained(run, 4))
    err, took = _stop(proc, 0.3)
    assert proc.returncode == 143 and took < 20, err[-2000:]
    assert _last_line(err).startswith("bertgpu pretrain: SIGTERM: wrote a preemption checkpoint "
                                      "of step 4 in "), err[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_4"]
    _rerun(shards, run, *extra, "--checkpoint.async_save", "false")
    # The evaluation of step 4 that the stop cut short is done first after the resume (it was
    # lost).
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4, 8, 12]
    ref = reference_run(shards, tmp_path_factory)
    assert_bitwise_equal(final_weights(ref), final_weights(run))
    for step in (8, 12):
        _same_checkpoint(ref / "checkpoints" / f"step_{step}", run / "checkpoints" / f"step_{step}")


@pytest.mark.timeout(300)
def test_a_final_evaluation_cut_short_is_in_the_final_checkpoint_after_the_rerun(
        shards, tmp_path, one_thread, no_faults):
    """SIGTERM during the evaluation of the last step (4): the preemption checkpoint of step 4
    says that evaluation is still to come. The re-run does it, and rewrites that checkpoint: it
    was kept as it was (the same step, "already saved"), so the final checkpoint said step 4
    unevaluated, and a run extended from it (--train.max_steps 8) evaluated step 4 again (two
    eval records of one step)."""
    import torch

    run = tmp_path / "run"
    extra = ["--train.eval_every_steps", "4", "--train.max_steps", "4"]
    proc = _start(shards, run, *extra, faults="slow_eval=60")
    _until(lambda: _trained(run, 4))
    err, _ = _stop(proc, 0.3)
    assert proc.returncode == 143, err[-2000:]
    assert "wrote a preemption checkpoint of step 4" in _last_line(err), err[-2000:]
    _rerun(shards, run, *extra, "--checkpoint.async_save", "false")
    state = torch.load(run / "checkpoints" / "step_4" / "train_state.pt", weights_only=True)
    assert state["evaluated_at"] == 4 and state["last_eval"]
    _rerun(shards, run, "--train.eval_every_steps", "4", "--train.max_steps", "8")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [4, 8]


@pytest.mark.timeout(300)
def test_sigterm_during_a_background_write_waits_for_it(shards, tmp_path, tmp_path_factory,
                                                        one_thread, no_faults):
    """Step 8's checkpoint write takes 2 s more, every micro-step 0.12 s: SIGTERM in step 10
    while step 8's checkpoint is written in the background. The run stops at the next
    micro-step, lets that write finish and writes the last completed step's checkpoint (from the
    state before the aborted step: its data had been read)."""
    run = tmp_path / "run"
    proc = _start(shards, run, faults="slow_write=2@step=8,slow_rank=0:0.03")
    _until(lambda: _trained(run, 9))
    err, _ = _stop(proc, 0.05)
    assert proc.returncode == 143, err[-2000:]
    newest = max(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert newest in (9, 10) and (run / "checkpoints" / "step_8" / "COMPLETE").exists()
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert f"SIGTERM: wrote a preemption checkpoint of step {newest} in " in _last_line(err)
    _rerun(shards, run)
    assert_bitwise_equal(final_weights(reference_run(shards, tmp_path_factory)),
                         final_weights(run))


@pytest.mark.timeout(300)
def test_a_second_sigterm_during_a_write_exits_at_once(shards, tmp_path, tmp_path_factory,
                                                       one_thread, no_faults):
    """Checkpoints written in place, step 8's 3 s more: the first SIGTERM lets that write go on,
    the second ends the process at once. step_8 never became complete, step_4 is intact and the
    re-run resumes from it."""
    run = tmp_path / "run"
    extra = ["--checkpoint.async_save", "false"]
    proc = _start(shards, run, *extra, faults="slow_write=3@step=8")
    _until(lambda: (run / "checkpoints" / "step_8.tmp").exists())
    err, took = _stop(proc, 0.0, 1.2)
    assert proc.returncode == 143 and took < 1.5, (took, err[-2000:])
    assert _last_line(err) == ("bertgpu pretrain: second SIGTERM: stopped at once while writing "
                               "the checkpoint of step 8; re-running the same command resumes "
                               f"from step 4 ({run / 'checkpoints' / 'step_4'})"), err[-2000:]
    _rerun(shards, run)
    assert_bitwise_equal(final_weights(reference_run(shards, tmp_path_factory)),
                         final_weights(run))


@pytest.mark.timeout(300)
def test_sigkill_during_a_background_write_loses_only_the_steps_since_the_previous(
        shards, tmp_path, tmp_path_factory, one_thread, no_faults, capsys):
    """Every write takes 1 s more; rank 0 dies at step 9 while step 8's checkpoint is written in
    the background (from a host copy taken at step 8: steps 5-8 changed the weights while step
    4's was written). step_4 stays the newest complete checkpoint."""
    run = tmp_path / "run"
    killed = bertgpu(args(shards, run), faults="slow_write=1,kill_rank=0@step=9")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # step_8.tmp, unless the kill came before the writer thread made it
    assert sorted(p.name for p in (run / "checkpoints").iterdir())[:1] == ["step_4"]
    assert not (run / "checkpoints" / "step_8").exists()
    _rerun(shards, run)
    assert "step_4 (step 4" in capsys.readouterr().out
    assert_bitwise_equal(final_weights(reference_run(shards, tmp_path_factory)),
                         final_weights(run))


@pytest.mark.timeout(300)
def test_a_stop_whose_console_went_away_stays_a_stop(shards, tmp_path):
    """A closed terminal or ssh session (SIGHUP to `bertgpu`, whose workers then get SIGTERM)
    takes the reader of the workers' stderr with it. The preemption checkpoint was written, but
    the line saying so met a broken pipe: a second end record said "error: BrokenPipeError",
    `watch` showed the run as failed, and the exit status was 141, not 143."""
    run = tmp_path / "run"
    proc = _start(shards, run, faults="")
    _until(lambda: _trained(run, 2))
    proc.stderr.close()  # the reader goes away
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ends = [r for r in records if r.get("event") == "end"]
    assert [e["reason"] for e in ends] == ["preempted"], ends
    # The stop's step is in a whole checkpoint: the preemption wrote it, or (the signal came at
    # a step of checkpoint.every_steps, as a busy machine makes likely) the regular one had.
    stopped = [r for r in records if r.get("event") == "preempted"]
    assert len(stopped) == 1, records
    assert stopped[0]["checkpoint"] or (
        run / "checkpoints" / f"step_{ends[0]['step']}" / "COMPLETE").is_file(), records


@pytest.mark.parametrize("gap_s", [0.4, 0.9])
def test_a_second_signal_while_the_process_winds_down_still_exits_143(shards, tmp_path, gap_s):
    """The README: a second stop signal exits at once the same way. One that came while the
    interpreter shut down after the preemption checkpoint (a second or so after the first
    signal) met the default action: the process died of SIGTERM (-15), not 143."""
    run = tmp_path / "run"
    proc = _start(shards, run, faults="")
    _until(lambda: _trained(run, 3))
    os.kill(proc.pid, signal.SIGTERM)
    time.sleep(gap_s)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 143, proc.stderr.read()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "preempted" for r in records), records


@pytest.mark.timeout(300)
def test_a_closed_terminal_sighup_stops_the_run_with_its_checkpoint(shards, tmp_path):
    """SIGHUP (the terminal or ssh session closed) killed the run at once: exit 129, nothing on
    stderr, no end record, and the steps since the last checkpoint lost. It is a stop signal
    now, like SIGTERM; the same command resumes."""
    run = tmp_path / "run"
    proc = _start(shards, run, faults="")
    _until(lambda: _trained(run, 2))
    os.killpg(proc.pid, signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 129, err[-2000:]
    assert "bertgpu pretrain: SIGHUP: " in err, err[-2000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ends = [r for r in records if r.get("event") == "end"]
    assert [e["reason"] for e in ends] == ["preempted"], ends
    assert (run / "checkpoints" / f"step_{ends[0]['step']}" / "COMPLETE").is_file()
