"""The one training loop, shared by pretraining and fine-tuning.

    task = PretrainTask(...)                 # or a fine-tuning task: what differs lives there
    engine, timer = build_engine(model, info, lr=peak_lr, train=cfg.train, optim=cfg.optim, ...)
    loop = Loop(task, model, engine, info, run_dir=run_dir, train=cfg.train, schedule=cfg.schedule,
                peak_lr=peak_lr, checkpoint=cfg.checkpoint, dist=cfg.distributed,
                logging=cfg.logging, seed=cfg.seed, comm_timer=timer,
                resume=load_resume(run_dir, info))
    result = loop.run()                      # -> LoopResult(step, preempted, last_eval, ...)

The loop owns what every job needs and nothing else: the step loop and its stop decisions
(max_steps, wall-clock budget, preemption), the learning rate as a function of progress, the log
window (loss, lr, grad norm, tokens/s, MFU, memory, data-wait and comm shares), evaluation and
checkpoint cadence, exact resume (model, optimizer, engine counters, the task's data cursor,
every rank's RNG and PowerSGD state, elapsed time and budget) and the end-of-run checkpoint and
export. A task object (`Task`) supplies the rest: this rank's micro batches of a step, the summed
losses and their counts, how to evaluate and what to export.

Every decision that ends or skips work is collective, so ranks never disagree about the step they
are on. Rank 0's budget clock and its time since the last checkpoint ride in the count all-reduce
the engine does anyway at the start of each step (`signals`): no collective of their own, and a
step's lr uses the clock agreed at the previous step, the same on every rank. After an evaluation,
a save or a compiled run's first step the clock is agreed at once: one that spent the budget ends
the run. A stop signal ends the run within `checkpoint.grace_s` (train/preemption.py).

The body of the loop is `task.micro_batches(step)` -> `engine.train_step(...)` -> log /
evaluate / checkpoint; what must be exactly right in one optimizer step (accumulation, DDP sync,
AMP, clipping, skipping) lives in `engine.py` (and `build_engine`); the checkpoint to resume
from comes from `checkpoint.load_resume`. The loop takes the config sections as they are.

What readers of metrics.jsonl (`bertgpu watch`, `bertgpu report`) learn of a run's life: an
`info` record `event: start` (host, pid, world_size, max_steps; a fine-tuning run's `task`) when
`run()` begins, and one `event: end` however it stops: reason max_steps, budget or preempted, or,
for an exception leaving the loop (raised as it was), "diverged" (`TrainingDiverged`) or "error"
with its message. Before it the newest step gets its train record whatever the log cadence
(except after an "error": its numbers may be on a device in trouble). A budget run's train
records carry its budget clock (`budget_elapsed_s`, `budget_left_s`), which `elapsed_s` is not.
"""

from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from bertgpu.config.sections import (
    CheckpointSection,
    DistributedSection,
    LoggingSection,
    ScheduleSection,
    TrainSection,
)
from bertgpu.errors import BertgpuError
from bertgpu.telemetry.records import process_started
from bertgpu.testing import faults
from bertgpu.train import distributed, loop_state
from bertgpu.train.balance import rebalance, straggler_fields
from bertgpu.train.engine import Engine, StepResult
from bertgpu.train.loop_state import LogWindow, LoopResult, device_mfu, eval_pending, loss_state
from bertgpu.train.preemption import Preempted, Preemption, Snapshot
from bertgpu.train.run_end import log_failure
from bertgpu.train.schedule import BudgetClock, Schedule, progress_from_steps
from bertgpu.train.task import Batch, Task


class Loop:
    """Drives `task` with `engine` until max_steps, the budget or a preemption (see module doc).

    `model` is the unwrapped module (saved, evaluated, exported); `engine.model` may be its
    DDP / compiled wrapper. It resumes from `resume` (`checkpoint.load_resume`), if given."""

    def __init__(self, task: Task, model: torch.nn.Module, engine: Engine,
                 info: distributed.DistInfo, *, run_dir: Path, train: TrainSection,
                 schedule: ScheduleSection, peak_lr: float, checkpoint: CheckpointSection,
                 dist: DistributedSection, logging: LoggingSection, seed: int = 0,
                 config: dict[str, Any] | None = None, title: str = "bertgpu",
                 startup_rows: Sequence[tuple[str, str]] = (),
                 checkpoint_files: Callable[[], dict[str, str]] = dict,
                 final_checkpoint: bool = True, flops_per_token: float | None = None,
                 comm_timer: distributed.CommTimer | None = None,
                 resume: tuple[Path, dict[str, torch.Tensor], dict[str, Any]] | None = None,
                 evaluate_first: bool = False, task_name: str | None = None) -> None:
        """`train`, `schedule`, `checkpoint`, `dist` and `logging` are the config sections (their
        max_steps, budget, cadences, keep_last, load balancing, sinks); `peak_lr` the lr after
        batch scaling; `seed` the run's (dropout noise after a resume at another world size
        derives from it); `config` the resolved configuration sent to every metric sink.
        What the job adds: `title` and `startup_rows` for the start-up table, `checkpoint_files`
        (files written into every checkpoint beside the weights, e.g. config.toml),
        `final_checkpoint` (write one at the end of a completed run: pretraining, to continue it;
        fine-tuning checkpoints only to survive preemption), `flops_per_token` for MFU,
        `evaluate_first` (evaluate at step 0 of a new run: the baseline of a continued one),
        `task_name` (a fine-tuning run's task, as results.json names it: its start record's)."""
        self.max_steps = int(train.max_steps or 0)
        if self.max_steps <= 0 and not train.budget_hours:
            raise BertgpuError("config: max_steps must be positive unless budget_hours is set")
        self.task, self.model, self.engine, self.info = task, model, engine, info
        self.run_dir, self.train = Path(run_dir), train
        self.ckpt, self.logging = checkpoint, logging
        self.seed, self.config = seed, config
        self.title, self.startup_rows = title, list(startup_rows)
        self.checkpoint_files, self.final_checkpoint = checkpoint_files, final_checkpoint
        self.evaluate_first, self.task_name = evaluate_first, task_name
        self.flops_per_token, self.comm_timer = flops_per_token, comm_timer
        self.world = info.world_size
        self.schedule = Schedule(peak_lr=peak_lr, decay=schedule.decay,
                                 warmup_fraction=schedule.warmup_fraction or 0.0,
                                 warmup_steps=schedule.warmup_steps, max_steps=self.max_steps,
                                 budget_mode=bool(train.budget_hours),
                                 min_lr_ratio=schedule.min_lr_ratio, power=schedule.power,
                                 decay_fraction=schedule.decay_fraction,
                                 decay_span=schedule.decay_span)
        # A rank's compute time shows it slow where the others wait for it outside that time
        # (DDP's all-reduce). Under fsdp every layer's all-gather waits inside it: the straggler
        # fields would read about 1.00x, so they are left out (and the config refuses balancing).
        self.stragglers = self.world > 1 and dist.strategy != "fsdp"
        # Re-share the global batch by measured speed every N steps (0 = equal shares; the task
        # must then have `shares()` / `set_shares()`).
        self.balance_every = (dist.balance_every_steps
                              if dist.balance == "auto" and self.stragglers else 0)
        self.budget = BudgetClock(train.budget_hours * 3600.0) if train.budget_hours else None
        self.faults = faults.active()  # read once: None unless BERTGPU_FAULTS (testing/faults.py)
        engine.lr_fn = self.lr
        self.tokens_seen, self.sequences_seen, self.elapsed_offset = 0, 0, 0.0
        # Step of the newest checkpoint written or resumed from, the same on every rank (a lagging
        # network filesystem's listing may not be): the final "save unless saved" is collective.
        self.saved_step: int | None = None
        self.resumed_from: Path | None = None
        # The result being built while `run()` lasts (a task may read its clocks), then returned.
        self.result: LoopResult | None = None
        self._window: LogWindow | None = None  # the log window while `run()` lasts
        self._resumed_loss: dict[str, float] | None = None  # its loss, from the checkpoint
        self._eval_pending = False  # ... and whether its step's evaluation was cut short
        self._resumed_eval: tuple[int | None, dict[str, Any]] = (None, {})  # its newest evaluation
        from bertgpu.train.checkpointer import make_checkpointer

        # Whole files from rank 0 (ddp) or every rank's shards (fsdp, optionally in the background).
        self.checkpoints = make_checkpointer(model, info, self.run_dir, checkpoint.keep_last,
                                             checkpoint.async_save, dist.timeout_minutes)
        # No checkpoint follows the one at max_steps (`_finish`: the step the run ends at), so no
        # warning that the next will not fit after it (whole-file checkpoints; sharded ones check
        # before each save only).
        self.checkpoints.final_step = self.max_steps or None
        self.preemption = Preemption(checkpoint.grace_s, info, title=title, run_dir=self.run_dir,
                                     timeout_minutes=dist.timeout_minutes)
        if resume is not None:
            self._restore(*resume)

    # -- schedule --------------------------------------------------------------------------------
    def progress(self) -> float:
        """Training progress in [0, 1] at the step about to be taken: in step mode the steps
        done before it (step k of 0 .. max_steps - 1 at k / max_steps, train/schedule.py)."""
        if self.budget is not None:
            return self.budget.progress()
        return progress_from_steps(self.engine.step, self.max_steps)

    def lr(self) -> float:
        return self.schedule.lr(self.progress(), self.engine.step)

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> LoopResult:
        from bertgpu.telemetry.console import format_startup_table
        from bertgpu.telemetry.run_logger import open_logger

        if self.info.is_main:
            print(format_startup_table(self._startup_rows(), title=self.title), flush=True)
        logger = open_logger(  # on every rank: a missing sink package fails everywhere alike
            self.run_dir, self.info.is_main, self.logging, self.config, device=self.engine.device,
            total_steps=self.max_steps or None, log_every=self.train.log_every_steps,
            initial_step=self.engine.step, elapsed_offset_s=self.elapsed_offset)
        # Where the run lives, so that `bertgpu watch` on this host can tell a run that was
        # killed (no end record, its process gone) from one that is busy.
        logger.log(self.engine.step, "info", event="start", host=socket.gethostname(),
                   pid=os.getpid(), pid_started=process_started(os.getpid()),
                   world_size=self.world, max_steps=self.max_steps or None, task=self.task_name)
        # For the end record of a stop whose grace ran out (written by the preemption's thread).
        self.preemption.step, self.preemption.elapsed = self.engine.step, lambda: logger.elapsed_s
        self.preemption.install()
        try:
            return self._run(logger)
        except BaseException as e:  # noqa: BLE001 - recorded, then raised as it was
            log_failure(self, logger, e)  # its end record
            raise
        finally:
            self.checkpoints.settle(self.engine.step + 1)  # an error: let a write in flight end
            logger.close()
            self.task.close()
            self.preemption.restore()

    def _run(self, logger: Any) -> LoopResult:
        result = self.result = LoopResult(step=self.engine.step)
        w = self._window = LogWindow(self.world, self.info.rank, self.train.log_every_steps)
        w.load_loss_state(self._resumed_loss)
        # resumed from a checkpoint written after its evaluation: not evaluated again
        w.evaluated_at, result.last_eval = self._resumed_eval
        self._last_ckpt = time.monotonic()
        try:
            self._steps(logger, result, w)
        except Preempted:  # every rank agreed (preemption.check)
            result.preempted, result.stop_reason = True, "preempted"
        return self._finish(logger, result, w)

    def _steps(self, logger: Any, result: LoopResult, w: LogWindow) -> None:
        t, c = self.train, self.ckpt
        if self.evaluate_first and self.engine.step == 0:  # before the budget's clock starts
            result.last_eval = self._evaluate(logger, 0, None)
            w.throughput.reset()  # the rates start after it
        if self._eval_pending:  # the evaluation of the resumed step was cut short by a stop
            result.last_eval = self._evaluate(logger, self.engine.step, w)
            self.saved_step = None  # its checkpoint still awaits it: the final one is written
        if self.budget is not None:
            self.budget.start()
        first = self.engine.step + 1 if hasattr(self.engine.model, "_orig_mod") else -1  # compiles
        self.engine.on_skipped = lambda step, n: logger.print(  # when the engine reads the step
            f"step {step}: non-finite loss or gradients, update skipped ({n} in a row)")
        while True:
            if self.max_steps and self.engine.step >= self.max_steps:
                if self.budget is not None and (note := self.budget.cut_note(self.engine.step)):
                    logger.print(note)  # its lr follows the clock: it never decayed
                break
            if self.budget is not None and self.budget.expired_agreed():
                logger.print(f"budget of {t.budget_hours:g} h reached at step {self.engine.step}")
                result.stop_reason = "budget"
                break
            self._log_written(logger, self.checkpoints.poll())
            res = w.last = self._train_step(w, result)
            step = self.engine.step
            if w.later is not None:  # the previous step's record: read behind this step's work
                self._write_train(logger, *w.later)
            if res.signals.get("checkpoint_failed", 0.0) > 0:  # a background write, on some rank
                raise self.checkpoints.failure()
            reshare = bool(self.balance_every) and step % self.balance_every == 0
            # The final step's evaluation comes before its checkpoint, so a run resumed there
            # (killed before its export) knows it was done.
            evaluate = step == self.max_steps or bool(t.eval_every_steps
                                                      and step % t.eval_every_steps == 0)
            by_time = (c.every_minutes is not None
                       and res.signals.get("since_checkpoint_s", 0.0) >= c.every_minutes * 60)
            save = (c.every_steps and step % c.every_steps == 0) or by_time
            if step % t.log_every_steps == 0 or step == self.max_steps:
                # later where steps are read late, unless evaluation or a save reads it now
                self._log_train(logger, res, w, later=self.engine.read_late
                                and self.engine.skips_on_device() and not (evaluate or save))
            if reshare:
                rebalance(self.task, w.balance_times, self.train.global_batch_size, step,
                          logger.print)
            if evaluate:
                result.last_eval = self._evaluate(logger, step, w)
            if save:
                self.save(logger, background=c.async_save)
                self._last_ckpt = time.monotonic()
                w.throughput.reset()
            if self.budget is not None and (evaluate or save or step == first):
                self.budget.sync()  # what used up the budget ends the run: no step at a stale lr

    def _train_step(self, w: LogWindow, result: LoopResult) -> StepResult:
        """One optimizer step with its timing and counters; Preempted when a stop signal came
        (the step is then dropped: the preemption checkpoint holds the state from before it)."""
        step = self.engine.step
        self.preemption.begin_step(step, self.task, self.engine, w.loss_mark())
        # the test double (testing/faults.py): off unless BERTGPU_FAULTS
        if self.faults is not None:
            faults.maybe_kill(self.info.rank, step + 1, settle=self.checkpoints.settle)
            faults.delay(self.info.rank, step + 1)
        t0 = time.perf_counter()
        micro_batches = self.preemption.interruptible(
            f"waiting for the data of step {step + 1}", lambda: self.task.micro_batches(step))
        n = self.preemption.check(len(micro_batches or ()))  # every rank; raises Preempted
        t1 = time.perf_counter()
        # The same keys on every rank (one all-reduce); the clocks are rank 0's, the other ranks
        # add zeros.
        main = self.info.is_main
        signals = {"since_checkpoint_s": time.monotonic() - self._last_ckpt if main else 0.0,
                   "budget_elapsed_s": self.budget.read() if main and self.budget else 0.0}
        if self.checkpoints.background:
            signals["checkpoint_failed"] = float(self.checkpoints.failed)
        loss_fn = self.preemption.checked_loss(self._loss_fn(), n)  # a check per micro-step
        res = self.engine.train_step(micro_batches, loss_fn, self.task.counts, signals=signals)
        self.preemption.end_step(self.engine.step)
        if self.budget is not None:
            self.budget.agree(res.signals.get("budget_elapsed_s", 0.0))
        t2 = time.perf_counter()
        comm = self.comm_timer.pop_step() if self.comm_timer is not None else 0.0
        local = sum(int(mb["input_ids"].shape[0]) for mb in micro_batches)
        result.train_s += t2 - t0
        result.data_s += t1 - t0
        tokens = res.counts.get("tokens", 0)
        sequences = res.counts.get("sequences", self.train.global_batch_size)
        self.tokens_seen += tokens
        self.sequences_seen += sequences
        compiled = w.throughput.update(tokens=tokens, sequences=sequences)
        w.add_step(t1 - t0, t2 - t1, comm_s=comm, local_sequences=local, compiled=compiled)
        w.add_loss(res, sequences)
        return res

    def _log_train(self, logger: Any, res: StepResult, w: LogWindow, gather: bool = True,
                   later: bool = False) -> None:
        """The train record of step `res.step`; collective with several ranks unless `gather`
        is False (then without the straggler fields: after an error, the others may be gone).
        `later`: the host's numbers now, the step's own (loss, grad norm: a wait for the
        device) once the next step is queued (`w.later`, `_write_train`)."""
        from bertgpu.telemetry import metrics

        rates = w.throughput.rates()
        if self.comm_timer is not None and gather and not later:  # all-reduce times kept back
            w.comm_s += self.comm_timer.settle()
        stragglers = (straggler_fields(w.log_times.gather()[0])
                      if self.stragglers and gather else {})
        fields = dict(**rates, **w.throughput.compile_fields(),
                      mfu=self._mfu(rates["tokens_per_s"]) if rates else None,
                      data_wait_share=w.data_s / max(w.window_s, 1e-9),
                      comm_share=w.comm_s / max(w.window_s, 1e-9) if self.comm_timer else None,
                      tokens_seen=self.tokens_seen,
                      **(self.budget.fields() if self.budget is not None else {}),
                      **stragglers, **metrics.device_memory(self.engine.device))
        w.window_s = w.data_s = w.comm_s = 0.0
        w.later = (res, fields) if later else None
        if not later:
            self._write_train(logger, res, fields)

    def _write_train(self, logger: Any, res: StepResult, fields: dict[str, Any]) -> None:
        w = self._window
        logger.log(res.step, "train", loss=res.loss, **self.task.log_scalars(res), lr=res.lr,
                   grad_norm=res.grad_norm, skipped_steps=self.engine.skipped_read, **fields)
        w.logged_at, w.later = res.step, None

    def _loss_fn(self) -> Callable[[torch.nn.Module, Batch], Mapping[str, torch.Tensor]]:
        """The task's loss; with a fault injected for this step, `faults.faulty_loss`."""
        if self.faults is None:
            return self.task.loss
        return faults.faulty_loss(self.task.loss, self.info.rank, self.engine.step + 1)

    def _finish(self, logger: Any, result: LoopResult, w: LogWindow) -> LoopResult:
        """End of training (steps, budget, or preemption): evaluate, checkpoint, export; when
        preempted, the preemption checkpoint if it fits in the grace (train/preemption.py).
        The last steps not logged yet get their train record first, however the run ended."""
        step = result.step = self.engine.step
        if w.later is not None:  # a log step's record, its host numbers taken at its step
            self._write_train(logger, *w.later)
        last = w.unlogged()
        if last is not None:  # the same on every rank: the steps agree
            self._log_train(logger, last, w)
        if not result.preempted and w.evaluated_at != step:
            try:
                result.last_eval = self._evaluate(logger, step, w)
            except Preempted:
                result.preempted, result.stop_reason = True, "preempted"
        # Ranks agree on the step by construction; check it once (cheap) rather than trust it.
        lo, hi = -distributed.all_reduce_max(-step), distributed.all_reduce_max(step)
        if lo != hi:
            raise BertgpuError(f"ranks stopped at different steps ({lo}..{hi}); please "
                               "report this bug")
        self.checkpoints.final_step = step
        # "finished" once the final checkpoint and the export are written; a stop signal during
        # either (it cuts neither short: both are renamed into place whole) ends it as preempted,
        # without the export when the signal came before it.
        if not result.preempted:
            try:
                self._log_written(logger, self.checkpoints.wait())
                if self.final_checkpoint and self.saved_step != step:
                    self.save(logger)
                self.preemption.check()
                self._export(result, step)
                self.preemption.check()
            except Preempted:  # every rank agreed
                result.preempted, result.stop_reason = True, "preempted"
        logger.log(step, "info", event="end", reason=result.stop_reason, world_size=self.world,
                   rank_step_min=lo, rank_step_max=hi)
        self.preemption.end_logged = True  # a grace that runs out adds no second one
        if result.preempted:  # after the end record: the grace may end the process in `stop`
            result.exit_status = self.preemption.stop(self, logger)
        distributed.barrier()
        result.tokens_seen, result.sequences_seen = self.tokens_seen, self.sequences_seen
        return result

    def _evaluate(self, logger: Any, step: int, w: LogWindow | None) -> dict[str, Any]:
        """The task's evaluation, with the training loss since the previous one (`w`), cut
        short by a stop signal (then Preempted, on every rank, the loss kept for the redo)."""
        slow = faults.slow_eval if self.faults is not None else lambda: None  # the test double
        loss = w.train_loss(reset=False) if w is not None else None
        out = self.preemption.interruptible(f"in the evaluation at step {step}",
                                            lambda: slow() or self.task.evaluate(step, loss))
        self.preemption.check()
        if w is not None:
            w.evaluated(step)
        if out:
            logger.log(step, "eval", **out)
        return out or {}

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, logger: Any, background: bool = False,
             snapshot: Snapshot | None = None) -> Path | None:
        """Write a checkpoint of the current step (collective: every rank sends its RNG state;
        rank 0 writes, or with a sharded model every rank writes its shards; in the background
        if asked). `snapshot`: the state from before a step that was aborted. The time the
        training thread was blocked is logged (`stall_s`)."""
        t0 = time.perf_counter()
        self.preemption.phase = f"while writing the checkpoint of step {self.engine.step}"
        self._log_written(logger, self.checkpoints.wait())  # a background write still going on
        waited = time.perf_counter() - t0
        rngs, hooks = loop_state.rank_states(self.engine, snapshot.rng if snapshot else None)
        state, files = None, {}
        if self.info.is_main:
            state = {
                "step": self.engine.step,
                "engine": snapshot.engine() if snapshot else self.engine.state_dict(),
                **(snapshot.task if snapshot else self.task.state_dict()),
                "rng": rngs,
                "comm_hook": hooks,  # every rank's PowerSGD state, or None
                "tokens_seen": self.tokens_seen,
                "sequences_seen": self.sequences_seen,
                "elapsed_s": logger.elapsed_s,
                "budget": self.budget.state_dict() if self.budget is not None else None,
                "max_steps": self.max_steps,  # a resume with another says what its lr does
                "world_size": self.world,
                "loss_window": loss_state(snapshot.loss if snapshot else self._window.loss_mark()
                                          if self._window is not None else None),
                "evaluated_at": self._window.evaluated_at if self._window is not None else None,
                "last_eval": self.result.last_eval if self.result is not None else {},
            }
            files = self.checkpoint_files()
        path = self.checkpoints.save(self.engine.step, self.model, self.engine.optimizer, state,
                                     files, background=background)
        self.saved_step = self.engine.step
        # stall_s: how long training was blocked, waiting for the previous background write
        # (wait_s) included.
        logger.log(self.engine.step, "info", event="checkpoint", stall_s=time.perf_counter() - t0,
                   wait_s=waited if self.checkpoints.background else None, background=path is None)
        return path

    def _log_written(self, logger: Any, written: Any) -> None:
        """A background checkpoint write finished (None: nothing to report)."""
        if written is not None:
            logger.log(self.engine.step, "info", event="checkpoint_written",
                       saved_step=written.step, write_s=written.write_s)

    def _restore(self, path: Path, model_state: dict[str, torch.Tensor],
                 st: dict[str, Any]) -> None:
        from bertgpu.train.checkpointer import restore

        # Weights and optimizer state, whichever strategy wrote them and whichever reads them.
        restore(path, model_state, st, self.model, self.engine.optimizer)
        self.engine.load_state_dict(st["engine"])
        self.task.load_state_dict(st)
        self.tokens_seen = int(st.get("tokens_seen", 0))
        self.sequences_seen = int(st.get("sequences_seen", 0))
        self.elapsed_offset = float(st.get("elapsed_s", 0.0))
        self._resumed_loss = st.get("loss_window")
        self._eval_pending = eval_pending(st, self.engine.step, self.train.eval_every_steps)
        self._resumed_eval = (st.get("evaluated_at"), dict(st.get("last_eval") or {}))
        if self.budget is not None and st.get("budget"):
            self.budget.load_state_dict(st["budget"])
        self.saved_step, self.resumed_from = self.engine.step, path
        if self.info.is_main:
            print(f"resumed from {path} (step {self.engine.step}, {self.tokens_seen:,} tokens "
                  "seen)", flush=True)
            budget_s = self.budget.budget_s if self.budget is not None else None
            note = loop_state.length_change_note(st, path, self.schedule, self.engine.step,
                                                 self.progress(), budget_s)
            if note:  # another train.max_steps or budget: the lr jumps
                warnings.warn(note, stacklevel=1)
        # every rank's RNG and PowerSGD state, at the same world size
        loop_state.restore_rank_states(st, self.engine, self.info, self.seed)

    def _export(self, result: LoopResult, step: int) -> None:
        """The task's result, on rank 0; a sharded model's full weights are gathered first
        (collective, one tensor at a time into rank 0's CPU memory)."""
        from bertgpu.train import sharding

        self.preemption.phase = f"while exporting step {step}"  # for a grace that runs out
        if sharding.is_sharded(self.model):
            full = sharding.full_state_dict(self.model)
            if self.info.is_main:
                result.export_dir = self.task.export(step, state_dict=full)
        elif self.info.is_main:
            result.export_dir = self.task.export(step)

    # -- reporting -------------------------------------------------------------------------------
    def _startup_rows(self) -> list[tuple[str, str]]:
        e, budget = self.engine, self.train.budget_hours
        rows = list(self.startup_rows)
        if "compute" not in dict(rows):  # pretraining's compute row names device and precision
            rows.append(("device", f"{e.device} x {self.world} ({e.precision})"))
        if budget:
            rows.append(("budget", f"{budget:g} h (max_steps {self.max_steps or 'none'})"))
        elif "steps" not in dict(rows):
            rows.append(("steps", f"{self.max_steps:,}"))
        if self.resumed_from is not None:
            rows.append(("resumed at step", str(e.step)))
        rows.append(("checkpoints", f"{self.checkpoints.note}; stop signals end the run within "
                                    f"{self.ckpt.grace_s:g} s"))
        return rows

    def _mfu(self, tokens_per_s: float) -> float | None:
        return device_mfu(self.engine, self.flops_per_token, self.world, tokens_per_s)
