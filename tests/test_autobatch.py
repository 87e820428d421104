"""autobatch: the micro batch search against a simulated memory limit, the global-batch
arithmetic of "auto", what counts as out of memory, the probe's precision and optimizer, and
rank agreement (two gloo processes, one failing probe)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.train.autobatch import (
    agree_on_micro_batch,
    attempt,
    estimate_train_bytes,
    find_micro_batch,
    find_pretrain_micro_batch,
    is_out_of_memory,
    pretrain_step_fn,
    probe_model,
    resolve_auto_batch,
    search_largest,
)
from bertgpu.train.optim import build_optimizer


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
    # the optimizer stepped
    assert not torch.equal(before, model.cls.predictions.transform.dense.weight)
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


# --------------------------------------------------------------------------------------------
# Out-of-memory classification, the run's precision and optimizer, rank agreement


@pytest.mark.parametrize("exc, oom", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
     True),
    (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
    (RuntimeError("CUDA error: out of memory"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"), False),
    (ValueError("out of memory"), False),
])
def test_out_of_memory_includes_cublas_and_cudnn_allocation_failures(exc, oom):
    assert is_out_of_memory(exc) is oom


def test_a_cublas_allocation_failure_counts_as_not_fitting():
    def step(b: int) -> None:
        if b > 5:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                               "`cublasCreate(handle)`")

    assert find_micro_batch(fits=lambda b: attempt(step, b), start=1, max_batch=64) == 5
    with pytest.raises(RuntimeError, match="shapes"):  # a real bug is not mistaken for "too big"
        attempt(lambda b: (_ for _ in ()).throw(RuntimeError("shapes cannot be multiplied")), 1)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_probe_step_uses_the_runs_precision_and_optimizer(dtype):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=32))
    opt = build_optimizer(model, "lamb", 1e-3)
    seen: list[torch.dtype] = []
    hook = model.cls.predictions.decoder.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    pretrain_step_fn(model, opt, seq_len=8, device="cpu", dtype=dtype)(2)
    hook.remove()
    # under the run's autocast
    assert seen == [torch.bfloat16 if dtype == "bf16" else torch.float16]
    # LAMB stepped (fp16: scaler)
    assert all("exp_avg_sq" in opt.state[p] for p in model.parameters())
    # LAMB's temporaries are counted where the size is estimated instead of probed
    cfg = BertConfig()
    assert estimate_train_bytes(cfg, 8, 128, optimizer="lamb") > estimate_train_bytes(cfg, 8, 128)


def test_probe_model_follows_the_architecture():
    import dataclasses

    from bertgpu.models.modernbert.config import ModernBertConfig

    bert = probe_model(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32),
                       with_nsp=True, grad_ckpt=True)
    assert (type(bert).__name__ == "BertForPreTraining" and bert.with_nsp
            and bert.options.gradient_checkpointing)
    ids = {f.name for f in dataclasses.fields(ModernBertConfig) if f.name.endswith("_token_id")}
    modern = ModernBertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=64,
                              **{k: i for i, k in enumerate(sorted(ids))})
    model = probe_model(modern, with_nsp=False, grad_ckpt=False)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    pretrain_step_fn(model, torch.optim.AdamW(model.parameters()), seq_len=8, device="cpu",
                     dtype="bf16", with_nsp=False)(2)  # the probe's step runs on it


def test_agreement_without_a_process_group():
    assert agree_on_micro_batch(12, None) == 12
    with pytest.raises(BertgpuError, match="automatic micro batch size: nothing fits"):
        agree_on_micro_batch(0, "nothing fits")


def _agree_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import os

    from bertgpu.train import distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    distributed.init_distributed("cpu")
    try:
        cfg = BertConfig()
        results = []
        # Both fit: the smaller answer wins everywhere.
        # as on the CPU
        limit = estimate_train_bytes(cfg, 16 if rank == 0 else 8, 128, flash_attention=False)
        results.append(find_pretrain_micro_batch(cfg, 128, "cpu", dtype="fp32",
                                                 memory_limit_bytes=limit))
        # Rank 1's probe fails (nothing fits its limit): every rank stops with the same message,
        # none is left waiting in a collective.
        try:
            find_pretrain_micro_batch(cfg, 128, "cpu", dtype="fp32",
                                      memory_limit_bytes=limit if rank == 0 else 1)
            results.append("no error")
        except BertgpuError as e:
            results.append(str(e))
        distributed.barrier()
        (Path(out_dir) / f"rank{rank}.txt").write_text("\n".join(map(str, results)))
    finally:
        distributed.destroy()


@pytest.mark.timeout(120)
def test_ranks_agree_even_when_one_probe_fails(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_agree_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    out = [(tmp_path / f"rank{r}.txt").read_text().splitlines() for r in range(2)]
    assert out[0] == out[1]
    assert out[0][0] == "8"
    assert out[0][1].startswith("automatic micro batch size: the probe failed on rank 1: ")
    assert "even a micro batch of 1" in out[0][1]


@pytest.mark.parametrize("setting, default", [
    ({"grad_ckpt": True}, {"grad_ckpt": False}),
    ({"dtype_bytes": 2}, {"dtype_bytes": 4}),
    ({"optimizer": "lamb"}, {"optimizer": "adamw"}),
])
def test_cpu_estimate_search_passes_precision_checkpointing_and_optimizer(setting, default):
    """The CPU branch of find_micro_batch (config=, no fits, no CUDA) must hand its grad_ckpt,
    dtype_bytes and optimizer to estimate_train_bytes; catches any of them being replaced by the
    default (False / 4 / "adamw") in that call."""
    cfg = BertConfig()  # BERT-base: plain arithmetic, no model is built
    seq = 128
    limit = estimate_train_bytes(cfg, 48, seq, flash_attention=False, **setting)

    def answer(kwargs):
        return search_largest(
            lambda b: estimate_train_bytes(cfg, b, seq, flash_attention=False, **kwargs) <= limit,
            start=8, max_batch=4096)

    expected, other = answer(setting), answer(default)
    assert expected == 48
    assert other != expected  # the setting changes the answer, so the test means something
    found = find_micro_batch(config=cfg, seq_len=seq, device="cpu", memory_limit_bytes=limit,
                             **setting)
    assert found == expected
    assert find_micro_batch(config=cfg, seq_len=seq, device="cpu", memory_limit_bytes=limit,
                            **default) == other
