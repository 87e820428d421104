"""Preemption within a grace period: from the first SIGTERM, SIGINT or SIGHUP (a closed
terminal; not under nohup, which ignores it) a run ends within
`checkpoint.grace_s` seconds, whatever it was doing (compiling, evaluating, writing).

A scheduler gives a job little time between SIGTERM and SIGKILL: Slurm 30 s (KillWait),
Kubernetes 30 s (terminationGracePeriodSeconds), a spot VM 30-120 s. From the first signal:

1. A thread of its own notes it (through Python's signal wakeup fd, so the signal counts even
   while the main thread is inside a long C call: a step that compiles, a collective) and starts
   the deadline: `grace_s` minus a margin for the exit itself and, where metric sinks are open
   (rank 0), the seconds they need to close (telemetry/fanout.py; at most a sixth of the grace).
2. The main thread looks at the flag at safe points: before every step (once its data is
   there), after every micro-step and after every evaluation; a data wait and an evaluation are
   cut short (the signal raises out of them). With several ranks each check is one MAX
   all-reduce on a gloo group of its own, so every rank stops at the same point even when the
   signal reached only some of them.
3. Rank 0 then decides, and one collective tells every rank: if a step completed since the
   newest checkpoint (one still being written in the background counts) and the estimated time
   to write one (the last measured save, else the state's bytes at 200 MB/s; with a 25% margin,
   plus what is left of a write in flight) fits in what is left of the grace, it writes a
   preemption checkpoint of that step; else it keeps the newest complete one. Either way the run
   ends with exit status 143 (130 for SIGINT, 129 for SIGHUP) and one line that says which.
4. At the deadline, a run still going (a step that cannot be interrupted, a write slower than
   its estimate) exits with the same status and a line saying so, once its metric sinks closed
   or the seconds kept for them ran out (they used to be left unclosed: the TensorBoard file
   without its last records, the MLflow run RUNNING); a second signal ends it at once, without
   waiting for the sinks. Loader workers are killed first. A checkpoint is written into `step_N.tmp`
   and sealed and renamed last, so neither leaves a half-written checkpoint that a re-run would
   trust: it resumes from the newest complete one.

An aborted step leaves no trace in the checkpoint: the data cursor, RNG states and engine
counters saved are those taken just before it (`Snapshot`, taken at every step start), and the
model and the optimizer only change in the update that ends a step. The same signal delivered
twice within a second counts once (a scheduler signals every process of a job, and torchrun
forwards the signal to its workers again).

Limits. With several ranks, a rank already waiting in the collective that closes an evaluation
cannot be interrupted (it is in C code): if another rank leaves the evaluation then, the run ends
at the deadline keeping the newest complete checkpoint. torchrun kills its workers 30 s after it
forwards a signal, so under torchrun (and `--nproc`) keep grace_s below 30.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bertgpu import errors
from bertgpu.locks import release_held
from bertgpu.train import distributed

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: a closed terminal
_DUPLICATE_S = 1.0  # the same signal again within this long is the same preemption
_RELAYED_S = 5.0  # ... and the other stop signal within this long: torchrun, signalled itself
#     (a Ctrl-C reaches the whole group, Slurm signals every process), sends its workers SIGTERM
_ASSUMED_BYTES_PER_S = 200e6  # write + checksum + fsync, before any save was measured
_SAFETY = 1.25  # on the estimated write time
_WRITE, _NONE_NEEDED, _NO_TIME = 1, 2, 3  # rank 0's verdicts


class Preempted(Exception):  # noqa: N818 - it is an event, not an error
    """A stop signal was received: raised at a safe point once every rank agreed (or, inside
    `interruptible`, by the signal handler)."""


@dataclass
class Snapshot:
    """What a checkpoint holds of a step that was aborted: the state just before the step."""

    rng: tuple[Any, ...]
    task: dict[str, Any]
    engine: Callable[[], dict[str, Any]]  # read when written: Engine.state_later
    loss: Any = None  # the loop's LogWindow.loss_mark() (train/loop_state.py), if any


def margin(grace_s: float) -> float:
    """Seconds kept for the exit itself (loader workers, the launcher noticing)."""
    return min(2.0, grace_s / 4)


def sinks_reserve(grace_s: float) -> float:
    """Seconds kept before the margin for the metric sinks open in this process to close when
    the grace runs out: what they say they need (telemetry/fanout.py), at most a sixth of the
    grace; 0.0 without any (every rank but 0)."""
    fanout = sys.modules.get("bertgpu.telemetry.fanout")  # not imported: no sink was opened
    try:
        need = fanout.close_reserve_s() if fanout is not None else 0.0
    except Exception:  # noqa: BLE001 - a sink's odd close_s must not keep the deadline unarmed
        need = 1.0
    return max(0.0, min(float(need), grace_s / 6))


class Preemption:
    """The stop signals of one run: see the module docstring. Collective to construct (it makes
    the gloo group of the checks when there are several ranks)."""

    def __init__(self, grace_s: float, info: distributed.DistInfo, *, title: str = "bertgpu",
                 run_dir: Path | None = None, timeout_minutes: float = 60.0) -> None:
        # its lines name the command the user ran (`bertgpu glue`, not the finetune inside it)
        self.title = errors.running_command or title
        self.grace_s, self.info, self.run_dir = grace_s, info, run_dir
        self.signum: int | None = None  # the stop signal: this rank's first, or another's
        self.end: float | None = None  # time.monotonic() at which the process must be gone
        self.deadline: float | None = None  # ... and at which the run's work must stop: `end`
        #     less the margin and the time kept for the sinks to close (`_arm`)
        self.snapshot: Snapshot | None = None  # set while a step is in flight
        self.phase = "while starting"  # where the run is, for the deadline's line
        self.step = 0  # the newest completed step, for the end record of `_exit_now`
        self.elapsed: Callable[[], float] | None = None  # the run's clock (the loop's logger)
        self.end_logged = False  # the loop wrote its end record: `_exit_now` adds none
        self._seen: int | None = None  # set by the handler at once (the listener may lag)
        self._own: tuple[int, float] | None = None  # this rank's first signal and its time
        self._interruptible = False
        self._lock = threading.RLock()
        self._exiting = self._closed = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}
        self._wakeup: int | None = None
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        self._listener: threading.Thread | None = None
        self._group = None
        if info.world_size > 1 and distributed.is_initialized():
            import datetime

            import torch.distributed as dist

            # CPU tensors on a group apart from the training collectives: a check never
            # interleaves with them, and NCCL runs need a CPU backend for host flags anyway.
            self._group = dist.new_group(backend="gloo",
                                         timeout=datetime.timedelta(minutes=timeout_minutes))

    @property
    def requested(self) -> bool:
        return self._seen is not None or self.signum is not None

    # -- signals -------------------------------------------------------------------------------
    def install(self) -> None:
        """Catch SIGTERM, SIGINT and SIGHUP (main thread only; elsewhere nothing is installed).
        A closed terminal (SIGHUP) ended a run at once, without its checkpoint or end record; a
        signal already ignored (SIGHUP under nohup) stays ignored."""
        for sig in STOP_SIGNALS:
            if sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # nohup's (SIGINT ignored by `sh -c "cmd &"` is still a stop asked)
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread (e.g. a test's thread)
                return
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            self._wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            reader.close()
            writer.close()
            return
        self._sockets = (reader, writer)
        self._listener = threading.Thread(target=self._listen, args=(reader,), daemon=True,
                                          name="bertgpu-signals")
        self._listener.start()

    def restore(self) -> None:
        """Put the previous handlers back and disarm the deadline (the run has ended). The
        listener first reads what is left, so that no signal it notes later arms a deadline
        that would end the process after the run."""
        if self._sockets is not None:
            signal.set_wakeup_fd(self._wakeup if self._wakeup is not None else -1)
            self._sockets[1].close()  # the listener reads end-of-file and returns
            if self._listener is not None:
                self._listener.join(timeout=5)
            self._sockets[0].close()
            self._sockets = self._listener = None
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        """The Python-level handler, in the main thread between two bytecodes."""
        if self._seen is None:
            self._seen = signum
        if self._listener is None:  # no wakeup fd: count the signal here
            self._note(signum)
        if self._interruptible:
            self._interruptible = False
            raise Preempted(signal.Signals(signum).name)

    def _listen(self, reader: socket.socket) -> None:
        """One byte per signal delivered, written by the C-level handler whatever the main
        thread is doing."""
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._note(signum)

    def _note(self, signum: int) -> None:
        with self._lock:
            now = time.monotonic()
            if self._own is None:
                self._own = (signum, now)
                self.signum = self.signum or signum
                self._arm(now + self.grace_s)
            elif now - self._own[1] < (_DUPLICATE_S if signum == self._own[0] else _RELAYED_S):
                return  # the same preemption, delivered twice (or relayed as another signal)
            else:
                self._exit_now(f"second {signal.Signals(signum).name}: stopped at once "
                               f"{self.phase}", prefix=False)

    def _arm(self, end: float) -> None:
        """The grace ends at `end` (time.monotonic()), unless it ends sooner already: the
        deadline's timer is set before it, by the margin and the sinks' reserve."""
        with self._lock:
            if self._closed or (self.end is not None and self.end <= end):
                return
            if self._timer is not None:
                self._timer.cancel()
            self.end = end
            self.deadline = end - margin(self.grace_s) - sinks_reserve(self.grace_s)
            self._timer = threading.Timer(max(0.0, self.deadline - time.monotonic()),
                                          self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        self._exit_now(f"the grace of {self.grace_s:g} s ran out {self.phase}; stopped without "
                       "a preemption checkpoint", close_sinks=True)

    def _exit_now(self, what: str, prefix: bool = True, close_sinks: bool = False) -> None:
        """End the process now (from the listener or the deadline's thread): one line on rank
        0 (after the signal's name when `prefix`), loader workers killed, exit 128 + the first
        signal. With `close_sinks` (the deadline) the metric sinks open in this process are
        closed first, after the end record that sets their status, within what is left of the
        grace less the margin."""
        with self._lock:
            if self._exiting:
                return
            self._exiting = True
        if self.info.is_main:
            self._append_end()
        if close_sinks:
            self._close_sinks()
        if self.info.is_main:
            line = f"{self.title}: {self._name() + ': ' if prefix else ''}{what}; {self._hint()}\n"
            flush = threading.Thread(target=_flush_stdio, daemon=True)
            flush.start()
            flush.join(min(0.5, margin(self.grace_s) / 2))  # never wait long on a blocked stdout
            try:
                os.write(2, line.encode("utf-8", "replace"))
            except OSError:  # stderr gone (its reader ended): the process must end all the same
                pass
        for child in multiprocessing.active_children():  # loader workers ignore SIGTERM
            child.kill()
        release_held()  # os._exit skips the output lock's finally (locks.py)
        os._exit(self.exit_status)

    def _close_sinks(self) -> None:
        """Close the metric sinks still open in this process (telemetry/fanout.py), returning by
        the grace's end less the margin whatever they do. Best effort, as `_append_end`."""
        fanout = sys.modules.get("bertgpu.telemetry.fanout")  # not imported: no sink is open
        left = (self.end - margin(self.grace_s) - time.monotonic()) if self.end is not None else 0.0
        if fanout is None or left <= 0:
            return
        try:
            fanout.close_open(left)
        except Exception:  # noqa: BLE001 - nothing here may keep the process from exiting
            pass

    def _append_end(self) -> None:
        """Rank 0: the `end` record (reason preempted) that the loop had no time to write, one
        line appended to metrics.jsonl. It used to be missing, and `bertgpu watch` took the run
        for killed or crashed. Best effort: nothing here may keep the process from exiting."""
        if self.run_dir is None or self.end_logged:
            return
        import json

        record: dict[str, Any] = {"step": self.step, "kind": "info", "time": round(time.time(), 3)}
        try:
            if self.elapsed is not None:
                record["elapsed_s"] = round(float(self.elapsed()), 3)
        except Exception:  # noqa: BLE001
            pass
        record.update(event="end", reason="preempted", world_size=self.info.world_size)
        path = Path(self.run_dir) / "metrics.jsonl"
        try:
            if not path.is_file():
                return  # no run's records here (the logger writes none on this run)
            with open(path, "rb+") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - (1 << 20)))
                tail = f.read()
                cut = tail.rfind(b"\n")
                # A line cut short (the main thread's, cut by the exit): readers reject it unless
                # it is the last, so it goes.
                if tail and not tail.endswith(b"\n") and (cut >= 0 or len(tail) == size):
                    f.truncate(size - len(tail) + cut + 1)
                f.seek(0, os.SEEK_END)
                f.write((json.dumps(record) + "\n").encode())
        except (OSError, ValueError):
            pass
        self.end_logged = True

    def _name(self) -> str:
        return signal.Signals(self.signum or self._seen or signal.SIGTERM).name

    def _hint(self) -> str:
        if self.run_dir is None:  # no run folder: nothing to resume (and no torch to import)
            return "no checkpoint was written, so re-running the same command starts over"
        from bertgpu.train.checkpoint import hint_for

        try:
            return hint_for(self.run_dir)
        except OSError:
            return "re-running the same command resumes from its newest complete checkpoint"

    @property
    def exit_status(self) -> int:
        """128 + the first stop signal: 143 for SIGTERM, 130 for SIGINT, 129 for SIGHUP."""
        return 128 + int(self.signum or self._seen or signal.SIGTERM)

    # -- safe points ---------------------------------------------------------------------------
    def interruptible(self, phase: str, fn: Callable[[], T]) -> T | None:
        """`fn()`, cut short by a stop signal: None when it was (or when one came before). The
        caller must `check()` next, on every rank. `phase` lasts while `fn` runs, then the phase
        from before comes back (it used to stay, so a grace that ran out during a step said
        "waiting for the data of step N")."""
        before, self.phase = self.phase, phase
        try:
            try:
                if self.requested:
                    return None
                self._interruptible = True
                return fn()
            finally:
                self._interruptible = False
        except Preempted:
            return None
        finally:
            self.phase = before

    def check(self, micro_batches: int = 1) -> int:
        """A safe point, at the same place on every rank: raises Preempted when any rank got a
        stop signal. Returns the smallest `micro_batches` over ranks (the micro-steps after
        which every rank checks again)."""
        if self._group is None:
            if self.requested:
                raise Preempted(self._name())
            return micro_batches
        import torch
        import torch.distributed as dist

        # The grace's end, not the deadline: each rank keeps its own reserve for its sinks.
        left = (self.end - time.monotonic()) if self.end is not None else float("inf")
        sig = float(self.signum or self._seen or 0)
        flags = torch.tensor([sig, -float(micro_batches), -left], dtype=torch.float64)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group)
        if flags[0] > 0:
            if self.signum is None:  # another rank's signal: its signal and its deadline
                self.signum = int(flags[0])
            agreed = -float(flags[2])
            self._arm(time.monotonic() + (agreed if math.isfinite(agreed) else self.grace_s))
            raise Preempted(self._name())
        return int(-flags[1])

    def checked_loss(self, loss_fn: Callable[..., T], micro_batches: int) -> Callable[..., T]:
        """`loss_fn` with a check before micro-steps 2..micro_batches, i.e. after every
        micro-step but the last (the step's update follows that one; the next step's check
        comes right after)."""
        if micro_batches <= 1:
            return loss_fn
        calls = 0

        def checked(*args: Any, **kwargs: Any) -> T:
            nonlocal calls
            calls += 1
            if 1 < calls <= micro_batches:
                self.check()
            return loss_fn(*args, **kwargs)

        return checked

    def begin_step(self, step: int, task: Any, engine: Any, loss: Any = None) -> None:
        """Before step `step` + 1 changes anything: what a checkpoint holds if it is aborted
        (the RNG states, the task's state, the engine's counters, the loop's `loss` mark)."""
        from bertgpu.train.checkpoint import capture_rng

        self.snapshot = Snapshot(capture_rng(), task.state_dict(), engine.state_later(), loss)
        self.phase, self.step = f"in step {step + 1}", step

    def end_step(self, step: int) -> None:
        self.snapshot, self.step = None, step
        self.phase = f"after step {step}"

    # -- the end -------------------------------------------------------------------------------
    def stop(self, loop: Any, logger: Any) -> int:
        """Every rank, once agreed: rank 0 decides (one collective), the preemption checkpoint
        is written or not, one line says which. Returns the exit status. `loop` is the
        train.loop.Loop (its step, checkpoints, model and `save`)."""
        # An aborted fsdp accumulation leaves the parameters unsharded; FSDP2's state-dict
        # pre-hook (to_sharded) still gives the checkpoint the shards.
        step, ckpts = loop.engine.step, loop.checkpoints
        verdict, estimate, left = _NONE_NEEDED, 0.0, 0.0
        if self.info.is_main:
            verdict, estimate, left = self._decide(step, loop.saved_step, ckpts, loop.model)
        verdict = self._broadcast(verdict)
        t0 = time.perf_counter()
        if verdict == _WRITE:
            self.phase = f"while writing the preemption checkpoint of step {step}"
            loop.save(logger, snapshot=self.snapshot)
            what = (f"wrote a preemption checkpoint of step {step} in "
                    f"{time.perf_counter() - t0:.1f} s")
        else:
            self.phase = "while waiting for the checkpoint being written"
            written = ckpts.wait()
            if written is not None:
                logger.log(step, "info", event="checkpoint_written", saved_step=written.step,
                           write_s=written.write_s)
            what = ("no step completed since the newest checkpoint" if verdict == _NONE_NEEDED
                    else f"no preemption checkpoint: writing one takes about {estimate:.0f} s, "
                         f"{max(left, 0.0):.0f} s of the {self.grace_s:g} s grace left")
        logger.log(step, "info", event="preempted", signal=self._name(),
                   checkpoint=verdict == _WRITE, estimate_s=estimate if self.info.is_main else None,
                   grace_left_s=left if self.info.is_main else None)
        if self.info.is_main:
            try:
                print(f"{self.title}: {self._name()}: {what}; {self._hint()}", file=sys.stderr,
                      flush=True)
            except OSError:  # stderr's reader is gone (a dead terminal or launcher): the
                pass  # checkpoint and the end record stand, and the exit status says the rest
        return self.exit_status

    def _decide(self, step: int, saved_step: int | None, ckpts: Any, model: torch.nn.Module
                ) -> tuple[int, float, float]:
        """Rank 0: (verdict, estimated seconds, seconds left)."""
        from bertgpu.train.hostcopy import estimate_host_bytes

        left = (self.deadline - time.monotonic()) if self.deadline is not None else self.grace_s
        if step == 0 or (saved_step is not None and saved_step >= step):
            return _NONE_NEEDED, 0.0, left
        measured = ckpts.last_write_s
        estimate = _SAFETY * (measured if measured is not None
                              else estimate_host_bytes(model) / _ASSUMED_BYTES_PER_S)
        pending = ckpts.pending()
        if pending is not None:  # the write in flight finishes first
            estimate += max(0.0, _SAFETY * (measured or 0.0) - pending[1])
        return (_WRITE if estimate <= left else _NO_TIME), estimate, left

    def _broadcast(self, verdict: int) -> int:
        if self._group is None:
            return verdict
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(verdict)], dtype=torch.float64)
        dist.broadcast(t, src=0, group=self._group)
        return int(t.item())


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


__all__ = ["STOP_SIGNALS", "Preempted", "Preemption", "Snapshot", "margin", "sinks_reserve"]
