"""modernbert.py and rope.py against transformers' ModernBert classes (the independent reference)
and against direct, hand-written versions of RoPE and the sliding-window mask (tiny, CPU, fp32)."""

from __future__ import annotations

import dataclasses
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from _tiny import hf_grads, perturb, tiny_batch  # noqa: E402
from _tiny_modern import TINY_MODERN, TINY_MODERN_BIASED

from bertgpu.batch import IGNORE_INDEX, batch_meta
from bertgpu.errors import BertgpuError
from bertgpu.models.layout import hf_state_dict, load_hf_state_dict
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.model import (
    ModernBertForMaskedLM,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
    attention_masks,
)
from bertgpu.models.modernbert.rope import apply_rope, cos_sin, sliding_window_mask
from bertgpu.models.shared import ModelOptions

transformers = pytest.importorskip("transformers")

CONFIGS = {"plain": TINY_MODERN, "biased": TINY_MODERN_BIASED}


def hf_pair(ours_cls, hf_cls, attn="sdpa", cfg=TINY_MODERN, hf_kw=None, **kw):
    """A random transformers model and ours with its exact weights (keys must match 1:1 in
    Hugging Face's layout: models/layout.py)."""
    torch.manual_seed(0)
    hf = perturb(hf_cls(transformers.ModernBertConfig(**cfg, attn_implementation=attn,
                                                      **(hf_kw or {})))).eval()
    ours = ours_cls(ModernBertConfig(**cfg), **kw).eval()
    hf_sd = hf.state_dict()
    assert set(hf_state_dict(ours)) == set(hf_sd)
    load_hf_state_dict(ours, hf_sd)
    return ours, hf


def inputs(b):
    return {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}


def assert_grads_match(ours, hf):
    for name, grad in hf_grads(ours).items():
        torch.testing.assert_close(grad, hf.get_parameter(name).grad, atol=1e-5,
                                   rtol=1e-4, msg=name)


# --- parity with transformers, every head --------------------------------------------------------


@pytest.mark.parametrize("variant", ["plain", "biased"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_masked_lm_matches_transformers(attn, variant):
    ours, hf = hf_pair(ModernBertForMaskedLM, transformers.ModernBertForMaskedLM, attn,
                       CONFIGS[variant])
    assert ours.decoder.weight is ours.model.embeddings.tok_embeddings.weight
    b = tiny_batch()
    real = b["attention_mask"].bool()
    # Full logits without labels (padding positions are garbage in both: compared at tokens)
    o = ours(**inputs(b)).prediction_logits
    r = hf(**inputs(b)).logits
    torch.testing.assert_close(o[real], r[real], atol=1e-5, rtol=1e-4)
    assert torch.isfinite(o).all()

    # Loss, sparse logits, counts and every gradient with labels
    o = ours(**inputs(b), token_type_ids=b["token_type_ids"], labels=b["labels"])
    r = hf(**inputs(b), labels=b["labels"])
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    keep = b["labels"] != -100
    torch.testing.assert_close(o.prediction_logits, r.logits[keep], atol=1e-5, rtol=1e-4)
    assert o.mlm_count.item() == keep.sum().item()
    assert o.mlm_correct.item() == (r.logits[keep].argmax(-1) == b["labels"][keep]).sum().item()
    torch.testing.assert_close(o.mlm_loss_sum / o.mlm_count, o.loss)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


def test_masked_lm_without_padding_mask():
    ours, hf = hf_pair(ModernBertForMaskedLM, transformers.ModernBertForMaskedLM)
    ids = tiny_batch()["input_ids"][:1]  # the full-length row: nothing padded
    torch.testing.assert_close(ours(ids).prediction_logits, hf(input_ids=ids).logits,
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours(ids, torch.ones_like(ids)).prediction_logits,
                               hf(input_ids=ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("num_labels", [3, 1])
def test_classification_matches_transformers(pooling, num_labels):
    cfg = dict(TINY_MODERN_BIASED if pooling == "mean" else TINY_MODERN, classifier_pooling=pooling)
    ours, hf = hf_pair(ModernBertForSequenceClassification,
                       transformers.ModernBertForSequenceClassification, cfg=cfg,
                       num_labels=num_labels, hf_kw={"num_labels": num_labels})
    b = tiny_batch(2)
    labels = torch.tensor([0.5, -1.0, 2.0]) if num_labels == 1 else torch.tensor([2, 0, 1])
    o, r = ours(**inputs(b), labels=labels), hf(**inputs(b), labels=labels)
    torch.testing.assert_close(o.logits, r.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.loss_sum / o.count, o.loss)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_qa_matches_transformers(attn):
    ours, hf = hf_pair(ModernBertForQuestionAnswering, transformers.ModernBertForQuestionAnswering,
                       attn, TINY_MODERN_BIASED)
    b = tiny_batch(3)
    real = b["attention_mask"].bool()
    o, r = ours(**inputs(b)), hf(**inputs(b))
    torch.testing.assert_close(o.start_logits[real], r.start_logits[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.end_logits[real], r.end_logits[real], atol=1e-5, rtol=1e-4)
    # The span loss is a softmax over every column, padding included, and a padding query with no
    # token in its window is garbage that even transformers' eager and SDPA paths disagree on:
    # the loss is compared on full-length rows (the logits above cover the padded ones).
    b = tiny_batch(3, T=7)
    b["attention_mask"][:] = 1
    # the last pair lies outside the window (clamped to T and ignored, as transformers)
    pos = dict(start_positions=torch.tensor([3, 0, 40]), end_positions=torch.tensor([5, 0, 40]))
    o, r = ours(**inputs(b), **pos), hf(**inputs(b), **pos)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    assert o.count.item() == 2
    torch.testing.assert_close(o.loss_sum / o.count, o.loss)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


def test_token_classification_matches_transformers():
    ours, hf = hf_pair(ModernBertForTokenClassification,
                       transformers.ModernBertForTokenClassification, num_labels=5,
                       hf_kw={"num_labels": 5})
    b = tiny_batch(4)
    real = b["attention_mask"].bool()
    labels = torch.where(real, torch.randint(0, 5, real.shape,
                                             generator=torch.Generator().manual_seed(1)),
                         torch.full(real.shape, -100))
    o, r = ours(**inputs(b), labels=labels), hf(**inputs(b), labels=labels)
    torch.testing.assert_close(o.logits[real], r.logits[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    assert o.count.item() == real.sum().item()
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


def test_gradient_checkpointing_gives_the_same_gradients():
    b = tiny_batch()
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN))
        model.gradient_checkpointing_enable(ckpt)
        model(**inputs(b), labels=b["labels"]).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, c in zip(*grads, strict=True):
        torch.testing.assert_close(a, c, atol=0, rtol=0)


# --- the sliding window ---------------------------------------------------------------------------


def test_sliding_window_mask_against_a_hand_built_mask():
    # local_attention 4: each token sees two neighbours on each side and itself
    expected = torch.tensor([
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 1, 1],
        [0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(sliding_window_mask(6, 4), expected)
    # odd widths round down, as transformers
    assert torch.equal(sliding_window_mask(6, 5), expected)
    assert sliding_window_mask(6, 128).all()


def test_attention_masks_with_padding():
    # lengths 6, 3 and an all-padding row, T = 6, window +-1
    am = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0], [0] * 6])
    masks = attention_masks(am, 6, 2, torch.device("cpu"))
    full, local = masks["full_attention"], masks["sliding_attention"]
    assert full.shape == (3, 1, 1, 6) and local.shape == (3, 1, 6, 6)
    for b in range(3):
        for i in range(6):
            for j in range(6):
                real_i, real_j = bool(am[b, i]), bool(am[b, j])
                if real_i:  # a token sees exactly the tokens within the window
                    assert bool(local[b, 0, i, j]) == (real_j and abs(i - j) <= 1), (b, i, j)
                    assert bool(full[b, 0, 0, j]) == real_j
    assert local.any(-1).all()  # no query without keys (NaN in some kernels)
    assert full[2].all()  # a row of padding only attends to all of it, as bert.py
    nothing_padded = attention_masks(None, 6, 2, torch.device("cpu"))
    assert nothing_padded["full_attention"] is None
    assert torch.equal(nothing_padded["sliding_attention"][0, 0], sliding_window_mask(6, 2))
    short = attention_masks(None, 3, 4, torch.device("cpu"))  # the window covers the sequence
    assert short["sliding_attention"] is None


def test_local_layers_see_only_their_window():
    """Two local layers of width 4 (two tokens a side): token 0 depends on tokens 0..4 only."""
    cfg = ModernBertConfig(**dict(TINY_MODERN, num_hidden_layers=2,
                                  layer_types=["sliding_attention"] * 2))
    torch.manual_seed(0)
    model = perturb(ModernBertModel(cfg)).eval()
    ids = torch.randint(5, 99, (1, 11))
    changed = ids.clone()
    changed[0, 5:] = torch.randint(5, 99, (6,))
    a, c = model(ids).last_hidden_state, model(changed).last_hidden_state
    torch.testing.assert_close(a[0, 0], c[0, 0], atol=0, rtol=0)
    assert not torch.allclose(a[0, 1], c[0, 1])  # token 1 reaches token 5 in two steps
    glob = ModernBertModel(ModernBertConfig(**dict(TINY_MODERN, num_hidden_layers=2,
                                                   layer_types=["full_attention"] * 2)))
    glob.load_state_dict(model.state_dict())
    assert not torch.allclose(glob(ids).last_hidden_state[0, 0],
                              glob(changed).last_hidden_state[0, 0])


# --- RoPE -----------------------------------------------------------------------------------------


def test_rope_against_a_direct_rotation():
    """Pair (d, d + D/2) of the vector at position p turns by p * theta^(-2d/D), written out."""
    D, theta, T = 8, 100.0, 5
    x = torch.randn(2, T, 3, D, generator=torch.Generator().manual_seed(0))  # (B, T, N, D)
    cos, sin = cos_sin(torch.arange(T)[None], D, theta)
    got = apply_rope(x, cos, sin)
    want = torch.empty_like(x)
    for p in range(T):
        for d in range(D // 2):
            angle = p * theta ** (-2 * d / D)
            c, s = math.cos(angle), math.sin(angle)
            a, b = x[:, p, :, d], x[:, p, :, d + D // 2]
            want[:, p, :, d] = a * c - b * s
            want[:, p, :, d + D // 2] = a * s + b * c
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    # unpadded rows: positions (N_tok,) give the same rotation per token
    flat = apply_rope(x[0], *cos_sin(torch.arange(T), D, theta))
    torch.testing.assert_close(flat, got[0])


def test_rope_scores_depend_on_the_offset_only():
    D = 16
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(D, generator=g), torch.randn(D, generator=g)

    def score(i, j):
        qi = apply_rope(q[None, None], *cos_sin(torch.tensor([i]), D, 10_000.0))
        kj = apply_rope(k[None, None], *cos_sin(torch.tensor([j]), D, 10_000.0))
        return (qi * kj).sum()

    torch.testing.assert_close(score(3, 1), score(40, 38), atol=1e-4, rtol=1e-5)
    assert not torch.allclose(score(3, 1), score(3, 2))


def test_rope_keeps_the_dtype():
    x = torch.randn(1, 4, 2, 8).to(torch.bfloat16)
    assert apply_rope(x, *cos_sin(torch.arange(4)[None], 8, 10.0)).dtype == torch.bfloat16


# --- configuration --------------------------------------------------------------------------------


def test_config_reads_both_transformers_forms():
    # transformers 5.x writes layer_types and rope_parameters; 4.x the thetas and the period
    hf5 = transformers.ModernBertConfig(**TINY_MODERN_BIASED).to_dict()
    ours = ModernBertConfig.from_dict(hf5).validate()
    assert ours.resolved_layer_types() == hf5["layer_types"]
    assert (ours.global_rope_theta, ours.local_theta) == (1000.0, 50.0)
    legacy = {k: v for k, v in hf5.items() if k not in ("layer_types", "rope_parameters")}
    legacy.update(global_rope_theta=1000.0, local_rope_theta=None)
    old = ModernBertConfig.from_dict(legacy)
    assert old.resolved_layer_types() == hf5["layer_types"] and old.local_theta == 1000.0
    # and what we write builds the same model in transformers
    back = transformers.ModernBertConfig(**ours.to_dict())
    assert back.layer_types == hf5["layer_types"]
    assert back.rope_parameters["sliding_attention"]["rope_theta"] == 50.0


@pytest.mark.parametrize(("change", "field"), [
    (dict(num_attention_heads=3), "hidden_size"),
    (dict(hidden_size=36, num_attention_heads=4), "hidden_size"),  # head size 9 is odd
    (dict(classifier_pooling="max"), "classifier_pooling"),
    (dict(hidden_activation="swiglu"), "hidden_activation"),
    (dict(layer_types=["full_attention"] * 3), "layer_types"),
    (dict(layer_types=["global"] * 4), "layer_types"),
    (dict(pad_token_id=99), "pad_token_id"),
    (dict(local_attention=0), "local_attention"),
    (dict(mlp_dropout=1.0), "mlp_dropout"),
])
def test_config_errors_name_the_field(change, field):
    with pytest.raises(BertgpuError, match=f"config field {field}"):
        ModernBertConfig(**dict(TINY_MODERN, **change)).validate()


def test_scaled_rope_is_refused():
    rope = {"full_attention": {"rope_type": "linear", "factor": 2.0}, "sliding_attention": {}}
    with pytest.raises(BertgpuError, match="rope_type"):
        ModernBertConfig.from_dict(dict(TINY_MODERN, rope_parameters=rope))


def test_initialisation_follows_transformers():
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN))
    cut = 2.0 * 0.02  # truncated at initializer_cutoff_factor standard deviations
    assert model.model.layers[1].attn.Wqkv.weight.abs().max() <= cut
    # residual outputs are scaled down
    out_cut = cut / math.sqrt(2 * TINY_MODERN["num_hidden_layers"])
    assert model.model.layers[1].mlp.Wo.weight.abs().max() <= out_cut
    assert isinstance(model.model.layers[0].attn_norm, torch.nn.Identity)
    assert model.model.final_norm.bias is None and model.decoder.bias.abs().max() == 0
    assert not model.with_nsp


def test_pretraining_loop_call_works_and_nsp_labels_are_refused():
    """The training loop calls every pretraining model with BertForPreTraining's keywords."""
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN))
    b = tiny_batch()
    out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"], labels=b["labels"], next_sentence_label=None)
    assert {"loss", "mlm_loss_sum", "mlm_count", "mlm_correct", "prediction_logits"} <= set(out)
    with pytest.raises(BertgpuError, match="no next-sentence head"):
        model(**b)


# --- batch metadata, unpadding, no host syncs -----------------------------------------------------


def layouts() -> dict[str, torch.Tensor]:
    """Attention masks of T = 11 (window +-2): right padding,
    left padding with an empty row, none."""
    right = tiny_batch()["attention_mask"]
    left = right.flip(1).clone()
    left[2] = 0
    return {"right": right, "left+empty": left, "none": torch.ones(3, 11, dtype=torch.long)}


def modern_batch(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 99, mask.shape, generator=g) * mask
    labels = torch.where((torch.rand(mask.shape, generator=g) < 0.4) & mask.bool(), ids,
                         torch.tensor(IGNORE_INDEX))
    labels[0, 0] = 7  # a loss needs one label
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def loss_and_grads(model, **kw):
    model.zero_grad(set_to_none=True)
    out = model(**kw)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("unpad", [False, True])
@pytest.mark.parametrize("layout", ["right", "left+empty", "none"])
def test_masked_lm_with_meta_and_unpadding_equals_the_plain_call(layout, unpad):
    torch.manual_seed(0)
    model = perturb(ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN_BIASED))).train()
    batch = modern_batch(layouts()[layout])
    ref, ref_grads = loss_and_grads(model, **batch)  # the model computes its own metadata
    # the exact kernel: no warning on the CPU
    model.configure(unpad=unpad, attention_backend="padded")
    got, grads = loss_and_grads(model, **batch,
                                batch_meta=batch_meta(batch["attention_mask"], batch["labels"]))
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-4)
    assert int(got.mlm_count) == int((batch["labels"] != IGNORE_INDEX).sum()) == int(ref.mlm_count)
    assert int(got.mlm_correct) == int(ref.mlm_correct)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_unpadded_masked_lm_with_meta_made_without_labels():
    """A collator may build the metadata before the labels exist:
    the labelled rows are found then."""
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN)).train()
    batch = modern_batch(layouts()["right"])
    ref = model(**batch).loss
    model.configure(unpad=True, attention_backend="padded")
    got = model(**batch, batch_meta=batch_meta(batch["attention_mask"])).loss
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("unpad", [False, True])
def test_task_heads_with_meta_and_unpadding_equal_the_plain_call(unpad):
    mask = layouts()["right"]
    ids = modern_batch(mask)["input_ids"]
    meta = batch_meta(mask)
    token_labels = torch.where(mask.bool(), torch.arange(11).remainder(4)[None],
                               torch.tensor(IGNORE_INDEX))
    cases = [
        (ModernBertForSequenceClassification(ModernBertConfig(**TINY_MODERN), 3),
         dict(labels=torch.tensor([0, 2, 1]))),
        (ModernBertForSequenceClassification(
            ModernBertConfig(**dict(TINY_MODERN, classifier_pooling="mean")), 1),
         dict(labels=torch.tensor([0.5, -1.0, 2.0]))),
        (ModernBertForQuestionAnswering(ModernBertConfig(**TINY_MODERN)),
         dict(start_positions=torch.tensor([1, 2, 0]), end_positions=torch.tensor([3, 2, 30]))),
        (ModernBertForTokenClassification(ModernBertConfig(**TINY_MODERN), 4),
         dict(labels=token_labels)),
    ]
    for model, labels in cases:
        perturb(model).train()
        ref, ref_grads = loss_and_grads(model, input_ids=ids, attention_mask=mask, **labels)
        model.configure(unpad=unpad, attention_backend="padded")
        got, grads = loss_and_grads(model, input_ids=ids, attention_mask=mask, **labels,
                                    batch_meta=meta)
        torch.testing.assert_close(got.loss, ref.loss, atol=1e-5, rtol=1e-4)
        assert int(got["count"]) == int(ref["count"])
        for name in grads:
            torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("unpad", [False, True])
def test_no_host_sync_given_the_metadata(monkeypatch, unpad):
    """With the loader's BatchMeta, forward and backward never wait on the device."""
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN)).train()
    model.configure(unpad=unpad, attention_backend="padded")
    batch = modern_batch(layouts()["right"])
    meta = batch_meta(batch["attention_mask"], batch["labels"])

    def sync(*args, **kwargs):
        raise AssertionError("host sync in the model")

    for name in ("nonzero", "item", "__bool__", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, sync)
    model(**batch, batch_meta=meta).loss.backward()


def test_compiles_without_graph_breaks():
    torch._dynamo.reset()
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN)).train()
    batch = modern_batch(layouts()["right"])
    meta = batch_meta(batch["attention_mask"], batch["labels"])
    explained = torch._dynamo.explain(model)(**batch, batch_meta=meta)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()


@pytest.mark.parametrize("unpad", [False, True])
def test_compiled_step_computes_the_rope_tables_once(unpad):
    """Inductor's code for a training step (forward and backward) computes no cosine: the tables
    come from one opaque operator per forward. Written as tensor math, the angle arithmetic was
    fused into each layer's rotation of q and k and its backward (8 cosines in the generated code
    of this 4-layer model padded, 4 unpadded; on an H200 9 of ModernBERT-base's 60 ms per
    step)."""
    import re

    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN)).train()
    model.configure(unpad=unpad, attention_backend="padded")
    batch = modern_batch(layouts()["right"])
    meta = batch_meta(batch["attention_mask"], batch["labels"])
    compiled = torch.compile(model)

    def step():
        loss = compiled(**batch, batch_meta=meta).loss
        loss.backward()
        return loss

    loss, sources = run_and_get_code(step)
    torch._dynamo.reset()
    assert len(sources) >= 2  # the forward's and the backward's code
    kernels_with_cos = sum(len(re.findall(r"\bcos\(|std::cos|\.cos\(\)", src))
                           for src in sources)
    assert kernels_with_cos == 0
    ref = model(**batch, batch_meta=meta).loss
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused kernels need CUDA")
@pytest.mark.parametrize("backend", ["varlen", "nested", "auto"])
def test_fused_unpadded_kernels_match_the_padded_model_on_gpu(backend):
    """bf16 on CUDA: varlen flash attention takes the window as window_size; where nested tensors
    (no mask) are picked, local layers run the padded kernel. Same loss as the padded model with
    SDPA and (T, T) window masks (backend "padded")."""
    torch.manual_seed(0)
    cfg = ModernBertConfig(**dict(TINY_MODERN, hidden_size=64, num_attention_heads=2))
    model = perturb(ModernBertForMaskedLM(cfg, options=ModelOptions(attention_backend="padded")))
    model = model.cuda().train()
    batch = {k: v.cuda() for k, v in modern_batch(layouts()["right"]).items()}
    meta = batch_meta(batch["attention_mask"].cpu(), batch["labels"].cpu()).to("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = model(**batch, batch_meta=meta).loss
        model.configure(unpad=True, attention_backend=backend)
        got = model(**batch, batch_meta=meta).loss
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flash attention needs CUDA")
def test_windowed_varlen_equals_the_masked_kernel_on_gpu():
    from _tiny import unpad_index

    from bertgpu.models.attention import unpadded_padded_attention
    from bertgpu.models.flash import flash_varlen

    mask = layouts()["right"].cuda()
    masks = attention_masks(mask, 11, 4, mask.device)
    un = unpad_index(mask)
    local = dataclasses.replace(un, mask=masks["sliding_attention"])
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(int(mask.sum()), 2, 64, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    cu = un.cu_seqlens.to(torch.int32)
    flash = flash_varlen(q, k, v, cu, 11, window=2).flatten(1)
    torch.testing.assert_close(flash, unpadded_padded_attention(q, k, v, local),
                               atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("unpad", [False, True])
def test_mean_pooling_in_bf16_is_the_exact_mean_rounded_once(unpad):
    # The count and the sum were bf16: 257 tokens counted as 256 (0.4% off on the CPU; on CUDA
    # index_add also rounded the unpadded sum at every row, 20% off over 512 rows).
    from _tiny import unpad_index

    model = ModernBertForSequenceClassification(
        ModernBertConfig(**dict(TINY_MODERN, classifier_pooling="mean")), 3)
    T, H = 300, 64
    mask = (torch.arange(T)[None] < torch.tensor([[257], [299]])).long()  # (2, T)
    torch.manual_seed(0)
    x = (torch.randn(2, T, H) + torch.empty(H).uniform_(1, 3)).to(torch.bfloat16)
    exact = (x.double() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    un = unpad_index(mask) if unpad else None
    rows = x.reshape(2 * T, H).index_select(0, un.index) if unpad else x
    pooled = model._pool(rows, un, mask)
    assert pooled.dtype == torch.bfloat16
    assert torch.equal(pooled, exact.to(torch.bfloat16))  # summed and divided in fp32
