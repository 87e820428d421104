"""Whether a run that writes no more is over, for `bertgpu watch`: its process gone from this host
without an end record (killed or crashed), its ``--max-restarts`` launcher still there to start
it again, or a process that took its run folder after its end record (`resuming`).

A ``--max-restarts`` job's launcher names itself to each attempt that another may follow, and
rank 0 writes it into its ``start`` record (records.launcher_fields) and a worker into an error's
``end`` record (train/run_end.py). While that launcher lives, the job is waited for: after a
worker's error, and after a rank 0 killed without an end record (watch said "killed or crashed"
there and stopped, while the launcher restarted the job and it trained on).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from bertgpu.telemetry.records import (
    error_at,
    named_launcher,
    process_gone,
    restart_launcher,
    run_end,
    run_start,
)

RESTART_WAIT_ELSEWHERE_S = 600
"""How long after its last record a job whose launcher runs on another host (which this one
cannot ask) is waited for."""


def writer_gone(records: list[dict[str, Any]]) -> int | None:
    """The pid of the process that wrote the newest ``start`` record, when it ran on this host and
    is gone; None while it may run (or runs elsewhere: its clock decides)."""
    start = run_start(records)
    if start is None or start.get("host") != socket.gethostname():
        return None  # a run of an older version, or of another host
    pid = start.get("pid")
    if (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0
            and process_gone(pid, start.get("pid_started"))):
        return pid
    return None


def restart_awaited(records: list[dict[str, Any]], last_update: float | None) -> str | None:
    """The status of a ``--max-restarts`` job between a failed attempt and the next one: its
    error end record, or (rank 0 gone without one) its start record, names the launcher that may
    start it again, which still runs (or runs on another host: for 10 minutes after the last
    record). Watch used to stop there while the job trained on. A launcher gone without a new
    start record restarted nothing: None."""
    end = run_end(records)
    if end is not None:
        launcher, why = restart_launcher(end), error_at(end)
    else:
        gone = writer_gone(records)
        launcher = named_launcher(run_start(records) or {}) if gone is not None else None
        why = f"process {gone} is gone without an end record"
    if launcher is None:
        return None
    here = socket.gethostname()
    host = (run_start(records) or {}).get("host", here)
    if (process_gone(*launcher) if host == here
            else time.time() - (last_update or 0.0) > RESTART_WAIT_ELSEWHERE_S):
        return None
    where = f"(process {launcher[0]}) is still running" if host == here else f"runs on {host}"
    return f"waiting for a restart ({why}; --max-restarts: its launcher {where})"


def resuming(folder: Path, end: dict[str, Any]) -> str | None:
    """The status of a run that ended (`end`, its newest record) and is started again (the same
    command with a larger train.max_steps, or after a preemption): its new process loads,
    evaluates and (on a GPU) compiles for minutes before its first record, and watch said
    "finished" meanwhile and left. The run folder's lock names that process ("PID HOST",
    written once it holds the lock), written after the end record, and it runs on this host
    (of another host only its records tell). None otherwise: the lock of the process that
    ended is older than its end record."""
    lock = _lock_holder(folder)
    at = end.get("time")
    if lock is None or isinstance(at, bool) or not isinstance(at, (int, float)):
        return None
    pid, written = lock
    if written < at or process_gone(pid, None):
        return None
    reason, step = end.get("reason"), end.get("step")
    last = f"finished ({reason})" if reason in ("max_steps", "budget") else f"stopped ({reason})"
    return f"resuming: process {pid} holds the run folder; last record: {last} at step {step}"


def _lock_holder(folder: Path) -> tuple[int, float] | None:
    """(pid, when it wrote the lock) of the process that took the run folder's lock on this
    host, or None (no lock file, one of another host or not ours)."""
    from bertgpu.fsutil import RUN_LOCK

    try:
        path = folder / RUN_LOCK
        written = path.stat().st_mtime
        pid_text, host = path.read_text(encoding="utf-8").split()[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return (pid, written) if host == socket.gethostname() and pid > 0 else None


def gone_before_first_record(folder: Path) -> str | None:
    """A run killed at start-up, before its first record: the run folder's lock names the
    process that took it ("PID HOST", written once it holds the lock), and that process is gone
    (watch waited for the first record for ever)."""
    lock = _lock_holder(folder)
    if lock is None or not process_gone(lock[0], None):
        return None
    pid = lock[0]
    return f"stopped (process {pid} is gone before its first record: killed or crashed)"
