"""`bertgpu watch` on a `--max-restarts` job: when one rank died, rank 0 wrote an error end
record and watch stopped there ("stopped (error at step 24: RuntimeError: ... gloo ...)") while
the launcher restarted the job, which trained on to its end. Now the launcher tells the workers
of an attempt that another may follow (its pid, in BERTGPU_RESTART_BY), the error end record
names it, and watch waits for the restart while that process lives; once it is gone without a
new start, the error is the end as before."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from bertgpu import watch
from bertgpu.cli import main as cli_main
from bertgpu.errors import BertgpuError
from bertgpu.telemetry.records import process_started
from bertgpu.train import launcher
from bertgpu.train.run_end import log_failure
from bertgpu.watch import RunState, ended

GLOO = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:1234"
RESTART_BY = "BERTGPU_RESTART_BY"  # launcher.RESTART_BY_ENV
LAUNCHER = os.getpid()  # `bertgpu pretrain --nproc 2 --max-restarts 1`: its end faked (`alive`)


def test_the_launcher_names_itself_to_the_attempts_a_restart_may_follow(monkeypatch):
    seen = []

    def failed(nproc, argv, attempt):  # a crash (no stop, no bad input): restarted
        seen.append(os.environ.get(RESTART_BY))
        return 1, ["x\n"], []

    monkeypatch.setattr(launcher, "_launch_once", failed)
    monkeypatch.setenv(RESTART_BY, "1 2")  # an outer command's: not this job's
    assert launcher.launch_local(2, ["pretrain"], max_restarts=2, resume_hint=lambda: "h") == 1
    assert seen[0] is not None and seen[1:] == [seen[0], None], seen  # none on the last attempt
    pid, started = seen[0].split()
    assert int(pid) == os.getpid()
    assert started == "-" or started.isdigit()
    assert os.environ[RESTART_BY] == "1 2"  # this process's own, as it was
    seen.clear()
    monkeypatch.delenv(RESTART_BY)
    assert launcher.launch_local(2, ["pretrain"], resume_hint=lambda: "h") == 1
    assert seen == [None] and RESTART_BY not in os.environ


class _Logger:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def log(self, step: int, kind: str, **fields) -> None:
        self.records.append({"step": step, "kind": kind, **fields})


def _end_record(error: BaseException) -> dict:
    loop = SimpleNamespace(preemption=None, _window=None, info=SimpleNamespace(is_main=True),
                           engine=SimpleNamespace(step=24), world=2)
    logger = _Logger()
    log_failure(loop, logger, error)
    return logger.records[-1]


def test_an_error_end_record_names_the_launcher_while_a_restart_may_follow(monkeypatch):
    monkeypatch.setenv(RESTART_BY, f"{LAUNCHER} 987")
    end = _end_record(RuntimeError(GLOO.split(": ", 1)[1]))
    assert end["reason"] == "error" and end["error"] == GLOO
    assert end["launcher_pid"] == LAUNCHER and end["launcher_pid_started"] == 987
    # bad input (exit 2) and stops are never restarted: no promise of one
    for error in (BertgpuError("bad"), KeyboardInterrupt(), SystemExit(1)):
        assert "launcher_pid" not in _end_record(error), error
    monkeypatch.setenv(RESTART_BY, f"{LAUNCHER} -")  # start time unknown
    assert _end_record(RuntimeError("x"))["launcher_pid_started"] is None
    monkeypatch.delenv(RESTART_BY)  # the last attempt, or no --max-restarts
    assert "launcher_pid" not in _end_record(RuntimeError("x"))


def _train(step: int) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step, "elapsed_s": 1.0 * step,
            "loss": 8.0 / step, "lr": 1e-4}


def _info(step: int, event: str, **fields) -> dict:
    return {"step": step, "kind": "info", "time": 1.7e9 + step, "elapsed_s": 1.0 * step,
            "event": event, **fields}


def _start(step: int, host: str | None = None) -> dict:
    return _info(step, "start", host=host or socket.gethostname(), pid=os.getpid(),
                 world_size=2, max_steps=45)


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _failed_attempt(run: Path, host: str | None = None) -> Path:
    """r5 as rank 0 left it when rank 1 was killed at step 25 (checkpoint of step 20)."""
    run.mkdir()
    _append(run / "metrics.jsonl", [_start(0, host), *(_train(s) for s in (5, 10, 15, 20)),
                                    _info(24, "end", reason="error", error=GLOO, world_size=2,
                                          launcher_pid=LAUNCHER,
                                          launcher_pid_started=process_started(LAUNCHER))])
    return run / "metrics.jsonl"


def _watch_through_a_restart(records: Path, start: dict, monkeypatch, capsys,
                             piped: bool) -> tuple[str, list[float]]:
    """`bertgpu watch` of the run of `records` (its first attempt ended), as a terminal's live
    view or piped: at its second sleep the restarted job logs `start` (resumed from step 20)
    and two steps, at its third its end at step 45. Its output, one line, and its sleeps."""
    sleeps: list[float] = []

    def restarted(seconds: float) -> None:
        sleeps.append(seconds)
        assert len(sleeps) < 5, "the view did not stop at the end record"
        if len(sleeps) == 2:  # the launcher started the job again; it resumed from step 20
            _append(records, [start, _train(25), _train(30)])
        elif len(sleeps) == 3:
            _append(records, [_train(45), _info(45, "end", reason="max_steps")])

    monkeypatch.setattr(watch.time, "sleep", restarted)
    from rich.console import Console  # a terminal: the live view; else a frame per change

    monkeypatch.setattr(Console, "is_terminal", property(lambda self: not piped))
    monkeypatch.setenv("COLUMNS", "200")
    assert cli_main(["watch", str(records.parent), "--interval", "1"]) == 0
    return " ".join(capsys.readouterr().out.split()), sleeps


@pytest.fixture()
def alive(monkeypatch) -> list[bool]:
    """Whether the launcher runs (this process, as os.kill(pid, 0) finds it: faked)."""
    state = [True]
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid == LAUNCHER and sig == 0 and not state[0]:
            raise ProcessLookupError(pid)
        real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    return state


def test_watch_waits_while_the_launcher_lives(tmp_path, alive):
    records = _failed_attempt(tmp_path / "r5")
    state = RunState(tmp_path / "r5")
    state.poll()
    assert ended(state) is None
    status = watch._status(state, 1.8e9)
    assert status == (f"waiting for a restart (error at step 24: {GLOO}; --max-restarts: its "
                      f"launcher (process {LAUNCHER}) is still running)")
    alive[0] = False  # the launcher ended without restarting (it was the last attempt after all)
    assert ended(state) == f"stopped (error at step 24: {GLOO})"
    alive[0] = True  # it restarted the job: a new start, and the run goes on to its end
    _append(records, [_start(20), _train(25), _train(45), _info(45, "end", reason="max_steps")])
    state.poll()
    alive[0] = False
    assert ended(state) == "finished (max_steps)"


def test_a_launcher_on_another_host_is_waited_for(tmp_path, alive):
    _failed_attempt(tmp_path / "r5", host="another-node")
    state = RunState(tmp_path / "r5")
    state.poll()
    assert ended(state) is None
    assert watch._status(state, 1.8e9).endswith("its launcher runs on another-node)")


@pytest.mark.parametrize("piped", [False, True])
def test_the_live_view_follows_the_job_through_its_restart(tmp_path, capsys, monkeypatch,
                                                          alive, piped):
    out, sleeps = _watch_through_a_restart(_failed_attempt(tmp_path / "r5"), _start(20),
                                           monkeypatch, capsys, piped)
    assert len(sleeps) == 3 and "finished (max_steps)" in out and "step 45 / 45" in out
    assert "stopped (error" not in out
    if piped:  # a frame per change: the wait for the restart is one of them
        assert f"waiting for a restart (error at step 24: {GLOO}" in out
