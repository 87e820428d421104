"""A BERT of type_vocab_size 1 is exported with a tokenizer that gives no token_type_ids: it
kept them, and `tokenizer(a, b)` gave the second segment type 1, which transformers' model
then looked up in a table of one row (IndexError). ModernBERT's export already did this."""

from __future__ import annotations

import json

import pytest
from _export_run import tiny_model, tiny_run

from bertgpu.models.hf_export import save_pretrained


@pytest.mark.parametrize("types, names", [(1, ["input_ids", "attention_mask"]), (2, None)])
def test_token_type_ids_travel_only_with_a_model_that_has_token_types(tmp_path, types, names):
    run = tiny_run(tmp_path / "run", steps=())
    out = save_pretrained(tiny_model(type_vocab_size=types), tmp_path / "hf",
                          tokenizer=run / "tokenizer")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config.get("model_input_names") == names


@pytest.mark.parametrize("types, names", [(1, ["input_ids", "attention_mask"]), (2, None)])
def test_a_checkpoints_tokenizer_files_follow_the_same_rule(tmp_path, types, names):
    """The tokenizer files beside each pretraining checkpoint (what --init and a copied
    checkpoint's export read) kept token_type_ids for a BERT of type_vocab_size 1."""
    from bertgpu.tasks.pretraining import checkpoint_files

    run = tiny_run(tmp_path / "run", steps=())
    files = checkpoint_files("", tiny_model(type_vocab_size=types), run)
    assert json.loads(files["tokenizer_config.json"]).get("model_input_names") == names
