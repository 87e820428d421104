"""Whether a run that writes no more is over, for `bertgpu watch`: its ``--max-restarts``
launcher still there to start it again after an error, or its process gone from this host before
its first record (killed or crashed)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

from bertgpu.telemetry.records import error_at, process_gone, restart_launcher, run_end, run_start


def restart_awaited(records: list[dict[str, Any]], last_update: float | None) -> str | None:
    """The status of a ``--max-restarts`` job between a worker's error and its restart: the error
    end record names the launcher that may start it again (records.restart_launcher), which still
    runs (or runs on another host: for 10 minutes after the record). Watch used to stop at it while
    the job trained on. A launcher gone without a new start record restarted nothing: None."""
    end = run_end(records)
    launcher = restart_launcher(end) if end is not None else None
    if end is None or launcher is None:
        return None
    here = socket.gethostname()
    host = (run_start(records) or {}).get("host", here)
    if (process_gone(*launcher) if host == here  # elsewhere: 10 minutes without a restart
            else time.time() - (last_update or 0.0) > 600):
        return None
    where = f"(process {launcher[0]}) is still running" if host == here else f"runs on {host}"
    return f"waiting for a restart ({error_at(end)}; --max-restarts: its launcher {where})"


def gone_before_first_record(folder: Path) -> str | None:
    """A run killed at start-up, before its first record: the run folder's lock names the
    process that took it ("PID HOST", written once it holds the lock), and that process is gone
    (watch waited for the first record for ever)."""
    from bertgpu.fsutil import RUN_LOCK

    try:
        pid_text, host = (folder / RUN_LOCK).read_text(encoding="utf-8").split()[:2]
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if host != socket.gethostname() or pid <= 0 or not process_gone(pid, None):
        return None
    return f"stopped (process {pid} is gone before its first record: killed or crashed)"
