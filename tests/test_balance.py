"""Stragglers and load balancing: shares, the loader's split, the straggler fields, and a slowed
rank end to end (gloo, 2 processes): the log names it, and balanced training gives the same
model as equal shares."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _e2e import args, bertgpu_here, final_weights
from _shards import write_synthetic_shards

from bertgpu.data.loaders import PretrainLoader
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet
from bertgpu.errors import BertgpuError
from bertgpu.train.balance import shares_for, speeds_of, straggler_fields


def test_shares_sum_to_the_global_batch_and_follow_the_speeds():
    assert shares_for([1.0, 1.0], 8) == [4, 4]
    assert shares_for([3.0, 1.0], 8) == [6, 2]
    assert (shares_for([1.0, 2.0, 1.0], 10) == [3, 5, 2]
            or shares_for([1.0, 2.0, 1.0], 10) == [2, 5, 3])
    assert shares_for([100.0, 1.0], 8) == [7, 1]  # every rank keeps at least one sequence
    assert shares_for([0.0, 0.0], 6) == [3, 3] and shares_for([float("nan"), 1.0], 4) == [1, 3]
    rng = np.random.default_rng(0)
    for _ in range(200):
        world = int(rng.integers(1, 9))
        g = int(rng.integers(world, 300))
        speeds = list(rng.uniform(0.1, 10.0, world))
        shares = shares_for(speeds, g)
        assert sum(shares) == g and min(shares) >= 1
        ideal = np.array(speeds) / sum(speeds) * g
        assert np.all(np.abs(np.array(shares) - ideal) <= 1.0 + 1e-9)
        assert shares == shares_for(speeds, g)  # deterministic: every rank agrees
    with pytest.raises(BertgpuError, match="cannot give"):
        shares_for([1.0, 1.0, 1.0], 2)


def test_speeds_and_straggler_fields():
    assert speeds_of([2.0, 4.0], [8, 8]) == [4.0, 2.0]
    f = straggler_fields([1.0, 1.1, 3.0, 0.9])
    # over the median of the other ranks (1.0, 1.1, 0.9)
    assert f["slowest_rank"] == 2 and f["slowest_vs_median"] == pytest.approx(3.0 / 1.0)
    assert f["rank_compute_s"] == [1.0, 1.1, 3.0, 0.9]
    assert straggler_fields([2.0, 2.0])["slowest_vs_median"] == 1.0
    assert straggler_fields([1.0, 2.0, 3.0, 10.0])["slowest_vs_median"] == pytest.approx(5.0)


def test_two_ranks_a_straggler_8x_slower_reads_8x():
    # The probe's run: rank 1 needed 8.3 times rank 0's compute. Over the median of both ranks
    # (their mean) it read 1.78x, and no straggler could ever pass 2.0x.
    f = straggler_fields([0.184875, 1.53476])
    assert f["slowest_rank"] == 1
    assert f["slowest_vs_median"] == pytest.approx(1.53476 / 0.184875)
    assert straggler_fields([0.1, 100.0])["slowest_vs_median"] == pytest.approx(1000.0)


def test_loader_shares_partition_each_step_in_rank_order(tmp_path):
    data = write_synthetic_shards(tmp_path / "d", n_train=64, n_val=8, seq_len=16, vocab_size=50)
    shards = ShardSet(data)
    masking = MaskingConfig(mask_rate=0.15)

    def ids(rank, shares=None, steps=3):
        loader = PretrainLoader(shards, masking, 12, 2, rank=rank, world_size=2, seed=3)
        if shares:
            loader.set_shares(shares)
        out = []
        for _ in range(steps):
            out.append(torch.cat([mb["input_ids"] for mb in loader.next_step()]))
        return out

    equal = [torch.cat(pair) for pair in zip(ids(0), ids(1), strict=True)]
    uneven = [torch.cat(pair) for pair in zip(ids(0, [9, 3]), ids(1, [9, 3]), strict=True)]
    for a, b in zip(equal, uneven, strict=True):
        assert torch.equal(a, b)  # the same samples, with the same masks, in the same order
    loader = PretrainLoader(shards, masking, 12, 2, rank=0, world_size=2, seed=3)
    loader.set_shares([9, 3])
    assert (loader.accumulation_steps == 5
            and [mb["input_ids"].shape[0] for mb in loader.next_step()] == [2, 2, 2, 2, 1])
    with pytest.raises(BertgpuError, match="summing to the global batch 12"):
        loader.set_shares([5, 5])


def test_set_shares_drops_prefetched_batches_of_the_old_shares(tmp_path):
    data = write_synthetic_shards(tmp_path / "d", n_train=64, n_val=8, seq_len=16, vocab_size=50)
    shards = ShardSet(data)
    masking = MaskingConfig(mask_rate=0.15)

    def steps(rank, num_workers):
        loader = PretrainLoader(shards, masking, 16, 4, rank=rank, world_size=2, seed=3,
                                num_workers=num_workers)
        out = [loader.next_step()]
        loader.set_shares([12, 4])
        out += [loader.next_step() for _ in range(2)]
        loader.close()
        return out

    for rank in (0, 1):
        single, workers = steps(rank, 0), steps(rank, 1)
        assert [len(s) for s in workers] == [len(s) for s in single] == [2] + [3 - 2 * rank] * 2
        for a, b in zip(single, workers, strict=True):
            for ma, mb in zip(a, b, strict=True):
                for k in ("input_ids", "labels", "attention_mask"):
                    assert torch.equal(ma[k], mb[k]), (rank, k)


def _train_records(run: Path) -> list[dict]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "train"]


@pytest.mark.timeout(400)
def test_a_slowed_rank_is_named_and_balancing_keeps_the_model(tmp_path):
    data = write_synthetic_shards(tmp_path / "d", n_train=96, n_val=16, seq_len=32, vocab_size=100)
    common = ["--nproc", "2", "--train.max_steps", "10", "--train.log_every_steps", "2",
              "--model.hidden_dropout_prob", "0", "--model.attention_probs_dropout_prob", "0",
              "--checkpoint.every_steps", "0"]
    # rank 1 spends 25 ms more per sequence (a slower device): 200 ms a logged window, well past
    # what a busy 2-core CI machine adds to either rank at random (4 ms was not: CI saw a window
    # where rank 0 was the slower)
    slow = "slow_rank=1:0.025"
    equal_run, balanced_run = tmp_path / "equal", tmp_path / "balanced"
    done = bertgpu_here(args(data, equal_run, *common), faults=slow)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = _train_records(equal_run)
    assert all(r["slowest_rank"] == 1 and r["slowest_vs_median"] > 1.2 for r in recs[1:]), recs
    assert all(len(r["rank_compute_s"]) == 2 for r in recs)

    done = bertgpu_here(args(data, balanced_run, *common, "--distributed.balance", "auto",
                             "--distributed.balance_every_steps", "3"), faults=slow)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "batch shares per rank" in done.stdout
    state = torch.load(sorted((balanced_run / "checkpoints").iterdir())[-1] / "train_state.pt",
                       weights_only=True)
    shares = state["shares"]
    assert sum(shares) == 8 and shares[0] > shares[1]  # the fast rank takes more
    a, b = final_weights(equal_run), final_weights(balanced_run)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)

    # A balanced run resumed at world size 1 measures nothing and goes on with the same samples.
    more = bertgpu_here(args(data, balanced_run, "--train.max_steps", "12",
                             "--model.hidden_dropout_prob", "0",
                             "--model.attention_probs_dropout_prob", "0",
                             "--checkpoint.every_steps", "0"))
    assert more.returncode == 0, more.stderr[-3000:]
    assert "resumed from" in more.stdout and _train_records(balanced_run)[-1]["step"] == 12


def _array_split_sizes(global_batch: int, world: int) -> list[int]:
    """numpy's split of G items into W near-equal parts (the first G % W one larger): the
    independent reference for equal speeds."""
    return [len(part) for part in np.array_split(np.arange(global_batch), world)]


def test_equal_or_unusable_speeds_split_the_global_batch_like_numpy_array_split():
    """Equal speeds, or speeds that say nothing (all zero, NaN, inf: the all-unusable case is
    `_spread`'s), with a remainder: the shares sum to G, differ by at most one, and the larger
    ones go to the lower ranks, as numpy.array_split's sizes."""
    cases = [(g, w) for w in range(2, 9) for g in range(w, 4 * w + 3) if g % w]
    assert len(cases) > 90
    for g, w in cases:
        expected = _array_split_sizes(g, w)
        for speeds in ([1.0] * w, [2.5] * w, [0.0] * w, [float("nan")] * w,
                       [float("inf")] * w, [-1.0] * w):
            shares = shares_for(speeds, g)
            assert sum(shares) == g, (g, w, speeds, shares)
            assert max(shares) - min(shares) <= 1, (g, w, speeds, shares)
            assert shares == expected, (g, w, speeds, shares)


def test_ties_of_equal_speeds_go_to_the_lower_rank():
    """The docstring's rule: every rank computes the same answer, the extra sequences to the
    lowest ranks."""
    assert shares_for([1.0, 1.0, 1.0], 8) == [3, 3, 2]
    assert shares_for([1.0, 1.0, 1.0], 7) == [3, 2, 2]
    assert shares_for([4.0] * 4, 10) == [3, 3, 2, 2]
    assert shares_for([0.0, 0.0, 0.0], 8) == [3, 3, 2]
