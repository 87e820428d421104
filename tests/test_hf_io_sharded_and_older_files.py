"""Weight folders the other hf_io tests never wrote: a sharded folder (`*.index.json` and its
shards, as transformers writes a model over `max_shard_size`), a ModernBERT file holding only
the tied `decoder.weight`, one with the persistent `rotary_emb.*` buffers of older versions, and
an `--init` into a model with as many positions as the folder (no "positions grown" row) or more.

Each is checked against transformers (the weights it wrote, its logits), not against hf_io."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from _tiny import TINY, perturb, tiny_batch
from _tiny_modern import TINY_MODERN
from safetensors.torch import load_file, save_file

from bertgpu.models import build
from bertgpu.models.hf_io import TIED_KEYS, load_init_weights, load_pretrained
from bertgpu.models.layout import hf_state_dict
from bertgpu.train.continued import InitSource, load_weights

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


def _bert_mlm() -> transformers.BertForMaskedLM:
    torch.manual_seed(0)
    return perturb(transformers.BertForMaskedLM(transformers.BertConfig(**TINY))).eval()


def _modern_mlm() -> transformers.ModernBertForMaskedLM:
    torch.manual_seed(0)
    return perturb(transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**TINY_MODERN))).eval()


def _as_bin_shards(folder: Path) -> None:
    """The safetensors shards of `folder` -> pytorch_model-*.bin and pytorch_model.bin.index.json
    (the sharded form of older transformers, which `save_pretrained` no longer writes)."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    renamed = {}
    for shard in sorted(set(index["weight_map"].values())):
        new = shard.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save(load_file(folder / shard), folder / new)
        (folder / shard).unlink()
        renamed[shard] = new
    index["weight_map"] = {k: renamed[v] for k, v in index["weight_map"].items()}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors.index.json").unlink()


def _assert_weights_equal(ours: torch.nn.Module, hf: torch.nn.Module) -> None:
    """Every weight transformers holds is ours, bitwise (buffers and tied copies aside)."""
    mine = hf_state_dict(ours)
    theirs = {k: v for k, v in hf.state_dict().items() if k not in TIED_KEYS
              and not k.endswith(("position_ids", "token_type_ids"))}
    assert set(theirs) <= set(mine), sorted(set(theirs) - set(mine))
    for k, v in theirs.items():
        assert torch.equal(mine[k], v), k


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
@pytest.mark.parametrize("form", ["safetensors", "bin"])
def test_a_sharded_folder_loads_every_shard(tmp_path, arch, form):
    hf = _bert_mlm() if arch == "bert" else _modern_mlm()
    hf.save_pretrained(tmp_path, max_shard_size="10KB")
    if form == "bin":
        _as_bin_shards(tmp_path)
    index = tmp_path / ("model.safetensors.index.json" if form == "safetensors"
                        else "pytorch_model.bin.index.json")
    assert len(set(json.loads(index.read_text())["weight_map"].values())) >= 5
    assert not (tmp_path / "model.safetensors").exists()

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "initialised fresh" would be a warning
        ours = load_pretrained(tmp_path, head="masked_lm").eval()
    _assert_weights_equal(ours, hf)
    b = tiny_batch()
    ids, mask = b["input_ids"], torch.ones_like(b["input_ids"])  # unpadded: rows compare whole
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids, attention_mask=mask).prediction_logits,
                                   hf(input_ids=ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-4)

    # the --init path: the weights into a model built from the folder's config, no fresh row
    fresh = build.build_model(json.loads((tmp_path / "config.json").read_text()), "masked_lm")
    rows = dict(load_weights(fresh, InitSource.open(str(tmp_path)), resume_optimizer=False))
    assert "init: initialised fresh" not in rows and "init: positions grown" not in rows
    _assert_weights_equal(fresh, hf)


def test_a_modernbert_file_with_only_the_tied_decoder_weight(tmp_path):
    """Some ModernBERT files store the tied table as `decoder.weight` and leave out
    `model.embeddings.tok_embeddings.weight`: the token embeddings are that table."""
    hf = _modern_mlm()
    hf.config.save_pretrained(tmp_path)
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    table = sd.pop("model.embeddings.tok_embeddings.weight")
    sd["decoder.weight"] = table.clone()
    save_file(sd, tmp_path / "model.safetensors")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = load_pretrained(tmp_path, head="masked_lm").eval()
    _assert_weights_equal(ours, hf)
    assert torch.equal(hf_state_dict(ours)["model.embeddings.tok_embeddings.weight"], table)
    ids = tiny_batch()["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).prediction_logits, hf(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-4)

    fresh = build.build_model(json.loads((tmp_path / "config.json").read_text()), "masked_lm")
    report = load_init_weights(fresh, tmp_path)
    assert report.missing == [] and report.unused == []
    assert torch.equal(hf_state_dict(fresh)["model.embeddings.tok_embeddings.weight"], table)


def test_a_modernbert_file_with_persistent_rotary_buffers(tmp_path):
    """Older ModernBERT files keep each layer's RoPE frequencies (`rotary_emb.inv_freq`): an old
    buffer, recomputed here, neither an unexpected weight nor one "not used"."""
    hf = _modern_mlm()
    hf.save_pretrained(tmp_path)
    sd = load_file(tmp_path / "model.safetensors")
    head_dim = TINY_MODERN["hidden_size"] // TINY_MODERN["num_attention_heads"]
    for i in range(TINY_MODERN["num_hidden_layers"]):
        sd[f"model.layers.{i}.attn.rotary_emb.inv_freq"] = torch.rand(head_dim // 2)
    save_file(sd, tmp_path / "model.safetensors")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = load_pretrained(tmp_path, head="masked_lm").eval()
    _assert_weights_equal(ours, hf)
    report = ours.load_report
    assert report.missing == [] and report.unused == []
    fresh = build.build_model(json.loads((tmp_path / "config.json").read_text()), "masked_lm")
    assert load_init_weights(fresh, tmp_path).unused == []


def test_positions_grow_only_into_a_longer_table(tmp_path):
    """--init into a model with the folder's own max_position_embeddings copies the table as it
    is and says nothing of growing; into a longer one the start-up row says 64 -> 128."""
    hf = transformers.BertForMaskedLM(transformers.BertConfig(**TINY, max_position_embeddings=64))
    hf.save_pretrained(tmp_path)
    table = hf.bert.embeddings.position_embeddings.weight.detach()
    fields = json.loads((tmp_path / "config.json").read_text())
    key = "bert.embeddings.position_embeddings.weight"

    same = build.build_model(fields, "masked_lm")
    assert load_init_weights(same, tmp_path).grown == []
    same = build.build_model(fields, "masked_lm")
    rows = dict(load_weights(same, InitSource.open(str(tmp_path)), resume_optimizer=False))
    assert "init: positions grown" not in rows
    assert torch.equal(hf_state_dict(same)[key], table)

    longer = build.build_model({**fields, "max_position_embeddings": 128}, "masked_lm")
    rows = dict(load_weights(longer, InitSource.open(str(tmp_path)), resume_optimizer=False))
    assert rows["init: positions grown"] == f"{key} 64 -> 128 rows (rows 64-127 copy rows 0-63)"
    grown = hf_state_dict(longer)[key]
    assert torch.equal(grown[:64], table) and torch.equal(grown[64:], table)
