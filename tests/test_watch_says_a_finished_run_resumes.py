"""`bertgpu watch` on a finished run started again (the same command with a larger
train.max_steps): until the new process writes its first record, the newest record is the old
end record, and watch said "finished (max_steps)" and "step 4 / 10" and left, for the minutes
the new process loads, evaluates and compiles. The run folder's lock, taken by that process
after the end record, now says it is resuming; config.toml's new length is read again."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from test_watch import CONFIG, _append, _train

from bertgpu.cli import main as cli_main
from bertgpu.fsutil import RUN_LOCK
from bertgpu.watch import RunState, _status, ended, render

_END = 1.7e9 + 5  # the end record's time: long before the lock below is written


def _finished(tmp_path: Path) -> Path:
    run = tmp_path / "base"
    run.mkdir()
    (run / "config.toml").write_text(CONFIG, encoding="utf-8")
    _append(run / "metrics.jsonl", [
        {"step": 0, "kind": "info", "time": 1.7e9, "event": "start"},
        *[_train(s) for s in (1, 2, 3, 4)],
        {"step": 4, "kind": "info", "time": _END, "elapsed_s": 41.0, "event": "end",
         "reason": "max_steps"}])
    return run


def _lock(run: Path, pid: int, written: float | None = None) -> None:
    """The lock file as run_folder_lock writes it once it holds the lock ("PID HOST")."""
    (run / RUN_LOCK).write_text(f"{pid} {socket.gethostname()}\n", encoding="utf-8")
    if written is not None:
        os.utime(run / RUN_LOCK, (written, written))


def _text(state: RunState) -> str:
    from rich.console import Console

    console = Console(width=160, file=io.StringIO())
    console.print(render(state, width=160))
    return console.file.getvalue()


def test_a_process_that_took_the_folder_after_the_end_is_resuming(tmp_path, capsys, monkeypatch):
    run = _finished(tmp_path)
    _lock(run, os.getpid())  # a live process (this one) took the lock after the end record
    state = RunState(run)
    state.poll()
    assert ended(state) is None
    resuming = (f"resuming: process {os.getpid()} holds the run folder; last record: finished "
                "(max_steps) at step 4")
    assert _status(state, time.time()) == resuming
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_main(["watch", str(run), "--once"]) == 0
    frame = capsys.readouterr().out
    assert resuming in frame and "ETA" not in frame, frame
    # the new process writes config.toml with its length, then its records: followed on
    (run / "config.toml").write_text(CONFIG.replace("max_steps = 10", "max_steps = 20"),
                                     encoding="utf-8")
    os.utime(run / "config.toml", ns=(1, 1))  # another mtime than the first one's, whatever
    state.poll()
    assert "step 4 / 20 (20.0%)" in _text(state)
    _append(run / "metrics.jsonl", [{"step": 4, "kind": "info", "time": _END + 60,
                                     "event": "start"}, _train(5)])
    state.poll()
    assert ended(state) is None and _status(state, time.time()).startswith("running")
    assert "step 5 / 20 (25.0%)" in _text(state)


def test_the_lock_of_the_process_that_ended_or_of_a_gone_one_is_no_resume(tmp_path):
    run = _finished(tmp_path)
    _lock(run, os.getpid(), written=_END - 30)  # taken by the run that ended, before its end
    state = RunState(run)
    state.poll()
    assert ended(state) == "finished (max_steps)"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _lock(run, int(gone.stdout))  # after the end, by a process that is gone (a refused re-run)
    assert ended(state) == "finished (max_steps)"
    (run / RUN_LOCK).unlink()
    assert ended(state) == "finished (max_steps)"
