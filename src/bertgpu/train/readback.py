"""What one optimizer step reports, and how its device numbers reach the host without stalling.

The engine (`engine.py`) decides a skipped step on the device and queues the update behind the
backward; the loss terms, the grad norm and the non-finite flags it computed are read by the host
afterwards. `PendingStep` carries them there: on CUDA a copy into pinned memory queued behind the
step's kernels, with an event after it, so reading waits for that copy and nothing queued later.
`StepResult` is what `Engine.train_step` returns: the numbers the host already knows (lr, counts,
signals) as fields, the device's (`StepNumbers`) read when first asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bertgpu.errors import BertgpuError


@dataclass
class StepNumbers:
    """What the device computed in one step, as the host reads it (global: the same on every
    rank)."""

    losses: dict[str, float]
    """Per-term normalised losses, e.g. {"mlm": 2.1, "nsp": 0.6}."""
    extras: dict[str, float]
    """Global sums of any extra scalar outputs (keys of loss_fn's result starting with "_")."""
    grad_norm: float
    """Global L2 norm of the (unscaled) gradients before clipping; nan/inf on a skipped step."""
    skipped: bool
    """True when the update was not applied (non-finite loss or gradients on some rank)."""
    scale_changed: bool = False
    """The fp16 loss scale moved (recorded only where a compression hook must hear of it)."""
    calibrating: bool = False
    """fp16: the gradients overflowed with a finite loss at a loss scale of 1 or more: the
    scaler looking for its level (65536 at the start halves per skipped step), not divergence.
    Skipped and counted, but no abort for `max_nonfinite_steps` in a row while it lasts (a run
    whose gradients overflowed its first five steps, loss finite, was stopped as diverged)."""

    @property
    def loss(self) -> float:
        """sum_k loss_sum[k] / count[k] over all micro batches and ranks."""
        return float(sum(self.losses.values()))


class PendingStep:
    """One step's device numbers on their way to the host: `vector` is (loss terms, extras, the
    two summed non-finite flags, grad norm[, fp16 loss scale before[, after]]) in float64. On
    CUDA it is copied into pinned memory behind the step's kernels (no wait now; by the end of
    the next step the copy has long landed); elsewhere it is read as it is when asked (free on
    the CPU)."""

    def __init__(self, step: int, lr: float, vector: torch.Tensor, keys: list[str],
                 extra_keys: list[str], divisors: Mapping[str, float]) -> None:
        self.step, self.lr = step, lr
        self.keys, self.extra_keys, self.divisors = keys, extra_keys, divisors
        self.numbers: StepNumbers | None = None
        self._event: Any = None
        if vector.device.type == "cuda":
            self._host = torch.empty(vector.shape, dtype=vector.dtype, pin_memory=True)
            self._host.copy_(vector, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = vector

    def read(self) -> StepNumbers:
        """The numbers (waiting for the copy on CUDA); cached in `numbers`."""
        if self.numbers is None:
            if self._event is not None:
                self._event.synchronize()
            values = self._host.tolist()
            nt, ne = len(self.keys), len(self.extra_keys)
            rest = values[nt + ne:]
            self.numbers = StepNumbers(
                losses={k: values[i] / self.divisors[k] for i, k in enumerate(self.keys)},
                extras={k: values[nt + i] for i, k in enumerate(self.extra_keys)},
                grad_norm=rest[2], skipped=rest[0] > 0 or rest[1] > 0,
                scale_changed=len(rest) > 4 and rest[3] != rest[4],
                calibrating=len(rest) > 3 and rest[0] == 0 and rest[1] > 0 and rest[3] >= 1)
        return self.numbers


@dataclass
class StepResult:
    """What one optimizer step did; every number is global (the same on every rank). `loss`,
    `losses`, `grad_norm`, `skipped` and `extras` come from the device and are read when first
    asked for (on CUDA that waits for the step's end, and applies the engine's counters up to
    this step first); the fields are known on the host at once."""

    lr: float
    """Learning rate applied to every parameter group at this step."""
    counts: dict[str, int]
    """Totals of count_fn over all micro batches and ranks (e.g. masked tokens, sequences)."""
    step_s: float = 0.0
    """Wall time of the train_step call, in seconds: with late reads (CUDA) the time to queue this
    step's work and to wait for the previous step's numbers, not this step's GPU time."""
    micro_batches: int = 0
    """Number of micro batches on this rank (the accumulation steps)."""
    step: int = 0
    """The engine's step counter after this step (1 for the first step)."""
    signals: dict[str, float] = field(default_factory=dict)
    """Global sums of the `signals` given to train_step (e.g. a preemption flag, rank 0's clock)."""
    read: Callable[[], StepNumbers] | None = field(default=None, repr=False)
    """The step's device numbers (the engine reads them in step order)."""

    def numbers(self) -> StepNumbers:
        if self.read is None:
            raise ValueError("this StepResult carries no device numbers")
        return self.read()

    @property
    def loss(self) -> float:
        """sum_k loss_sum[k] / count[k] over all micro batches and ranks."""
        return self.numbers().loss

    @property
    def losses(self) -> dict[str, float]:
        """Per-term normalised losses, e.g. {"mlm": 2.1, "nsp": 0.6}."""
        return self.numbers().losses

    @property
    def grad_norm(self) -> float:
        """Global L2 norm of the (unscaled) gradients before clipping; nan/inf when skipped."""
        return self.numbers().grad_norm

    @property
    def skipped(self) -> bool:
        """True when the update was not applied (non-finite loss or gradients)."""
        return self.numbers().skipped

    @property
    def extras(self) -> dict[str, float]:
        """Global sums of the extra scalar outputs ("_"-prefixed keys of loss_fn's result)."""
        return self.numbers().extras


class TrainingDiverged(BertgpuError):
    """Raised after too many non-finite steps in a row; `step`, `numbers` and `lr` are the
    step's that made the count (the run's last train record)."""

    def __init__(self, message: str, step: int | None = None,
                 numbers: StepNumbers | None = None, lr: float | None = None) -> None:
        super().__init__(message)
        self.step, self.numbers, self.lr = step, numbers, lr


PRETRAINING_ADVICE = {"lr": "optim.lr", "warmup": "schedule.warmup_steps",
                      "clip": "train.grad_clip", "precision": "train.precision",
                      "then": "resume from the last checkpoint"}
"""The keys `diverged_message` names; fine-tuning's (`FINETUNING_ADVICE`) are its options."""
FINETUNING_ADVICE = {"lr": "--lr", "warmup": "--warmup_fraction", "clip": "--grad_clip",
                     "precision": "--precision", "then": "run it again"}


def diverged_message(in_row: int, step: int, numbers: StepNumbers, lr: float, precision: str,
                     grad_clip: float | None = None,
                     advice: dict[str, str] | None = None) -> str:
    """TrainingDiverged's message: `in_row` non-finite steps up to `step`, with what to try,
    in the job's own keys (`advice`; pretraining's by default): clipping only when it is off."""
    keys = advice or PRETRAINING_ADVICE
    hints = [f"lower {keys['lr']}", f"a longer warm-up ({keys['warmup']})"]
    if not grad_clip:
        hints.append(f"{keys['clip']} 1.0")
    if precision == "fp16":
        hints.insert(0, f"{keys['precision']} bf16 (fp16 overflows)")
    return (f"training diverged: {in_row} steps in a row with non-finite loss or gradients "
            f"(step {step}, loss {numbers.loss}, grad norm {numbers.grad_norm}, lr {lr:.3g}); "
            f"try {', '.join(hints)}; {keys['then']}")
