"""FLOPs per token, peak throughput of known GPUs, and model FLOPs utilisation (MFU).

    fpt = flops_per_token_from_config(model_cfg, seq_len=128, mlm_fraction=0.15)  # by architecture
    fpt = flops_per_real_token(model_cfg, [12, 40, 7], mlm_fraction=0.0)  # unpadded sequences
    peak = peak_tflops(torch.cuda.get_device_name(), "bf16")   # None on unknown hardware
    mfu(tokens_per_s, fpt, peak, n_devices=world_size)          # 0.42 means 42 %

The FLOP count is nanoGPT's / PaLM appendix B's: 6 N per token for the weights plus the
attention scores, and the MLM decoder only at predicted positions (see ANCHORS.md). Tokens are
real (non-padding) tokens: the training loop and `bench` count those, and padding is no useful
work, so a batch of sequences shorter than its width is counted by `flops_per_real_token`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

from bertgpu.errors import BertgpuError

_GIB = float(1 << 30)


def flops_per_token_from_config(cfg: Any, seq_len: int, mlm_fraction: float = 1.0,
                                with_nsp: bool = True) -> float:
    """Training FLOPs per token of the model `cfg` describes (a BertConfig or ModernBertConfig, or
    a transformers config with the same field names), by its architecture's own count
    (`models/<name>/cost.py`); with_nsp applies to architectures with a next-sentence head."""
    from bertgpu.models.build import spec_of_config

    return spec_of_config(cfg).flops_per_token(cfg, seq_len, mlm_fraction, with_nsp)


def flops_per_real_token(cfg: Any, lengths: Iterable[int], mlm_fraction: float = 1.0,
                         with_nsp: bool = True) -> float:
    """Training FLOPs per real token of sequences of these real (unpadded) `lengths`, in tokens.

    Each sequence is counted at its own length n_i, weighted by its n_i tokens: the attention
    scores grow with the length a token attends over, and a per-sequence head (BERT's pooler and
    NSP) is paid once per sequence. For BERT the average is ``6 N + 12 L d sum(n_i^2) / sum(n_i)``
    (+ the heads), where `flops_per_token_from_config` at the padded width T would charge every
    real token ``12 L d T``: fine-tuning MFU overstated 1.02x (BERT-base, T 128, sentences of 25)
    to 1.79x (ModernBERT-base, T 8192, documents of 512). ModernBERT's sliding-window layers see
    the keys their band allows in a sequence of n_i, as its own count says. Packed pretraining
    rows are all full, and then this equals `flops_per_token_from_config` at T.
    """
    values, counts = np.unique(np.fromiter(lengths, dtype=np.int64), return_counts=True)
    if values.size and values[0] < 0:
        raise ValueError(f"flops_per_real_token: a negative length ({values[0]})")
    weights = values * counts  # tokens of each length; empty sequences weigh nothing
    if weights.sum() <= 0:
        raise ValueError("flops_per_real_token: no real tokens in the sequences")
    total = sum(float(w) * flops_per_token_from_config(cfg, int(n), mlm_fraction, with_nsp)
                for n, w in zip(values.tolist(), weights.tolist(), strict=True) if w)
    return total / float(weights.sum())


def finetune_flops_per_token(model: Any, lengths: Iterable[int], head: str) -> float:
    """Training FLOPs per real token of fine-tuning `model` (a bertgpu model with `head`) on
    sequences of these real `lengths`: the encoder (`flops_per_real_token`, no MLM or NSP head)
    plus a head that runs at every token (QA spans, token labels): 6 x its matrices' weights,
    outside the encoder. ModernBERT's run its d x d MLM dense layer first, left out before: 0.5%
    of ModernBERT-base's count at T 384, 3% of modern-tiny's. A per-sequence head (classification)
    costs nothing per token worth counting, as BERT's pooler in `flops_per_real_token`."""
    import torch

    encoder = flops_per_real_token(model.config, lengths, mlm_fraction=0.0, with_nsp=False)
    if head not in ("qa", "token_classification"):
        return encoder
    from bertgpu.models.build import spec_of_config

    inside = spec_of_config(model.config).encoder_prefix  # "bert." / "model."
    weights = sum(m.weight.numel() for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and not f"{name}.".startswith(inside))
    return encoder + 6.0 * weights


# --------------------------------------------------------------------------------------------
# Peak throughput and MFU
# --------------------------------------------------------------------------------------------

# Dense (no 2:4 sparsity) tensor-core peak TFLOP/s from the vendors' data sheets. "bf16"/"fp16"
# are with fp32 accumulation (what autocast uses); "fp32" is the plain CUDA-core rate; "tf32" is
# the fp32 matmul rate with TF32 tensor cores allowed (without them, V100 and T4, the fp32 rate).
# Another missing dtype means "not supported in hardware" (V100 and T4 have no bf16 tensor cores):
# peak_tflops returns None and MFU is not shown.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
    "H200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},  # the SXM part
    "H200 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0},
    # GH200 Grace Hopper (96 GB HBM3 or 144 GB HBM3e): an H100-class GPU; NVIDIA's GH200 data
    # sheet gives the H100 SXM's dense rates (bf16 990, 1,979 with sparsity; TF32 494; FP32 67).
    "GH200": {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0},
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
# from matching "A100" or "A10G", "L4" from matching "L40S", and "H200" from "GH200"; an NVL or
# PCIe part comes before its family's SXM entry, which would match it too.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe"),
    (r"\bH100\b.*\bNVL\b", "H100 NVL"),
    (r"\bH100\b", "H100 SXM"),  # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
    (r"\bH200\b.*\bNVL\b", "H200 NVL"),
    (r"\bH200\b", "H200"),  # "NVIDIA H200"
    (r"\bGH200\b", "GH200"),  # "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"
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

RUN_PEAK_DTYPE = {"bf16": "bf16", "fp16": "fp16", "fp32": "tf32"}
"""The peak a run's MFU is measured against, by its `impl.precision`: an fp32 run's matrix
products take TF32 where the card has it (the table's fp32 peak where it has not)."""


def _dtype_key(dtype: Any) -> str:
    name = str(dtype).lower().removeprefix("torch.")
    if name not in _DTYPE_ALIASES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of bf16, fp16, tf32, fp32")
    return _DTYPE_ALIASES[name]


def gpu_model(device_name: str) -> str | None:
    """The ``PEAK_TFLOPS`` key for a ``torch.cuda.get_device_name()`` string, or None. A laptop
    part ("NVIDIA GeForce RTX 4090 Laptop GPU") is another chip with about half the desktop
    card's peak: None, not the desktop's (its MFU read half the true value)."""
    if re.search(r"\b(Laptop|Mobile|Max-Q)\b", device_name, flags=re.IGNORECASE):
        return None
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
    return peak_and_source(device_name, dtype, override)[0]


def peak_and_source(
    device_name: str | None, dtype: Any = "bf16", override: float | None = None
) -> tuple[float | None, str | None]:
    """``peak_tflops`` and where it came from: "--peak-tflops" (the override), the environment
    variable's name, or the table entry ("table: H100 SXM bf16"); (None, None) when unknown."""
    if override is not None:
        if not override > 0 or math.isinf(override):  # inf would show every MFU as 0
            raise BertgpuError(f"peak TFLOP/s override: found {override!r}, expected a finite "
                               "number > 0")
        return float(override), "--peak-tflops"
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
        return value, PEAK_ENV_VAR
    key = _dtype_key(dtype)
    model = gpu_model(device_name) if device_name else None
    if key == "tf32" and model is not None and "tf32" not in PEAK_TFLOPS[model]:
        key = "fp32"  # no TF32 tensor cores (V100, T4): fp32 matrix products at the fp32 rate
    peak = PEAK_TFLOPS[model].get(key) if model is not None else None
    return (peak, f"table: {model} {key}") if peak is not None else (None, None)


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


