"""The flash-attention paths of models/flash.py on a GPU (`pytest -m gpu`; skipped elsewhere).

Each kernel path against an independent reference: the kernel itself against attention written
out in float64 (windows included); padded rows through `Segments`, unpadded rows through the
varlen kernel, BERT and ModernBERT (local layers with a window), against the padded model with
SDPA and explicit masks (backend "padded"); attention dropout against its expectation; and a
compiled model over full and padded batches making one graph (inductor, as training runs it).

    pytest -m gpu tests/test_gpu_flash.py
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertgpu.batch import batch_meta
from bertgpu.models.attention import Segments, padded_layout
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.flash import flash_varlen, segments
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.models.shared import ModelOptions

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda", 0)
BF16 = dict(atol=2e-2, rtol=2e-2)
BERT = dict(vocab_size=512, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=256, max_position_embeddings=128, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)
MODERN = dict(vocab_size=512, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
              intermediate_size=256, max_position_embeddings=128, local_attention=16,
              global_attn_every_n_layers=3, pad_token_id=0)


def reference(q, k, v, cu, window=None):
    """Attention within each sequence of `cu`, written out in float64."""
    out = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if b == a:
            continue
        qq, kk, vv = (t[a:b].transpose(0, 1).double() for t in (q, k, v))  # (N, L, D)
        s = qq @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if window is not None:
            i = torch.arange(b - a, device=q.device)
            s = s.masked_fill((i[:, None] - i[None, :]).abs() > window, float("-inf"))
        out.append((s.softmax(-1) @ vv).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("window", [None, 7])
def test_kernel_equals_float64_attention(window):
    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = torch.tensor([50, 1, 64, 0, 23])  # a length-1 and an empty sequence too
    cu = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32).to(CUDA)
    q, k, v = (torch.randn(int(lengths.sum()), 4, 32, device=CUDA, generator=g,
                           dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = flash_varlen(q, k, v, cu, 64, window=window)
    ref = reference(q, k, v, cu.cpu(), window)
    assert ((out.double() - ref).norm() / ref.norm()) < 1e-2
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    want = torch.autograd.grad(reference(*leaves, cu.cpu(), window), leaves, grad.double())
    for a, b in zip(got, want, strict=True):
        assert ((a.double() - b).norm() / b.norm()) < 2e-2


def test_attention_dropout_is_unbiased_and_seeded():
    g = torch.Generator(device="cuda").manual_seed(1)
    cu = torch.tensor([0, 40, 100], dtype=torch.int32, device=CUDA)
    q, k, v = (torch.randn(100, 2, 32, device=CUDA, generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    clean = flash_varlen(q, k, v, cu, 64).float()
    torch.manual_seed(3)
    first = flash_varlen(q, k, v, cu, 64, dropout_p=0.3)
    torch.manual_seed(3)
    assert torch.equal(first, flash_varlen(q, k, v, cu, 64, dropout_p=0.3))  # replayable
    assert not torch.equal(first.float(), clean)
    mean = torch.stack([flash_varlen(q, k, v, cu, 64, dropout_p=0.3).float()
                        for _ in range(400)]).mean(0)
    assert (mean - clean).norm() / clean.norm() < 0.05  # E[dropout(P) / (1 - p)] V = P V


def _batch(lengths, T=64, vocab=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(lengths)
    mask = (torch.arange(T)[None] < lens[:, None]).long()
    ids = torch.randint(5, vocab, (len(lengths), T), generator=g) * mask
    pick = (torch.rand(len(lengths), T, generator=g) < 0.2) & mask.bool()
    pick[:, 1] = True
    labels = torch.where(pick, ids, torch.tensor(-100))
    b = dict(input_ids=ids, attention_mask=mask, labels=labels)
    b["batch_meta"] = batch_meta(mask, labels)
    return {k: v.to(CUDA) for k, v in b.items()}


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    return loss.float(), {n: p.grad.float() for n, p in model.named_parameters()
                          if p.grad is not None}


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
@pytest.mark.parametrize("unpad", [False, True])
def test_flash_layouts_match_sdpa_with_masks(arch, unpad):
    torch.manual_seed(0)
    options = ModelOptions(attention_backend="padded")
    model = (BertForPreTraining(BertConfig(**BERT), with_nsp=False, options=options)
             if arch == "bert" else ModernBertForMaskedLM(ModernBertConfig(**MODERN),
                                                          options=options))
    model = model.to(CUDA).train()
    batch = _batch((64, 37, 50, 9))
    ref = _loss_and_grads(model, batch)
    model.configure(unpad=unpad, attention_backend="auto")
    got = _loss_and_grads(model, batch)
    torch.testing.assert_close(got[0], ref[0], **BF16)
    for name, grad in ref[1].items():
        torch.testing.assert_close(got[1][name], grad, msg=name, **BF16)
    with torch.autocast("cuda", dtype=torch.bfloat16):  # the flash layout was the one used
        layout = padded_layout(batch["attention_mask"], batch["batch_meta"], "auto", CUDA,
                               torch.float32, (4, 64), 32)
    assert isinstance(layout, Segments)
    assert layout.cu_seqlens.tolist() == segments(batch["attention_mask"], 4, 64, CUDA).tolist()
    assert layout.cu_seqlens.tolist() == [0, 64, 64, 101, 128, 178, 192, 201, 256]


@pytest.mark.parametrize("unpad", [False, True])
def test_compiled_flash_model_makes_one_graph(unpad):
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    cfg = dict(MODERN, attention_dropout=0.1)
    model = ModernBertForMaskedLM(ModernBertConfig(**cfg),
                                  options=ModelOptions(unpad=unpad)).to(CUDA).train()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model)
    for i, lengths in enumerate([(64,) * 4, (64, 37, 50, 9), (64,) * 4, (12, 64, 64, 64)]):
        batch = _batch(lengths, seed=i)
        batch["batch_meta"] = batch["batch_meta"].to(CUDA)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = compiled(**batch).loss
        loss.backward()
        assert torch.isfinite(loss)
    assert counters["stats"]["unique_graphs"] == 1
