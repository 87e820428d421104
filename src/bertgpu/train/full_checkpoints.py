"""Whole-file checkpoints (ddp, or one process): rank 0 writes model.safetensors and
train_state.pt with the optimizer's state, in place or in the background. The weights are in
Hugging Face's layout (`layout.file_state`: transformers' `from_pretrained` reads the folder, the
config.json the job passes beside them); `checkpointer.restore` converts them back.

In place (`checkpoint.async_save = false`, or when the host copy would not fit in memory), `save`
returns once the folder is written, sealed and renamed (`checkpoint.save_checkpoint`). In the
background, rank 0's training thread only copies the weights, the optimizer state and the train
state into host buffers (`hostcopy.HostCopy`: pinned, non-blocking copies, one synchronisation);
a thread then writes the files from that copy, checksums, fsyncs and seals them, and renames the
folder into place, the same bytes as in place. Training goes on meanwhile; the next save, and the
end of the run, wait for the write first. A crash during the write leaves `step_N.tmp`, which
nothing trusts and the next start removes: the previous checkpoint stays the newest complete one.
A write that fails is reported by `poll` and stops every rank at the next step (the loop shares
`failed` in the step's signals).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertgpu.errors import BertgpuError
from bertgpu.models.layout import file_state
from bertgpu.train import distributed
from bertgpu.train.checkpoint import check_free_space, save_checkpoint
from bertgpu.train.hostcopy import HostCopy


@dataclass
class Written:
    """A background write that finished: its step and how long it took (seconds)."""

    step: int
    write_s: float


@dataclass
class Pending:
    """A background write in flight: its step, when it started, its future."""

    step: int
    started: float
    future: Future


def agree(error: BertgpuError | None, what: str) -> None:
    """Collective: every rank stops when any rank failed (rank 0's message when it is the one)."""
    if distributed.any_true(error is not None):
        raise error or BertgpuError(f"{what} failed on another rank (its error names the cause)")


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class FullCheckpoints:
    """Whole files from rank 0 (see the module docstring). `background` is the same on every
    rank (the loop's signals depend on it)."""

    def __init__(self, run_dir: Path, info: distributed.DistInfo, keep_last: int,
                 background: bool = False, note: str = "") -> None:
        self.run_dir, self.info, self.keep_last = Path(run_dir), info, keep_last
        self.background, self.note = background, note
        self.failed = False
        self.error: BertgpuError | None = None
        self.last_write_s: float | None = None  # the last save, copy and write, for estimates
        # Set by the loop: the step whose checkpoint is the run's last (max_steps, or the step
        # the run ends at). After it no warning that the next checkpoint will not fit: none comes.
        self.final_step: int | None = None
        self._pending: Pending | None = None
        self._host = HostCopy() if background and info.is_main else None
        self._executor = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertgpu-ckpt")
                          if background and info.is_main else None)

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             state: dict[str, Any] | None, files: dict[str, str],
             background: bool = False) -> Path | None:
        """Collective; `state` (the train state without the optimizer) and `files` on rank 0.
        Returns the folder once written, None while a background write goes on."""
        self.wait()
        background = background and self.background
        warn = self.final_step is None or step < self.final_step
        t0 = time.perf_counter()
        path, error, future = None, None, None
        if self.info.is_main:
            try:
                if background:
                    copy = self._copy(step, model, optimizer, state)
                    future = self._executor.submit(self._write, step, copy, files,
                                                   time.perf_counter() - t0, warn)
                else:
                    full = {**(state or {}), "optimizer": optimizer.state_dict()}
                    path = save_checkpoint(self.run_dir, step, file_state(model), full,
                                           extra_files=files, keep_last=self.keep_last)
                    if warn:  # one interval before a full disk
                        check_free_space(self.run_dir)
                    self.last_write_s = time.perf_counter() - t0
            except BertgpuError as exc:
                error = exc
        # Instead of a barrier: every rank learns whether rank 0's save failed and stops with it.
        agree(error, f"{self.run_dir}: the checkpoint of step {step}")
        if future is not None:
            self._pending = Pending(step, time.perf_counter(), future)
        return path

    def _copy(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              state: dict[str, Any] | None) -> dict[str, Any]:
        """The stall: weights, optimizer state and train state into the host buffers."""
        assert self._host is not None and self._executor is not None
        try:
            full = {**(state or {}), "optimizer": optimizer.state_dict()}
            return self._host.copy({"model": file_state(model), "state": full})
        except RuntimeError as exc:  # e.g. pinned memory that cannot be allocated
            raise BertgpuError(f"{self.run_dir}: cannot copy the checkpoint of step {step} to "
                               f"host memory ({first_line(exc)}); set checkpoint.async_save false "
                               "to write it in place") from None

    def _write(self, step: int, copy: dict[str, Any], files: dict[str, str],
               copy_s: float, warn: bool = True) -> Path:
        """The background thread: the files from the host copy, sealed and renamed; then, when
        `warn`, a warning if the next checkpoint will not fit."""
        t0 = time.perf_counter()
        try:
            path = save_checkpoint(self.run_dir, step, copy["model"], copy["state"],
                                   extra_files=files, keep_last=self.keep_last)
            if warn:
                check_free_space(self.run_dir)
        except BertgpuError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure becomes the one-line error
            raise BertgpuError(f"{self.run_dir}: the background write of step {step} failed: "
                               f"{first_line(exc)}") from None
        self.last_write_s = copy_s + time.perf_counter() - t0
        return path

    # -- the background write --------------------------------------------------------------------
    def poll(self) -> Written | None:
        """This rank, between steps: the background write that just finished, if any. A failure
        sets `failed` (the loop shares it in the next step's signals) and keeps the error."""
        p = self._pending
        if p is None or not p.future.done():
            return None
        return self._collect()

    def wait(self) -> Written | None:
        """Collective: finish the background write, if any; raise on every rank if it failed."""
        done = self._collect() if self._pending is not None else None
        if self.background:
            agree(self.error, f"{self.run_dir}: a background checkpoint write")
        return done

    def _collect(self) -> Written | None:
        p, self._pending = self._pending, None
        assert p is not None
        try:
            p.future.result()
        except Exception as exc:  # noqa: BLE001 - kept as the one-line error
            self.error = (exc if isinstance(exc, BertgpuError) else BertgpuError(
                f"{self.run_dir}: the background write of step {p.step} failed: "
                f"{first_line(exc)}"))
            self.failed = True
            return None
        return Written(p.step, time.perf_counter() - p.started)

    def settle(self, before_step: int) -> None:
        """This rank, no collective: let a background write of a checkpoint older than
        `before_step` finish (its outcome stays for `poll` and `wait`)."""
        p = self._pending
        if p is not None and p.step < before_step:
            try:
                p.future.result()
            except Exception:  # noqa: BLE001 - reported by poll / wait
                pass

    def pending(self) -> tuple[int, float] | None:
        """(step, seconds since it started) of the write in flight on this rank, if any."""
        p = self._pending
        return None if p is None else (p.step, time.perf_counter() - p.started)

    def failure(self) -> BertgpuError:
        """The error to stop with once some rank's background write failed."""
        return self.error or BertgpuError(f"{self.run_dir}: a background checkpoint write failed "
                                          "on another rank (its error names the cause)")


__all__ = ["FullCheckpoints", "Pending", "Written", "agree", "first_line"]
