"""Fine-tuning MFU's FLOPs per token with a head that runs at every token: the QA and token
heads' matrices, against torch's FlopCounterMode on the real models (forward and backward)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from bertgpu.models.build import build_model
from bertgpu.telemetry.flops import finetune_flops_per_token, flops_per_real_token

FIELDS = {
    "bert": {"architecture": "bert", "vocab_size": 96, "hidden_size": 64,
             "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 128},
    "modernbert": {"architecture": "modernbert", "vocab_size": 96, "hidden_size": 64,
                   "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 96,
                   "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
                   "sep_token_id": 2},
}


def _counted(model: torch.nn.Module, ids: torch.Tensor, key: str) -> int:
    """Forward + backward FLOPs of `model` on `ids`, as torch counts them."""
    with FlopCounterMode(display=False) as counter:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        sum(v.float().sum() for k, v in out.items() if k in key.split()).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
@pytest.mark.parametrize(("head", "key"), [("qa", "start_logits end_logits"),
                                           ("token_classification", "logits")])
def test_a_head_at_every_token_is_counted(arch, head, key):
    """ModernBERT's QA and token heads run its d x d MLM dense layer at every token before the
    classifier; fine-tuning counted the encoder only, so its MFU read 0.5% low on
    ModernBERT-base at T 384 and 3% on modern-tiny. The head's share of the count is what torch
    counts for the head model less the bare encoder (same weights, same tokens)."""
    torch.manual_seed(0)
    model = build_model(FIELDS[arch], head, num_labels=2 if head == "qa" else 5)
    encoder = getattr(model, "bert" if arch == "bert" else "model")
    B, T = 2, 16
    ids = torch.randint(5, 96, (B, T))
    head_flops = _counted(model, ids, key) - _counted(encoder, ids, "last_hidden_state")
    ours = finetune_flops_per_token(model, [T] * B, head)
    bare = flops_per_real_token(model.config, [T] * B, mlm_fraction=0.0, with_nsp=False)
    assert ours - bare == pytest.approx(head_flops / (B * T), rel=1e-6)


def test_a_per_sequence_head_adds_nothing_per_token():
    model = build_model(FIELDS["modernbert"], "classification", num_labels=3)
    assert finetune_flops_per_token(model, [16, 9], "classification") == flops_per_real_token(
        model.config, [16, 9], mlm_fraction=0.0, with_nsp=False)
