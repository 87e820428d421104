"""torchrun's --max-restarts with its agent's store (TORCHELASTIC_USE_AGENT_STORE, torch >= 2.5):
the store outlives a failed attempt, and the start-up gate's keys (train/startup_gate.py) were
the same on every attempt, so the next attempt read the last one's: a healthy restart stopped
with "rank 1 stopped at start-up: boom from attempt 0", and after an all-healthy attempt a rank
that failed on the next was not heard (its peer took the old empty keys for "all started"), and
gloo, its group's keys kept too, connected to the last attempt's addresses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# attempt (TORCHELASTIC_RESTART_COUNT) and rank -> what each worker does; rank 1 comes a few
# seconds after rank 0 on attempt 1, so rank 0 reads the store before rank 1 wrote this time
_WORKER = textwrap.dedent('''
    import os, sys, time
    import torch
    import torch.distributed as dist
    from bertgpu.errors import BertgpuError
    from bertgpu.train import startup_gate

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank = int(os.environ["RANK"])
    failing = {"old error": (0, 1), "old success": (1, 1), "old group": None}[
        os.environ["SCENARIO"]]
    if attempt == 1 and rank == 1:
        time.sleep(3)
    if (attempt, rank) == failing:
        startup_gate.hand_over(f"boom from attempt {attempt}", 0.5)
        sys.exit(1)
    try:
        store = startup_gate.store_for_group(rank, 2, 0.5)
    except BertgpuError as e:
        print(f"attempt {attempt} rank {rank}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    dist.init_process_group("gloo", rank=rank, world_size=2, store=store)
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    print(f"attempt {attempt} rank {rank}: ok {t.item():g}", file=sys.stderr, flush=True)
    sys.exit(1 if attempt == 0 else 0)  # a healthy attempt 0 ends in a restart
''')


def _torchrun(tmp_path: Path, scenario: str) -> subprocess.CompletedProcess:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "SCENARIO": scenario, "PYTHONWARNINGS": "ignore"}
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE", "RANK",
                 "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", "--max-restarts", "1", str(script)],
                          env=env, capture_output=True, text=True, timeout=100)


@pytest.mark.timeout(120)
def test_a_healthy_restart_does_not_read_the_failed_attempts_error(tmp_path):
    result = _torchrun(tmp_path, "old error")
    assert "attempt 0 rank 0: rank 1 stopped at start-up: boom from attempt 0" in result.stderr
    assert "attempt 1 rank 0: ok 2" in result.stderr, result.stderr[-3000:]
    assert "attempt 1 rank 1: ok 2" in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.timeout(120)
def test_an_error_after_a_healthy_attempt_reaches_the_other_rank(tmp_path):
    result = _torchrun(tmp_path, "old success")
    assert "attempt 0 rank 0: ok 2" in result.stderr, result.stderr[-3000:]
    assert "attempt 1 rank 0: rank 1 stopped at start-up: boom from attempt 1" in result.stderr, \
        result.stderr[-3000:]
    assert "timed out" not in result.stderr and "DistStoreError" not in result.stderr


@pytest.mark.timeout(120)
def test_a_restart_after_a_healthy_attempt_makes_its_group(tmp_path):
    result = _torchrun(tmp_path, "old group")
    assert "attempt 0 rank 1: ok 2" in result.stderr, result.stderr[-3000:]
    assert "attempt 1 rank 0: ok 2" in result.stderr, result.stderr[-3000:]
    assert "attempt 1 rank 1: ok 2" in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
