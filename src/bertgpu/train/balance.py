"""Stragglers made visible, and the global batch shared in proportion to each rank's speed.

In data parallel training every step waits for the slowest rank. Each rank measures its own
compute time per step (the step's wall time minus the time it spent waiting: for data, and for
the gradient all-reduce beyond the backward, which is where a fast rank waits for a slow one).

- `RankTimes.gather()` (one small all-reduce per log window) gives every rank's compute time of
  the window; the log names the slowest rank and how much slower it is than the median of the
  other ranks (`straggler_fields`).
- With `[distributed] balance = "auto"`, after every `balance_every_steps` steps the ranks agree
  on new shares of the global batch, proportional to their measured sequences per second
  (`shares_for`): a rank twice as fast takes twice the samples. The global batch, the global
  sample order (rank r takes the next n_r samples of the step's window, in rank order) and the
  loss normalisation (by the counts of the whole step) are the same as without balancing, so the
  trained model does not depend on it (up to floating-point summation order).

Shares go into checkpoints; a resume at the same world size keeps them, at another one starts
from equal shares and measures again.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch

from bertgpu.errors import BertgpuError
from bertgpu.train import distributed


def equal_shares(global_batch: int, world: int) -> list[int]:
    """G / W each (the configuration guarantees that it divides)."""
    return [global_batch // world] * world


def shares_for(speeds: Sequence[float], global_batch: int, minimum: int = 1) -> list[int]:
    """Integer shares of `global_batch` proportional to `speeds` (sequences/s of each rank), at
    least `minimum` each, summing exactly to `global_batch` (largest-remainder rounding; ties go
    to the lower rank, so every rank computes the same answer from the same numbers)."""
    world = len(speeds)
    if world * minimum > global_batch:
        raise BertgpuError(f"global batch {global_batch} cannot give {world} ranks {minimum} "
                           "sequences each")
    clean = [s if s > 0 and s == s and s != float("inf") else 0.0 for s in speeds]
    total = sum(clean)
    if total <= 0:
        return (equal_shares(global_batch, world) if global_batch % world == 0
                else _spread(global_batch, world))
    ideal = [global_batch * s / total for s in clean]
    shares = [max(minimum, int(x)) for x in ideal]
    # One sequence at a time: to the rank furthest below its ideal share, or (when raising the
    # small ones to the minimum cost too much) from the rank furthest above it; ties go to the
    # lower rank, so every rank computes the same answer.
    while sum(shares) < global_batch:
        r = max(range(world), key=lambda q: (ideal[q] - shares[q], -q))
        shares[r] += 1
    while sum(shares) > global_batch:
        r = max((q for q in range(world) if shares[q] > minimum),
                key=lambda q: (shares[q] - ideal[q], -q))
        shares[r] -= 1
    return shares


def _spread(global_batch: int, world: int) -> list[int]:
    q, rest = divmod(global_batch, world)
    return [q + (1 if r < rest else 0) for r in range(world)]


class RankTimes:
    """This rank's compute seconds and sequences since the last `gather` / `reset`."""

    def __init__(self, world: int, rank: int) -> None:
        self.world, self.rank = world, rank
        self.compute_s = 0.0
        self.sequences = 0
        self.steps = 0

    def add(self, compute_s: float, sequences: int) -> None:
        self.compute_s += max(compute_s, 0.0)
        self.sequences += int(sequences)
        self.steps += 1

    def gather(self) -> tuple[list[float], list[int]]:
        """(compute seconds, sequences) of every rank since the last gather; collective. Resets."""
        mine = torch.zeros(2 * self.world, dtype=torch.float64)
        mine[self.rank], mine[self.world + self.rank] = self.compute_s, float(self.sequences)
        both = distributed.host_all_reduce_sum(mine).tolist()
        self.compute_s, self.sequences, self.steps = 0.0, 0, 0
        return both[: self.world], [int(round(x)) for x in both[self.world:]]


def straggler_fields(compute_s: Sequence[float]) -> dict[str, object]:
    """Log fields of one window (two ranks or more): every rank's compute seconds, the slowest
    rank, and its time over the median of the *other* ranks (1.0 = not slower). Over the median
    of all ranks the ratio could never pass 2 with two ranks (their median is their mean), and a
    rank 8x slower read 1.78x; against the others it reads 8x."""
    slowest = max(range(len(compute_s)), key=lambda r: (compute_s[r], -r))
    others = [x for r, x in enumerate(compute_s) if r != slowest] or list(compute_s)
    median = statistics.median(others)
    return {"rank_compute_s": [round(x, 6) for x in compute_s], "slowest_rank": slowest,
            "slowest_vs_median": compute_s[slowest] / median if median > 0 else None}


def speeds_of(compute_s: Sequence[float], sequences: Sequence[int]) -> list[float]:
    """Sequences per second of each rank over a window."""
    return [n / s if s > 0 else 0.0 for s, n in zip(compute_s, sequences, strict=True)]


def rebalance(task: Any, times: RankTimes, global_batch: int, step: int,
              say: Callable[[str], None]) -> None:
    """Collective: new shares of the global batch for `task` (`shares()` / `set_shares()`) from
    every rank's speed measured in `times`; `say` tells of a change."""
    compute_s, sequences = times.gather()
    if not all(sequences):  # a rank measured nothing (every step of its window compiled): its
        return  # speed is unknown, not 0, which gave it the minimum share
    speeds = speeds_of(compute_s, sequences)
    shares = shares_for(speeds, global_batch)
    if shares != task.shares():
        task.set_shares(shares)
        say(f"step {step}: batch shares per rank {shares} (sequences/s measured: "
            f"{', '.join(f'{x:.1f}' for x in speeds)})")
