"""Rotary position embeddings (RoPE, Su et al. 2021, arXiv:2104.09864) and sliding-window masks.

RoPE rotates each (query, key) feature pair by an angle proportional to the token's position, so
the attention score q_i . k_j depends on i - j only. We use the "rotate half" layout of Hugging
Face's Llama / ModernBERT code: feature d is paired with feature d + D/2 (not with its neighbour),
and pair d turns by `position * theta ** (-2d / D)`. The angles are computed in fp32 and the
rotation is done in fp32, as transformers does, whatever the activations' dtype.

    cos, sin = cos_sin(torch.arange(T)[None], head_dim=64, theta=160_000.0)   # (1, T, 1, D) each
    q = apply_rope(q, cos, sin)                                                # q (B, T, N, D)
"""

from __future__ import annotations

import torch


def inv_freq(head_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """(D/2,) fp32 angular frequencies theta ** (-2d / D), d = 0 .. D/2 - 1.

    Computed on the fly rather than kept as a buffer: a buffer would be cast by `model.to(bf16)`
    and lose the precision that long positions need; D/2 numbers cost nothing to recompute.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    return 1.0 / (theta ** exponents)


def cos_sin(positions: torch.Tensor, head_dim: int,
            theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer positions (...) -> cos, sin of shape (..., 1, D) in fp32.

    The trailing 1 broadcasts over the heads of a (..., N, D) query or key; each of the D/2
    angles appears twice (once per half), matching `apply_rope`'s pairing.

    The tables are computed by one opaque operator (`bertgpu::rope_cos_sin`), so a compiled model
    computes them once per forward and every layer reads them. Written as plain tensor math,
    inductor fused the angle arithmetic, `cos` and `sin` into every consumer instead: each layer's
    rotation of q and k, forward and backward, recomputed them per element (ModernBERT-base at
    32 x 1024 unpadded on an H200: 9 of the step's 60 ms of device time in those kernels)."""
    return torch.ops.bertgpu.rope_cos_sin(positions, int(head_dim), float(theta))


def _cos_sin(positions: torch.Tensor, head_dim: int,
             theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    # angles: (..., D/2)
    angles = positions.to(torch.float32)[..., None] * inv_freq(head_dim, theta, positions.device)
    angles = torch.cat((angles, angles), dim=-1)[..., None, :]  # (..., 1, D)
    return angles.cos(), angles.sin()


@torch.library.custom_op("bertgpu::rope_cos_sin", mutates_args=())
def _rope_cos_sin(positions: torch.Tensor, head_dim: int,
                  theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _cos_sin(positions, head_dim, theta)


@_rope_cos_sin.register_fake
def _(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (*positions.shape, 1, head_dim)
    return (positions.new_empty(shape, dtype=torch.float32),
            positions.new_empty(shape, dtype=torch.float32))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (d, d + D/2) of `x` (..., N, D) by the angles behind cos/sin;
    same dtype out."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)  # the 90-degree turn of each pair
    return (xf * cos + rotated * sin).to(x.dtype)


def sliding_window_mask(seq_len: int, local_attention: int,
                        device: torch.device | None = None) -> torch.Tensor:
    """(T, T) bool, True where query i may attend to key j: |i - j| <= local_attention // 2.

    ModernBERT's `local_attention` is the whole window (128 = 64 tokens each side plus the token
    itself), as transformers' `create_bidirectional_sliding_window_mask` and the flash kernel's
    window_size=(64, 64) both read it.
    """
    pos = torch.arange(seq_len, device=device)
    return (pos[:, None] - pos[None, :]).abs() <= local_attention // 2


__all__ = ["inv_freq", "cos_sin", "apply_rope", "sliding_window_mask"]
