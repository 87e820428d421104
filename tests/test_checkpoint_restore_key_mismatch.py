"""Restoring a whole-file checkpoint into a model whose weights it does not name one for one: a
weight missing from it, or one the model lacks, is the one-line "checkpoint does not match the
configured model" error before anything is loaded; only the tied decoder copies (stored once, as
the word embeddings) may be absent."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY

from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining
from bertgpu.models.layout import file_state
from bertgpu.train.checkpointer import restore

pytestmark = pytest.mark.usefixtures("one_thread")


def _saved_and_fresh():
    """The weights and optimizer state of one tiny model (as a checkpoint holds them) and a
    second model of the same config with its optimizer, to restore into."""
    torch.manual_seed(0)
    saved = BertForPreTraining(BertConfig(**TINY))
    opt = torch.optim.AdamW(saved.parameters(), lr=1e-3)
    saved(input_ids=torch.randint(5, 99, (2, 8))).seq_relationship_logits.sum().backward()
    opt.step()
    state = {k: v.detach().clone() for k, v in file_state(saved).items()}
    torch.manual_seed(1)
    model = BertForPreTraining(BertConfig(**TINY))
    return saved, state, {"optimizer": opt.state_dict()}, model, torch.optim.AdamW(
        model.parameters(), lr=1e-3)


def test_a_matching_checkpoint_restores_without_its_tied_decoder_copy(tmp_path):
    saved, state, train_state, model, opt = _saved_and_fresh()
    del state["cls.predictions.decoder.weight"]  # the word embeddings, stored once
    restore(tmp_path / "step_5", state, train_state, model, opt)
    for (k, a), b in zip(saved.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("change", ["missing", "unexpected"])
def test_a_checkpoint_of_another_model_is_refused_before_loading(tmp_path, change):
    _, state, train_state, model, opt = _saved_and_fresh()
    key = "bert.embeddings.LayerNorm.weight"
    if change == "missing":
        del state[key]
    else:
        state["cls.extra.weight"] = torch.zeros(3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(BertgpuError) as err:
        restore(tmp_path / "step_5", state, train_state, model, opt)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'step_5'}: checkpoint does not match the configured "
                          "model (missing ") and "\n" not in msg
    assert (key if change == "missing" else "cls.extra.weight") in msg
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not opt.state  # nor the optimizer's
