"""What BERT costs: training FLOPs per token (for MFU) and the bytes of one pretraining step
(the automatic micro batch's estimate where it cannot probe real steps). Plain arithmetic on the
config; no torch.

    flops_per_token_of(BertConfig(), seq_len=128, mlm_fraction=0.15, with_nsp=False)  # 0.546e9
"""

from __future__ import annotations

from typing import Any


def _encoder_layer_params(d: int, ff: int) -> int:
    """Parameters of one BERT encoder layer (all of them take part in a matmul or an add)."""
    attention = 4 * d * d + 4 * d  # query, key, value, output dense: weights + biases
    ffn = d * ff + ff + ff * d + d  # intermediate dense + output dense, weights + biases
    layer_norms = 2 * 2 * d  # attention-output and layer-output LayerNorm: gamma + beta
    return attention + ffn + layer_norms


def _mlm_head_params(d: int, vocab: int) -> int:
    """Parameters of ``cls.predictions``: transform dense + LayerNorm, decoder (tied) + bias."""
    return (d * d + d) + 2 * d + (d * vocab + vocab)


def _pooler_nsp_params(d: int) -> int:
    """Parameters of ``bert.pooler.dense`` and ``cls.seq_relationship`` (2 classes)."""
    return (d * d + d) + (2 * d + 2)


def flops_per_token(
    hidden_size: int,
    num_layers: int,
    intermediate_size: int,
    vocab_size: int,
    seq_len: int,
    mlm_fraction: float = 1.0,
    with_nsp: bool = True,
) -> float:
    """Training FLOPs (forward + backward) per input token of BERT pretraining.

    Derivation (the PaLM appendix B / nanoGPT ``estimate_mfu`` accounting, in ANCHORS.md):

    - A matmul with a weight of ``n`` parameters costs ``2n`` FLOPs per token forward (one
      multiply and one add per weight) and ``4n`` backward (gradient w.r.t. the input and w.r.t.
      the weight), so ``6n`` for a training step. Biases and LayerNorm parameters are counted the
      same way; they are < 0.1 % of the total and keep the count equal to "6 x parameters".
    - Encoder, per layer (d = hidden_size, ff = intermediate_size)::

          n_layer = (4 d^2 + 4 d)            query, key, value, attention-output dense
                  + (2 d ff + ff + d)        the two FFN dense layers
                  + 4 d                      two LayerNorms
          N = num_layers * n_layer           (non-embedding parameters)

    - Attention scores ``Q K^T`` and the weighted sum ``A V`` each cost ``2 T d`` FLOPs per token
      forward (T = seq_len), ``4 T d`` per layer, so ``12 L d T`` for forward + backward.
    - Embedding lookups are not matmuls and are not counted.
    - MLM head, evaluated only at the predicted positions (our sparse head), so per input token it
      costs ``mlm_fraction * 6 * n_head`` with ``n_head = (d^2 + d) + 2 d + (d V + V)``: transform
      dense, its LayerNorm, decoder (tied to the word embeddings, but still a matmul) and bias.
      Pass ``mlm_fraction=1.0`` for a dense head that scores every position. V is the real
      vocabulary (config.vocab_size): the model's padding columns (shared.VOCAB_MULTIPLE) are
      computed but are no useful work, so MFU does not count them.
    - Pooler and NSP classifier run once per sequence: ``6 * ((d^2 + d) + (2 d + 2)) / T`` per
      token when ``with_nsp``.

    Total: ``6 N + 12 L d T + mlm_fraction * 6 n_head + [with_nsp] 6 n_pool / T``.

    BERT-base at T = 128 with 15 % masked: 0.546 GFLOP/token; BERT-large: 1.88 GFLOP/token,
    matching ANCHORS.md (0.55 and 1.9). Activation recomputation is not counted: MFU is about
    useful model FLOPs, not the FLOPs the hardware happened to execute.
    """
    if min(hidden_size, num_layers, intermediate_size, vocab_size, seq_len) <= 0:
        raise ValueError("flops_per_token: all sizes must be positive")
    if not 0.0 <= mlm_fraction <= 1.0:
        raise ValueError(f"flops_per_token: mlm_fraction must be in [0, 1], got {mlm_fraction}")
    d, L, T = hidden_size, num_layers, seq_len
    n_encoder = L * _encoder_layer_params(d, intermediate_size)
    flops = 6.0 * n_encoder + 12.0 * L * d * T
    flops += mlm_fraction * 6.0 * _mlm_head_params(d, vocab_size)
    if with_nsp:
        flops += 6.0 * _pooler_nsp_params(d) / T
    return flops


def flops_per_token_of(cfg: Any, seq_len: int, mlm_fraction: float = 1.0,
                       with_nsp: bool = True) -> float:
    """`flops_per_token` of any object with BertConfig's field names (ours, or transformers')."""
    return flops_per_token(hidden_size=int(cfg.hidden_size), num_layers=int(cfg.num_hidden_layers),
                           intermediate_size=int(cfg.intermediate_size),
                           vocab_size=int(cfg.vocab_size), seq_len=seq_len,
                           mlm_fraction=mlm_fraction, with_nsp=with_nsp)


def estimate_train_bytes(config: Any, micro_batch: int, seq_len: int, dtype_bytes: int = 4,
                         grad_ckpt: bool = False, flash_attention: bool = True,
                         optimizer: str = "adamw") -> int:
    """Rough bytes of one training step of BertForPreTraining (an upper-ish estimate).

    - parameters, gradients and the two moments of AdamW / RAdam / LAMB: 4 fp32 copies of every
      parameter; LAMB's step also holds two parameter-sized temporaries (the update and its
      denominator): 6 copies;
    - activations kept for backward, per layer and token, in `dtype_bytes` each: the layer input,
      q/k/v, attention output, dense input/output, two LayerNorm inputs, dropout masks (~12 H)
      plus the FFN's pre- and post-activation (2 F, F = intermediate_size); without a flash
      kernel the (N, T, T) attention probabilities and their dropout mask as well;
    - with activation checkpointing only each layer's input is kept, plus one layer's worth.
    """
    H, L, F, N = (int(config.hidden_size), int(config.num_hidden_layers),
                  int(config.intermediate_size), int(config.num_attention_heads))
    V = int(config.vocab_size)
    params = L * (4 * H * H + 2 * H * F) + (V + int(config.max_position_embeddings) + 2) * H + H * H
    tokens = micro_batch * seq_len
    per_layer = tokens * (12 * H + 2 * F) * dtype_bytes  # F: the FFN width
    if not flash_attention:
        per_layer += micro_batch * N * seq_len * seq_len * (dtype_bytes + 1)
    activations = (tokens * H * dtype_bytes * L + per_layer) if grad_ckpt else per_layer * L
    mlm = int(0.15 * tokens) * V * 4 * 2  # fp32 logits of the masked rows and their gradient
    copies = 6 if optimizer == "lamb" else 4
    return 4 * copies * params + activations + mlm


__all__ = ["estimate_train_bytes", "flops_per_token", "flops_per_token_of"]
