"""The CPU dropout (models/dropout.py) and the written-out CPU attention with dropout
(attention.cpu_dropout_attention): torch's distribution and SDPA's math, checked against
statistics and against SDPA itself."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertgpu.models import attention
from bertgpu.models.dropout import Dropout, dropout
from bertgpu.models.modernbert.model import attention_masks


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_has_torchs_distribution(p):
    torch.manual_seed(0)
    R, C = 1000, 2000  # a 2-D input: one mask element per element, not per row or per column
    x = torch.full((R, C), 3.0, requires_grad=True)
    y = dropout(x, p)
    gone = y == 0
    dropped = gone.double().mean().item()
    # A binomial proportion: within 5 standard deviations of p.
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / x.numel())
    # Independent across rows and across columns: neighbours are both dropped with probability
    # p**2 (a mask drawn for one row or one column and broadcast gives p).
    for both in ((gone[1:] & gone[:-1]), (gone[:, 1:] & gone[:, :-1])):
        q = p * p
        assert abs(both.double().mean().item() - q) < 5 * math.sqrt(q * (1 - q) / both.numel())
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 3.0 / (1 - p)))
    assert abs(y.mean().item() - 3.0) < 0.01  # unbiased, as F.dropout
    # The gradient is the same mask and scale.
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach() / 3.0)


def test_dropout_is_seeded_by_torch_and_independent_of_threads():
    x = torch.randn(64, 128)
    threads = torch.get_num_threads()
    try:
        masks = []
        for n in (1, 2):
            torch.set_num_threads(n)
            torch.manual_seed(7)
            masks.append(dropout(x, 0.1) == 0)
        torch.manual_seed(8)
        other = dropout(x, 0.1) == 0
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(masks[0], masks[1]) and not torch.equal(masks[0], other)
    # The draws advance torch's generator, so a checkpointed RNG state replays them.
    state = torch.get_rng_state()
    a = dropout(x, 0.3)
    torch.set_rng_state(state)
    assert torch.equal(a, dropout(x, 0.3))


def test_dropout_edges_and_module():
    x = torch.randn(4, 8)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    m = Dropout(0.25)
    assert repr(m) == repr(torch.nn.Dropout(0.25)) and not m.state_dict()
    assert m.eval()(x) is x
    bf16 = dropout(x.bfloat16(), 0.5)
    assert bf16.dtype == torch.bfloat16 and set(bf16.unique().tolist()) <= {0.0} | set(
        (x.bfloat16() * 2).flatten().tolist())


@pytest.mark.parametrize("mask_kind", ["none", "padding", "window"])
def test_cpu_attention_with_dropout_is_sdpas_math(monkeypatch, mask_kind):
    """With the mask drawing nothing (dropout patched to the identity), the written-out path that
    CPU training takes equals SDPA without dropout, forward and every gradient."""
    torch.manual_seed(0)
    B, T, N, D = 3, 10, 4, 8
    q, k, v = (torch.randn(B, T, N, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    tokens = (torch.arange(T)[None, :] < torch.tensor([10, 6, 1])[:, None]).long()  # (B, T)
    # The masks the models build: BERT's padding mask, ModernBERT's local layers' window.
    mask = {"none": None, "padding": attention.sdpa_mask(tokens),
            "window": attention_masks(tokens, T, 4, q.device)["sliding_attention"]}[mask_kind]
    calls = []

    def identity(x, p, training=True):
        calls.append(p)
        return x

    monkeypatch.setattr(attention, "dropout", identity)
    got = attention.padded_attention(q, k, v, mask, dropout_p=0.1)  # routed to the CPU path
    assert calls == [0.1]
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2), attn_mask=mask)
    want = want.transpose(1, 2).reshape(B, T, N * D)
    torch.testing.assert_close(got, want)
    g = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, (q, k, v), g),
                               torch.autograd.grad(want, (q, k, v), g))


def test_cpu_attention_drops_attention_probabilities(monkeypatch, one_thread):
    """Real dropout on the probabilities: the mask is drawn for the (B, N, T, T) softmax (dropout
    on V or on the output has the same mean, not this shape), the output is the dropped
    probabilities times V, and averaged over draws it is the expectation, SDPA's output without
    dropout."""
    torch.manual_seed(0)
    B, T, N, D = 2, 6, 2, 4
    q, k, v = (torch.randn(B, T, N, D, dtype=torch.float64) for _ in range(3))
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.transpose(1, 2)).transpose(1, 2).reshape(B, T, -1)
    drawn = []

    def recorded(x, p, training=True):
        y = dropout(x, p, training)
        drawn.append((x.detach(), y.detach()))
        return y

    monkeypatch.setattr(attention, "dropout", recorded)
    one = attention.padded_attention(q, k, v, None, dropout_p=0.5)
    assert not torch.allclose(one, want)
    [(probs, dropped)] = drawn
    assert probs.shape == (B, N, T, T)
    torch.testing.assert_close(probs.sum(-1), torch.ones(B, N, T, dtype=torch.float64))
    assert ((dropped == 0) | (dropped == 2 * probs)).all() and (dropped == 0).any()
    torch.testing.assert_close(one, (dropped @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, -1))
    # 4,000 draws in one call: the batch repeated, one independent mask per copy.
    n = 4000
    many = attention.padded_attention(*(t.repeat(n, 1, 1, 1) for t in (q, k, v)), None,
                                      dropout_p=0.5)
    torch.testing.assert_close(many.view(n, B, T, -1).mean(0), want, atol=0.05, rtol=0)


# -- the compiled hash mask (dropout.hash_dropout), compiled dropout's default (issue 24) -------

@pytest.fixture
def hash_compiled():
    from bertgpu.models.dropout import set_compiled_dropout

    old = set_compiled_dropout("hash")
    torch._dynamo.reset()
    yield
    set_compiled_dropout(old)
    torch._dynamo.reset()


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_hash_dropout_has_torchs_distribution(p):
    from bertgpu.models.dropout import hash_dropout

    torch.manual_seed(0)
    x = torch.full((1000, 2000), 3.0, requires_grad=True)
    y = hash_dropout(x, p)
    gone = y == 0
    assert abs(gone.double().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / x.numel())
    for both in ((gone[1:] & gone[:-1]), (gone[:, 1:] & gone[:, :-1])):
        q = p * p
        assert abs(both.double().mean().item() - q) < 5 * math.sqrt(q * (1 - q) / both.numel())
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 3.0 / (1 - p)))
    y.sum().backward()
    torch.testing.assert_close(x.grad, y.detach() / 3.0)


def test_hash_masks_follow_torchs_generator_and_differ_between_draws():
    """Seeds come from torch's generator: a seed replays the masks, and two draws (two sites, or
    one site at two steps) are independent, also where only the second key differs."""
    from bertgpu.models.dropout import hash_dropout, hash_keep

    x, p = torch.ones(500, 400), 0.1
    torch.manual_seed(3)
    a, b = hash_dropout(x, p) == 0, hash_dropout(x, p) == 0
    torch.manual_seed(3)
    assert torch.equal(a, hash_dropout(x, p) == 0) and not torch.equal(a, b)
    q = p * p
    tol = 5 * math.sqrt(q * (1 - q) / x.numel())
    assert abs((a & b).double().mean().item() - q) < tol
    one_key = [~hash_keep(x.shape, torch.tensor([11, k], dtype=torch.int32), p) for k in (5, 6)]
    assert abs((one_key[0] & one_key[1]).double().mean().item() - q) < tol


def _dropout_residual_norm(x, residual, weight):
    from bertgpu.models.dropout import dropout

    z = dropout(x @ weight, 0.1)
    return torch.nn.functional.layer_norm(z + residual, (z.shape[-1],))


@pytest.mark.parametrize("mode", ["philox", "hash"])
def test_compiled_hash_dropout_recomputes_its_mask_in_backward(mode):
    """The point of the hash: inductor keeps no mask for backward (Philox's dropout saves one
    bool per element, which this check sees) and recomputes the same mask there."""
    from torch._inductor.utils import run_and_get_code

    from bertgpu.models.dropout import set_compiled_dropout

    old = set_compiled_dropout(mode)
    torch._dynamo.reset()
    try:
        torch.manual_seed(0)
        x = torch.randn(64, 48, requires_grad=True)
        residual, weight = torch.randn(64, 48), torch.randn(48, 48)
        f = torch.compile(_dropout_residual_norm, fullgraph=True)
        _, (forward, _) = run_and_get_code(lambda: f(x, residual, weight).sum().backward())
        saved_masks = forward.count("torch.bool)")
        assert saved_masks == (0 if mode == "hash" else 1), forward
        # Forward and backward apply one mask: for y = dropout(x) * w the gradient of sum(y) is
        # w where y kept x, 0 where it dropped it.
        g = torch.compile(lambda x: dropout(x, 0.3), fullgraph=True)
        x2 = torch.full((300, 200), 2.0, requires_grad=True)
        w = torch.randn(300, 200)
        y = g(x2)
        (y * w).sum().backward()
        dropped = (y == 0).double().mean().item()
        assert abs(dropped - 0.3) < 0.01
        torch.testing.assert_close(x2.grad, torch.where(y != 0, w / 0.7, 0.0))
    finally:
        set_compiled_dropout(old)
        torch._dynamo.reset()


def test_compiled_hash_mask_is_the_eager_one(hash_compiled):
    """Inductor's integer arithmetic (wrapping products, masked shifts) gives the eager mask."""
    from bertgpu.models.dropout import hash_keep

    seeds = torch.tensor([123456789, -987654321], dtype=torch.int32)
    f = torch.compile(lambda s: hash_keep(torch.Size((257, 129)), s, 0.1), fullgraph=True)
    assert torch.equal(f(seeds), hash_keep(torch.Size((257, 129)), seeds, 0.1))


def test_compiled_bert_trains_with_hash_dropout_in_one_graph(hash_compiled):
    from _tiny import TINY, tiny_batch

    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    torch.manual_seed(0)
    cfg = BertConfig(**{**TINY, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1})
    model = BertForPreTraining(cfg).train()
    compiled = torch.compile(model, fullgraph=True)
    batch = tiny_batch()
    losses = [compiled(**batch).loss for _ in range(2)]
    losses[0].backward()
    assert all(torch.isfinite(v) for v in losses) and losses[0].item() != losses[1].item()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("mode", ["hash", "philox"])
def test_a_compiled_bert_step_keeps_no_hash_mask_for_backward(mode):
    """In a whole compiled BERT training step, not only in one kernel: with the hash no bool mask
    is saved for backward (the check's control, Philox, saves one per dropout site). Left to its
    heuristics, the partitioner kept the hash's masks there (2 bytes per token and hidden unit
    per layer in the saved-bytes audit, as many as Philox): every site's index ramp is one node
    after CSE, used far apart, and the hash is a long fusible chain."""
    from bertgpu.bench import saved_bytes
    from bertgpu.bench.graph_check import Case, _pretraining_loss
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.dropout import set_compiled_dropout

    old = set_compiled_dropout(mode)
    try:
        torch.manual_seed(0)
        cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, vocab_size=256, max_position_embeddings=128,
                         attention_probs_dropout_prob=0.0)
        model = BertForPreTraining(cfg, with_nsp=False).train()
        batch, counts = saved_bytes._batch(2)
        found = saved_bytes.saved_tensors(
            Case("bert", model, batch, _pretraining_loss, counts),
            lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    finally:
        set_compiled_dropout(old)
    assert found["bfloat16"] > 0
    # whole masks of 2 x 128 x 64 (a few other bool bytes are the batch's own: the MLM positions)
    masks = found["bool"] // (2 * 128 * 64)
    assert masks == (0 if mode == "hash" else 5), found  # Philox: embeddings, 2 sites per layer


def test_compiled_dropout_choice_is_checked():
    from bertgpu.models.dropout import set_compiled_dropout

    with pytest.raises(ValueError, match="expected one of hash, philox"):
        set_compiled_dropout("fast")


def test_a_misspelt_compiled_dropout_switch_warns_and_runs_as_usual():
    import os
    import subprocess
    import sys

    code = "import bertgpu.models.dropout as d; print(d._compiled)"
    env = {**os.environ, "BERTGPU_COMPILED_DROPOUT": "fast"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "hash", out.stderr
    assert "BERTGPU_COMPILED_DROPOUT='fast': expected one of hash, philox" in out.stderr
