"""`load_resume` on two gloo ranks whose run folders are not one folder: rank 1 with a stale copy
of another run at the same step (a run folder at the same path on a node's own disk) resumed from
it silently while rank 0 resumed from the shared one; rank 1 without the step stopped alone and
left rank 0 waiting in its next collective. Now every rank stops with the same line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_distributed import free_port

from bertgpu.errors import BertgpuError
from bertgpu.train import distributed
from bertgpu.train.checkpoint import load_resume, save_checkpoint


def _worker(rank: int, world: int, port: int, folders: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    with distributed.process_group("cpu", timeout_minutes=0.5) as info:
        try:
            found = load_resume(Path(folders[rank]), info)
            said = f"resumed from {found[0] if found else None}"
        except BertgpuError as exc:
            said = f"error: {exc}"
    Path(out, f"rank{rank}.txt").write_text(said, encoding="utf-8")


def _checkpoint(run: Path, step: int, value: float) -> None:
    save_checkpoint(run, step, {"w": torch.full((2,), value)}, {"step": step})


def _both(tmp_path: Path, folders: list[Path]) -> list[str]:
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(2, free_port(), [str(f) for f in folders], str(tmp_path)), nprocs=2,
             join=True)
    return [(tmp_path / f"rank{r}.txt").read_text(encoding="utf-8") for r in range(2)]


@pytest.mark.timeout(120)
def test_every_rank_stops_when_one_resumes_from_another_copy_of_the_step(tmp_path):
    shared, stale = tmp_path / "shared", tmp_path / "stale"
    _checkpoint(shared, 4, 1.0)
    _checkpoint(stale, 4, 2.0)  # another run's step_4 at the same path on node 1's disk
    said = _both(tmp_path, [shared, stale])
    expected = ("error: rank 1 resumes from another step_4 than rank 0 (its checksums.json "
                "differs); --out must be one folder every node sees (on a shared filesystem), "
                "not a folder of the same name on each machine")
    assert said == [expected, expected]


@pytest.mark.timeout(120)
def test_every_rank_stops_when_one_cannot_see_the_step(tmp_path):
    shared, empty = tmp_path / "shared", tmp_path / "empty"
    _checkpoint(shared, 4, 1.0)
    said = _both(tmp_path, [shared, empty])
    expected = (f"error: rank 1 cannot open the checkpoint rank 0 resumes from "
                f"({empty / 'checkpoints' / 'step_4'} is not there); --out must be one folder "
                "every node sees (on a shared filesystem), not a folder of the same name on each "
                "machine")
    assert said == [expected, expected]


@pytest.mark.timeout(120)
def test_one_shared_folder_resumes_on_every_rank(tmp_path):
    shared = tmp_path / "shared"
    _checkpoint(shared, 4, 1.0)
    step = shared / "checkpoints" / "step_4"
    assert _both(tmp_path, [shared, shared]) == [f"resumed from {step}"] * 2


@pytest.mark.timeout(120)
def test_every_rank_stops_when_rank_0_finds_every_checkpoint_damaged(tmp_path):
    # rank 0 alone refused the run folder; the others waited for its step until the timeout
    shared = tmp_path / "shared"
    _checkpoint(shared, 4, 1.0)
    weights = shared / "checkpoints" / "step_4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])  # cut short: its checksum fails
    own, other = _both(tmp_path, [shared, shared])
    assert own.startswith("error: ") and "step_4" in own, own
    assert other == "error: rank 0 cannot resume: " + own.removeprefix("error: ")
