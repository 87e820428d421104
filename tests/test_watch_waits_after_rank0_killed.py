"""`bertgpu watch` on a `--nproc 2 --max-restarts N` job whose rank 0 is SIGKILLed: rank 0 writes
the records and could write no end record, so watch said "stopped (process P is gone; no end
record: killed or crashed)" and stopped following, while the launcher restarted the job and it
trained on to its end. Now rank 0's start record names the launcher that may start the job again
(the one BERTGPU_RESTART_BY names; under torchrun with restarts left, torch's agent), and watch
waits for the restart while that process lives. With it gone, or no restart left (the last
attempt names none), the run was killed or crashed, as before."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from test_watch_waits_for_a_restart import _append, _info, _train, _watch_through_a_restart

from bertgpu import watch
from bertgpu.cli import main as cli_main
from bertgpu.telemetry.metrics import MetricsLogger
from bertgpu.telemetry.records import process_started, read_jsonl
from bertgpu.train import launcher
from bertgpu.watch import RunState, ended

RESTART_BY = "BERTGPU_RESTART_BY"  # launcher.RESTART_BY_ENV
LAUNCHER = os.getpid()  # the launcher of the job: this process, its end faked (`gone`)
RANK0 = 4_000_001  # the killed rank 0 of the first attempt (faked gone)
RANK0_AGAIN = 4_000_002  # rank 0 of the restarted attempt


def _start_record(run: Path, monkeypatch, restart_by: str | None) -> dict:
    """The start record rank 0 writes (train/loop.py's fields) with the environment the launcher
    gave the attempt."""
    if restart_by is None:
        monkeypatch.delenv(RESTART_BY, raising=False)
    else:
        monkeypatch.setenv(RESTART_BY, restart_by)
    log = MetricsLogger(run, is_main=True, tensorboard=False, progress=False)
    log.log(0, "info", event="start", host=socket.gethostname(), pid=os.getpid(), world_size=2)
    log.close()
    return [r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "start"][-1]


def test_the_start_record_names_the_launcher_while_a_restart_may_follow(tmp_path, monkeypatch):
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(name, raising=False)
    start = _start_record(tmp_path / "a", monkeypatch, f"{LAUNCHER} 987")
    assert start["launcher_pid"] == LAUNCHER and start["launcher_pid_started"] == 987
    assert start["pid"] == os.getpid() and start["world_size"] == 2  # the loop's own, as given
    start = _start_record(tmp_path / "b", monkeypatch, f"{LAUNCHER} -")  # start time unknown
    assert start["launcher_pid"] == LAUNCHER and "launcher_pid_started" not in start
    start = _start_record(tmp_path / "c", monkeypatch, None)  # the last attempt: no restart
    assert "launcher_pid" not in start
    # torchrun --max-restarts 2 restarts its workers itself: its agent, the worker's parent
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    start = _start_record(tmp_path / "d", monkeypatch, None)
    assert start["launcher_pid"] == os.getppid()
    assert start.get("launcher_pid_started") == process_started(os.getppid())
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")  # its last attempt
    assert "launcher_pid" not in _start_record(tmp_path / "e", monkeypatch, None)


def test_each_attempt_but_the_last_names_the_launcher_in_its_start_record(tmp_path, monkeypatch):
    """launch_local's attempts, each of whose rank 0 writes a start record (faked here, in this
    process: the launcher's workers inherit its environment)."""
    monkeypatch.delenv(RESTART_BY, raising=False)
    runs = []

    def attempt(nproc, argv, number):
        runs.append(tmp_path / f"attempt{number}")
        log = MetricsLogger(runs[-1], is_main=True, tensorboard=False, progress=False)
        log.log(0, "info", event="start", host=socket.gethostname(), pid=os.getpid())
        log.close()
        return 1, ["x\n"], []  # a crash: restarted

    monkeypatch.setattr(launcher, "_launch_once", attempt)
    assert launcher.launch_local(2, ["pretrain"], max_restarts=2, resume_hint=lambda: "h") == 1
    named = [read_jsonl(run / "metrics.jsonl")[0].get("launcher_pid") for run in runs]
    assert named == [os.getpid(), os.getpid(), None]


def _start(step: int, pid: int, launcher_pid: int | None = LAUNCHER) -> dict:
    named = ({"launcher_pid": launcher_pid, "launcher_pid_started": process_started(launcher_pid)}
             if launcher_pid else {})
    return _info(step, "start", host=socket.gethostname(), pid=pid, world_size=2, max_steps=45,
                 **named)


def _killed_attempt(run: Path, launcher_pid: int | None = LAUNCHER) -> Path:
    """r5 as rank 0 left it when it was SIGKILLed after step 20: no end record."""
    run.mkdir()
    _append(run / "metrics.jsonl",
            [_start(0, RANK0, launcher_pid), *(_train(s) for s in (5, 10, 15, 20))])
    return run / "metrics.jsonl"


@pytest.fixture()
def gone(monkeypatch) -> set[int]:
    """The pids os.kill(pid, 0) finds gone (faked): rank 0 of the first attempt at first."""
    pids = {RANK0}
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if sig == 0 and pid in pids:
            raise ProcessLookupError(pid)
        if sig == 0 and pid in (RANK0, RANK0_AGAIN):
            return  # alive
        real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    return pids


def test_watch_waits_for_the_restart_while_the_launcher_lives(tmp_path, gone):
    records = _killed_attempt(tmp_path / "r5")
    state = RunState(tmp_path / "r5")
    state.poll()
    assert ended(state) is None  # old code: "stopped (process 4000001 is gone; ...)"
    assert watch._status(state, 1.8e9) == (
        f"waiting for a restart (process {RANK0} is gone without an end record; --max-restarts: "
        f"its launcher (process {LAUNCHER}) is still running)")
    gone.add(LAUNCHER)  # the launcher ended without restarting (killed itself, say)
    assert ended(state) == f"stopped (process {RANK0} is gone; no end record: killed or crashed)"
    gone.discard(LAUNCHER)  # it restarted the job: a new start, and the run goes on to its end
    _append(records, [_start(20, RANK0_AGAIN, None), _train(25)])
    state.poll()
    assert ended(state) is None and watch._status(state, 1.7e9 + 30).startswith("running")
    _append(records, [_train(45), _info(45, "end", reason="max_steps")])
    state.poll()
    gone.update({LAUNCHER, RANK0_AGAIN})
    assert ended(state) == "finished (max_steps)"


def test_no_restart_left_is_killed_or_crashed(tmp_path, gone):
    """The last attempt's start record names no launcher: nothing will start the job again."""
    _killed_attempt(tmp_path / "r5", launcher_pid=None)
    state = RunState(tmp_path / "r5")
    state.poll()
    assert ended(state) == f"stopped (process {RANK0} is gone; no end record: killed or crashed)"


def test_a_launcher_whose_pid_another_process_took_is_gone(tmp_path, gone):
    log = _killed_attempt(tmp_path / "r5")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    rows[0]["launcher_pid_started"] = (process_started(LAUNCHER) or 0) + 1  # another start time
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    state = RunState(tmp_path / "r5")
    state.poll()
    assert ended(state) is not None and "killed or crashed" in ended(state)


@pytest.mark.parametrize("piped", [False, True])
def test_the_live_view_follows_the_job_through_its_restart(tmp_path, capsys, monkeypatch, gone,
                                                          piped):
    out, sleeps = _watch_through_a_restart(_killed_attempt(tmp_path / "r5"),
                                           _start(20, RANK0_AGAIN, None), monkeypatch, capsys,
                                           piped)
    assert len(sleeps) == 3 and "finished (max_steps)" in out and "step 45 / 45" in out
    assert "killed or crashed" not in out
    if piped:  # a frame per change: the wait for the restart is one of them
        assert f"waiting for a restart (process {RANK0} is gone without an end record" in out


def test_a_piped_watch_shows_the_wait_that_begins_without_a_record(tmp_path, capsys, monkeypatch,
                                                                  gone):
    """`watch RUN > log` prints a frame per change: rank 0 killed adds no record, and the wait
    was not shown (the log went from "running" to "finished")."""
    records = _killed_attempt(tmp_path / "r5")
    gone.discard(RANK0)  # rank 0 still trains when the watch starts
    sleeps = []

    def killed_then_restarted(seconds: float) -> None:
        sleeps.append(seconds)
        assert len(sleeps) < 6, "the view did not stop at the end record"
        if len(sleeps) == 1:
            gone.add(RANK0)  # SIGKILL: no record
        elif len(sleeps) == 3:  # the launcher started the job again
            _append(records, [_start(20, RANK0_AGAIN, None), _train(25), _train(45),
                              _info(45, "end", reason="max_steps")])

    monkeypatch.setattr(watch.time, "sleep", killed_then_restarted)
    from rich.console import Console

    monkeypatch.setattr(Console, "is_terminal", property(lambda self: False))
    monkeypatch.setenv("COLUMNS", "200")
    assert cli_main(["watch", str(tmp_path / "r5"), "--interval", "1"]) == 0
    frames = [line for line in capsys.readouterr().out.splitlines()
              if line.startswith("bertgpu watch")]
    assert [frame.split("  ·  ")[1].split(" (")[0] for frame in frames] == [
        "running", "waiting for a restart", "finished"], frames
