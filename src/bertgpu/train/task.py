"""What a job gives the one training loop (train/loop.py): a `Task` object.

Pretraining (tasks/pretraining.py) and every fine-tuning job (tasks/finetuning.py) implement it;
the loop calls nothing else of theirs. A new kind of job is a class with these methods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from bertgpu.train.engine import StepResult

Batch = Mapping[str, Any]


class Task(Protocol):
    """What differs between jobs. Every method but `export` runs on every rank."""

    def micro_batches(self, step: int) -> Sequence[Batch]:
        """This rank's micro batches of optimizer step `step` (0-based)."""

    def loss(self, model: torch.nn.Module, batch: Batch) -> Mapping[str, torch.Tensor]:
        """Summed loss terms (and "_"-prefixed extra sums) of one micro batch (engine contract)."""

    def counts(self, batch: Batch) -> Mapping[str, float]:
        """Counts of one micro batch, computed on the host: one per loss term, plus "tokens"
        (real tokens) and "sequences" for the throughput."""

    def log_scalars(self, res: StepResult) -> dict[str, Any]:
        """Task-specific fields of the train log line (e.g. mlm_acc, epoch)."""

    def evaluate(self, step: int, train_loss: float | None) -> dict[str, Any]:
        """Evaluation at `step` (collective); `train_loss` is the mean training loss since the
        previous evaluation. Returns the scalars of the eval log record ({} when there is none)."""

    def state_dict(self) -> dict[str, Any]:
        """What the task needs to resume exactly (e.g. the data cursor), merged into the
        checkpoint's train state; plain values only."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from a checkpoint's train state."""

    def export(self, step: int, state_dict: Mapping[str, torch.Tensor] | None = None
               ) -> Path | None:
        """Rank 0 only, at the end of a run that was not preempted: write the result. A task that
        trains a sharded model is given its gathered full weights (`state_dict`) to write."""

    def close(self) -> None:
        """Release workers and files."""


__all__ = ["Batch", "Task"]
