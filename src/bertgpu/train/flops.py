"""FLOPs per token, peak throughput of known GPUs, and model FLOPs utilisation (MFU).

    fpt = flops_per_token_from_config(model_cfg, seq_len=128, mlm_fraction=0.15)
    peak = peak_tflops(torch.cuda.get_device_name(), "bf16")   # None on unknown hardware
    mfu(tokens_per_s, fpt, peak, n_devices=world_size)          # 0.42 means 42 %

The FLOP count is nanoGPT's / PaLM appendix B's: 6 N per token for the weights plus the
attention scores, and the MLM decoder only at predicted positions (see ANCHORS.md).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from bertgpu.errors import BertgpuError

_GIB = float(1 << 30)


# --------------------------------------------------------------------------------------------
# FLOPs per token
# --------------------------------------------------------------------------------------------


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
      Pass ``mlm_fraction=1.0`` for a dense head that scores every position.
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


def flops_per_token_from_config(
    cfg: Any, seq_len: int, mlm_fraction: float = 1.0, with_nsp: bool = True
) -> float:
    """``flops_per_token`` for any object with BertConfig's field names (``hidden_size``,
    ``num_hidden_layers``, ``intermediate_size``, ``vocab_size``): ours, or transformers'.
    A ModernBERT config (it has ``global_attn_every_n_layers``) is counted by
    ``modernbert_flops_per_token``."""
    if hasattr(cfg, "global_attn_every_n_layers"):
        return modernbert_flops_per_token(cfg, seq_len, mlm_fraction)
    return flops_per_token(
        hidden_size=int(cfg.hidden_size),
        num_layers=int(cfg.num_hidden_layers),
        intermediate_size=int(cfg.intermediate_size),
        vocab_size=int(cfg.vocab_size),
        seq_len=seq_len,
        mlm_fraction=mlm_fraction,
        with_nsp=with_nsp,
    )


def modernbert_flops_per_token(cfg: Any, seq_len: int, mlm_fraction: float = 1.0) -> float:
    """Training FLOPs per token of ModernBERT, counted as ``flops_per_token`` counts BERT.

    Per layer (d = hidden_size, f = intermediate_size): Wqkv ``3 d^2``, attention output ``d^2``,
    the GeGLU input ``Wi`` (d -> 2 f: input and gate) ``2 d f`` and ``Wo`` ``f d``: ``4 d^2 + 3 d f``
    weights (plus biases and norm gains when configured; both negligible), so 6x that per token.
    Attention scores and the weighted sum cost ``12 d T_l`` per token of layer l, where T_l is the
    sequence length for global layers (0, n, 2n, ...) and ``min(T, local_attention + 1)`` for
    sliding-window layers (what the banded mask lets a token see; the kernels may compute more).
    The head (dense d x d, norm, tied decoder d x V) runs at the predicted positions only."""
    d, f, L, T = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.num_hidden_layers), int(seq_len)
    if min(d, f, L, T) <= 0:
        raise ValueError("modernbert_flops_per_token: all sizes must be positive")
    every = max(int(cfg.global_attn_every_n_layers), 1)
    window = min(T, int(cfg.local_attention) + 1)
    per_layer = 4 * d * d + 3 * d * f
    attention = sum(12.0 * d * (T if layer % every == 0 else window) for layer in range(L))
    head = d * d + d + d * int(cfg.vocab_size) + int(cfg.vocab_size)
    return 6.0 * L * per_layer + attention + mlm_fraction * 6.0 * head


# --------------------------------------------------------------------------------------------
# Peak throughput and MFU
# --------------------------------------------------------------------------------------------

# Dense (no 2:4 sparsity) tensor-core peak TFLOP/s from the vendors' data sheets. "bf16"/"fp16"
# are with fp32 accumulation (what autocast uses); "fp32" is the plain CUDA-core rate; "tf32" is
# the fp32 matmul rate with TF32 tensor cores allowed. A missing dtype means "not supported in
# hardware" (V100 and T4 have no bf16 tensor cores): peak_tflops returns None and MFU is not shown.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "A10": {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "L4": {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6},
    "RTX A6000": {"bf16": 155.0, "fp16": 155.0, "tf32": 77.4, "fp32": 38.7},
    "V100 SXM": {"fp16": 125.0, "fp32": 15.7},
    "V100 PCIe": {"fp16": 112.0, "fp32": 14.0},
    "T4": {"fp16": 65.0, "fp32": 8.1},
    "RTX 4090": {"bf16": 165.0, "fp16": 165.0, "tf32": 82.6, "fp32": 82.6},
    "RTX 3090": {"bf16": 71.0, "fp16": 71.0, "tf32": 35.6, "fp32": 35.6},
    "RTX 3060 Ti": {"bf16": 32.4, "fp16": 32.4, "tf32": 16.2, "fp32": 16.2},
}

# Patterns over torch.cuda.get_device_name(), most specific first. Word boundaries keep "A10"
# from matching "A100" or "A10G", and "L4" from matching "L40S".
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b", "H100 SXM"),  # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
    (r"\bH200\b", "H200"),
    (r"\bA100\b", "A100"),  # "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB"
    (r"\bA10\b", "A10"),
    (r"\bL40S\b", "L40S"),
    (r"\bL4\b", "L4"),
    (r"\bA6000\b", "RTX A6000"),
    (r"\bV100\b.*\bPCIE\b", "V100 PCIe"),
    (r"\bV100\b", "V100 SXM"),
    (r"\bT4\b", "T4"),
    (r"\bRTX 4090\b(?! D)", "RTX 4090"),
    (r"\bRTX 3090\b(?! Ti)", "RTX 3090"),
    (r"\bRTX 3060 Ti\b", "RTX 3060 Ti"),
)

_DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "tf32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
}

PEAK_ENV_VAR = "BERTGPU_PEAK_TFLOPS"


def _dtype_key(dtype: Any) -> str:
    name = str(dtype).lower().removeprefix("torch.")
    if name not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of bf16, fp16, tf32, fp32")
    return _DTYPE_ALIASES[name]


def gpu_model(device_name: str) -> str | None:
    """The ``PEAK_TFLOPS`` key for a ``torch.cuda.get_device_name()`` string, or None."""
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return key
    return None


def peak_tflops(
    device_name: str | None, dtype: Any = "bf16", override: float | None = None
) -> float | None:
    """Dense peak TFLOP/s of one device for ``dtype`` (bf16, fp16, tf32, fp32 or a torch.dtype).

    Precedence: ``override`` (e.g. a config field), then the environment variable
    ``BERTGPU_PEAK_TFLOPS``, then the table. Returns None for unknown hardware or a dtype the
    device has no tensor cores for, which means "do not show MFU" rather than a made-up number.
    """
    if override is not None:
        if not override > 0:
            raise BertgpuError(f"peak TFLOP/s override: found {override!r}, expected a number > 0")
        return float(override)
    env = os.environ.get(PEAK_ENV_VAR, "").strip()
    if env:
        try:
            value = float(env)
        except ValueError:
            value = float("nan")
        if not value > 0 or math.isinf(value):
            raise BertgpuError(
                f"environment variable {PEAK_ENV_VAR}: found {env!r}, expected a number > 0 "
                "(TFLOP/s of one device)"
            )
        return value
    key = _dtype_key(dtype)
    model = gpu_model(device_name) if device_name else None
    if model is None:
        return None
    return PEAK_TFLOPS[model].get(key)


def mfu(
    tokens_per_s: float, flops_per_token: float, peak_tflops: float | None, n_devices: int = 1
) -> float | None:
    """Model FLOPs utilisation as a fraction: achieved model FLOP/s over the peak of all devices.

    ``tokens_per_s`` is the total over ``n_devices`` devices; ``peak_tflops`` is one device's.
    Returns None when the peak is unknown (and so MFU should not be shown).
    """
    if peak_tflops is None or peak_tflops <= 0 or n_devices <= 0:
        return None
    return tokens_per_s * flops_per_token / (peak_tflops * 1e12 * n_devices)


