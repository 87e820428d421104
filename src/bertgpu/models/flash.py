"""Flash attention over packed rows: torch's own FlashAttention-2 varlen kernel, called directly.

`torch.ops.aten._flash_attention_forward` is the kernel under SDPA's flash backend and under
nested-tensor attention. Given packed rows and `cu_seqlens` it attends within each sequence
only; it takes attention dropout and a sliding window (window_size_left/right) itself, has a
backward (autograd's derivative of the op) and a meta kernel, so `torch.compile` traces it into
one graph with no break. Calling it directly skips the nested-tensor Python dispatch, which is
host-bound in forward and backward (measured on an H100: unpadded BERT-base at 32 x 512 ran at
0.21x the padded path through nested tensors, README "Measuring speed").

Two layouts reach it:

- unpadded rows (`attention.Unpadded`): (N_tok, N, D) of the real tokens, `cu_seqlens` (B + 1,)
  from the loader's `BatchMeta`;
- padded rows (`segments`): the (B, T) batch flattened to (B T, N, D), where each row's padding
  tail is a sequence of its own. Real tokens attend to the real tokens of their row only, which
  is exactly the masked padded attention; padding attends to padding (finite garbage that no loss
  reads, as the padded SDPA path). All shapes are static and nothing depends on whether the
  batch has padding, so padded and full batches share one compiled graph.

`max_len` is passed as the padded length T, an upper bound of every sequence: the kernel only
uses it to size its grid, and a per-batch value would be a Python int that a compiled graph
guards on (one recompile per new longest sequence).

Needs CUDA and fp16/bf16 q, k, v with a head size the kernel supports (<= 256); `usable` says.
"""

from __future__ import annotations

import torch

HALF = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256
"""The largest head size FlashAttention-2 takes."""


def usable(q: torch.Tensor) -> bool:
    """The kernel exists for these inputs: CUDA, fp16/bf16, head size <= 256 (static under
    torch.compile: device, dtype and the last dimension are part of the graph)."""
    return q.is_cuda and q.dtype in HALF and q.shape[-1] <= MAX_HEAD_DIM


def flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                 max_len: int, dropout_p: float = 0.0,
                 window: int | None = None) -> torch.Tensor:
    """q, k, v (R, N, D) packed rows, `cu_seqlens` (S + 1,) int32 offsets of the S sequences
    (zero-length ones allowed) -> (R, N, D): softmax(q k^T / sqrt(D)) v within each sequence,
    with attention dropout `dropout_p` (drawn from the CUDA generator, replayed in backward), and,
    with `window`, only the keys at most `window` positions away on either side."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    side = -1 if window is None else int(window)
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, float(dropout_p), False, False,
        window_size_left=side, window_size_right=side)[0]
    return out


def segments(attention_mask: torch.Tensor | None, batch: int, seq_len: int,
             device: torch.device) -> torch.Tensor:
    """(2B + 1,) int32 `cu_seqlens` of the padded (B, T) rows flattened: row b is the sequence
    [b T, b T + len_b) of its tokens followed by [b T + len_b, (b + 1) T) of its padding (empty when
    the row is full). Right padding only (`BatchMeta.packed_ok`). Device ops, no host sync.

    A row that is all padding gets an empty first sequence and a padding sequence of T, so it
    attends everywhere, as `attention.sdpa_mask` makes the padded SDPA path do."""
    starts = torch.arange(batch, device=device, dtype=torch.int32) * seq_len  # (B,)
    if attention_mask is None:
        ends = starts + seq_len
    else:
        ends = starts + attention_mask.sum(dim=1, dtype=torch.int32)
    bounds = torch.stack((starts, ends), dim=1).reshape(-1)  # (2B,)
    total = torch.full((1,), batch * seq_len, device=device, dtype=torch.int32)
    return torch.cat((bounds, total))


def padded_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_segments: torch.Tensor,
                 dropout_p: float = 0.0, window: int | None = None) -> torch.Tensor:
    """q, k, v (B, T, N, D) right-padded rows -> (B, T, N D) through `flash_varlen` over the
    `segments` of the batch (see the module docstring)."""
    B, T = q.shape[:2]
    y = flash_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_segments, T,
                     dropout_p, window)  # (B T, N, D)
    return y.view(B, T, -1)


__all__ = ["HALF", "MAX_HEAD_DIM", "usable", "flash_varlen", "segments", "padded_flash"]
