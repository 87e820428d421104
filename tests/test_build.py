"""build.py (architecture + head -> model class) and the recipes and
[model] section that feed it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _tiny import TINY, tiny_batch
from _tiny_modern import TINY_MODERN

from bertgpu.config.overrides import config_to_dict
from bertgpu.config.schema import load_config
from bertgpu.errors import BertgpuError
from bertgpu.models.bert import model as bert
from bertgpu.models.build import build_model
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.models.shared import num_parameters

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

EXPECTED = {
    ("bert", "pretraining"): "BertForPreTraining",
    ("bert", "masked_lm"): "BertForPreTraining",
    ("bert", "classification"): "BertForSequenceClassification",
    ("bert", "qa"): "BertForQuestionAnswering",
    ("bert", "base"): "BertModel",
    ("modernbert", "pretraining"): "ModernBertForMaskedLM",
    ("modernbert", "masked_lm"): "ModernBertForMaskedLM",
    ("modernbert", "classification"): "ModernBertForSequenceClassification",
    ("modernbert", "qa"): "ModernBertForQuestionAnswering",
    ("modernbert", "token_classification"): "ModernBertForTokenClassification",
    ("modernbert", "base"): "ModernBertModel",
}


def fields(arch: str, **kw) -> dict:
    return {"architecture": arch, **(TINY if arch == "bert" else TINY_MODERN), **kw}


@pytest.mark.parametrize(("arch", "head"), list(EXPECTED))
def test_every_head_of_both_architectures(arch, head):
    model = build_model(fields(arch), head, num_labels=3)
    assert type(model).__name__ == EXPECTED[arch, head]
    assert model.training
    b = tiny_batch()
    out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"])
    assert all(torch.isfinite(v).all() for v in out.values())


def test_heads_follow_their_arguments():
    assert not build_model(fields("bert"), "masked_lm").with_nsp
    assert build_model(fields("bert"), "pretraining").with_nsp
    assert not build_model(fields("bert"), "pretraining", with_nsp=False).with_nsp
    assert build_model(fields("bert"), "base", add_pooling_layer=False).pooler is None
    # num_labels: the argument, else config.json's id2label (with its names), else 2
    labelled = fields("modernbert", id2label={"0": "neg", "1": "neu", "2": "pos"})
    assert build_model(labelled, "classification").id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert (build_model(labelled, "classification", num_labels=2).id2label
            == {0: "LABEL_0", 1: "LABEL_1"})
    assert build_model(fields("modernbert"), "token_classification").num_labels == 2


def test_bert_token_classification_when_available():
    if hasattr(bert, "BertForTokenClassification"):
        assert (type(build_model(fields("bert"), "token_classification", 4)).__name__
                == "BertForTokenClassification")
    else:
        with pytest.raises(BertgpuError,
                           match="token_classification: not available for architecture bert"):
            build_model(fields("bert"), "token_classification", 4)


def test_architecture_from_model_type():
    hf_style = {**TINY_MODERN, "model_type": "modernbert"}  # a transformers config.json
    assert isinstance(build_model(hf_style, "masked_lm"), ModernBertForMaskedLM)
    assert type(build_model(dict(TINY), "base")).__name__ == "BertModel"  # neither given: bert
    with pytest.raises(BertgpuError,
                       match="architecture 'bert' disagrees with model_type 'modernbert'"):
        build_model({**hf_style, "architecture": "bert"}, "base")
    with pytest.raises(BertgpuError,
                       match="model_type: found 'gpt2', expected one of bert, modernbert"):
        build_model({"model_type": "gpt2"}, "base")


def test_one_line_errors():
    with pytest.raises(BertgpuError, match="with_nsp: ModernBERT has no next-sentence head"):
        build_model(fields("modernbert"), "pretraining", with_nsp=True)
    with pytest.raises(BertgpuError, match="head 'mlm': expected one of"):
        build_model(fields("bert"), "mlm")
    with pytest.raises(BertgpuError, match="config field local_attention"):
        build_model(fields("modernbert", local_attention=-1), "base")


# --- recipes and the [model] section --------------------------------------------------------------


@pytest.mark.parametrize("name", ["modern-tiny", "modern-base", "modern-budget-24h"])
def test_modern_recipes_load_and_build(name):
    cfg = load_config(CONFIGS / f"{name}.toml")
    assert cfg.model.architecture == "modernbert"
    assert cfg.data.mask_rate == 0.3 and cfg.data.objective == "mlm"
    assert cfg.schedule.decay == "wsd" and 0 < cfg.schedule.decay_fraction < 1
    with torch.device("meta"):  # the shapes, without allocating 150 M parameters
        model = build_model(config_to_dict(cfg.model), "pretraining")
    assert isinstance(model, ModernBertForMaskedLM)
    n = num_parameters(model)
    if name == "modern-base":
        assert n == pytest.approx(149.0e6, rel=0.01)  # ModernBERT-base's published 149 M
        kinds = [layer.attention_type for layer in model.model.layers]
        assert kinds[:4] == ["full_attention", "sliding_attention", "sliding_attention",
                             "full_attention"]
    if name == "modern-tiny":  # about tiny.toml's size (1.49 M)
        assert 1.4e6 < n < 1.7e6


def test_modern_tiny_trains_a_step():
    cfg = load_config(CONFIGS / "modern-tiny.toml")
    torch.manual_seed(0)
    model = build_model(config_to_dict(cfg.model), "pretraining")
    ids = torch.randint(5, cfg.model.vocab_size, (2, 128))
    labels = torch.where(torch.rand(2, 128) < cfg.data.mask_rate, ids, torch.full_like(ids, -100))
    out = model(ids, torch.ones_like(ids), labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss) and out.loss.item() == pytest.approx(9.0, abs=0.5)  # ~ln(8192)


@pytest.mark.parametrize(("overrides", "message"), [
    (["--model.hidden_activation", "silu"],
     r"model\.hidden_activation = 'silu'.*for bert: model\.hidden_act"),
    (["--model.architecture", "modernbert", "--model.hidden_dropout_prob", "0.2"],
     r"model\.hidden_dropout_prob = 0\.2.*model\.mlp_dropout"),
    (["--model.architecture", "modernbert", "--model.classifier_pooling", "max"],
     r"model\.classifier_pooling: found 'max', expected one of cls, mean"),
    (["--model.architecture", "modernbert", "--model.local_attention", "0"],
     r"model\.local_attention"),
    (["--model.architecture", "modernbert", "--train.with_nsp", "true"], "no next-sentence head"),
    (["--model.architecture", "modernbert", "--data.objective", "mlm+nsp"],
     "no next-sentence head"),
    (["--model.architecture", "roberta"],
     r"model\.architecture = 'roberta': expected one of bert, modernbert"),
    (["--schedule.decay_fraction", "1.5"], r"schedule\.decay_fraction"),
])
def test_model_section_errors(overrides, message):
    with pytest.raises(BertgpuError, match=message):
        load_config(None, overrides)


def test_model_section_builds_what_it_says():
    cfg = load_config(None, ["--model.architecture", "modernbert", "--model.num_hidden_layers", "2",
                             "--model.hidden_size", "64", "--model.num_attention_heads", "2",
                             "--model.vocab_size", "100", "--model.local_attention", "8"])
    model = build_model(dataclasses.asdict(cfg.model), "masked_lm")
    assert model.config.local_attention == 8 and model.config.pad_token_id == 0
    assert model.config.norm_eps == 1e-5  # ModernBERT's own epsilon, not BERT's layer_norm_eps


def test_config_schema_does_not_import_torch():
    """`bertgpu --help` and the data tools read the schema; torch comes with a model only."""
    code = "import sys, bertgpu.config.schema; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_config_of_either_architecture_without_torch():
    """The training config and the data tools check model fields before any model is built."""
    code = ("import sys; from bertgpu.models.build import model_config; "
            "assert model_config({'hidden_size': 64, 'num_attention_heads': 2}).hidden_size == 64; "
            "assert model_config({'architecture': 'modernbert', 'hidden_size': 64, "
            "'num_attention_heads': 2}).head_dim == 32; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
