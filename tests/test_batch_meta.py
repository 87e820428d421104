"""Host-side batch metadata (models/attention.py) against a plain-Python reference, and the model
given it against the model computing it itself (the Hugging Face-style call), on random and
adversarial batches: all padding but one token, no masked token, every token masked, length 1,
left padding, an all-padding row, no padding at all."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY, unpad_index

from bertgpu.batch import IGNORE_INDEX, BatchMeta, batch_meta
from bertgpu.models.attention import nested_attention, unpadded_padded_attention
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)


def reference_meta(mask: list[list[int]], labels: list[list[int]] | None) -> dict:
    """The layout written out with loops: which (b, t) are kept, in order, and where labels sit."""
    B, T = len(mask), len(mask[0])
    kept: list[tuple[int, int]] = []
    lengths = []
    for b in range(B):
        row = [t for t in range(T) if mask[b][t] or t == 0 or not any(mask[b])]
        kept += [(b, t) for t in row]
        lengths.append(len(row))
    # The unpadded layout is there whether or not anything is padded (the identity then), so an
    # unpadded model runs one graph for both kinds of batch.
    out = {"padded": any(0 in r for r in mask)}
    out["index"] = [b * T + t for b, t in kept]
    out["cu_seqlens"] = [sum(lengths[:b]) for b in range(B + 1)]
    out["max_len"] = max(lengths)
    out["packed_ok"] = all(r[0] == 1 for r in mask)
    if labels is not None:
        out["masked"] = [b * T + t for b in range(B) for t in range(T)
                         if labels[b][t] != IGNORE_INDEX]
        out["masked_rows"] = [i for i, (b, t) in enumerate(kept)
                              if labels[b][t] != IGNORE_INDEX]
    return out


def check_against_reference(mask: torch.Tensor, labels: torch.Tensor | None) -> BatchMeta:
    meta = batch_meta(mask, labels)
    ref = reference_meta(mask.tolist(), None if labels is None else labels.tolist())
    assert meta.padded == ref["padded"]
    for key in ("index", "cu_seqlens", "masked", "masked_rows"):
        got = getattr(meta, key)
        assert (got.tolist() if got is not None else None) == ref.get(key), key
    if ref["padded"]:
        assert meta.max_len == ref["max_len"] and meta.packed_ok == ref["packed_ok"]
    return meta


def adversarial_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(attention_mask, labels) pairs a collator could produce, and worse."""
    out = []
    one = torch.zeros(3, 6, dtype=torch.long)
    one[1, 0] = 1  # all padding but one token
    out.append((one, torch.full((3, 6), IGNORE_INDEX).index_put_(
        (torch.tensor([1]), torch.tensor([0])), torch.tensor([7]))))
    full = torch.ones(2, 5, dtype=torch.long)  # no padding
    out.append((full, torch.full((2, 5), IGNORE_INDEX)))  # no masked token
    every = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # all masked
    out.append((every, torch.where(every.bool(), torch.tensor(9), torch.tensor(IGNORE_INDEX))))
    # length 1
    out.append((torch.ones(4, 1, dtype=torch.long), torch.tensor([[5], [IGNORE_INDEX], [6], [7]])))
    # left padding, empty row
    left = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    out.append((left, torch.where(left.bool(), torch.tensor(8), torch.tensor(IGNORE_INDEX))))
    return out


def test_meta_matches_the_reference_on_random_batches():
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        B = int(torch.randint(1, 6, (1,), generator=g))
        T = int(torch.randint(1, 12, (1,), generator=g))
        mask = (torch.rand(B, T, generator=g) < 0.7).long()  # holes anywhere, left padding too
        if torch.rand(1, generator=g) < 0.5:  # right padding, as the loaders make it
            lengths = torch.randint(0, T + 1, (B,), generator=g)
            mask = (torch.arange(T)[None] < lengths[:, None]).long()
        labels = torch.where((torch.rand(B, T, generator=g) < 0.3) & mask.bool(),
                             torch.randint(5, 99, (B, T), generator=g), torch.tensor(IGNORE_INDEX))
        check_against_reference(mask, labels)
        check_against_reference(mask, None)


@pytest.mark.parametrize("case", range(5))
def test_meta_matches_the_reference_on_adversarial_batches(case):
    mask, labels = adversarial_batches()[case]
    check_against_reference(mask, labels)


def test_meta_without_a_mask_and_moving_it():
    meta = batch_meta(None, None, shape=(2, 7))
    assert not meta.padded and meta.max_len == 7 and meta.index is None
    with pytest.raises(ValueError):
        batch_meta(None)
    meta = batch_meta(torch.tensor([[1, 1, 0]]), torch.tensor([[5, -100, -100]]))
    assert meta.to("cpu") is meta  # already there: no copy
    if torch.cuda.is_available():
        pinned = meta.pin_memory()
        assert pinned.index.is_pinned() and pinned.masked.is_pinned()
    # the padded layout the unpadding machinery builds from it
    un = unpad_index(torch.tensor([[1, 1, 0]]))
    assert un.index.tolist() == [0, 1] and un.first_rows().tolist() == [0]


def _tiny_batch(mask: torch.Tensor, labels: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, T = mask.shape
    ids = torch.randint(5, 99, (B, T), generator=g) * mask
    return dict(input_ids=ids, attention_mask=mask,
                token_type_ids=(torch.arange(T)[None] >= T // 2).long() * mask, labels=labels,
                next_sentence_label=torch.randint(0, 2, (B,), generator=g))


def _loss_and_grads(model, **kw):
    model.zero_grad(set_to_none=True)
    out = model(**kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("unpad", [False, True])
@pytest.mark.parametrize("case", range(5))
def test_pretraining_with_meta_equals_the_hf_style_call(case, unpad):
    mask, labels = adversarial_batches()[case]
    if case == 1:
        labels[0, 2] = 11  # a loss needs one label
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**{**TINY, "max_position_embeddings": 16})).train()
    batch = _tiny_batch(mask, labels)
    ref, ref_grads = _loss_and_grads(model, **batch)  # the model computes its own metadata
    model.configure(unpad=unpad)
    got, grads = _loss_and_grads(model, **batch, batch_meta=batch_meta(mask, labels))
    for key in ("loss", "mlm_loss_sum", "nsp_loss_sum"):
        torch.testing.assert_close(got[key], ref[key], atol=1e-5, rtol=1e-4)
    for key in ("mlm_count", "mlm_correct", "nsp_count"):
        assert int(got[key]) == int(ref[key]), key
    assert int(got.mlm_count) == int((labels != IGNORE_INDEX).sum())
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_meta_made_without_labels_still_serves_the_mlm_head():
    mask, labels = adversarial_batches()[4]
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).train()
    batch = _tiny_batch(mask, labels)
    ref = model(**batch).loss
    for unpad in (False, True):
        model.configure(unpad=unpad)
        torch.testing.assert_close(model(**batch, batch_meta=batch_meta(mask)).loss, ref,
                                   atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("unpad", [False, True])
def test_task_heads_with_meta_equal_the_hf_style_call(unpad):
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    batch = _tiny_batch(mask, torch.full_like(mask, IGNORE_INDEX))
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    meta = batch_meta(mask)
    cfg = BertConfig(**TINY)
    torch.manual_seed(0)
    cases = [
        (BertForSequenceClassification(cfg, num_labels=3), dict(labels=torch.tensor([0, 2, 1]))),
        (BertForQuestionAnswering(cfg), dict(start_positions=torch.tensor([1, 2, 0]),
                                              end_positions=torch.tensor([3, 2, 4]))),
        (BertForTokenClassification(cfg, num_labels=4),
         dict(labels=torch.where(mask.bool(), torch.arange(6).remainder(4)[None],
                                 torch.tensor(IGNORE_INDEX)))),
    ]
    for model, labels in cases:
        model.train()
        ref, ref_grads = _loss_and_grads(model, **inputs, **labels)
        model.configure(unpad=unpad)
        got, grads = _loss_and_grads(model, **inputs, **labels, batch_meta=meta)
        torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-4)
        assert int(got["count"]) == int(ref["count"])
        for name in grads:
            torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_nested_kernel_equals_the_padded_one_on_cpu():
    """The nested-tensor kernel (math backend on the CPU; flash on CUDA bf16 in test_gpu.py)
    against the exact masked fallback: same attention and gradients."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    un = unpad_index(mask)
    n_tok = int(mask.sum())
    q, k, v = (torch.randn(n_tok, 2, 4, requires_grad=True) for _ in range(3))
    w = torch.randn(n_tok, 8)
    grads = []
    for fn in (nested_attention, unpadded_padded_attention):
        for t in (q, k, v):
            t.grad = None
        y = fn(q, k, v, un)
        (y * w).sum().backward()
        grads.append((y.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_loader_batches_carry_their_meta(tmp_path):
    from _shards import write_synthetic_shards

    from bertgpu.data.loaders import PretrainLoader
    from bertgpu.data.masking import MaskingConfig
    from bertgpu.data.shards import ShardSet

    data = write_synthetic_shards(tmp_path / "data", n_train=32, seq_len=32, objective="mlm+nsp",
                                  variable_lengths=True)
    for window in (0, 2):
        loader = PretrainLoader(ShardSet(data), MaskingConfig(), 16, 4, seed=1,
                                bucket_window=window)
        for mb in loader.next_step():
            meta = mb["batch_meta"]
            check_against_reference(mb["attention_mask"], mb["labels"])
            ref = batch_meta(mb["attention_mask"], mb["labels"])
            assert meta.padded == ref.padded and torch.equal(meta.masked, ref.masked)
            if ref.padded:
                assert (torch.equal(meta.index, ref.index)
                        and torch.equal(meta.masked_rows, ref.masked_rows))
