"""Two "machines" of one `bertgpu pretrain` job, each its own command as torchrun's workers on
two nodes are (RANK, WORLD_SIZE, MASTER_ADDR/PORT set, one process per node), run without
torchrun, with a short distributed.timeout_minutes: what a rank says when the other differs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _e2e import ROOT, args
from test_distributed import free_port

TIMEOUT_MINUTES = "0.5"  # how long a rank waits for one that never comes


def two_nodes(per_rank: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """`bertgpu ARGS` as rank 0 and rank 1 of a two-node job (one process per node)."""
    port = free_port()
    procs = []
    for rank, argv in enumerate(per_rank):
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
               "PYTHONWARNINGS": "ignore", "RANK": str(rank), "WORLD_SIZE": "2",
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("BERTGPU_FAULTS", None)
        procs.append(subprocess.Popen([sys.executable, "-m", "bertgpu", *argv], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=150)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def node(data: Path, out: Path, *extra: str) -> list[str]:
    """One node's `bertgpu pretrain` of the tiny model (_e2e.args), on CPU."""
    return args(data, out, "--distributed.timeout_minutes", TIMEOUT_MINUTES,
                "--impl.device", "cpu", "--impl.num_workers", "0", *extra)


def last_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else ""
