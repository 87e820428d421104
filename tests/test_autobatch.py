"""autobatch: the micro batch search against a simulated memory limit, and the global-batch
arithmetic of "auto"."""

from __future__ import annotations

import pytest
import torch

from bertgpu.errors import BertgpuError
from bertgpu.models.bert import BertConfig, BertForPreTraining
from bertgpu.train.autobatch import (
    estimate_train_bytes,
    find_micro_batch,
    pretrain_step_fn,
    resolve_auto_batch,
    search_largest,
)


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 8, 9, 100, 1000, 4096])
@pytest.mark.parametrize("start", [1, 8, 64])
def test_search_finds_the_largest_fitting_size_with_few_probes(limit, start):
    probes: list[int] = []

    def fits(b: int) -> bool:
        probes.append(b)
        return b <= limit

    assert search_largest(fits, start=start, max_batch=4096) == limit
    assert len(probes) <= 2 * 13 + 2  # doubling then bisection: O(log n)


def test_search_respects_max_and_reports_nothing_fits():
    assert search_largest(lambda b: True, start=8, max_batch=100) == 100
    with pytest.raises(BertgpuError, match="even a micro batch of 1"):
        search_largest(lambda b: False, start=8)


def test_find_micro_batch_with_simulated_memory_limit():
    cfg = BertConfig()  # BERT-base
    per = [estimate_train_bytes(cfg, b, 128) for b in (1, 2, 64)]
    assert per[0] < per[1] < per[2]  # more sequences, more activations
    limit = estimate_train_bytes(cfg, 48, 128, flash_attention=False)  # what the CPU search assumes
    found = find_micro_batch(config=cfg, seq_len=128, memory_limit_bytes=limit, device="cpu")
    assert found == 48
    # activation checkpointing and shorter sequences fit more
    assert find_micro_batch(config=cfg, seq_len=128, memory_limit_bytes=limit, grad_ckpt=True) > 48
    assert find_micro_batch(config=cfg, seq_len=64, memory_limit_bytes=limit) > 48
    # an explicit fits() callable wins (how a real probe is simulated)
    assert find_micro_batch(fits=lambda b: b * 3 <= 100, start=4) == 33


def test_pretrain_step_fn_runs_a_full_step():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = model.cls.predictions.transform.dense.weight.clone()
    step = pretrain_step_fn(model, opt, seq_len=8, device="cpu")
    # a simulated OOM above 4 sequences, probed with real steps below it
    assert find_micro_batch(fits=lambda b: b <= 4 and step(b) is None, start=1, max_batch=16) == 4
    assert not torch.equal(before, model.cls.predictions.transform.dense.weight)  # the optimizer stepped
    assert all(p.grad is None for p in model.parameters())  # grads freed after each probe


@pytest.mark.parametrize("global_batch, world, found, expected", [
    (256, 1, 48, (32, 8)),    # largest divisor of 256 <= 48
    (256, 1, 1000, (256, 1)),
    (256, 4, 48, (32, 2)),
    (96, 2, 40, (24, 2)),     # 48 per device: divisors 1 2 3 4 6 8 12 16 24 48
    (7, 1, 3, (1, 7)),        # a prime per-device batch: micro 1
])
def test_resolve_auto_batch_keeps_the_global_batch(global_batch, world, found, expected):
    micro, acc = resolve_auto_batch(global_batch, world, found)
    assert (micro, acc) == expected
    assert micro * acc * world == global_batch and micro <= found


def test_resolve_auto_batch_errors():
    with pytest.raises(BertgpuError, match="not divisible"):
        resolve_auto_batch(10, 3, 4)
    with pytest.raises(BertgpuError):
        resolve_auto_batch(8, 1, 0)
