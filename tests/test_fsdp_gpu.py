"""FSDP's CUDA branches, where a GPU exists (`pytest -m gpu`; skipped elsewhere): a one-GPU
process group (NCCL) with bf16 parameters all-gathered and fp32 gradient reduction, CPU offload
(shards and optimizer state in CPU memory), and checkpoints written in the background (DCP's
async save over its own gloo group): a run resumed from its step-4 checkpoint ends where the
uninterrupted run does (within a tolerance that tells one checkpoint from the next), and close
to ddp on the same GPU.

    pytest -m gpu tests/test_fsdp_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _e2e import TINY, bertgpu, final_weights
from _shards import write_synthetic_shards

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "pretrain",
        TINY,
        "--data",
        str(data),
        "--out",
        str(out),
        "--impl.device",
        "cuda",
        "--model.vocab_size",
        "100",
        "--model.hidden_size",
        "64",
        "--model.intermediate_size",
        "128",
        "--model.num_attention_heads",
        "2",
        "--model.max_position_embeddings",
        "64",
        "--model.hidden_dropout_prob",
        "0",
        "--model.attention_probs_dropout_prob",
        "0",
        "--train.global_batch_size",
        "8",
        "--impl.micro_batch_size",
        "4",
        "--train.precision",
        "bf16",
        "--train.log_every_steps",
        "1",
        "--train.eval_every_steps",
        "0",
        "--train.eval_sequences",
        "8",
        "--schedule.decay",
        "constant",
        "--schedule.warmup_steps",
        "0",
        "--impl.num_workers",
        "0",
        "--checkpoint.every_steps",
        "4",
        "--checkpoint.keep_last",
        "0",
        # eager: what is under test is FSDP's CUDA path, not the compiler (tests/test_gpu.py
        # compiles); four compiled runs took the whole pytest stage of a GPU lease (stop 28)
        "--impl.compile",
        "false",
        *extra,
    ]


RESUME_ATOL = 1e-4
"""How far a resumed fsdp run may end from the uninterrupted one on the same GPU: the same bf16
path, so only non-deterministic kernels differ (SDPA's memory-efficient backward accumulates
with atomics), ~1e-7 relative in a gradient, which AdamW's ~lr-sized steps (lr 1e-3 here) carry
into the weights at about that size. One checkpoint interval (4 steps) moves weights by ~4e-3:
the test checks that the uninterrupted run's step-4 and step-8 weights differ by more than
10 x this, so a resume from the wrong checkpoint, or without its optimizer state, fails."""


def _checkpoint(run: Path, step: int) -> dict[str, torch.Tensor]:
    """The fp32 weights of a run's (sharded) checkpoint, gathered whole."""
    from bertgpu.models.hf_io import read_state_dict

    return read_state_dict(run / "checkpoints" / f"step_{step}")


@pytest.mark.timeout(300)
def test_bf16_offload_and_async_checkpoints_on_one_gpu(tmp_path):
    data = write_synthetic_shards(tmp_path / "d", n_train=64, n_val=8, seq_len=32, vocab_size=100)
    ddp, whole, resumed = tmp_path / "ddp", tmp_path / "fsdp", tmp_path / "resumed"
    sharded = (
        "--distributed.strategy",
        "fsdp",
        "--distributed.cpu_offload",
        "true",
        "--checkpoint.async_save",
        "true",
    )
    done = bertgpu(args(data, ddp, "--train.max_steps", "8"))
    assert done.returncode == 0, done.stderr[-3000:]
    done = bertgpu(args(data, whole, "--train.max_steps", "8", *sharded))  # uninterrupted
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bf16 all-gather, fp32 reduce, CPU offload" in done.stdout
    done = bertgpu(args(data, resumed, "--train.max_steps", "4", *sharded))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (resumed / "checkpoints" / "step_4" / ".metadata").is_file()
    done = bertgpu(args(data, resumed, "--train.max_steps", "8", *sharded))
    assert done.returncode == 0 and "resumed from" in done.stdout, done.stderr[-3000:]
    assert "step_4" in done.stdout
    ref, got, wrong = _checkpoint(whole, 8), _checkpoint(resumed, 8), _checkpoint(whole, 4)
    assert ref.keys() == got.keys() == wrong.keys()
    gap = max(float((ref[k] - wrong[k]).abs().max()) for k in ref)
    assert gap > 10 * RESUME_ATOL, gap  # the tolerance tells one checkpoint from the next
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=RESUME_ATOL, msg=k)
    # Against ddp on the same GPU (autocast instead of bf16 parameters in the forward): close,
    # not equal; the weights the export holds.
    a, b = final_weights(ddp), final_weights(whole)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=5e-2, atol=5e-3, msg=k)


def test_offloaded_engine_step_reports_the_norm_on_the_gpu(monkeypatch):
    from _tiny import TINY as TINY_BERT

    from bertgpu.config.sections import DistributedSection, ImplSection, OptimSection, TrainSection
    from bertgpu.models.build import build_model
    from bertgpu.train import distributed
    from bertgpu.train.engine import build_engine

    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    info = distributed.init_distributed("cuda", strategy="fsdp")  # a group of one, NCCL
    try:
        torch.manual_seed(0)
        model = build_model(
            {**TINY_BERT, "architecture": "bert"}, "pretraining", with_nsp=False
        ).cuda()
        engine, _ = build_engine(
            model,
            info,
            lr=1e-3,
            train=TrainSection(precision="bf16"),
            optim=OptimSection(),
            impl=ImplSection(device="cuda"),
            dist=DistributedSection(strategy="fsdp", cpu_offload=True),
        )
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, TINY_BERT["vocab_size"], (4, 12), generator=g)
        labels = torch.where(torch.rand(4, 12, generator=g) < 0.3, ids, -100)
        labels[:, 1] = ids[:, 1]
        batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
        res = engine.train_step(
            [batch],
            lambda m, b: {"mlm": m(**b).mlm_loss_sum},
            lambda b: {"mlm": int((b["labels"] != -100).sum())},
        )
        assert not res.skipped and res.grad_norm == res.grad_norm
        # offloaded: every fp32 master shard and AdamW's state in CPU memory
        shards = {(p.to_local().device.type, p.to_local().dtype) for p in model.parameters()}
        assert shards == {("cpu", torch.float32)}
        state = {(v.device.type, v.dtype) for st in engine.optimizer.state.values()
                 for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0}
        assert state == {("cpu", torch.float32)}
    finally:
        distributed.destroy()
