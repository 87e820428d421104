"""An MLM-only model (with_nsp=False: no pooler, no NSP head) exports as BertForMaskedLM in
config.json's `architectures`, with NSP as BertForPreTraining, and the class each names loads
the export with no weight missing. A probe that always wrote BertForPreTraining found no test
failing: AutoModelForMaskedLM goes by model_type and never reads `architectures`, but pipelines
and the hub do, and BertForPreTraining would start an MLM-only export's pooler and NSP head
from random weights."""

from __future__ import annotations

import json

import pytest
import torch
from _tiny import TINY

from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.hf_export import hf_config, save_pretrained

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("with_nsp, name", [(False, "BertForMaskedLM"),
                                            (True, "BertForPreTraining")])
def test_export_names_the_class_that_has_exactly_its_weights(tmp_path, with_nsp, name):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=with_nsp)
    assert hf_config(model)["architectures"] == [name]
    folder = save_pretrained(model, tmp_path / "export")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == [name]
    hf, info = getattr(transformers, name).from_pretrained(folder, output_loading_info=True)
    assert type(hf).__name__ == name
    assert not info["missing_keys"] and not info["mismatched_keys"], info
