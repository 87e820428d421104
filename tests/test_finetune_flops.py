"""Fine-tuning's MFU numerator: the FLOPs per real token the loop is given match what the model
computes on the training sequences without padding, measured by torch's own FLOP counter.

Fine-tuning sequences are much shorter than --max_seq_len (GLUE sentences of ~25 tokens at 128),
and the loop counts real tokens; charging each of them the attention of a max-length sequence
overstated MFU (1.02x for BERT-base on GLUE, 1.79x for ModernBERT-base at 8192).
"""

from __future__ import annotations

import random

import _tiny_init
import pytest
import torch
from _tiny_init import SPECIAL

from bertgpu.finetune import finetune_examples
from bertgpu.tasks.glue import Example
from bertgpu.telemetry.flops import flops_per_token_from_config

WORDS = "apple river stone cloud table green quiet music paper window garden silver".split()

pytestmark = pytest.mark.usefixtures("one_thread")


def _measured_flops_per_token(model: torch.nn.Module, sequences: list) -> float:
    """Training FLOPs per token of `model`'s encoder, each sequence run alone (a batch of one,
    no padding) forward and backward under FlopCounterMode. The counter sees matmuls and the
    attention (SDPA's math backend: its matmuls), not the elementwise bias adds and LayerNorms;
    those are counted as the FLOP convention counts them (ANCHORS.md): 6 per parameter and token.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        for ids in sequences:
            x = torch.as_tensor(ids, dtype=torch.long)[None]  # (1, n)
            out = model(input_ids=x, attention_mask=torch.ones_like(x),
                        token_type_ids=torch.zeros_like(x), labels=torch.tensor([1]))
            out.loss.backward()
    encoder = [v for k, v in counter.get_flop_counts().items() if k.endswith(".bert.encoder")]
    assert len(encoder) == 1
    tokens = sum(len(ids) for ids in sequences)
    elementwise = sum(p.numel() for p in model.bert.encoder.parameters() if p.dim() == 1)
    return sum(encoder[0].values()) / tokens + 6.0 * elementwise


def test_finetune_mfu_counts_attention_at_each_sequences_own_length(tmp_path, monkeypatch):
    from bertgpu.train import loop

    seen: dict = {}

    class Recording(loop.Loop):
        def __init__(self, task, model, *args, **kwargs):
            seen.update(task=task, model=model, flops_per_token=kwargs["flops_per_token"])
            super().__init__(task, model, *args, **kwargs)

    monkeypatch.setattr(loop, "Loop", Recording)
    init = _tiny_init.tiny_init(tmp_path, SPECIAL + WORDS)
    rng = random.Random(0)
    examples = [Example(str(i), " ".join(rng.choices(WORDS, k=1 + i % 12)), None, i % 2)
                for i in range(20)]
    finetune_examples("sst-2", examples[:16], examples[16:], init, tmp_path / "ft",
                      overrides=["--epochs", "1", "--global_batch_size", "16",
                                 "--warmup_fraction", "0"])

    train = seen["task"].job.train.ids
    assert sorted(len(ids) for ids in train) == sorted(3 + i % 12 for i in range(16))  # [CLS] [SEP]
    model = seen["model"]
    expected = _measured_flops_per_token(model, train)
    assert seen["flops_per_token"] == pytest.approx(expected, rel=1e-9)
    # ... and not the count at the padded width, which charges every token 128 positions
    padded = flops_per_token_from_config(model.config, 128, mlm_fraction=0.0, with_nsp=False)
    assert padded > 1.5 * seen["flops_per_token"]
