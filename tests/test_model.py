"""model.py against transformers' BERT as the independent reference (tiny configs, CPU, fp32)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from _tiny import TINY, hf_grads, tiny_batch  # noqa: E402

from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertgpu.models.layout import hf_state_dict, load_hf_state_dict
from bertgpu.models.shared import ModelOutput, num_parameters

transformers = pytest.importorskip("transformers")

def hf_pair(ours_cls, hf_cls, attn="sdpa", **kw):
    """A random HF model and ours with its exact weights (state dict keys must match 1:1 in
    Hugging Face's layout: models/layout.py)."""
    torch.manual_seed(0)
    hf = hf_cls(transformers.BertConfig(**TINY, attn_implementation=attn,
                                        **kw.pop("hf_kw", {}))).eval()
    ours = ours_cls(BertConfig(**TINY), **kw).eval()
    hf_sd = hf.state_dict()
    assert set(hf_state_dict(ours)) == set(hf_sd)
    load_hf_state_dict(ours, hf_sd)
    return ours, hf


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_pretraining_matches_transformers(attn):
    ours, hf = hf_pair(BertForPreTraining, transformers.BertForPreTraining, attn=attn)
    b = tiny_batch()
    # Full logits without labels.
    o = ours(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    r = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
           token_type_ids=b["token_type_ids"])
    torch.testing.assert_close(o.prediction_logits, r.prediction_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.seq_relationship_logits, r.seq_relationship_logits,
                               atol=1e-5, rtol=1e-4)

    # Loss and every gradient with labels; the sparse logits are the full ones at masked positions.
    o = ours(**b)
    r = hf(**b)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    keep = b["labels"] != -100
    torch.testing.assert_close(o.prediction_logits, r.prediction_logits[keep], atol=1e-5, rtol=1e-4)
    assert o.mlm_count.item() == keep.sum().item()
    assert o.nsp_count.item() == 3
    assert (o.mlm_correct.item()
            == (r.prediction_logits[keep].argmax(-1) == b["labels"][keep]).sum().item())
    o.loss.backward()
    r.loss.backward()
    for name, grad in hf_grads(ours).items():
        torch.testing.assert_close(grad, hf.get_parameter(name).grad, atol=1e-5,
                                   rtol=1e-4, msg=name)


def test_masked_lm_matches_transformers():
    ours, hf = hf_pair(BertForPreTraining, transformers.BertForMaskedLM, with_nsp=False)
    assert ours.bert.pooler is None and ours.cls.seq_relationship is None
    b = tiny_batch(1)
    del b["next_sentence_label"]
    o, r = ours(**b), hf(**b)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.prediction_logits, r.logits[b["labels"] != -100],
                               atol=1e-5, rtol=1e-4)
    assert "seq_relationship_logits" not in o and "nsp_loss_sum" not in o


@pytest.mark.parametrize("num_labels", [3, 1])
def test_classification_matches_transformers(num_labels):
    ours, hf = hf_pair(BertForSequenceClassification, transformers.BertForSequenceClassification,
                       num_labels=num_labels, hf_kw={"num_labels": num_labels})
    b = tiny_batch(2)
    labels = torch.tensor([0.5, -1.0, 2.0]) if num_labels == 1 else torch.tensor([2, 0, 1])
    kw = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
              token_type_ids=b["token_type_ids"], labels=labels)
    o, r = ours(**kw), hf(**kw)
    torch.testing.assert_close(o.logits, r.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.loss_sum / o.count, o.loss)
    o.loss.backward()
    r.loss.backward()
    for name, grad in hf_grads(ours).items():
        torch.testing.assert_close(grad, hf.get_parameter(name).grad, atol=1e-5,
                                   rtol=1e-4, msg=name)


def test_qa_matches_transformers():
    """Logits as transformers' on a padded batch; the loss and its gradients as transformers'
    where no row is padded (its span softmax keeps padding in, ours leaves it out:
    test_qa_loss_does_not_depend_on_the_padding)."""
    ours, hf = hf_pair(BertForQuestionAnswering, transformers.BertForQuestionAnswering)
    b = tiny_batch(3)
    # the third example's answer is outside the window: HF clamps it to T and ignores it
    kw = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
              token_type_ids=b["token_type_ids"], start_positions=torch.tensor([3, 0, 40]),
              end_positions=torch.tensor([5, 0, 45]))
    o, r = ours(**kw), hf(**kw)
    torch.testing.assert_close(o.start_logits, r.start_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.end_logits, r.end_logits, atol=1e-5, rtol=1e-4)
    kw["attention_mask"] = torch.ones_like(b["attention_mask"])
    o, r = ours(**kw), hf(**kw)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    assert o.count.item() == 2
    torch.testing.assert_close(o.loss_sum / o.count, o.loss)
    o.loss.backward()
    r.loss.backward()
    for name, grad in hf_grads(ours).items():
        torch.testing.assert_close(grad, hf.get_parameter(name).grad, atol=1e-5,
                                   rtol=1e-4, msg=name)


def test_qa_loss_does_not_depend_on_the_padding():
    """A feature's span loss was over every padded position: its value depended on the width
    its micro batch was padded to, so one step trained otherwise on another number of devices
    or micro batch (SQuAD only: the other heads leave padding out)."""
    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(**TINY)).eval()
    b = tiny_batch(3)
    starts, ends = torch.tensor([3, 0, 2]), torch.tensor([5, 1, 3])
    together = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], starts, ends)
    alone = 0.0
    for i, n in enumerate(b["attention_mask"].sum(1).tolist()):  # each row, unpadded
        row = [b[k][i:i + 1, :n] for k in ("input_ids", "attention_mask", "token_type_ids")]
        alone = alone + model(*row, starts[i:i + 1], ends[i:i + 1]).loss_sum
    torch.testing.assert_close(together.loss_sum, alone, atol=1e-5, rtol=1e-5)


def test_token_classification_matches_transformers():
    ours, hf = hf_pair(BertForTokenClassification, transformers.BertForTokenClassification,
                       num_labels=5, hf_kw={"num_labels": 5})
    # HF: bert.* without pooler, classifier
    assert not any("pooler" in k for k in ours.state_dict())
    b = tiny_batch(6)
    g = torch.Generator().manual_seed(6)
    labels = torch.randint(0, 5, b["input_ids"].shape, generator=g)
    labels[b["attention_mask"] == 0] = -100  # padding and sub-word continuations carry no label
    labels[0, 3] = -100
    kw = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
              token_type_ids=b["token_type_ids"], labels=labels)
    o, r = ours(**kw), hf(**kw)
    assert o.logits.shape == (3, 11, 5)
    torch.testing.assert_close(o.logits, r.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    assert o.count.item() == (labels != -100).sum().item()
    torch.testing.assert_close(o.loss_sum / o.count, o.loss)
    o.loss.backward()
    r.loss.backward()
    for name, grad in hf_grads(ours).items():
        torch.testing.assert_close(grad, hf.get_parameter(name).grad, atol=1e-5,
                                   rtol=1e-4, msg=name)


def test_token_classification_export_loads_in_transformers(tmp_path):
    from bertgpu.models.hf_export import save_pretrained
    from bertgpu.models.hf_io import load_pretrained

    torch.manual_seed(0)
    ours = BertForTokenClassification(BertConfig(**TINY), num_labels=3,
                                      id2label={0: "O", 1: "B-PER", 2: "I-PER"})
    ours.eval()
    save_pretrained(ours, tmp_path / "ner")
    hf, info = transformers.AutoModelForTokenClassification.from_pretrained(
        tmp_path / "ner", output_loading_info=True)
    assert type(hf).__name__ == "BertForTokenClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert hf.config.id2label == {0: "O", 1: "B-PER", 2: "I-PER"}
    b = tiny_batch(7)
    inputs = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                  token_type_ids=b["token_type_ids"])
    torch.testing.assert_close(hf.eval()(**inputs).logits, ours(**inputs).logits,
                               atol=1e-5, rtol=1e-4)
    back = load_pretrained(tmp_path / "ner", head="token_classification")
    assert isinstance(back, BertForTokenClassification) and back.id2label == ours.id2label


def test_base_model_keys_and_outputs():
    ours, hf = hf_pair(BertModel, transformers.BertModel)
    b = tiny_batch(4)
    o = ours(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    r = hf(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
           token_type_ids=b["token_type_ids"])
    torch.testing.assert_close(o.last_hidden_state, r.last_hidden_state, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=1e-5, rtol=1e-4)
    # all-ones mask takes the attn_mask=None path and agrees with no mask at all
    ones = torch.ones_like(b["input_ids"])
    torch.testing.assert_close(ours(b["input_ids"], ones).last_hidden_state,
                               ours(b["input_ids"]).last_hidden_state)


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
def test_other_activations_match(act):
    torch.manual_seed(0)
    hf = transformers.BertModel(transformers.BertConfig(**TINY, hidden_act=act)).eval()
    ours = BertModel(BertConfig(**TINY, hidden_act=act)).eval()
    load_hf_state_dict(ours, hf.state_dict())
    ids = torch.randint(5, 99, (2, 9))
    torch.testing.assert_close(ours(ids).last_hidden_state, hf(input_ids=ids).last_hidden_state,
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("act", ["gelu", "gelu_new", "gelu_pytorch_tanh", "relu"])
def test_activations_match_transformers_where_they_differ(act):
    """At BERT's initializer_range (0.02) the feed-forward inputs of a tiny model stay near 0,
    where erf-GELU and its tanh approximation agree to ~1e-6, so the parity tests above cannot
    tell them apart. A wide initialisation spreads them over a few units, where the two differ
    by up to ~5e-4, and the whole pre-training model must still match transformers."""
    torch.manual_seed(0)
    wide = dict(TINY, hidden_act=act, initializer_range=0.5)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**wide)).eval()
    ours = BertForPreTraining(BertConfig(**wide)).eval()
    load_hf_state_dict(ours, hf.state_dict())
    b = tiny_batch(8)
    inputs = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                  token_type_ids=b["token_type_ids"])
    r = hf(**inputs)
    o = ours(**inputs)
    torch.testing.assert_close(o.prediction_logits, r.prediction_logits, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(o.seq_relationship_logits, r.seq_relationship_logits,
                               atol=1e-4, rtol=1e-5)
    # The check has teeth: the other GELU form moves the logits far beyond that tolerance.
    if act.startswith("gelu"):
        other = "gelu_new" if act == "gelu" else "gelu"
        hf.config.hidden_act = other
        swapped = transformers.BertForPreTraining(hf.config).eval()
        swapped.load_state_dict(hf.state_dict())
        gap = (swapped(**inputs).prediction_logits - r.prediction_logits).abs().max().item()
        assert gap > 1e-3, gap  # ten times the tolerance


def test_hf_initialisation_statistics():
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=500, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, initializer_range=0.05)
    m = BertForPreTraining(cfg)
    for name, p in m.named_parameters():
        if name.endswith("LayerNorm.weight"):
            assert torch.all(p == 1), name
        elif name.endswith("bias"):
            assert torch.all(p == 0), name
        else:
            w = p[1:] if "word_embeddings" in name else p  # row 0 is [PAD], zeroed
            assert abs(w.std().item() - 0.05) < 0.006, (name, w.std().item())
            assert abs(w.mean().item()) < 0.01, name
    assert torch.all(m.bert.embeddings.word_embeddings.weight[0] == 0)


def test_tied_weights_share_storage():
    m = BertForPreTraining(BertConfig(**TINY))
    dec, emb = m.cls.predictions.decoder, m.bert.embeddings.word_embeddings
    assert dec.weight is emb.weight and dec.weight.data_ptr() == emb.weight.data_ptr()
    assert dec.bias is m.cls.predictions.bias
    # tied parameters are counted once, as transformers does
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
    assert num_parameters(m) == hf.num_parameters()
    assert num_parameters(m, exclude_embeddings=True) == hf.num_parameters(exclude_embeddings=True)


def test_with_nsp_false_has_no_pooler():
    m = BertForPreTraining(BertConfig(**TINY), with_nsp=False)
    assert m.bert.pooler is None
    assert not any("pooler" in k or "seq_relationship" in k for k in m.state_dict())
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY))
    assert set(hf_state_dict(m)) == set(hf.state_dict())


def test_gradient_checkpointing_same_gradients():
    torch.manual_seed(0)
    cfg = BertConfig(**TINY)
    a = BertForPreTraining(cfg)
    b = BertForPreTraining(cfg)
    b.load_state_dict(a.state_dict())
    b.gradient_checkpointing_enable()
    assert b.bert.encoder.gradient_checkpointing
    batch = tiny_batch(5)
    a(**batch).loss.backward()
    b(**batch).loss.backward()
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = BertModel(BertConfig(**{**TINY, "hidden_dropout_prob": 0.1,
                                "attention_probs_dropout_prob": 0.1}))
    ids = torch.randint(5, 99, (2, 9))
    m.eval()
    torch.testing.assert_close(m(ids).last_hidden_state, m(ids).last_hidden_state)
    m.train()
    assert not torch.allclose(m(ids).last_hidden_state, m(ids).last_hidden_state)


def test_fully_padded_row_is_finite():
    m = BertModel(BertConfig(**TINY)).eval()
    ids = torch.randint(5, 99, (2, 6))
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    out = m(ids, mask).last_hidden_state
    assert torch.isfinite(out).all()


def test_config_from_dict_to_dict_validate():
    d = {**TINY, "architectures": ["BertForMaskedLM"], "model_type": "bert",
         "torch_dtype": "float32", "transformers_version": "4.8.2", "use_cache": True}
    cfg = BertConfig.from_dict(d)
    assert cfg.hidden_size == 32 and cfg.layer_norm_eps == 1e-12
    assert BertConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(BertgpuError, match="num_attention_heads"):
        BertConfig(hidden_size=30, num_attention_heads=4).validate()
    with pytest.raises(BertgpuError, match="position_embedding_type"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"}).validate()
    with pytest.raises(BertgpuError, match="hidden_act"):
        BertConfig(hidden_act="swish").validate()
    with pytest.raises(BertgpuError, match="hidden_act"):
        BertModel(BertConfig(**{**TINY, "hidden_act": "silu"}))


def test_model_output_attribute_access():
    o = ModelOutput(loss=1)
    o.logits = 2
    assert o.loss == 1 and o["logits"] == 2 and set(o) == {"loss", "logits"}
    with pytest.raises(AttributeError):
        _ = o.start_logits


@pytest.mark.parametrize("classifier_dropout", [0.3, None])
def test_classifier_dropout_is_transformers(classifier_dropout):
    """The heads' dropout is classifier_dropout when set, else hidden_dropout_prob, as in
    transformers' BertForSequenceClassification and BertForTokenClassification."""
    kw = dict(TINY, hidden_dropout_prob=0.1, classifier_dropout=classifier_dropout)
    hf_config = transformers.BertConfig(**kw)
    for ours_cls, hf_cls in [
        (BertForSequenceClassification, transformers.BertForSequenceClassification),
        (BertForTokenClassification, transformers.BertForTokenClassification),
    ]:
        expected = hf_cls(hf_config).dropout.p
        assert expected == (0.3 if classifier_dropout is not None else 0.1)
        assert ours_cls(BertConfig(**kw)).dropout.p == expected, ours_cls.__name__
