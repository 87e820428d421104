"""A rank whose start-up failed waits, under a multi-process launch, for its peers to read its
line (train/startup_gate.py). A probe: that wait ignored Ctrl-C and SIGTERM for up to
distributed.timeout_minutes (it waits in C++, and was not under setup_signals' stop_ends_setup
as a healthy rank's is), an error from cli.py's own branch then ended in a KeyboardInterrupt
traceback, and an error from pretrain's start-up was said only after the wait, so the user saw
nothing while it waited. Here: rank 0 of two, rank 1 never comes."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_distributed import free_port

ROOT = Path(__file__).resolve().parents[1]


def _rank_0_alone(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    env.pop("BERTGPU_FAULTS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "bertgpu", "pretrain", str(ROOT / "configs" / "tiny.toml"),
         "--data", str(tmp_path / "nonexistent"), "--out", str(tmp_path / "run"),
         "--impl.device", "cpu", "--distributed.timeout_minutes", "1", *extra],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)


def _stderr_until(proc: subprocess.Popen, text: str, limit_s: float) -> str:
    """What `proc` wrote to stderr until a line holding `text` (or `limit_s` passed)."""
    seen = b""
    sel = selectors.DefaultSelector()
    sel.register(proc.stderr, selectors.EVENT_READ)
    deadline = time.monotonic() + limit_s
    while text.encode() not in seen and time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            chunk = os.read(proc.stderr.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
    return seen.decode()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("extra", "error"), [
    ((), "bertgpu pretrain: error: "),  # raised in pretrain's start-up (its --data)
    (("--max-restarts", "-1"), "bertgpu pretrain: error: --max-restarts -1"),  # in cli.py's
], ids=["pretrain-start-up", "cli"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_ends_a_failed_ranks_wait_at_once(tmp_path, extra, error, sig):
    proc = _rank_0_alone(tmp_path, *extra)
    try:
        said = _stderr_until(proc, error, 45)
        assert error in said, said[-3000:]  # its own line first, then the wait
        time.sleep(1.0)  # well inside the wait (a minute)
        assert proc.poll() is None, said[-3000:]
        sent = time.monotonic()
        proc.send_signal(sig)
        rest = proc.communicate(timeout=30)[1].decode()
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    what = "interrupted" if sig == signal.SIGINT else "stopped"
    assert proc.returncode == 128 + sig, (said + rest)[-3000:]
    assert took < 10, took
    assert rest.strip().splitlines() == [f"bertgpu pretrain: {sig.name}: {what} during "
                                         "distributed set-up"], (said + rest)[-3000:]
    assert "Traceback" not in said + rest
