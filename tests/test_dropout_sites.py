"""Every dropout site of BERT draws in training, on the padded path and on the unpadded one (the
default on CUDA bf16): embeddings, attention probabilities, attention output, feed-forward
output. Each site alone, the others at 0, makes the training-mode output differ from the eval
one; with every site at 0 the two are equal. (A mutation probe found that dropping the attention
probabilities' dropout, or the embeddings' on the unpadded path, failed no test: the one test
counting dropout sites sets attention_probs_dropout_prob=0.)"""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY, tiny_batch

from bertgpu.models.bert import model as bert_model
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertModel

P = 0.5  # high, so that one site's draws change the output beyond doubt


def _set_site(model: BertModel, site: str, p: float) -> None:
    if site == "embeddings":
        model.embeddings.dropout.p = p
    for layer in model.encoder.layer:
        if site == "attention_probs":
            layer.attention.self.dropout_p = p
        elif site == "attention_output":
            layer.attention.output.dropout.p = p
        elif site == "ffn_output":
            layer.output.dropout.p = p


SITES = ("embeddings", "attention_probs", "attention_output", "ffn_output")


def _model(unpad: bool, hidden: float, attention: float) -> BertModel:
    torch.manual_seed(0)
    cfg = BertConfig(**{**TINY, "hidden_dropout_prob": hidden,
                        "attention_probs_dropout_prob": attention})
    model = BertModel(cfg, add_pooling_layer=False)
    model.configure(unpad=unpad)
    return model


def _hidden(model: BertModel, batch: dict, seed: int = 1) -> torch.Tensor:
    """The last hidden state at the real tokens, (N_tok, H)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        x = model(batch["input_ids"], batch["attention_mask"],
                  batch["token_type_ids"]).last_hidden_state
    return x[batch["attention_mask"].bool()]


@pytest.fixture
def path_seen(monkeypatch):
    """Which embeddings path each forward took (True: unpadded), so that an unpadded check
    cannot pass on the padded path."""
    seen: list[bool] = []
    forward = bert_model.BertEmbeddings.forward

    def spy(self, input_ids, token_type_ids=None, unpadded=None):
        seen.append(unpadded is not None)
        return forward(self, input_ids, token_type_ids, unpadded)

    monkeypatch.setattr(bert_model.BertEmbeddings, "forward", spy)
    return seen


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
@pytest.mark.parametrize("site", SITES)
def test_each_dropout_site_draws_in_training_only(site, unpad, path_seen, one_thread):
    batch = tiny_batch()
    # Built with both probabilities set (the config reaches every site), then all but one off.
    model = _model(unpad, hidden=P, attention=P)
    for other in SITES:
        _set_site(model, other, P if other == site else 0.0)
    want = _hidden(model.eval(), batch)
    model.train()
    one, again, other = (_hidden(model, batch, seed) for seed in (1, 1, 2))
    assert path_seen and set(path_seen) == {unpad}
    assert not torch.allclose(one, want, atol=1e-4), f"{site}: no dropout in training"
    assert torch.equal(one, again)  # torch's generator governs the draws
    assert not torch.allclose(one, other, atol=1e-4)
    # Off again: training equals eval, so the difference above is that site's dropout.
    _set_site(model, site, 0.0)
    torch.testing.assert_close(_hidden(model, batch), want)


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
def test_attention_probs_dropout_from_the_config_alone(unpad, path_seen, one_thread):
    """attention_probs_dropout_prob > 0 with hidden_dropout_prob 0, as a config sets it: the
    training output differs from eval; with both 0 it equals eval."""
    batch = tiny_batch()
    model = _model(unpad, hidden=0.0, attention=0.3)
    want = _hidden(model.eval(), batch)
    got = _hidden(model.train(), batch)
    assert set(path_seen) == {unpad}
    assert not torch.allclose(got, want, atol=1e-4)

    off = _model(unpad, hidden=0.0, attention=0.0)
    torch.testing.assert_close(_hidden(off.train(), batch), _hidden(off.eval(), batch))
    torch.testing.assert_close(_hidden(off.eval(), batch), want)  # same weights (same seed)
