"""Fast paths against the plain ones: unpadding, length bucketing, bf16, torch.compile.

Each switch must leave the math alone: same loss and gradients (to float tolerance) as the path
it replaces, on tiny configs on the CPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from _shards import write_synthetic_shards
from _tiny import unpad_index

from bertgpu.data.loaders import PretrainLoader, bucket_by_length
from bertgpu.data.masking import MaskingConfig
from bertgpu.data.shards import ShardSet
from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
)
from bertgpu.models.shared import ModelOptions

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def padded_batch(seed: int = 0, lengths: tuple[int, ...] = (11, 7, 4, 9),
                 T: int = 11) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    lens = torch.tensor(lengths)
    mask = (torch.arange(T)[None, :] < lens[:, None]).long()
    ids = torch.randint(5, 99, (B, T), generator=g) * mask
    tt = ((torch.arange(T)[None, :] >= (lens[:, None] // 2)) & mask.bool()).long()
    pick = (torch.rand(B, T, generator=g) < 0.3) & mask.bool()
    pick[:, 1] = True
    labels = torch.where(pick, torch.randint(5, 99, (B, T), generator=g), torch.full((B, T), -100))
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=tt, labels=labels,
                next_sentence_label=torch.randint(0, 2, (B,), generator=g))


def loss_and_grads(model: torch.nn.Module, batch: dict,
                   **kw) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    out = model(**batch, **kw)
    out.loss.backward()
    return (out.loss.detach(),
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})


def assert_same(a: tuple, b: tuple, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=rtol)
    assert set(a[1]) == set(b[1])
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize("backend", ["padded", "nested"])
@pytest.mark.parametrize("with_nsp", [True, False])
def test_unpadded_matches_padded(backend, with_nsp):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=with_nsp).train()
    batch = padded_batch()
    if not with_nsp:
        batch.pop("next_sentence_label")
    ref = loss_and_grads(model, batch)
    model.unpad_enable(True, backend)
    out = model(**batch)
    assert out.mlm_count.item() == (batch["labels"] != -100).sum().item()
    assert_same(loss_and_grads(model, batch), ref)
    # the forward kwarg overrides the model's switch
    assert_same(loss_and_grads(model, batch, unpad=False), ref)


def test_unpadded_with_gradient_checkpointing_and_odd_masks():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).train()
    model.gradient_checkpointing_enable()
    batch = padded_batch(lengths=(11, 0, 3, 11))  # an all-padding row
    batch["attention_mask"][3, :4] = 0  # a left-padded row: its [CLS] column is padding
    batch["labels"][3, :4] = -100
    batch["labels"][1] = -100
    ref = loss_and_grads(model, batch)
    model.unpad_enable(True, "nested")  # not exact for such rows: must fall back to "padded"
    assert_same(loss_and_grads(model, batch), ref)


def test_unpad_index_layout():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    un = unpad_index(mask)
    assert un.index.tolist() == [0, 1, 2, 4, 5, 8, 9, 10, 11]  # a row of padding only is kept whole
    assert un.cu_seqlens.tolist() == [0, 3, 5, 9]
    assert un.max_len == 4 and not un.packed_ok
    un = unpad_index(torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert un.index.tolist() == [0, 1, 2, 3, 4]  # column 0 kept for the pooler even when padding
    assert not un.packed_ok


def test_unpadded_heads_and_eval_outputs_match():
    torch.manual_seed(0)
    batch = padded_batch()
    mask = batch["attention_mask"].bool()
    for model in (BertForSequenceClassification(BertConfig(**TINY), num_labels=3).eval(),
                  BertForQuestionAnswering(BertConfig(**TINY)).eval()):
        plain = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        model.unpad_enable(True)
        fast = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        for key in plain:
            a, b = plain[key], fast[key]
            if a.dim() == 2 and a.shape == mask.shape:  # QA logits: only real positions are defined
                a, b = a[mask], b[mask]
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    # Without labels the full (B, T, V) logits come from the padded path, unchanged.
    model = BertForPreTraining(BertConfig(**TINY), options=ModelOptions(unpad=True)).eval()
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert out.prediction_logits.shape == (4, 11, 99)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_qa_head_trains_unpadded_with_the_padded_loss_and_gradients(arch, monkeypatch):
    """SQuAD is the longest-padded fine-tuning set: its head must take the unpadded encoder when
    the model unpads (it once forced the padded one), with the padded path's loss and gradients
    (the span loss leaves the padding out)."""
    from _tiny_modern import TINY_MODERN

    from bertgpu.models.bert.model import BertModel
    from bertgpu.models.modernbert.config import ModernBertConfig
    from bertgpu.models.modernbert.model import ModernBertForQuestionAnswering, ModernBertModel

    torch.manual_seed(0)
    batch = padded_batch(lengths=(11, 7, 1, 9))
    if arch == "bert":
        model, encoder = BertForQuestionAnswering(BertConfig(**TINY)), BertModel
    else:
        model = ModernBertForQuestionAnswering(ModernBertConfig(**TINY_MODERN))
        encoder = ModernBertModel
        batch.pop("token_type_ids")
    batch.pop("labels"), batch.pop("next_sentence_label")
    batch["start_positions"] = torch.tensor([3, 2, 0, 30])  # 30: past the row (ignored)
    batch["end_positions"] = torch.tensor([5, 6, 0, 30])
    model.train()
    ref = loss_and_grads(model, batch)
    unpadded = []
    encode = encoder.encode

    def spy(self, *args, **kw):
        x, un = encode(self, *args, **kw)
        unpadded.append(un is not None)
        return x, un

    monkeypatch.setattr(encoder, "encode", spy)
    model.unpad_enable(True, "padded")
    assert_same(loss_and_grads(model, batch), ref)
    assert unpadded == [True]


def test_unpad_backend_errors():
    model = BertForPreTraining(BertConfig(**TINY))
    with pytest.raises(BertgpuError, match="unpad backend"):
        model.unpad_enable(True, "flash3")
    ref = loss_and_grads(model, padded_batch())
    model.unpad_enable(True, "varlen")
    # CPU fp32: no fused varlen kernel; said plainly (a warning, never a raw flash error) and the
    # exact padded kernel runs instead
    with pytest.warns(RuntimeWarning, match="'varlen' needs CUDA fp16/bf16"):
        got = loss_and_grads(model, padded_batch())
    assert_same(got, ref)


def test_options_belong_to_the_instance():
    # A class-wide switch once leaked from one test's model into the next: options are per
    # instance, and `configure` hands them to every submodule that reads them.
    model = BertForPreTraining(BertConfig(**TINY))
    other = BertForPreTraining(BertConfig(**TINY), options=ModelOptions(unpad=True))
    model.configure(gradient_checkpointing=True)
    assert all(m.options.gradient_checkpointing for m in model.modules() if hasattr(m, "options"))
    assert other.options.unpad and not other.options.gradient_checkpointing
    assert not model.options.unpad
    assert not BertForPreTraining(BertConfig(**TINY)).options.gradient_checkpointing


def test_bf16_autocast_close_to_fp32():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).train()
    batch = padded_batch()
    fp32 = model(**batch).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    assert out.mlm_loss_sum.dtype == torch.float32  # the cross-entropy runs in fp32
    # bf16 has ~3 significant digits
    torch.testing.assert_close(out.loss, fp32, atol=0.05, rtol=0.02)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # the unpadded path under autocast agrees too
    model.unpad_enable(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(model(**batch).loss, fp32, atol=0.05, rtol=0.02)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("BERTGPU_SLOW"),
                    reason="CPU inductor compile takes ~1 min; set BERTGPU_SLOW=1")
def test_compiled_matches_eager():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY)).train()
    batch = padded_batch()
    eager = loss_and_grads(model, batch)
    compiled = torch.compile(model)
    out = compiled(**batch)
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    got = (out.loss.detach(),
           {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert_same(got, eager, atol=1e-4, rtol=1e-3)


# --------------------------------------------------------------------------------------------
# Length bucketing (data.py)


def test_bucketed_steps_same_samples_and_same_step_loss(tmp_path):
    data = write_synthetic_shards(tmp_path / "data", n_train=64, seq_len=32, objective="mlm+nsp",
                                  variable_lengths=True)
    shards = ShardSet(data)
    lengths = np.concatenate([a["lengths"] for a in shards._open()])
    assert lengths.min() < 32  # the fixture has padding to remove
    kw = dict(global_batch_size=16, micro_batch_size=4, seed=3)
    plain = PretrainLoader(shards, MaskingConfig(), **kw)
    bucketed = PretrainLoader(shards, MaskingConfig(), bucket_window=4, **kw)
    torch.manual_seed(0)
    cfg = BertConfig(**{**TINY, "vocab_size": shards.vocab_size, "max_position_embeddings": 32})
    model = BertForPreTraining(cfg).train()

    def step_loss(mbs: list[dict]) -> torch.Tensor:
        # the engine's normalisation: summed losses over the step / the step's counts
        n_mlm = sum(int((mb["labels"] != -100).sum()) for mb in mbs)
        n_nsp = sum(int(mb["input_ids"].shape[0]) for mb in mbs)
        total = torch.zeros(())
        for mb in mbs:
            out = model(**mb)
            total = total + out.mlm_loss_sum / n_mlm + out.nsp_loss_sum / n_nsp
        return total

    def rows(mbs: list[dict]) -> set[tuple]:
        return {tuple(r[r != 0].tolist()) + tuple(lab[lab != -100].tolist())
                for mb in mbs for r, lab in zip(mb["input_ids"], mb["labels"], strict=True)}

    for _ in range(2):
        a, b = plain.next_step(), bucketed.next_step()
        assert [mb["input_ids"].shape[0] for mb in b] == [4] * 4
        assert rows(a) == rows(b)  # same samples with the same masks
        widths = [mb["input_ids"].shape[1] for mb in b]
        assert widths == sorted(widths, reverse=True) and sum(widths) < 4 * 32  # less padding
        torch.testing.assert_close(step_loss(b), step_loss(a), atol=1e-5, rtol=1e-5)
    assert plain.state_dict() == bucketed.state_dict()  # the global order is untouched
    with pytest.raises(BertgpuError, match="bucket_window"):
        PretrainLoader(shards, MaskingConfig(), bucket_window=-1, **kw)


def test_bucket_by_length_windows_do_not_mix():
    mbs = []
    for lens in ([2, 5], [7, 3], [1, 4]):
        m = (torch.arange(8)[None, :] < torch.tensor(lens)[:, None]).long()
        mbs.append(dict(input_ids=m * 9, attention_mask=m, labels=torch.full((2, 8), -100)))
    out = bucket_by_length(mbs, window=2, round_width=False)
    got = [mb["attention_mask"].sum(1).tolist() for mb in out]
    assert got == [[7, 5], [3, 2], [4, 1]]  # first window sorted, last window alone
    assert [mb["input_ids"].shape[1] for mb in out] == [7, 3, 4]
    # by default widths are rounded to a few sizes (bounded recompiles), never above T
    assert [mb["input_ids"].shape[1] for mb in bucket_by_length(mbs, window=2)] == [8, 8, 8]


def test_bucket_widths_are_few_and_cover_the_longest():
    from bertgpu.data.loaders import bucket_width

    for T in (8, 100, 128, 512):
        widths = {bucket_width(L, T) for L in range(1, T + 1)}
        assert all(bucket_width(L, T) >= L for L in range(1, T + 1)) and max(widths) == T
        assert len(widths) <= 8 + T // 64
    assert [bucket_width(L, 512) for L in (1, 9, 64, 65, 129, 500)] == [8, 16, 64, 128, 192, 512]
