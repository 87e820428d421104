"""Learning-rate schedules as pure functions of training progress, and the wall-clock budget.

The schedule sees only `progress` in [0, 1]: `step / max_steps` in step mode, or
`elapsed / budget` in budget mode (Cramming, Geiping & Goldstein 2022). The peak lr is applied by
the caller: `lr = peak_lr * lr_factor(progress, ...)`.

In step mode optimizer step k (0-based, so k = 0 .. max_steps - 1) runs at progress
k / max_steps, the convention of transformers' schedulers (`get_linear_schedule_with_warmup`: the
lr of step k is lambda(k)) and of BERT's TF optimization.py (global_step from 0): the first step
starts the warm-up, the last runs at (N - 1) / N, just before the decay reaches `min_lr_ratio`.
(Taking the progress after the step instead spent the last step, at lr 0 by default, on nothing.)

In budget mode the clock is read on rank 0 only and broadcast, so every rank sets the same lr and
takes the same stop decision (per-rank clocks drift apart and would desynchronise the schedule).
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertgpu.config.sections import DECAYS, check_decay_span
from bertgpu.errors import BertgpuError
from bertgpu.train import distributed


def lr_factor(
    progress: float,
    warmup: float,
    decay: str,
    min_ratio: float = 0.0,
    power: float = 1.0,
    decay_fraction: float = 0.1,
    span: str = "after_warmup",
) -> float:
    """Multiplier of the peak lr at `progress` (clamped to [0, 1]).

    Linear warm-up from 0 to 1 over the first `warmup` fraction, then the decay shape of t from 1
    down to `min_ratio` at progress 1. `span` says what linear, cosine and polynomial decay over:
      after_warmup  t = (progress - warmup) / (1 - warmup), the post-warm-up fraction: the decay
                    starts at 1 when the warm-up ends (transformers' schedulers)
      whole_run     t = progress: the decay runs over the whole run and the warm-up overrides its
                    start, so the lr drops from 1 to the decay's value at `warmup` as the warm-up
                    ends (NVIDIA's BERT PolyWarmUpScheduler: (1 - progress) ** degree; BERT's TF
                    optimization.py: polynomial_decay over num_train_steps, power 1)
    The shapes:
      linear      straight line
      cosine      half cosine (Loshchilov & Hutter 2017)
      constant    stays at 1 (min_ratio unused)
      polynomial  (1 - t) ** power (NVIDIA's BERT recipes use power 0.5, BERT's TF code 1.0)
      triangle / one-cycle  linear up to the peak at `warmup`, linear down to min_ratio; the same
                  as linear here, named for Cramming's "one-cycle" recipe (warmup around 0.5)
      wsd         warmup-stable-decay (trapezoidal): 1 until the last `decay_fraction` of training,
                  then 1 - sqrt(u) over it, u the fraction of the decay done (Hägele et al. 2024,
                  arXiv:2405.18392: 1-sqrt beats a linear cool-down; ModernBERT's schedule). The
                  decay never starts before the warm-up ends.
    """
    if decay not in DECAYS:
        raise BertgpuError(f"schedule.decay {decay!r}: expected one of {', '.join(DECAYS)}")
    check_decay_span(decay, span)
    p = min(max(float(progress), 0.0), 1.0)
    # A warm-up of the whole run or longer (warmup >= 1: warmup_steps >= max_steps) ramps at its
    # own pace to its end, p / warmup, and never reaches a decay: at p = 1 it is at 1 / warmup.
    if warmup > 0.0 and (p < warmup or warmup >= 1.0):
        return p / warmup
    if decay == "constant":
        return 1.0
    if decay == "wsd":
        start = max(warmup, 1.0 - decay_fraction)
        if p < start:
            return 1.0
        u = 1.0 if start >= 1.0 else (p - start) / (1.0 - start)
        return min_ratio + (1.0 - min_ratio) * (1.0 - math.sqrt(u))
    t = p if span == "whole_run" else (p - warmup) / (1.0 - warmup)  # (warmup < 1 here)
    if decay in ("linear", "triangle", "one-cycle"):
        shape = 1.0 - t
    elif decay == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * t))
    else:  # polynomial
        shape = (1.0 - t) ** power
    return min_ratio + (1.0 - min_ratio) * shape


def progress_from_steps(step: int, max_steps: int) -> float:
    """Fraction of training done after `step` optimizer steps."""
    if max_steps <= 0:
        return 1.0
    return min(max(step / max_steps, 0.0), 1.0)


def warmup_fraction(warmup_steps: int | None, warmup_fraction: float | None,
                    max_steps: int) -> float:
    """The warm-up as a fraction of training, from either knob (steps win when both are set).
    Not clipped: warm-up steps past max_steps give a fraction above 1, so the ramp keeps the
    slope of the `warmup_steps` it was given (clipped to 1 it ramped over the run instead, 10x
    as steep for 50 warm-up steps in a 5-step run)."""
    if warmup_steps is not None:
        return 0.0 if max_steps <= 0 else warmup_steps / max_steps
    return float(warmup_fraction or 0.0)


@dataclass(frozen=True)
class Knobs:
    """How a command names what `warmup_note` speaks of: the run's length (`run`, formatted with
    `n` steps and `s`, the plural's s), how to give it more steps, and the two warm-up keys."""

    run: str
    more_steps: str
    warmup_steps: str
    warmup_fraction: str


PRETRAIN = Knobs("train.max_steps {n}", "train.max_steps", "schedule.warmup_steps",
                 "schedule.warmup_fraction")
FINETUNE = Knobs("a run of {n} step{s}", "more epochs, or a smaller global_batch_size",
                 "warmup_steps", "warmup_fraction")


def warmup_note(schedule: Any, train: Any, peak_lr: float, knobs: Knobs = PRETRAIN) -> str | None:
    """The start-up warning of a run that trains nothing, ends inside (or right at the end of)
    its warm-up, or never reaches wsd's decay (`[schedule]` and `[train]` sections; `knobs`: the
    command's names of them).

    A run of one step with any warm-up takes that step at lr 0, where the warm-up starts (in
    budget mode too: a warm-up in steps ramps step / warmup_steps, and a warm-up fraction of the
    budget is next to 0 when the clock has just started), and says so plainly. Else, in step mode,
    a warm-up of the whole run or longer: what the lr does and where it ends. None otherwise (in
    budget mode a warm-up in steps ramps over steps, not over the budget)."""
    warmup_steps, warmup_fraction = schedule.warmup_steps, schedule.warmup_fraction
    max_steps = int(train.max_steps or 0)
    if max_steps <= 0:
        return None
    run = knobs.run.format(n=max_steps, s="" if max_steps == 1 else "s")
    key, value = ((knobs.warmup_steps, warmup_steps) if warmup_steps is not None
                  else (knobs.warmup_fraction, warmup_fraction or 0.0))
    if max_steps == 1 and value > 0:
        shown = value if warmup_steps is not None else f"{value:g}"
        return (f"{key} {shown} with {run}: step 1 runs at lr 0, where the warm-up starts: the "
                f"run trains nothing; give it more steps ({knobs.more_steps}) or no warm-up "
                f"({key} 0)")
    if train.budget_hours:
        return None
    if warmup_steps is not None:
        if warmup_steps < max_steps:
            return _decay_note(schedule, max_steps, run, knobs)
        knob = f"{key} {warmup_steps} >= {run}"
        length = warmup_steps
    elif value >= 1.0:
        knob = f"{key} {value:g} ({run})"
        length = max_steps
    else:
        return _decay_note(schedule, max_steps, run, knobs)
    last = peak_lr * (max_steps - 1) / length  # the lr of the last step, k = max_steps - 1
    return (f"{knob}: the warm-up takes the whole run, with no decay: the lr rises from 0 by "
            f"{peak_lr / length:.3g} per step (the peak lr {peak_lr:.3g} / {length} steps) and "
            f"the last step runs at {last:.3g}, {(max_steps - 1) / length:.0%} of the peak")


def _decay_note(schedule: Any, max_steps: int, run: str, knobs: Knobs) -> str | None:
    """wsd decays over the last `decay_fraction` of the run: in a run where that is less than a
    step, no step takes it and the run ends at the peak lr (a 5-step run at the default 0.1)."""
    fraction = schedule.decay_fraction
    if schedule.decay != "wsd" or max_steps < 2 or schedule.min_lr_ratio >= 1.0:
        return None
    warmup = warmup_fraction(schedule.warmup_steps, schedule.warmup_fraction, max_steps)
    last = lr_factor((max_steps - 1) / max_steps, warmup, "wsd", schedule.min_lr_ratio,
                     schedule.power, fraction, schedule.decay_span)
    if last < 1.0:
        return None
    larger = ", or a larger schedule.decay_fraction" if knobs is PRETRAIN else ""
    return (f"schedule.decay wsd with decay_fraction {fraction:g} and {run}: the decay starts "
            f"after the last step, so every step after the warm-up runs at the peak lr and the "
            f"run ends there; give it more steps ({knobs.more_steps}){larger}")


def warn_warmup(schedule: Any, train: Any, peak_lr: float, say: bool = True,
                knobs: Knobs = PRETRAIN) -> None:
    """`warmup_note` as a warning of the caller's (on the rank that `say`s it)."""
    note = warmup_note(schedule, train, peak_lr, knobs)
    if note and say:
        warnings.warn(note, stacklevel=2)


class BudgetClock:
    """Training wall-clock for budget mode, shared by all ranks.

    `elapsed_s` accumulates only while the clock runs and is stored in checkpoints, so a resumed
    run continues the same budget instead of restarting it. The loop starts it when its step loop
    begins (after the first evaluation of a continued run) and does not pause it: steps (the
    compiling ones too), evaluations and checkpoint writes count; the start-up before the loop
    and, after a crash, the time since the checkpoint resumed from do not. That is not the
    metrics log's `elapsed_s` (telemetry/metrics.py): train records carry this clock as
    `budget_elapsed_s` and `budget_left_s` (`fields()`), which the ETA of the console and of
    `bertgpu watch` use, so they say when the run stops. In the loop, rank 0 reads its clock
    at the start of each step (`read()`), the reading rides on the step's all-reduce, and every
    rank then takes it (`agree()`): `progress()` and `expired_agreed()` use only agreed values, so
    every rank sets the same lr and stops at the same step. `sync()` (a broadcast from rank 0)
    agrees at once: the loop calls it after an evaluation, a save and a compiled run's first
    step, which may use up the budget between two steps' readings.
    """

    def __init__(self, budget_s: float, time_fn: Callable[[], float] = time.monotonic) -> None:
        if budget_s <= 0:
            raise BertgpuError("train.budget_hours: expected a positive number, got "
                               f"{budget_s / 3600:g}")
        self.budget_s = float(budget_s)
        self.time_fn = time_fn
        self.elapsed_s = 0.0
        self._started_at: float | None = None
        self._read_at: float | None = None

    def start(self) -> None:
        """(Re)start counting from now, on top of `elapsed_s`."""
        self._started_at = self.time_fn()
        self._read_at = None

    def pause(self) -> None:
        """Stop counting (e.g. around evaluation or checkpoint writes,
        if excluded from the budget)."""
        self.sync()
        self._started_at = None

    def sync(self) -> float:
        """Fold the time since the last call into `elapsed_s`, take rank 0's value everywhere."""
        self.agree(self.read())
        self.elapsed_s = float(distributed.broadcast_scalar(self.elapsed_s, src=0))
        return self.elapsed_s

    def progress(self) -> float:
        """elapsed / budget, clamped to [0, 1], as last agreed."""
        return min(self.elapsed_s / self.budget_s, 1.0)

    def expired(self) -> bool:
        """Collective: syncs the clock, True on every rank once the budget is used up."""
        self.sync()
        return self.elapsed_s >= self.budget_s

    def read(self) -> float:
        """This rank's clock now, without a collective and without changing what `progress()`
        says: rank 0's reading is sent to the others by the caller, and every rank takes it with
        `agree()`. (Folding it in here made rank 0 set the step's lr from its fresh reading and
        the other ranks from the previous one: the DDP replicas drifted apart.)"""
        if self._started_at is None:
            return self.elapsed_s
        self._read_at = self.time_fn()
        return self.elapsed_s + self._read_at - self._started_at

    def agree(self, elapsed_s: float) -> None:
        """Take the agreed elapsed time (rank 0's `read()`, received with the step's all-reduce).
        The clock keeps counting from the moment of that read: the step between the read and the
        agreement is training time too."""
        self.elapsed_s = float(elapsed_s)
        if self._read_at is not None and self._started_at is not None:
            self._started_at = self._read_at
        self._read_at = None

    def cut_note(self, step: int) -> str | None:
        """What a budget run that its step limit stopped early says: its lr follows the clock, so
        it ended before its decay (None when the budget was nearly used up anyway)."""
        if self.progress() >= 0.95:
            return None
        used = self.elapsed_s
        used_text = (f"{used:.0f} s" if used < 120 else f"{used / 60:.0f} min" if used < 7200
                     else f"{used / 3600:.1f} h")
        return (f"the step limit ended this {self.budget_s / 3600:g} h budget run at step {step} "
                f"after {used_text} ({self.progress():.0%}): its lr follows the clock and had not "
                "decayed; allow more steps (train.max_steps, in budget mode an upper bound) to "
                "train to the budget")

    def fields(self) -> dict[str, float]:
        """For a train record: `budget_elapsed_s`, the agreed elapsed time (what `progress()`
        and the stop decision use), and `budget_left_s`, the budget minus it."""
        return {"budget_elapsed_s": self.elapsed_s,
                "budget_left_s": max(self.budget_s - self.elapsed_s, 0.0)}

    def expired_agreed(self) -> bool:
        """True once the agreed elapsed time has used up the budget (no collective)."""
        return self.elapsed_s >= self.budget_s

    def state_dict(self) -> dict[str, float]:
        """The clock now (a checkpoint's: rank 0's, which writes it), not as last agreed at the
        start of the step: the step, its evaluation and the save count, as the loop counts them.
        A run resumed from the agreed value lost them on every crash and trained past its
        budget."""
        now = self.elapsed_s
        if self._started_at is not None:
            now += self.time_fn() - self._started_at
        return {"elapsed_s": float(now), "budget_s": self.budget_s}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.elapsed_s = float(state["elapsed_s"])
        if self._started_at is not None:
            self._started_at = self.time_fn()
        self._read_at = None


@dataclass(frozen=True)
class Schedule:
    """The learning rate of a step: `peak_lr * lr_factor(progress, ...)`.

    Warm-up is a fraction of progress (`warmup_fraction`), or a number of optimizer steps
    (`warmup_steps`, which wins). In step mode the two are the same thing (steps / max_steps). In
    budget mode progress is wall-clock time, so a warm-up given in steps stays in steps: step k
    (0-based) runs at k / warmup_steps of the clock's decay shape, the ramp of step mode (step 0
    at lr 0, step warmup_steps at the peak), and at the shape alone from there (a step count is
    not a fraction of a time budget). The clock's shape then decays over the whole budget,
    whatever `decay_span` says: its warm-up is 0."""

    peak_lr: float
    decay: str = "linear"
    warmup_fraction: float = 0.0
    warmup_steps: int | None = None
    max_steps: int = 0
    budget_mode: bool = False
    min_lr_ratio: float = 0.0
    power: float = 1.0
    decay_fraction: float = 0.1
    """wsd only: the last fraction of training over which the lr decays."""
    decay_span: str = "after_warmup"
    """What linear, cosine and polynomial decay over: "after_warmup" or "whole_run" (lr_factor)."""

    def lr(self, progress: float, step: int) -> float:
        """lr of optimizer step `step` (0-based) taken at training progress `progress` (step
        mode: `step / max_steps`, so step 0 is at 0 and the last at (max_steps - 1) / max_steps)."""
        if self.budget_mode and self.warmup_steps:
            # step / W, as step k of step mode at progress k / N ramps k / W: (step + 1) / W ran
            # one step ahead, its first step at lr / W (and warmup_steps 1 was no warm-up at all)
            ramp = min(step / self.warmup_steps, 1.0)
            return self.peak_lr * ramp * lr_factor(progress, 0.0, self.decay, self.min_lr_ratio,
                                                   self.power, self.decay_fraction,
                                                   self.decay_span)
        warmup = warmup_fraction(self.warmup_steps, self.warmup_fraction, self.max_steps)
        return self.peak_lr * lr_factor(progress, warmup, self.decay, self.min_lr_ratio, self.power,
                                        self.decay_fraction, self.decay_span)
