"""Every CUDA branch, where a GPU exists (`pytest -m gpu`; skipped elsewhere).

Each test compares a GPU path with a plain one on the same inputs: the fused attention kernels
with the padded kernel, fused AdamW with foreach AdamW, DDP (one-process NCCL group, each comm
hook) with the bare model, compiled with eager; fp16's loss scaler skips an overflowing step and
backs off; the micro batch search survives a real out-of-memory; and steady-state training
micro-steps, and whole engine steps, make no host sync (`torch.cuda.set_sync_debug_mode("error")`).

    pytest -m gpu tests/test_gpu.py
"""

from __future__ import annotations

import socket
import warnings

import pytest
import torch
from _tiny import TINY, tiny_batch
from _toy import ToyPretrain, count_fn, loss_fn, make_batch

from bertgpu.batch import batch_meta
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
)
from bertgpu.models.shared import ModelOptions
from bertgpu.train.optim import build_optimizer, param_groups

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda", 0)
BF16 = dict(atol=2e-2, rtol=2e-2)  # bf16 keeps ~3 significant digits
# A GPU-sized tiny BERT: head size 32 (flash kernels want a multiple of 8), no dropout so paths
# compare.
GPU_TINY = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=256, max_position_embeddings=128, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)


def padded_batch(seed: int = 0, lengths: tuple[int, ...] = (64, 37, 50, 9), T: int = 64,
                 device: torch.device = CUDA, masked_capacity: int | None = None) -> dict:
    """Right-padded pretraining batch with MLM and NSP labels and its host-side metadata (its MLM
    positions padded to `masked_capacity`, as the loader does for CUDA graphs)."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    ids = torch.randint(5, GPU_TINY["vocab_size"], (len(lengths), T), generator=g) * mask
    pick = (torch.rand(len(lengths), T, generator=g) < 0.2) & mask.bool()
    pick[:, 1] = True
    labels = torch.where(pick, ids, torch.tensor(-100))
    b = dict(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids),
             labels=labels, next_sentence_label=torch.randint(0, 2, (len(lengths),), generator=g))
    b["batch_meta"] = batch_meta(mask, labels, masked_capacity=masked_capacity)
    return {k: v.to(device) for k, v in b.items()}


def loss_and_grads(model: torch.nn.Module, batch: dict, dtype: torch.dtype | None = torch.bfloat16):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = model(**batch).loss
    loss.backward()
    return (loss.detach().float(),
            {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None})


def assert_close(a, b, **tol) -> None:
    torch.testing.assert_close(a[0], b[0], **tol)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], msg=name, **tol)


# --------------------------------------------------------------------------------------------
# Attention kernels


@pytest.mark.parametrize("backend", ["nested", "varlen", "auto"])
def test_fused_unpadded_attention_matches_padded(backend):
    torch.manual_seed(0)
    # the reference: padded rows through SDPA with a mask (backend "padded")
    model = BertForPreTraining(BertConfig(**GPU_TINY),
                               options=ModelOptions(attention_backend="padded")).to(CUDA).train()
    batch = padded_batch()
    ref = loss_and_grads(model, batch)
    model.configure(unpad=True, attention_backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to the padded kernel would warn
        got = loss_and_grads(model, batch)
    assert_close(got, ref, **BF16)


def test_varlen_in_fp32_falls_back_instead_of_a_flash_error():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA).train()
    batch = padded_batch()
    ref = loss_and_grads(model, batch, dtype=None)
    model.configure(unpad=True, attention_backend="varlen")
    with pytest.warns(RuntimeWarning, match="needs CUDA fp16/bf16"):
        got = loss_and_grads(model, batch, dtype=None)
    assert_close(got, ref, atol=1e-4, rtol=1e-3)


# --------------------------------------------------------------------------------------------
# Optimizers and the fp16 scaler


def test_fused_adamw_matches_foreach():
    torch.manual_seed(0)
    a = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA)
    b = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA)
    b.load_state_dict(a.state_dict())
    fused = build_optimizer(a, "adamw", 1e-3, weight_decay=0.01)
    assert fused.defaults.get("fused") is True  # picked on CUDA
    foreach = torch.optim.AdamW(param_groups(b, 0.01), lr=1e-3, betas=(0.9, 0.999), eps=1e-6,
                                foreach=True)
    for step in range(4):
        for model, opt in ((a, fused), (b, foreach)):
            loss_and_grads(model, padded_batch(step), dtype=None)
            opt.step()
        for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5, msg=name)


def test_fp16_scaler_skips_an_overflow_and_backs_off():
    from bertgpu.train.engine import Engine

    torch.manual_seed(0)
    model = ToyPretrain().to(CUDA)
    engine = Engine(model, torch.optim.AdamW(model.parameters(), lr=1e-2), precision="fp16",
                    device=CUDA)
    scale = engine.scaler.get_scale()
    before = [p.detach().clone() for p in model.parameters()]
    poisoned = {**make_batch(4, 0), "poison": torch.tensor(1e20)}  # fp16 gradients overflow
    res = engine.train_step([poisoned], loss_fn, count_fn)
    assert res.skipped
    assert engine.scaler.get_scale() == scale * engine.scaler.get_backoff_factor()
    # no update
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    res = engine.train_step([make_batch(4, 1)], loss_fn, count_fn)
    assert not res.skipped
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))


def _engine_step_parts(optimizer: str, precision: str, device: torch.device = CUDA):
    """An engine over a tiny BERT on `device` and pinned host batches with their metadata, one
    of them non-finite (loss x inf)."""
    from bertgpu.train.engine import Engine

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**GPU_TINY)).to(device).train()
    engine = Engine(model, build_optimizer(model, optimizer, 1e-4), precision=precision,
                    device=device)
    batches = [padded_batch(i, device=torch.device("cpu")) for i in range(3)]
    batches[1]["poison"] = torch.tensor(float("inf"))
    if device.type == "cuda":
        batches = [{k: v.pin_memory() for k, v in b.items()} for b in batches]

    def loss(model, batch):
        out = model(**{k: v for k, v in batch.items() if k != "poison"})
        mlm = out.mlm_loss_sum * batch["poison"] if "poison" in batch else out.mlm_loss_sum
        return {"mlm": mlm, "nsp": out.nsp_loss_sum, "_mlm_correct": out.mlm_correct}

    def counts(batch):  # on the host, from the CPU batch, as the tasks count
        return {"mlm": int((batch["labels"] != -100).sum()),
                "nsp": int(batch["input_ids"].shape[0])}

    return engine, batches, loss, counts


@pytest.mark.parametrize(("optimizer", "precision"),
                         [("adamw", "bf16"), ("lamb", "bf16"), ("adamw", "fp16"), ("lamb", "fp16")])
def test_engine_steps_make_no_host_sync(optimizer, precision):
    """A whole engine step (forward, backward, clipping, the skip decision, the update, the fp16
    scaler) queues without a host sync, a non-finite step included: the step's numbers are read
    one step late through a pinned copy and an event. Reading them afterwards gives the skip."""
    engine, batches, loss, counts = _engine_step_parts(optimizer, precision)
    assert engine.read_late and engine.skips_on_device()
    for b in batches:  # warm-up: cuBLAS handles, the pinned buffers, the optimizer state
        engine.train_step([b], loss, counts)
    engine.read_all()
    torch.cuda.synchronize()
    results = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for b in batches:
            results.append(engine.train_step([b], loss, counts))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [r.skipped for r in results] == [False, True, False]
    assert engine.skipped_steps == 2 and engine.nonfinite_in_row == 0


# --------------------------------------------------------------------------------------------
# Automatic micro batch with a real out-of-memory


def test_autobatch_survives_a_real_out_of_memory():
    from bertgpu.train.autobatch import find_pretrain_micro_batch

    free, _ = torch.cuda.mem_get_info(CUDA)
    cfg = BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=512)
    # Cap this process at ~6 GiB so the search reaches a real OOM quickly; no limit of our own.
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, 6 * 2**30 / torch.cuda.get_device_properties(CUDA).total_memory))
    try:
        found = find_pretrain_micro_batch(cfg, seq_len=512, device=CUDA, dtype="bf16",
                                          optimizer="lamb", max_batch=1 << 16,
                                          memory_limit_bytes=1 << 62)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert 1 <= found < 1 << 16  # something failed above it: the OOM was caught, not raised
    assert torch.cuda.max_memory_allocated(CUDA) < 2**30  # the probe's peak is gone from the stats
    assert torch.cuda.mem_get_info(CUDA)[0] > free - 2**30  # and its memory is released


# --------------------------------------------------------------------------------------------
# DDP in a one-process NCCL group


@pytest.fixture(scope="module")
def nccl_group():
    import torch.distributed as dist

    from bertgpu.train.distributed import DistInfo

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(CUDA)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=CUDA)
    yield DistInfo(rank=0, world_size=1, local_rank=0, device="cuda:0", backend="nccl")
    dist.destroy_process_group()


@pytest.mark.parametrize("hook", ["none", "bf16", "fp16", "powersgd"])
def test_ddp_with_each_comm_hook_matches_the_bare_model(nccl_group, hook):
    from bertgpu.train.distributed import CommTimer, wrap_ddp

    torch.manual_seed(0)
    bare = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA)
    model = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA)
    model.load_state_dict(bare.state_dict())
    timer = CommTimer(CUDA)
    ddp = wrap_ddp(model, nccl_group, comm_hook=hook, timer=timer)
    batch = padded_batch()
    ref = loss_and_grads(bare, batch, dtype=None)
    got = loss_and_grads(ddp, batch, dtype=None)
    got = (got[0], {n.removeprefix("module."): g for n, g in got[1].items()})
    # world 1: the all-reduce is the identity, up to the hook's fp16/bf16 rounding of gradients
    tol = dict(atol=1e-6, rtol=1e-5) if hook in ("none", "powersgd") else dict(atol=1e-3, rtol=1e-2)
    assert_close(got, ref, **tol)
    assert timer._ready and all(isinstance(e, torch.cuda.Event) for e in timer._ready + timer._done)
    assert timer.pop_step() == 0.0  # this step's events are kept, read at the next step
    exposed = timer.settle()
    assert 0.0 <= exposed < 10.0 and not timer._ready  # seconds, from CUDA events


# --------------------------------------------------------------------------------------------
# torch.compile and host syncs


def test_compiled_matches_eager():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA).train()
    batch = padded_batch()
    eager = loss_and_grads(model, batch)
    # The gradients are read from `model`'s own parameters: the compiled wrapper shares them, but
    # its names carry an `_orig_mod.` prefix that would match none of the eager ones.
    compiled_loss = loss_and_grads(torch.compile(model), batch)[0]
    compiled = (compiled_loss, {n: p.grad.float().clone() for n, p in model.named_parameters()
                                if p.grad is not None})
    assert compiled[1].keys() == eager[1].keys() and eager[1]
    assert_close(compiled, eager, **BF16)


def test_cuda_graph_training_matches_the_default_compile():
    """impl.compile_mode reduce-overhead: steps of 2 micro batches through the engine (stable
    gradients: the graphs' pool is overwritten by each replay) give the losses and weights of
    the default compile mode. The batches' label counts differ; their MLM positions are padded
    to one capacity, as the loader pads them under CUDA graphs (one shape to replay)."""
    from bertgpu.train.engine import Engine

    batches = [padded_batch(i, masked_capacity=64) for i in range(4)]
    assert len({int(b["batch_meta"].masked_count) for b in batches}) > 1

    def loss(model, batch):
        out = model(**batch)
        return {"mlm": out.mlm_loss_sum, "nsp": out.nsp_loss_sum}

    def counts(batch):
        return {"mlm": int((batch["labels"] != -100).sum()), "nsp": 4}

    runs = []
    for mode in ("default", "reduce-overhead"):
        torch.manual_seed(0)
        model = BertForPreTraining(BertConfig(**GPU_TINY)).to(CUDA).train()
        engine = Engine(torch.compile(model, mode=mode), build_optimizer(model, "adamw", 1e-3),
                        precision="bf16", device=CUDA, stable_grads=mode != "default")
        losses = [engine.train_step(batches[i:i + 2], loss, counts) for i in (0, 2, 0, 2)]
        engine.read_all()
        runs.append(([r.loss for r in losses], {n: p.detach().float().clone()
                                                 for n, p in model.named_parameters()}))
    assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-3)
    for name, p in runs[0][1].items():
        torch.testing.assert_close(runs[1][1][name], p, msg=name, **BF16)


def test_cuda_graph_replays_draw_new_dropout_masks():
    """Under CUDA graphs (reduce-overhead) each replay draws new dropout masks, the hash
    dropout's seeds (the compiled default) and attention dropout in the flash kernel included: a
    graph that froze its random numbers would give the same loss for the same batch every time."""
    torch.manual_seed(0)
    cfg = BertConfig(**{**GPU_TINY, "hidden_dropout_prob": 0.1,
                        "attention_probs_dropout_prob": 0.1})
    model = BertForPreTraining(cfg, options=ModelOptions(unpad=True)).to(CUDA).train()
    compiled = torch.compile(model, mode="reduce-overhead")
    batch = padded_batch(0)
    losses = []
    for _ in range(6):  # warm-up and recording first, then replays
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            losses.append(float(compiled(**batch).loss))
    assert len(set(losses[2:])) == 4, losses


def _micro_steps(name: str):
    """(model, optimizer, batches) of one training configuration, batches pinned on the host."""
    torch.manual_seed(0)
    cfg = BertConfig(**GPU_TINY)
    mask_rows = [(64, 37, 50, 9), (61, 64, 20, 33)]
    if name.startswith("modernbert"):  # local (window 32) and global layers, MLM only
        from bertgpu.models.modernbert.config import ModernBertConfig
        from bertgpu.models.modernbert.model import ModernBertForMaskedLM

        mcfg = ModernBertConfig(vocab_size=512, hidden_size=128, num_hidden_layers=3,
                                num_attention_heads=4, intermediate_size=256,
                                max_position_embeddings=128, local_attention=32,
                                global_attn_every_n_layers=3, pad_token_id=0)
        model = ModernBertForMaskedLM(mcfg, options=ModelOptions(unpad="unpadded" in name))
        cpu = []
        for i, lengths in enumerate(mask_rows):
            b = padded_batch(i, lengths, device=torch.device("cpu"))
            b.pop("next_sentence_label")
            cpu.append(b)
    elif name.startswith("pretraining"):
        model = BertForPreTraining(cfg, options=ModelOptions(unpad="unpadded" in name))
        cpu = [padded_batch(i, lengths, device=torch.device("cpu"))
               for i, lengths in enumerate(mask_rows)]
    else:
        unpadded = ModelOptions(unpad="unpadded" in name)  # fine-tuning's default on CUDA
        model = (BertForSequenceClassification(cfg, num_labels=3, options=unpadded)
                 if name.startswith("classification") else BertForQuestionAnswering(cfg, unpadded))
        cpu = []
        for i, lengths in enumerate(mask_rows):
            b = {k: v for k, v in padded_batch(i, lengths, device=torch.device("cpu")).items()
                 if k in ("input_ids", "attention_mask", "token_type_ids")}
            b["batch_meta"] = batch_meta(b["attention_mask"])  # the fine-tuning collator's hook
            if name.startswith("classification"):
                b["labels"] = torch.tensor([0, 2, 1, 0])
            else:
                b.update(start_positions=torch.tensor([3, 1, 40, 2]),
                         end_positions=torch.tensor([5, 4, 41, 2]))
            cpu.append(b)
    model = model.to(CUDA).train()
    opt = build_optimizer(model, "lamb" if "pretraining" in name else "adamw", 1e-4)
    return model, opt, [{k: v.pin_memory() for k, v in b.items()} for b in cpu]


@pytest.mark.parametrize("name",
                         ["pretraining padded", "pretraining unpadded", "pretraining compiled",
                          "classification", "classification unpadded", "qa", "qa unpadded",
                          "modernbert pretraining padded",
                          "modernbert pretraining unpadded"])
def test_steady_state_micro_steps_make_no_host_sync(name):
    model, opt, batches = _micro_steps(name)
    run = torch.compile(model) if name.endswith("compiled") else model

    def step(b: dict) -> None:
        batch = {k: v.to(CUDA, non_blocking=True) for k, v in b.items()}  # as the engine moves it
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = run(**batch)
        loss = (out.loss_sum if "loss_sum" in out
                else out.mlm_loss_sum + out.get("nsp_loss_sum", 0.0))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # returns a tensor: no sync
        opt.step()
        opt.zero_grad(set_to_none=True)

    for b in batches:  # warm-up: lazy initialisation (cuBLAS handles, compiles) may sync
        step(b)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for b in batches:
            step(b)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_tiny_cpu_batches_still_run_on_the_gpu():
    # The Hugging Face-style call on CUDA (no metadata: the model computes it, with syncs).
    model = BertForPreTraining(BertConfig(**TINY)).to(CUDA)
    out = model(**{k: v.to(CUDA) for k, v in tiny_batch().items()})
    assert torch.isfinite(out.loss)



def test_compiled_hash_dropout_on_cuda():
    """The hash dropout (compiled dropout's default, models/dropout.py) under Triton: its integer
    arithmetic gives the eager mask, and a compiled bf16 dropout drops at the rate asked and
    applies one mask forward and backward."""
    from bertgpu.models.dropout import dropout, hash_keep, set_compiled_dropout

    shape = torch.Size((1023, 769))
    seeds = torch.tensor([123456789, -987654321], dtype=torch.int32, device=CUDA)
    f = torch.compile(lambda s: hash_keep(shape, s, 0.1), fullgraph=True)
    assert torch.equal(f(seeds), hash_keep(shape, seeds, 0.1))
    old = set_compiled_dropout("hash")
    torch._dynamo.reset()
    try:
        g = torch.compile(lambda x: dropout(x, 0.1), fullgraph=True)
        x = torch.full((4096, 768), 2.0, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
        w = torch.randn(x.shape, device=CUDA, dtype=torch.bfloat16)
        y = g(x)
        (y * w).sum().backward()
        assert abs((y == 0).float().mean().item() - 0.1) < 0.002
        torch.testing.assert_close(x.grad, torch.where(y != 0, w / 0.9, 0.0).to(x.dtype))
    finally:
        set_compiled_dropout(old)
        torch._dynamo.reset()


@pytest.mark.parametrize("unpad", [False, True])
def test_modernbert_mean_pooling_in_bf16_on_cuda_is_the_exact_mean_rounded_once(unpad):
    """CUDA's index_add into a bf16 buffer rounds at every row (the unpadded mean of 512 rows was
    up to 20% off, emulated on the CPU): the pooling sums and counts in fp32."""
    from _tiny import unpad_index
    from _tiny_modern import TINY_MODERN

    from bertgpu.models.modernbert.config import ModernBertConfig
    from bertgpu.models.modernbert.model import ModernBertForSequenceClassification

    model = ModernBertForSequenceClassification(
        ModernBertConfig(**dict(TINY_MODERN, classifier_pooling="mean")), 3).to(CUDA)
    T, H = 512, 64
    mask = (torch.arange(T, device=CUDA)[None]
            < torch.tensor([[301], [512]], device=CUDA)).long()
    torch.manual_seed(0)
    x = (torch.randn(2, T, H, device=CUDA) + torch.empty(H, device=CUDA).uniform_(1, 3)).to(
        torch.bfloat16)
    exact = (x.double() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    un = unpad_index(mask) if unpad else None
    rows = x.reshape(2 * T, H).index_select(0, un.index) if unpad else x
    pooled = model._pool(rows, un, mask)
    assert pooled.dtype == torch.bfloat16
    # fp32 sums on the GPU add in another order than float64: at most one bf16 step apart
    ulp = torch.finfo(torch.bfloat16).eps * exact.abs()
    assert ((pooled.double() - exact).abs() <= ulp).all()
