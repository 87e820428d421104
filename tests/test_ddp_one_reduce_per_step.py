"""With gradient accumulation, DDP all-reduces once per optimizer step: on the last micro batch
only, the others run under `no_sync`. All-reducing on more micro batches gives the same
gradients (the mean of sums is the sum of means), so no loss or weight comparison sees it: here
DDP's comm hook counts the bucket rounds. Two gloo processes on CPU. (A mutation probe found no
test failing when the engine synced on the last two micro batches.)"""

from __future__ import annotations

import os

import pytest
import torch
from _toy import ToyPretrain, count_fn, loss_fn, make_batch, rows
from test_distributed import free_port

from bertgpu.train import distributed
from bertgpu.train.engine import Engine

G, STEPS, ACCUMS = 8, 2, (1, 2, 3)  # G: sequences per optimizer step, over both ranks


def _micro_batches(step: int, rank: int, world: int, accum: int) -> list[dict]:
    batch = make_batch(G, 100 + step)
    per_rank = G // world
    start = rank * per_rank
    cuts = [start + per_rank * i // accum for i in range(accum + 1)]  # 4 rows into 3: 1, 1, 2
    return [rows(batch, lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]


def _rounds_per_step(info: distributed.DistInfo, accum: int) -> list[int]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    torch.manual_seed(0)
    ddp = distributed.wrap_ddp(ToyPretrain(), info)
    calls: list[int] = []

    def counting(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, counting)
    engine = Engine(ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-2))
    assert engine.ddp
    per_step = []
    for step in range(STEPS):
        before = len(calls)
        engine.train_step(_micro_batches(step, info.rank, info.world_size, accum), loss_fn,
                          count_fn)
        per_step.append(len(calls) - before)
    return per_step


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    with distributed.process_group("cpu") as info:
        found = {accum: _rounds_per_step(info, accum) for accum in ACCUMS}
        torch.save(found, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.timeout(120)
def test_ddp_reduces_one_bucket_round_per_step_whatever_the_accumulation(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    for rank in range(world):
        found = torch.load(tmp_path / f"rank{rank}.pt")
        buckets = found[1][0]  # accumulation 1: one synchronising backward per step
        assert buckets >= 1
        for accum in ACCUMS:
            assert found[accum] == [buckets] * STEPS, (rank, accum, found)
