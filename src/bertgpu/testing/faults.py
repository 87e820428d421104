"""Fault injection for tests: kill a rank, fail a write, poison a step or slow a rank on purpose,
so the suite can drive every fault path end to end through the real commands.

    BERTGPU_FAULTS="kill_rank=1@step=3,enospc_write=2,nonfinite_rank=0@step=4,delay_rank=1:0.05" \
        bertgpu pretrain ...

Items, separated by commas (an item may be given more than once):

    kill_rank=R@step=S            rank R sends itself SIGKILL at optimizer step S    maybe_kill
                                  (see below for a checkpoint written in the background)
    nonfinite_rank=R@step=S       rank R's loss is made non-finite at step S         nonfinite
    delay_rank=R:SECONDS[@step=S] rank R sleeps SECONDS each step (or at steps S)    delay
    delay_setup=R:SECONDS         rank R sleeps SECONDS before it joins the process  delay_setup
                                  group: the other ranks wait in its set-up (after
                                  one line on stderr saying so, for tests to wait on)
    slow_rank=R:SECONDS           rank R sleeps SECONDS per sequence it computes:    slow_down
                                  a slower device, for load balancing tests
    enospc_write=N                the N-th file written by save_checkpoint in this   check_write
                                  process is cut to half its size and raises ENOSPC
    kill_replace=N                SIGKILL between the two renames of the N-th        between_renames
                                  replacement of an existing checkpoint folder
    slow_write=SECONDS[@step=S]   a slow filesystem, on every rank (of step S's      slow_write,
                                  checkpoint only, when given; in the background      slow_files
                                  with checkpoint.async_save): a whole-file
                                  checkpoint sleeps SECONDS before its files; a
                                  sharded one writes the first bytes of each shard
                                  file and waits SECONDS before the rest, so a
                                  crash meanwhile leaves a cut file
    slow_eval=SECONDS             every rank sleeps SECONDS in each evaluation:      slow_eval
                                  a long one, for preemption tests
    kill_unit=U                   the process preparing work unit U of `bertgpu     kill_unit
                                  prepare` sends itself SIGKILL once the unit's
                                  first shard is written (a Ray worker, or the
                                  local engine's main process: the driver)

A slow step (one that cannot be interrupted, e.g. one that compiles) is delay_rank=R:SECONDS@step=S.

So that what a kill finds on disk does not depend on the machine's speed, `kill_rank` lets a
checkpoint write that this rank runs in the background finish first when that checkpoint is of a
step before S - 1; the write of step S - 1's checkpoint is the one a kill at step S can land in
(make it slow with slow_write to be sure it is still going). While a sharded write is slowed,
the kill waits (SECONDS at most) until a shard file is cut in the middle.

S is one step (3), a range (3-5) or an open range (3-: step 3 and every later one).

Faults fire in a launcher's first attempt only (TORCHELASTIC_RESTART_COUNT and
BERTGPU_RESTART_COUNT unset or 0): a job that `--max-restarts` restarts then runs clean, as it
would after a real one-off fault.

With slow_write, a kill_rank item waits (up to SECONDS) until that process is in the middle of a
shard file, so the crash cuts one whatever the timing of the background write.

Every helper reads the environment variable first and returns at once when it is unset, so the
training loop may call them at every step. The parsed plan (with its write and replace counters)
is kept per value of the variable; `reset()` forgets it, for tests that reuse one value.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

ENV = "BERTGPU_FAULTS"
_RESTART_ENVS = ("TORCHELASTIC_RESTART_COUNT", "BERTGPU_RESTART_COUNT")
_SYNTAX = ("kill_rank=R@step=S, nonfinite_rank=R@step=S, delay_rank=R:SECONDS[@step=S], "
           "delay_setup=R:SECONDS, slow_rank=R:SECONDS, enospc_write=N, kill_replace=N, "
           "slow_write=SECONDS[@step=S], slow_eval=SECONDS or kill_unit=U")


@dataclass(frozen=True)
class Trigger:
    """A fault on one rank at some steps (first..last inclusive; last None = no end)."""

    rank: int
    first: int = 0
    last: int | None = None
    seconds: float = 0.0

    def hits(self, rank: int, step: int | None) -> bool:
        if rank != self.rank:
            return False
        if step is None:  # a caller that knows no step: only step-less triggers apply
            return self.first == 0 and self.last is None
        return self.first <= step and (self.last is None or step <= self.last)


@dataclass
class Plan:
    """The parsed variable. The counters are this process's checkpoint writes and replacements."""

    kill: list[Trigger] = field(default_factory=list)
    nonfinite: list[Trigger] = field(default_factory=list)
    delay: list[Trigger] = field(default_factory=list)
    delay_setup: list[Trigger] = field(default_factory=list)
    slow: list[Trigger] = field(default_factory=list)
    enospc_writes: set[int] = field(default_factory=set)
    kill_replaces: set[int] = field(default_factory=set)
    slow_write_s: float = 0.0
    slow_write_steps: tuple[int, int | None] | None = None  # None: every checkpoint
    slow_eval_s: float = 0.0
    kill_units: set[int] = field(default_factory=set)
    writes: int = 0
    replaces: int = 0


_plans: dict[tuple[str, str], Plan] = {}


def _bad(item: str, why: str) -> BertgpuError:
    return BertgpuError(f"{ENV}: item {item!r}: {why}; expected {_SYNTAX}")


def _int(text: str, item: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _bad(item, f"{text!r} is not a whole number") from None
    if value < minimum:
        raise _bad(item, f"{value} is below {minimum}")
    return value


def _steps(text: str, item: str) -> tuple[int, int | None]:
    first, dash, last = text.partition("-")
    lo = _int(first, item, 0)
    if not dash:
        return lo, lo
    if not last:
        return lo, None
    hi = _int(last, item, lo)
    return lo, hi


def _trigger(value: str, item: str, *, timed: bool, step_required: bool) -> Trigger:
    head, *quals = value.split("@")
    seconds = 0.0
    if timed:
        rank_text, colon, sec_text = head.partition(":")
        try:
            seconds = float(sec_text) if colon else -1.0
        except ValueError:
            seconds = -1.0
        if not seconds >= 0:
            raise _bad(item, "the delay needs RANK:SECONDS with SECONDS >= 0")
    else:
        rank_text = head
    rank = _int(rank_text, item, 0)
    first, last = 0, None
    for q in quals:
        key, _, steps = q.partition("=")
        if key != "step":
            raise _bad(item, f"unknown qualifier {q!r} (only @step=S)")
        first, last = _steps(steps, item)
    if step_required and not quals:
        raise _bad(item, "a step is required (@step=S)")
    return Trigger(rank, first, last, seconds)


def parse(spec: str) -> Plan:
    """The plan of a BERTGPU_FAULTS value; a malformed item is a BertgpuError naming it."""
    plan = Plan()
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        key, eq, value = item.partition("=")
        if not eq:
            raise _bad(item, "no '='")
        if key == "kill_rank":
            plan.kill.append(_trigger(value, item, timed=False, step_required=True))
        elif key == "nonfinite_rank":
            plan.nonfinite.append(_trigger(value, item, timed=False, step_required=True))
        elif key == "delay_rank":
            plan.delay.append(_trigger(value, item, timed=True, step_required=False))
        elif key == "delay_setup":
            if "@" in value:
                raise _bad(item, "expected delay_setup=R:SECONDS (set-up has no step)")
            plan.delay_setup.append(_trigger(value, item, timed=True, step_required=False))
        elif key == "slow_rank":
            plan.slow.append(_trigger(value, item, timed=True, step_required=False))
        elif key == "enospc_write":
            plan.enospc_writes.add(_int(value, item, 1))
        elif key == "kill_replace":
            plan.kill_replaces.add(_int(value, item, 1))
        elif key == "kill_unit":
            plan.kill_units.add(_int(value, item, 0))
        elif key in ("slow_write", "slow_eval"):
            value, at, steps = value.partition("@step=")
            try:
                seconds = float(value)
            except ValueError:
                seconds = -1.0
            if not seconds >= 0 or (at and key == "slow_eval"):
                raise _bad(item, f"expected {key}=SECONDS with SECONDS >= 0")
            setattr(plan, f"{key}_s", seconds)
            if at:
                plan.slow_write_steps = _steps(steps, item)
        else:
            raise _bad(item, f"unknown fault {key!r}")
    return plan


def active() -> Plan | None:
    """The plan in force in this process, or None (variable unset, or a restarted attempt)."""
    spec = os.environ.get(ENV)
    if not spec:
        return None
    # A restarted attempt, by torch's launcher or by ours (`--max-restarts`), runs clean.
    restart = max(int(os.environ.get(v) or 0) for v in _RESTART_ENVS)
    key = (spec, str(restart))
    plan = _plans.get(key)
    if plan is None:
        plan = parse(spec) if restart == 0 else Plan()
        _plans[key] = plan
    return plan


def reset() -> None:
    """Forget parsed plans and their counters (tests that set the same value twice)."""
    _plans.clear()


def _die(what: str) -> None:
    # One line on stderr so a test log shows the death was on purpose, then no clean-up at all.
    print(f"bertgpu: fault injected ({ENV}): SIGKILL {what}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def maybe_kill(rank: int, step: int, settle: Callable[[int], None] | None = None) -> None:
    """SIGKILL this process if a kill_rank item names this rank and step. `settle(step - 1)`
    runs first: it lets this rank's background checkpoint write of a step before `step - 1`
    finish (see the module docstring); with a slowed sharded write, the kill then waits until a
    shard file is cut (SECONDS at most)."""
    plan = active()
    if plan is not None and any(t.hits(rank, step) for t in plan.kill):
        if settle is not None:
            settle(step - 1)
        if plan.slow_write_s > 0 and _slow_files_used.is_set():
            _mid_file.wait(plan.slow_write_s)
        _die(f"rank {rank} at step {step}")


def nonfinite(rank: int, step: int) -> bool:
    """True when this rank's loss at this step must be made non-finite (the caller multiplies
    it by NaN, so the real forward and backward still run)."""
    plan = active()
    return plan is not None and any(t.hits(rank, step) for t in plan.nonfinite)


def faulty_loss(loss: Callable[..., Any], rank: int, step: int) -> Callable[..., Any]:
    """A task's `loss` (model, batch) -> {term: tensor}, made non-finite on this rank when a
    fault is injected for the step (the forward and backward still run: the engine must find
    and skip it), and slowed down per sequence when a slow rank is injected (load balancing)."""
    poison = nonfinite(rank, step)

    def injected(model: Any, batch: Any) -> Any:
        slow_down(rank, int(batch["input_ids"].shape[0]))
        out = loss(model, batch)
        return {k: v * float("nan") if poison and not k.startswith("_") else v
                for k, v in out.items()}

    return injected


def delay(rank: int, step: int | None = None) -> None:
    """Sleep as a delay_rank item says for this rank (and step, when the item names steps)."""
    plan = active()
    if plan is None:
        return
    for t in plan.delay:
        if t.hits(rank, step):
            time.sleep(t.seconds)


def delay_setup(rank: int) -> None:
    """Before this rank joins the process group: sleep as a delay_setup item says for it, after
    one line on stderr (a test waits for it, then signals the job while it is being set up)."""
    plan = active()
    if plan is None:
        return
    for t in plan.delay_setup:
        if t.hits(rank, None):
            print(f"bertgpu: fault injected ({ENV}): rank {rank} joins the process group in "
                  f"{t.seconds:g} s", file=sys.stderr, flush=True)
            time.sleep(t.seconds)


def slow_down(rank: int, sequences: int) -> None:
    """Sleep as a slow_rank item says for this rank: its seconds per sequence computed, so the
    rank behaves like a slower device (the time scales with its share of the batch)."""
    plan = active()
    if plan is None:
        return
    for t in plan.slow:
        if t.hits(rank, None):
            time.sleep(t.seconds * sequences)


def check_write(path: Path) -> None:
    """Call after each file a checkpoint save writes: on the N-th one named by enospc_write, cut
    the file to half its size (what a full disk leaves) and raise ENOSPC."""
    plan = active()
    if plan is None:
        return
    plan.writes += 1
    if plan.writes in plan.enospc_writes:
        path = Path(path)
        os.truncate(path, path.stat().st_size // 2)
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (injected by {ENV})", str(path))


def _slow_write_s(step: int) -> float:
    """The seconds slow_write asks for the checkpoint of `step` (0: none)."""
    plan = active()
    if plan is None or plan.slow_write_s <= 0:
        return 0.0
    if plan.slow_write_steps is not None:
        first, last = plan.slow_write_steps
        if step < first or (last is not None and step > last):
            return 0.0
    return plan.slow_write_s


def slow_write(step: int) -> None:
    """Called before the files of step `step`'s whole-file checkpoint are written (for a
    background save, in its writer thread): sleep as slow_write says."""
    seconds = _slow_write_s(step)
    if seconds > 0:
        time.sleep(seconds)


def slow_eval() -> None:
    """Called inside every evaluation (where a stop signal may interrupt it): sleep as slow_eval
    says."""
    plan = active()
    if plan is not None and plan.slow_eval_s > 0:
        time.sleep(plan.slow_eval_s)


_mid_file = threading.Event()
"""Set while a slow_write waits in the middle of a shard file (what maybe_kill waits for)."""


_slow_files_used = threading.Event()
"""Set once a sharded checkpoint writes through `slow_files` (a kill then waits for a cut)."""


def slow_files(fs: object, step: int) -> object:
    """DCP's filesystem object (`FileSystemWriter.fs`) as slow_write makes it for the checkpoint
    of `step`: each shard file (*.distcp) opened for writing gets its first write flushed to disk,
    then its writer waits SECONDS before the rest. `fs` itself when slow_write is off."""
    seconds = _slow_write_s(step)
    if seconds <= 0:
        return fs
    _slow_files_used.set()
    return _SlowFiles(fs, seconds)


class _SlowFiles:
    def __init__(self, fs: object, seconds: float) -> None:
        self._fs, self._seconds = fs, seconds

    def __getattr__(self, name: str) -> object:
        return getattr(self._fs, name)

    @contextlib.contextmanager
    def create_stream(self, path: object, mode: str) -> Iterator[object]:
        with self._fs.create_stream(path, mode) as stream:
            shard = str(path).endswith(".distcp") and "w" in mode
            yield _SlowStream(stream, self._seconds) if shard else stream


class _SlowStream:
    """A file whose first write reaches the disk, then waits: a crash meanwhile cuts it."""

    def __init__(self, stream: object, seconds: float) -> None:
        self._stream, self._seconds, self._waited = stream, seconds, False

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)

    def write(self, data: object) -> int:
        n = self._stream.write(data)
        if not self._waited:
            self._waited = True
            self._stream.flush()
            _mid_file.set()
            try:
                time.sleep(self._seconds)
            finally:
                _mid_file.clear()
        return n


def between_renames() -> None:
    """Called by the folder replacement between "old aside" and "new in": SIGKILL on the N-th
    replacement named by kill_replace (the crash the start-up recovery must repair)."""
    plan = active()
    if plan is None:
        return
    plan.replaces += 1
    if plan.replaces in plan.kill_replaces:
        _die(f"between the renames of folder replacement {plan.replaces}")


def kill_unit(unit: int) -> None:
    """Called by `bertgpu prepare` while it writes work unit ``unit``'s shards: SIGKILL if a
    kill_unit item names the unit."""
    plan = active()
    if plan is not None and unit in plan.kill_units:
        _die(f"while preparing work unit {unit}")
