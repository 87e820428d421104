"""A tiny BERT config and a padded batch with MLM/NSP labels, shared by the model tests."""

from __future__ import annotations

import torch

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_batch(seed: int = 0, B: int = 3, T: int = 11) -> dict[str, torch.Tensor]:
    """Right-padded batch (lengths T, 7, 4), segment B in the second half, ~25% MLM labels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 7, 4][:B])
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(5, 99, (B, T), generator=g) * attention_mask
    token_type_ids = ((torch.arange(T)[None, :] >= (lengths[:, None] // 2))
                      & attention_mask.bool()).long()
    pick = (torch.rand(B, T, generator=g) < 0.25) & attention_mask.bool()
    pick[:, 1] = True  # at least one label per row
    labels = torch.where(pick, torch.randint(5, 99, (B, T), generator=g), torch.full((B, T), -100))
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                labels=labels, next_sentence_label=torch.randint(0, 2, (B,), generator=g))


def perturb(model):
    """Random values everywhere (biases and norms too, not just the initialisation), so that a
    swapped, missing or zero tensor shows in a comparison with another implementation."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def unpad_index(attention_mask: torch.Tensor, backend: str = "auto"):
    """(B, T) mask -> its `Unpadded` rows, even when nothing is padded (the kernels' tests take
    every layout; the model builds `Unpadded` from the loader's `BatchMeta` instead)."""
    from dataclasses import replace

    from bertgpu.batch import batch_meta
    from bertgpu.models.attention import Unpadded

    meta = batch_meta(attention_mask)
    if not meta.padded:
        B, T = attention_mask.shape
        n = torch.arange(B * T, device=attention_mask.device)
        meta = replace(meta, index=n,
                       cu_seqlens=torch.arange(0, B * T + 1, T, device=attention_mask.device))
    return Unpadded.from_meta(meta, attention_mask, backend)


def hf_grads(model) -> dict[str, torch.Tensor]:
    """The gradients of `model`'s parameters under Hugging Face's names and shapes (BERT's fused
    query/key/value split, the vocabulary tables' padding rows cut: models/layout.py), to compare
    with a transformers model's `get_parameter(name).grad`."""
    from bertgpu.models.layout import to_hf

    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return to_hf(grads, model.config.architecture, model.config.vocab_size)
