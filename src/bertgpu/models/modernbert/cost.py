"""What ModernBERT costs: training FLOPs per token (for MFU) and the bytes of one pretraining
step (the automatic micro batch's estimate where it cannot probe real steps). Plain arithmetic on
the config; no torch.
"""

from __future__ import annotations

from typing import Any


def flops_per_token_of(cfg: Any, seq_len: int, mlm_fraction: float = 1.0,
                       with_nsp: bool = False) -> float:
    """Training FLOPs per token of ModernBERT, counted as models/bert/cost.py counts BERT.

    Per layer (d = hidden_size, f = intermediate_size): Wqkv ``3 d^2``, attention output ``d^2``,
    the GeGLU input ``Wi`` (d -> 2 f: input and gate) ``2 d f`` and ``Wo`` ``f d``:
    ``4 d^2 + 3 d f`` weights (plus biases and norm gains when configured; both negligible), so 6x
    that per token.
    Attention scores and the weighted sum cost ``12 d T_l`` per token of layer l, where T_l is the
    sequence length for global layers (full_attention: 0, n, 2n, ..., or what layer_types says)
    and, for sliding-window layers, the keys the banded mask lets a query see, averaged over the
    sequence's queries (`window_keys`; the kernels may compute more).
    The head (dense d x d, norm, tied decoder d x V) runs at the predicted positions only; V is
    the real vocabulary (the model's padding columns, shared.VOCAB_MULTIPLE, are not useful work).
    ModernBERT has no next-sentence head: `with_nsp` is accepted for the common signature."""
    d, f = int(cfg.hidden_size), int(cfg.intermediate_size)
    L, T = int(cfg.num_hidden_layers), int(seq_len)
    if min(d, f, L, T) <= 0:
        raise ValueError("flops_per_token_of: all sizes must be positive")
    window = window_keys(T, int(cfg.local_attention))
    per_layer = 4 * d * d + 3 * d * f
    attention = sum(12.0 * d * (T if kind == "full_attention" else window)
                    for kind in _layer_types(cfg, L))
    head = d * d + d + d * int(cfg.vocab_size) + int(cfg.vocab_size)
    return 6.0 * L * per_layer + attention + mlm_fraction * 6.0 * head


def window_keys(seq_len: int, local_attention: int) -> float:
    """Keys per query of a sliding-window layer, averaged over a sequence of `seq_len`: query i
    sees |i - j| <= local_attention // 2 (rope.sliding_window_mask), so 2h + 1 keys in the middle
    of a long sequence (h = local_attention // 2) and fewer near its ends."""
    T, h = int(seq_len), int(local_attention) // 2
    # sum over queries of min(i, h): the keys on one side (the other side is the same sum)
    side = (T - 1) * T / 2 if T - 1 <= h else h * (h + 1) / 2 + h * (T - 1 - h)
    return 1.0 + 2.0 * side / T


def _layer_types(cfg: Any, num_layers: int) -> list[str]:
    """Each layer's attention: ours (`resolved_layer_types`), a transformers 5.x config's
    `layer_types` (it keeps no global_attn_every_n_layers), else a 4.x config's period."""
    if hasattr(cfg, "resolved_layer_types"):
        return cfg.resolved_layer_types()
    if getattr(cfg, "layer_types", None) is not None:
        return list(cfg.layer_types)
    every = max(int(getattr(cfg, "global_attn_every_n_layers", 3)), 1)
    return ["sliding_attention" if i % every else "full_attention" for i in range(num_layers)]


def estimate_train_bytes(config: Any, micro_batch: int, seq_len: int, dtype_bytes: int = 4,
                         grad_ckpt: bool = False, flash_attention: bool = True,
                         optimizer: str = "adamw") -> int:
    """Rough bytes of one training step of ModernBertForMaskedLM (an upper-ish estimate), counted
    as models/bert/cost.py counts BERT:

    - parameters (per layer Wqkv and Wo: 4 H^2, the GeGLU's Wi and Wo: 3 H F; the token embedding,
      tied to the decoder; the head's dense), gradients and the optimizer's two moments: 4 fp32
      copies (6 with LAMB's temporaries);
    - activations kept for backward, per layer and token: the layer input and its norm, q/k/v,
      the attention output, the MLP's norm, Wi's 2 F outputs, the GeGLU product F and dropout
      masks (~10 H + 3 F); without a flash kernel the (N, T, T) attention probabilities as well;
    - with activation checkpointing only each layer's input is kept, plus one layer's worth.
    """
    H, L, F, N = (int(config.hidden_size), int(config.num_hidden_layers),
                  int(config.intermediate_size), int(config.num_attention_heads))
    V = int(config.vocab_size)
    params = L * (4 * H * H + 3 * H * F) + V * H + H * H
    tokens = micro_batch * seq_len
    per_layer = tokens * (10 * H + 3 * F) * dtype_bytes
    if not flash_attention:
        per_layer += micro_batch * N * seq_len * seq_len * (dtype_bytes + 1)
    activations = (tokens * H * dtype_bytes * L + per_layer) if grad_ckpt else per_layer * L
    # fp32 logits of the masked rows (30%: its recipes) and their gradient
    mlm = int(0.3 * tokens) * V * 4 * 2
    copies = 6 if optimizer == "lamb" else 4
    return 4 * copies * params + activations + mlm


__all__ = ["estimate_train_bytes", "flops_per_token_of"]
