"""`load_resume` on two gloo ranks when rank 0 alone fails with an error that is not a
BertgpuError (an OSError or ValueError from a damaged file): it raised alone and rank 1 waited
for its step in the broadcast until the timeout. Now rank 1 stops at once with rank 0's line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from test_distributed import free_port

from bertgpu.train import checkpoint, distributed
from bertgpu.train.checkpoint import load_resume, save_checkpoint


def _worker(rank: int, world: int, port: int, run: str, out: str, raised: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    if rank == 0:  # rank 0's read of its newest checkpoint fails as a damaged file may make it
        def damaged(run_dir):
            raise {"OSError": OSError(5, "Input/output error", "step_4/model.safetensors"),
                   "ValueError": ValueError("bad safetensors header")}[raised]

        checkpoint.resume_checkpoint = damaged
    start = time.monotonic()
    with distributed.process_group("cpu", timeout_minutes=0.5) as info:
        try:
            found = load_resume(Path(run), info)
            said = f"resumed from {found[0] if found else None}"
        except Exception as exc:  # noqa: BLE001 - what each rank raised, in one line
            said = f"{type(exc).__name__}: {exc}"
    Path(out, f"rank{rank}.txt").write_text(f"{time.monotonic() - start:.1f}\n{said}",
                                            encoding="utf-8")


def _both(tmp_path: Path, raised: str) -> list[tuple[float, str]]:
    import torch.multiprocessing as mp

    run = tmp_path / "run"
    save_checkpoint(run, 4, {"w": torch.ones(2)}, {"step": 4})
    mp.spawn(_worker, args=(2, free_port(), str(run), str(tmp_path), raised), nprocs=2, join=True)
    said = [(tmp_path / f"rank{r}.txt").read_text(encoding="utf-8") for r in range(2)]
    return [(float(s.split("\n", 1)[0]), s.split("\n", 1)[1]) for s in said]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("raised,line", [
    ("OSError", "OSError: [Errno 5] Input/output error: 'step_4/model.safetensors'"),
    ("ValueError", "ValueError: bad safetensors header"),
])
def test_rank_0s_other_error_in_load_resume_stops_rank_1_at_once(tmp_path, raised, line):
    (_, own), (waited, other) = _both(tmp_path, raised)
    assert own == line  # rank 0 raises its own error as it was
    assert other == f"BertgpuError: rank 0 cannot resume: {line}"
    assert waited < 20  # not the 30 s timeout
