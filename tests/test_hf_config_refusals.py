"""Hugging Face configs whose math bertgpu would not reproduce are refused in one line, never
loaded or written as another model: a causal BERT (is_decoder, add_cross_attention), and a
ModernBERT whose layer_types no global_attn_every_n_layers derives (transformers 4.x reads only
the period). And ModernBERT's FLOPs count follows the layer types."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from _tiny import TINY, perturb, tiny_batch
from _tiny_modern import TINY_MODERN

from bertgpu.config.finetune import load_finetune_config
from bertgpu.config.schema import load_config
from bertgpu.errors import BertgpuError
from bertgpu.models.build import build_model as build_ours
from bertgpu.models.hf_export import save_pretrained
from bertgpu.models.hf_io import load_init_weights, load_pretrained, position_limit
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.cost import flops_per_token_of
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.tasks.init_model import build_model as build_task_model
from bertgpu.telemetry.flops import flops_per_token_from_config

pytestmark = pytest.mark.usefixtures("one_thread")

FULL, LOCAL = "full_attention", "sliding_attention"
REFUSED = "bertgpu loads bidirectional encoders only"


def hf_bert_folder(folder: Path, **switches) -> Path:
    """A tiny transformers BertForMaskedLM saved by transformers (config.json, safetensors)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # BertForMaskedLM with is_decoder: transformers warns
        model = transformers.BertForMaskedLM(transformers.BertConfig(**TINY, **switches))
    model.save_pretrained(folder)
    assert (folder / "model.safetensors").is_file()
    return folder


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


# --- a causal BERT -----------------------------------------------------------------------------


def test_a_causal_bert_is_refused_naming_the_file_and_the_key(tmp_path):
    """transformers keeps is_decoder's causal mask in every BERT class, so our bidirectional
    encoder would give other logits from the same folder: refused wherever a config is read."""
    folder = hf_bert_folder(tmp_path / "causal", is_decoder=True)
    assert json.loads((folder / "config.json").read_text())["is_decoder"] is True
    where = f"{folder / 'config.json'}: is_decoder true (a causal decoder); {REFUSED}"
    for head in ("masked_lm", "classification", "base"):
        with pytest.raises(BertgpuError) as e:
            load_pretrained(folder, head=head)
        assert one_line(e).startswith(where), str(e.value)
    with pytest.raises(BertgpuError, match="^" + where.replace("(", r"\(").replace(")", r"\)")):
        position_limit(folder)
    with pytest.raises(BertgpuError) as e:  # --init random --config-from FOLDER
        build_task_model("random", "classification", 2, load_finetune_config(None, []),
                         config_from=str(folder))
    assert one_line(e).startswith(where)
    with pytest.raises(BertgpuError) as e:  # continued pretraining: --init FOLDER
        load_config(None, ["--init", str(folder)])
    assert one_line(e).startswith(where)
    with pytest.raises(BertgpuError) as e:  # weights into a model built from another config
        load_init_weights(build_ours(dict(TINY), "masked_lm"), folder)
    assert one_line(e).startswith(where)
    # transformers writes both switches, false, into every BertConfig: that loads
    encoder = hf_bert_folder(tmp_path / "encoder")
    written = json.loads((encoder / "config.json").read_text())
    assert written["is_decoder"] is False and written["add_cross_attention"] is False
    load_pretrained(encoder, head="masked_lm")


def test_cross_attention_is_refused_naming_the_key(tmp_path):
    folder = hf_bert_folder(tmp_path / "seq2seq", is_decoder=True, add_cross_attention=True)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["is_decoder"] = False  # the other switch alone (transformers refuses to build this)
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BertgpuError) as e:
        load_pretrained(folder, head="masked_lm")
    assert one_line(e).startswith(f"{folder / 'config.json'}: add_cross_attention true (a "
                                  f"decoder with cross-attention to an encoder); {REFUSED}")


# --- ModernBERT layer types that transformers 4.x cannot read ----------------------------------


def modern(layer_types: list[str] | None, **kw) -> ModernBertForMaskedLM:
    torch.manual_seed(0)
    cfg = ModernBertConfig(**dict(TINY_MODERN, num_hidden_layers=len(layer_types or "abc"),
                                  layer_types=layer_types, **kw))
    return perturb(ModernBertForMaskedLM(cfg)).eval()


@pytest.mark.parametrize(("types", "layer"), [
    ([FULL, LOCAL, LOCAL, FULL, FULL], 4),  # the period 3 of layers 0-3, broken by layer 4
    ([LOCAL, FULL, LOCAL], 0),  # transformers 4.x makes layer 0 global whatever the period
    ([FULL, FULL, LOCAL], 2),
])
def test_export_refuses_layer_types_no_period_derives(tmp_path, types, layer):
    out = tmp_path / "hf"
    with pytest.raises(BertgpuError) as e:
        save_pretrained(modern(types), out)
    text = one_line(e)
    assert text.startswith(f"{out}: cannot export this modernbert model: layer_types: layer "
                           f"{layer} is {types[layer]} but ")
    assert "transformers 4.x reads only global_attn_every_n_layers" in text
    assert list(tmp_path.iterdir()) == []  # refused before any work: nothing written


def test_periodic_layer_types_export_the_same_model_to_both_transformers_versions(tmp_path):
    """layer_types all global beside the default global_attn_every_n_layers 3: the export said
    both, so transformers 4.x (the period) built local layers 1 and 2 and 5.x (the list) none.
    Now the period written derives the list, and both readings give our logits."""
    ours = modern([FULL, FULL, FULL])
    assert ours.config.global_attn_every_n_layers == 3
    out = save_pretrained(ours, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["layer_types"] == [FULL] * 3 and cfg["global_attn_every_n_layers"] == 1
    # transformers 4.x does not know layer_types: 5.x given the rest derives them from the period
    v4 = tmp_path / "as_4x"
    shutil.copytree(out, v4)
    (v4 / "config.json").write_text(json.dumps({k: v for k, v in cfg.items()
                                                if k != "layer_types"}))
    b = tiny_batch(1, T=11)  # longer than the window (4): local layers would differ
    args = {k: b[k] for k in ("input_ids", "attention_mask")}
    real = b["attention_mask"].bool()
    with torch.no_grad():
        want = ours(**args).prediction_logits[real]
        for folder in (out, v4):
            hf = transformers.AutoModelForMaskedLM.from_pretrained(
                folder, attn_implementation="eager").eval()
            assert hf.config.layer_types == [FULL] * 3, folder
            torch.testing.assert_close(hf(**args).logits[real], want, atol=1e-5, rtol=1e-4)


def test_pretraining_refuses_layer_types_it_could_not_export(tmp_path):
    """A pretraining run ends with its export: refused when the config is read, not then."""
    recipe = tmp_path / "modern.toml"
    recipe.write_text('[model]\narchitecture = "modernbert"\nnum_hidden_layers = 5\n'
                      f"layer_types = {json.dumps([FULL, LOCAL, LOCAL, FULL, FULL])}\n")
    with pytest.raises(BertgpuError) as e:
        load_config(recipe, [])
    assert one_line(e).startswith("config: model.layer_types: layer 4 is full_attention but ")


def test_finetuning_refuses_an_init_it_could_not_export(tmp_path):
    """transformers 5.x writes such a folder; a fine-tuning of it would train, then fail to
    export its model/: refused before anything trains."""
    folder = tmp_path / "hf5"
    fields = {k: v for k, v in TINY_MODERN.items() if k != "global_attn_every_n_layers"}
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **dict(fields, num_hidden_layers=3, layer_types=[FULL, FULL, LOCAL]))).save_pretrained(
            folder)
    with pytest.raises(BertgpuError) as e, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fresh head
        build_task_model(str(folder), "classification", 2, load_finetune_config(None, []))
    assert one_line(e).startswith(f"{folder / 'config.json'}: layer_types: layer 2 is "
                                  "sliding_attention but ")


# --- ModernBERT FLOPs follow the layer types ----------------------------------------------------


def test_flops_count_the_layer_types_given():
    """Each global layer's attention sees the sequence (T), each local one its window: making
    layers 1 and 2 global adds 2 x 12 d (T - window) per token."""
    T = 64
    base = dict(TINY_MODERN, num_hidden_layers=3)
    periodic = ModernBertConfig(**base)
    assert periodic.resolved_layer_types() == [FULL, LOCAL, LOCAL]
    all_global = ModernBertConfig(**dict(base, layer_types=[FULL] * 3))
    all_local = ModernBertConfig(**dict(base, layer_types=[LOCAL] * 3))
    from bertgpu.models.modernbert.cost import window_keys

    # a local layer's keys per query, averaged over the T queries (fewer at the edges)
    d, window = base["hidden_size"], window_keys(T, base["local_attention"])
    one = 12.0 * d * (T - window)
    assert flops_per_token_of(all_global, T) - flops_per_token_of(periodic, T) == pytest.approx(
        2 * one)
    assert flops_per_token_of(periodic, T) - flops_per_token_of(all_local, T) == pytest.approx(one)


def test_flops_of_a_transformers_5_config_read_its_layer_types():
    """transformers 5.x keeps layer_types and no global_attn_every_n_layers."""
    fields = {k: v for k, v in TINY_MODERN.items() if k != "global_attn_every_n_layers"}
    hf = transformers.ModernBertConfig(**dict(fields, num_hidden_layers=3,
                                              layer_types=[FULL, FULL, LOCAL]))
    ours = ModernBertConfig(**dict(TINY_MODERN, num_hidden_layers=3,
                                   layer_types=[FULL, FULL, LOCAL]))
    assert flops_per_token_from_config(hf, 64, 0.3) == flops_per_token_from_config(ours, 64, 0.3)
