"""Fault injection for tests: kill a rank, fail a write, poison a step or slow a rank on purpose,
so the suite can drive every fault path end to end through the real commands.

    BERTGPU_FAULTS="kill_rank=1@step=3,enospc_write=2,nonfinite_rank=0@step=4,delay_rank=1:0.05" \
        bertgpu pretrain ...

Items, separated by commas (an item may be given more than once):

    kill_rank=R@step=S            rank R sends itself SIGKILL at optimizer step S    maybe_kill
    nonfinite_rank=R@step=S       rank R's loss is made non-finite at step S         nonfinite
    delay_rank=R:SECONDS[@step=S] rank R sleeps SECONDS each step (or at steps S)    delay
    slow_rank=R:SECONDS           rank R sleeps SECONDS per sequence it computes:    slow_down
                                  a slower device, for load balancing tests
    enospc_write=N                the N-th file written by save_checkpoint in this   check_write
                                  process is cut to half its size and raises ENOSPC
    kill_replace=N                SIGKILL between the two renames of the N-th        between_renames
                                  replacement of an existing checkpoint folder
    slow_write=SECONDS            every rank sleeps SECONDS before writing its       slow_write
                                  checkpoint files (in the background with
                                  checkpoint.async_save): a slow filesystem
    kill_unit=U                   the process preparing work unit U of `bertgpu     kill_unit
                                  prepare` sends itself SIGKILL once the unit's
                                  first shard is written (a Ray worker, or the
                                  local engine's main process: the driver)

S is one step (3), a range (3-5) or an open range (3-: step 3 and every later one).

Faults fire in a launcher's first attempt only (TORCHELASTIC_RESTART_COUNT and
BERTGPU_RESTART_COUNT unset or 0): a job that `--max-restarts` restarts then runs clean, as it
would after a real one-off fault.

Every helper reads the environment variable first and returns at once when it is unset, so the
training loop may call them at every step. The parsed plan (with its write and replace counters)
is kept per value of the variable; `reset()` forgets it, for tests that reuse one value.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bertgpu.errors import BertgpuError

ENV = "BERTGPU_FAULTS"
_RESTART_ENVS = ("TORCHELASTIC_RESTART_COUNT", "BERTGPU_RESTART_COUNT")
_SYNTAX = ("kill_rank=R@step=S, nonfinite_rank=R@step=S, delay_rank=R:SECONDS[@step=S], "
           "slow_rank=R:SECONDS, enospc_write=N, kill_replace=N, slow_write=SECONDS or "
           "kill_unit=U")


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
    slow: list[Trigger] = field(default_factory=list)
    enospc_writes: set[int] = field(default_factory=set)
    kill_replaces: set[int] = field(default_factory=set)
    slow_write_s: float = 0.0
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
        elif key == "slow_rank":
            plan.slow.append(_trigger(value, item, timed=True, step_required=False))
        elif key == "enospc_write":
            plan.enospc_writes.add(_int(value, item, 1))
        elif key == "kill_replace":
            plan.kill_replaces.add(_int(value, item, 1))
        elif key == "kill_unit":
            plan.kill_units.add(_int(value, item, 0))
        elif key == "slow_write":
            try:
                plan.slow_write_s = float(value)
            except ValueError:
                plan.slow_write_s = -1.0
            if not plan.slow_write_s >= 0:
                raise _bad(item, "expected slow_write=SECONDS with SECONDS >= 0")
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


def maybe_kill(rank: int, step: int) -> None:
    """SIGKILL this process if a kill_rank item names this rank and step."""
    plan = active()
    if plan is not None and any(t.hits(rank, step) for t in plan.kill):
        _die(f"rank {rank} at step {step}")


def nonfinite(rank: int, step: int) -> bool:
    """True when this rank's loss at this step must be made non-finite (the caller multiplies
    it by NaN, so the real forward and backward still run)."""
    plan = active()
    return plan is not None and any(t.hits(rank, step) for t in plan.nonfinite)


def delay(rank: int, step: int | None = None) -> None:
    """Sleep as a delay_rank item says for this rank (and step, when the item names steps)."""
    plan = active()
    if plan is None:
        return
    for t in plan.delay:
        if t.hits(rank, step):
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


def slow_write() -> None:
    """Called before a checkpoint's files are written (by every rank; for a background save, in
    its writer thread): sleep as slow_write says."""
    plan = active()
    if plan is not None and plan.slow_write_s > 0:
        time.sleep(plan.slow_write_s)


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
