"""Dropout with torch's distribution, drawn more cheaply on the CPU.

On the CPU, `F.dropout` draws its mask with `bernoulli_`, which runs on one thread at about 8 ns
per element: BERT-base training at sequence length 128 draws 38 M of them per step (37 masks) and
spent 11% of a 2-thread step there (torch.profiler, torch 2.13). Here a CPU mask compares 31-bit
random integers with p * 2**31: an element is dropped with probability p (to 2**-31, where
`bernoulli_` compares a 24-bit float) and the kept ones are scaled by 1 / (1 - p), as `F.dropout`
does. The draws come from torch's default CPU generator, so `torch.manual_seed` and the RNG
states a checkpoint saves govern them as before; the masks differ from `F.dropout`'s draw for
draw, not in distribution. The integer draw is serial, so a mask does not depend on the number of
threads either.

On CUDA outside `torch.compile`, `F.dropout` (Philox) is what runs. Inside `torch.compile`,
inductor's own Philox, fused into its neighbours, was the default until its random numbers were
measured: on an H200 (BERT-base 256 x 128, bf16, compiled) the kernel
that adds a dropped-out sublayer output to the residual and normalises moved 1.55 TB/s against
3.7 without the in-kernel Philox. Drawing 16-bit masks in bulk with torch's `randint` instead
halved that kernel (3.36 -> 1.79 ms per step) but the draw itself took 1.73 ms: no net gain, so
not kept (a draw of half as many int32 values, split in two, is the untried next step).

Compiled dropout's default (issue 24) is a counter hash. Each element's keep bit comes from two
rounds of a 32-bit integer hash (xor-shift-multiply, Wellons' "lowbias32" constants) of its flat
index, keyed by two random int32 seeds per call drawn from torch's generator. Inductor fuses the
integer arithmetic into the kernel that consumes the mask (about 16 integer operations per element
against Philox's ten rounds), and because the mask is a pure function of (index, seed) it is
recomputed in backward instead of saved as a bool mask (the region is checkpointed, which tags it
for recomputation: the partitioner's own heuristics kept BERT's masks): one byte less written and
read per element per dropout site. On the H200 (BERT-base 256 x 128, bf16, compiled,
benchmarks/gpu_profile.py) it took the dropout + residual + LayerNorm kernel from 3.44 to 1.22 ms
per step and the step's device time from 47.5 to 45.4 ms (wall 48.4 -> 47.7 ms; the compile
warm-up grew from 29 to 47 s). `BERTGPU_COMPILED_DROPOUT=philox` (read at import;
`set_compiled_dropout` in tests and benchmarks) goes back to `F.dropout` inside compiled code.

    x = dropout(x, 0.1, training=True)             # (any shape), same dtype and device
    self.dropout = Dropout(config.hidden_dropout_prob)   # nn.Dropout's name, repr and state dict
"""

from __future__ import annotations

import math
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn

_BITS = 2**31
"""`random_()` on int32 draws uniformly from [0, 2**31)."""


COMPILED_DROPOUT = ("hash", "philox")
"""How compiled code draws dropout masks: "hash" (the default) is `hash_dropout`, "philox" is
`F.dropout` (inductor's in-kernel Philox)."""
_compiled = os.environ.get("BERTGPU_COMPILED_DROPOUT", "hash")


def set_compiled_dropout(name: str) -> str:
    """Choose how compiled code draws dropout masks; returns the previous choice. Dynamo guards on
    it, so a compiled model already traced recompiles on the next call after a change."""
    global _compiled
    if name not in COMPILED_DROPOUT:
        raise ValueError(f"compiled dropout {name!r}: expected one of "
                         f"{', '.join(COMPILED_DROPOUT)}")
    old, _compiled = _compiled, name
    return old


if _compiled not in COMPILED_DROPOUT:  # a typo in an experiment's switch: say so, run as usual
    warnings.warn(f"BERTGPU_COMPILED_DROPOUT={_compiled!r}: expected one of "
                  f"{', '.join(COMPILED_DROPOUT)}; using hash", stacklevel=1)
    _compiled = "hash"

# lowbias32's odd multipliers (C. Wellons, "Prospecting for hash functions"), as signed int32.
_M1, _M2 = 0x7FEB352D, 0x846CA68B - 2**32


def _mix(h: torch.Tensor) -> torch.Tensor:
    """A bijection of int32 with full avalanche. Shifts are logical (masked after torch's
    arithmetic shift) and products wrap, as in C and Triton."""
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * _M1
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * _M2
    return h ^ ((h >> 16) & 0xFFFF)


def hash_keep(shape: torch.Size, seeds: torch.Tensor, p: float) -> torch.Tensor:
    """The keep mask (bool, `shape`) of `hash_dropout`: element i is kept where the hash of
    (i, seeds) in 31 bits is at least p * 2**31. `seeds`: 2 int32 values."""
    idx = torch.arange(math.prod(shape), dtype=torch.int32, device=seeds.device).view(shape)
    h = _mix(_mix(idx + seeds[0]) ^ seeds[1])
    return (h & 0x7FFFFFFF) >= round(p * _BITS)


def hash_dropout(x: torch.Tensor, p: float, seeds: torch.Tensor | None = None) -> torch.Tensor:
    """Dropout whose mask is a counter hash of each element's flat index (`hash_keep`), keyed by
    `seeds` (2 int32; drawn from torch's generator on x's device when None). Same distribution
    as `F.dropout` to 2**-31; the mask differs draw for draw."""
    if seeds is None:
        seeds = torch.randint(-2**31, 2**31 - 1, (2,), dtype=torch.int32, device=x.device)
    if torch.compiler.is_compiling():
        # Marked for recomputation (a checkpointed region: its nodes are tagged so): left to its
        # heuristics, the partitioner saved BERT's masks anyway, one bool per element, because
        # every site's index ramp is one node after CSE, used far apart, and the hash is a long
        # fusible chain. Recomputed, the mask is written nowhere and read from nowhere.
        from torch.utils.checkpoint import checkpoint

        keep = checkpoint(hash_keep, x.shape, seeds, p, use_reentrant=False)
    else:
        keep = hash_keep(x.shape, seeds, p)
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Zero each element of `x` with probability `p` and scale the rest by 1 / (1 - p)."""
    if not training or p == 0.0:
        return x
    if (_compiled == "hash" and p < 1.0 and x.numel() < 2**31
            and torch.compiler.is_compiling()):
        return hash_dropout(x, p)
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    keep = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_() >= round(p * _BITS)
    # One multiply by a scaled float mask, forward and backward: measured 3x faster on the CPU
    # than masked_fill, whose backward is slow; autograd keeps the mask (4 bytes per element).
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


class Dropout(nn.Dropout):
    """`nn.Dropout` drawing its mask through `dropout` (same `p`, name and repr; no state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


__all__ = ["COMPILED_DROPOUT", "Dropout", "dropout", "hash_dropout", "hash_keep",
           "set_compiled_dropout"]
