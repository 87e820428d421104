"""Load balancing and compiled runs: a share one above a multiple of the micro batch (17 of 16)
ended in a micro batch of one row, which a compiled model compiled again for mid-run (torch
specialises sizes 0 and 1); that step's compile counted as the rank's compute, read as a straggler
400x slower, and the balancer gave the rank 1 row of 32."""

from __future__ import annotations

import torch
from _shards import write_synthetic_shards

from bertgpu.data.loaders import PretrainLoader
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet
from bertgpu.train.balance import RankTimes, rebalance
from bertgpu.train.loop_state import LogWindow


def test_a_share_one_above_the_micro_batches_makes_no_one_row_micro_batch(tmp_path):
    data = write_synthetic_shards(tmp_path / "d", n_train=96, n_val=8, seq_len=16, vocab_size=50)
    shards, masking = ShardSet(data), MaskingConfig(mask_rate=0.15)

    def step(rank: int, shares: list[int]) -> list[torch.Tensor]:
        loader = PretrainLoader(shards, masking, 24, 4, rank=rank, world_size=2, seed=3)
        loader.set_shares(shares)
        return [mb["input_ids"] for mb in loader.next_step()]

    uneven = step(0, [13, 11])
    assert [mb.shape[0] for mb in uneven] == [4, 4, 3, 2]  # was [4, 4, 4, 1]
    assert [mb.shape[0] for mb in step(1, [13, 11])] == [4, 4, 3]
    equal = step(0, [12, 12]) + step(1, [12, 12])
    # the same samples, with the same masks, in the same order
    assert torch.equal(torch.cat(uneven + step(1, [13, 11])), torch.cat(equal))


def test_a_step_that_compiled_is_no_measure_of_a_ranks_speed():
    w = LogWindow(world=1, rank=0, log_every=10)
    w.add_step(0.0, 25.0, comm_s=0.0, local_sequences=16, compiled=True)
    w.add_step(0.0, 0.1, comm_s=0.0, local_sequences=16)
    assert (w.balance_times.compute_s, w.balance_times.sequences) == (0.1, 16)
    assert (w.log_times.compute_s, w.log_times.sequences) == (0.1, 16)


def test_a_rank_that_measured_nothing_keeps_the_shares():
    class Task:
        def __init__(self):
            self.now = [16, 16]

        def shares(self):
            return self.now

        def set_shares(self, shares):
            self.now = shares

    task, said = Task(), []
    times = RankTimes(world=1, rank=0)  # (one process: gather is its own numbers)
    rebalance(task, times, 32, step=8, say=said.append)
    assert task.now == [16, 16] and said == []
