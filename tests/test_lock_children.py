"""A lock dies with the process that took it, not with its forked children.

A flock lasts until the last descriptor of it closes, and a forked child (a DataLoader worker)
holds copies. A pretraining run killed by SIGKILL (an OOM kill, a scheduler) left its workers
running for the seconds they take to notice, and the same command run again at once was
refused: "another bertgpu pretrain (pid N) is training in this run folder", N dead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bertgpu.locks import output_lock
from bertgpu.train import run_folder

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _killed_holder_with_a_live_child(code: str) -> int:
    """Run `code` (which takes a lock) in a process that forks a child, which lives on, then
    kills itself with SIGKILL while holding the lock. Returns the child's pid."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from bertgpu.locks import output_lock
        from bertgpu.train import run_folder
        with {code}:
            child = os.fork()
            if child == 0:  # a loader worker that has not noticed yet (off the pipes)
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.dup2(null, 2)
                time.sleep(60)
                os._exit(0)
            print(child, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return int(proc.stdout.split()[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("lock", ["run folder", "output"])
def test_a_killed_holders_children_do_not_keep_its_lock(tmp_path, lock):
    target = tmp_path / "run"
    code = (f"run_folder.run_folder_lock(Path({str(target)!r}))" if lock == "run folder"
            else f"output_lock(Path({str(target)!r}), 'bertgpu prepare')")
    child = _killed_holder_with_a_live_child(code)
    try:
        os.kill(child, 0)  # still alive
        if lock == "run folder":
            with run_folder.run_folder_lock(target):
                pass
        else:
            with output_lock(target, "bertgpu prepare"):
                pass
    finally:
        os.kill(child, signal.SIGKILL)
