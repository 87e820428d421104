"""models/layout.py: the model's own parameter layout (BERT's fused query/key/value, vocabulary
tables padded to a multiple of 64) against Hugging Face's, which every file we write keeps.

The parity tests (test_model.py, test_modernbert.py, test_hf_io.py) compare logits and gradients
with transformers through this conversion; here: exports byte for byte, the padding rows' zero
gradient through real optimizer steps, a fused Linear whose parts a file only partly has, and the
weight decay groups by Hugging Face's names.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from _tiny import TINY, perturb, tiny_batch  # noqa: E402
from _tiny_modern import TINY_MODERN
from safetensors.torch import load_file, save_file

from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.hf_export import save_pretrained
from bertgpu.models.hf_io import TIED_KEYS, load_pretrained
from bertgpu.models.layout import from_hf, hf_state_dict, load_hf_state_dict, to_hf
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.models.shared import padded_vocab_size
from bertgpu.train.optim import build_optimizer, param_groups

transformers = pytest.importorskip("transformers")


def test_padded_vocab_size_and_the_tables_that_have_it():
    assert [padded_vocab_size(v) for v in (30522, 99, 128, 1, 50368)] == [30528, 128, 128, 64,
                                                                           50368]
    bert = BertForPreTraining(BertConfig(**TINY))
    assert bert.bert.embeddings.word_embeddings.weight.shape == (128, 32)
    assert bert.cls.predictions.bias.shape == (128,)
    assert bert.bert.encoder.layer[0].attention.self.qkv.weight.shape == (96, 32)
    modern = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN, decoder_bias=True))
    assert modern.model.embeddings.tok_embeddings.weight.shape == (128, 32)
    assert modern.decoder.bias.shape == (128,)
    for table in (bert.bert.embeddings.word_embeddings.weight, bert.cls.predictions.bias,
                  modern.model.embeddings.tok_embeddings.weight):
        assert not table[99:].any()  # initialised to zero
    out = bert(**tiny_batch())
    assert out.prediction_logits.shape[-1] == 99  # logits over the real vocabulary only


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_padding_leaves_the_initial_weights_alone(arch, monkeypatch):
    # Initialisers draw for the token rows only, so a seed gives the weights an unpadded model
    # gets (VOCAB_MULTIPLE 1: no padding row), every tensor after the vocabulary tables included.
    from bertgpu.models import shared
    from bertgpu.models.build import build_model

    fields = dict(TINY if arch == "bert" else dict(TINY_MODERN, decoder_bias=True),
                  architecture=arch)
    weights = {}
    for multiple in (64, 1):
        monkeypatch.setattr(shared, "VOCAB_MULTIPLE", multiple)
        torch.manual_seed(0)
        weights[multiple] = hf_state_dict(build_model(fields, "pretraining"))
    assert weights[64].keys() == weights[1].keys()
    for k, v in weights[1].items():
        assert torch.equal(weights[64][k], v), k


def _hf_pretraining(arch: str):
    torch.manual_seed(0)
    if arch == "bert":
        hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
        return perturb(hf), BertForPreTraining(BertConfig(**TINY))
    hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(**TINY_MODERN))
    return perturb(hf), ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN))


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_export_is_byte_identical_to_the_unfused_unpadded_layout(tmp_path, arch):
    # What an export wrote before the layout changed, and what a model with separate q, k, v and
    # V rows writes: transformers' own tensors, tied copies left out, as one safetensors file.
    hf, ours = _hf_pretraining(arch)
    reference = {k: v.contiguous() for k, v in hf.state_dict().items() if k not in TIED_KEYS}
    save_file(reference, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    load_hf_state_dict(ours, hf.state_dict())
    folder = save_pretrained(ours, tmp_path / "export")
    exported = (folder / "model.safetensors").read_bytes()
    assert exported == (tmp_path / "reference.safetensors").read_bytes()
    # ... and back: a bertgpu checkpoint (our layout) and an export (theirs) load the same model
    again = load_pretrained(folder, head="pretraining")
    for k, v in ours.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_conversion_round_trips_and_takes_either_layout(arch):
    hf, ours = _hf_pretraining(arch)
    vocab = ours.config.vocab_size
    theirs = hf.state_dict()
    own = from_hf(theirs, arch, vocab)
    assert set(own) == set(ours.state_dict())
    assert all(own[k].shape == v.shape for k, v in ours.state_dict().items())
    back = to_hf(own, arch, vocab)
    assert set(back) == set(theirs) and all(torch.equal(back[k], v) for k, v in theirs.items())
    # converting what is converted already changes nothing (a checkpoint or an HF folder alike)
    again = from_hf(own, arch, vocab)
    assert all(torch.equal(again[k], v) for k, v in own.items())
    twice = to_hf(back, arch, vocab)
    assert all(torch.equal(twice[k], v) for k, v in back.items())


@pytest.mark.parametrize("name", ["adamw", "lamb"])
@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_padding_rows_get_no_gradient_and_stay_zero(arch, name):
    torch.manual_seed(0)
    if arch == "bert":
        model = BertForPreTraining(BertConfig(**TINY))
        tables = [model.bert.embeddings.word_embeddings.weight, model.cls.predictions.bias]
    else:
        model = ModernBertForMaskedLM(ModernBertConfig(**TINY_MODERN, decoder_bias=True))
        tables = [model.model.embeddings.tok_embeddings.weight, model.decoder.bias]
    # weight decay on: decoupled decay of a zero row is zero, LAMB's trust ratio ignores it
    opt = build_optimizer(model, name, lr=1e-2, weight_decay=0.1)
    for step in range(3):
        batch = tiny_batch(step)
        if arch == "modernbert":
            del batch["next_sentence_label"]  # no NSP head
        model(**batch).loss.backward()
        for t in tables:
            assert t.grad[:99].any() and not t.grad[99:].any()
        opt.step()
        opt.zero_grad()
        for t in tables:
            assert not t[99:].any()


def test_a_fused_part_missing_from_a_file_keeps_the_model_value(tmp_path):
    hf, _ = _hf_pretraining("bert")
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    weights = load_file(str(path))
    del weights["bert.encoder.layer.0.attention.self.query.weight"]
    save_file(weights, str(path), metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"1 weights .*: bert\.encoder\.layer\.0\.attention\."
                                         r"self\.query\.weight$"):
        ours = load_pretrained(tmp_path / "hf")
    qkv = ours.bert.encoder.layer[0].attention.self.qkv.weight
    assert torch.equal(qkv[32:64], weights["bert.encoder.layer.0.attention.self.key.weight"])
    assert torch.equal(qkv[64:], weights["bert.encoder.layer.0.attention.self.value.weight"])
    assert not torch.equal(qkv[:32], hf.bert.encoder.layer[0].attention.self.query.weight)


def test_weight_decay_groups_are_transformers_by_name():
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
    ours = BertForPreTraining(BertConfig(**TINY))

    def decayed(model, names):
        ids = {id(p) for p in param_groups(model, 0.01)[0]["params"]}
        return {hf_name for n, p in model.named_parameters() if id(p) in ids
                for hf_name in names(n, p)}

    ours_names = decayed(ours, lambda n, p: to_hf({n: p}, "bert", 99))
    assert ours_names == decayed(hf, lambda n, p: [n])
    assert "bert.encoder.layer.1.attention.self.value.weight" in ours_names
    assert set(hf_state_dict(ours)) == set(hf.state_dict())


def test_mfu_counts_the_real_vocabulary():
    # The MLM head's FLOPs are 6 per parameter of the exported (unpadded) head: the padding
    # columns the decoder computes are no useful work.
    from bertgpu.telemetry.flops import flops_per_token_from_config

    model = BertForPreTraining(BertConfig(**TINY), with_nsp=False)
    head = sum(v.numel() for k, v in hf_state_dict(model).items()
               if k.startswith("cls.predictions.") and k != "cls.predictions.decoder.bias")
    per_token = [flops_per_token_from_config(model.config, seq_len=11, mlm_fraction=f,
                                             with_nsp=False) for f in (1.0, 0.0)]
    assert per_token[0] - per_token[1] == 6 * head
