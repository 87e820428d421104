"""The `end` record of a run that an exception stops (train/loop.py's `Loop.run`): reason
"diverged" (`TrainingDiverged`) or "error" with its message, and, where `--max-restarts` may
start the job again, the process that would (`restart_by`). A run that ends on its steps, its
budget or a stop signal gets its end record from `Loop._finish` instead."""

from __future__ import annotations

import os
from typing import Any

from bertgpu.errors import BertgpuError, one_line
from bertgpu.telemetry.records import launcher_fields
from bertgpu.train.engine import TrainingDiverged
from bertgpu.train.launcher import RESTART_BY_ENV


def log_failure(loop: Any, logger: Any, error: BaseException) -> None:
    """An exception leaving `loop` (a train.loop.Loop; divergence, a failed write, a crash in the
    task): an `end` record with reason "diverged" or "error" and the message, so that readers of
    metrics.jsonl see that the run stopped; after a divergence the newest step's train record
    first if it had none, then the diverged step's (their loss as it was). Best effort, on
    rank 0 alone and without collectives: a failure here must not replace `error`."""
    if isinstance(error, BrokenPipeError) and getattr(loop.preemption, "end_logged", False):
        return  # a stopped run whose console went away (a closed terminal): its end stands
    diverged = isinstance(error, TrainingDiverged)
    w = loop._window
    if not diverged and w is not None and w.later is not None and loop.info.is_main:
        try:  # a log step's record waiting for its numbers: its host numbers, without a wait
            res, fields = w.later
            logger.log(res.step, "train", lr=res.lr, **fields)
        except Exception:  # noqa: BLE001
            pass
    # Only after a divergence: the steps' numbers are on the host then (the engine read them
    # to decide), whereas after another error a wait on the device might never end.
    if diverged and w is not None and loop.info.is_main:
        try:
            if w.later is not None:
                loop._write_train(logger, *w.later)
            last = w.unlogged()
            if last is not None:
                loop._log_train(logger, last, w, gather=False)
        except Exception:  # noqa: BLE001 - e.g. reading a step that diverged too
            pass
        # the step that made the count, whose result the loop never got: its numbers as they were
        step, numbers = getattr(error, "step", None), getattr(error, "numbers", None)
        if step is not None and numbers is not None and step > (w.logged_at or 0):
            try:
                logger.log(step, "train", loss=numbers.loss, grad_norm=numbers.grad_norm,
                           lr=getattr(error, "lr", None), skipped_steps=loop.engine.skipped_steps)
            except Exception:  # noqa: BLE001
                pass
    text = one_line(error).strip().splitlines()[0] if str(error).strip() else ""
    if not isinstance(error, BertgpuError):
        text = f"{type(error).__name__}: {text}" if text else type(error).__name__
    # Read late (CUDA), the step after the one that made the count was queued before the count
    # was read: the run ends where the message says, as when each step is read at its end.
    end_step = getattr(error, "step", None) if diverged else None
    try:
        logger.log(end_step or loop.engine.step, "info", event="end",
                   reason="diverged" if diverged else "error", error=text[:500],
                   world_size=loop.world, **restart_by(error))
    except Exception:  # noqa: BLE001
        pass


def restart_by(error: BaseException) -> dict[str, Any]:
    """``launcher_pid`` and ``launcher_pid_started`` for the end record of an error after which
    the job may be started again (`records.launcher_fields`: bertgpu's launcher said one may
    follow, naming itself, or torchrun has restarts left), and the error is a crash, not a stop
    (KeyboardInterrupt, SystemExit). Bad input (a BertgpuError, divergence included: exit status
    2) is never restarted by bertgpu's launcher, but torchrun restarts on any failure. `bertgpu
    watch` then follows the job on while that process lives; {} otherwise. Whether the launcher
    does restart is its own decision (another rank may have failed first, of bad input): the
    record says one may come, the launcher's process whether it did."""
    if not isinstance(error, Exception):
        return {}
    if isinstance(error, BertgpuError) and os.environ.get(RESTART_BY_ENV):
        return {}
    return launcher_fields()


__all__ = ["log_failure", "restart_by"]
