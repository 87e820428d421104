"""The execution engines of `bertgpu prepare`: who runs the work units, in what order, and the
progress line. The output never depends on the engine (`unit_job`).

    with open_engine("local", job, workers=8) as engine:     # or "ray", address="HOST:6379"
        records = run_all(engine, units, finished, job.validation_docs, progress)

- ``local``: the units one after another in this process, each with the pool of ``workers``
  processes behind the ordered pipeline (`pipeline`): a single large file still uses every core.
- ``ray``: each unit is a Ray task on a cluster (`ray_engine`), as many at a time as it has CPUs.

`run_all` sends the engine the units not already finished. With --validation-docs N a unit must
know how many of the first N documents the units before it held, so the units that may hold
some run one at a time first, the rest all at once (and a unit whose count changed, again).

The progress line (stderr, when it is a terminal) counts the stored bytes read, with the units
done of the total, tokens/s and bytes/s across the cluster and the ETA:
``prepare:  42%|████▏     | 1.21G/2.88G [01:10<01:37, 17.2MB/s, 19/45 units, 4.31M tokens/s]``
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

from bertgpu.data import pipeline
from bertgpu.data.output import StoreFailed
from bertgpu.data.unit_job import UnitJob, run_unit
from bertgpu.data.units import Unit
from bertgpu.errors import BertgpuError

ENGINES = ("local", "ray")
Done = Callable[[dict[str, Any]], None]


class Engine(Protocol):
    def run(self, work: list[tuple[Unit, int | None]], done: Done) -> None:
        """Prepare each (unit, held_docs); call ``done(record)`` as each finishes, any order."""

    def close(self) -> None: ...


class RunStopped(BertgpuError):
    """A run stopped by something other than its input (a worker died, Ctrl-C): the finished
    units stay in the work folder and a re-run of the same command redoes only the rest."""


PROGRESS_LINE_S = 60.0
"""Seconds between the plain progress lines of a run whose stderr is not a terminal."""


class Progress:
    """The one progress line: stored bytes (rate, ETA), units done of all, tokens/s. On a
    terminal (`enabled`) a bar; else, with `lines`, a plain line every PROGRESS_LINE_S (a batch
    job's log, `nohup`: a 200 MB corpus printed nothing for two minutes, a large one for hours).

    A unit run again (--validation-docs, `_due`) is done and its bytes read once: counted twice,
    the line said "10/8 units" at 130%. Its tokens count again (the rate is of the work done)."""

    def __init__(self, units: list[Unit], finished: Iterable[int], enabled: bool,
                 lines: bool = False) -> None:
        self.total_units = len(units)
        self.counted = set(finished)  # the units done (their bytes in `bytes_done`)
        self.done = len(self.counted)
        self.tokens = 0
        self.start = self._last_line = time.perf_counter()
        self.live = 0  # bytes of the unit in progress (local engine)
        self.again = False  # the unit in progress was done before: its bytes are counted
        self.total_bytes = sum(u.bytes for u in units)
        self.initial = self.bytes_done = sum(u.bytes for u in units if u.index in self.counted)
        self.lines_every_s = PROGRESS_LINE_S if lines and not enabled else None
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=sum(u.bytes for u in units), unit="B", unit_scale=True,
                            desc="prepare", file=sys.stderr, dynamic_ncols=True,
                            initial=self.initial)
            self._postfix()

    def _postfix(self) -> None:
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        self.bar.set_postfix_str(f"{self.done}/{self.total_units} units, "
                                 f"{_si(rate)} tokens/s", refresh=False)

    def starting(self, unit: int) -> None:
        """The unit (index) whose bytes `within` reports next (local engine)."""
        self.again, self.live = unit in self.counted, 0

    def within(self, read_bytes: int) -> None:
        """Bytes read so far of the unit in progress."""
        if read_bytes > self.live and not self.again:
            if self.bar is not None:
                self.bar.update(read_bytes - self.live)
            self.bytes_done += read_bytes - self.live
            self.live = read_bytes
        self._line()

    def unit_done(self, record: dict[str, Any], tokens_seen: int = 0) -> None:
        self.tokens += sum(s["tokens"] for s in record["splits"].values()) - tokens_seen
        first = record["unit"] not in self.counted
        if first:
            self.counted.add(record["unit"])
            self.done += 1
            self.bytes_done += record["bytes"] - self.live
        if self.bar is not None:
            if first:
                self.bar.update(record["bytes"] - self.live)
            self._postfix()
            self.bar.refresh()
        self.live, self.again = 0, False
        self._line()

    def tokens_within(self, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            self._postfix()
        self._line()

    def _line(self) -> None:
        """The plain line, when `lines_every_s` have passed since the last one (or the start)."""
        now = time.perf_counter()
        if self.lines_every_s is None or now - self._last_line < self.lines_every_s:
            return
        from tqdm import tqdm  # (its bar's clock format: 01:10, 1:01:40)

        duration = tqdm.format_interval
        self._last_line, elapsed = now, max(now - self.start, 1e-9)
        rate = (self.bytes_done - self.initial) / elapsed
        left = (f", ETA {duration((self.total_bytes - self.bytes_done) / rate)}" if rate > 0
                else "")
        print(f"prepare: {self.bytes_done / max(self.total_bytes, 1):.0%} of "
              f"{_si(self.total_bytes)}B, {self.done}/{self.total_units} units, "
              f"{_si(self.tokens / elapsed)} tokens/s, {duration(elapsed)} elapsed{left}",
              file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:.0f}"


class LocalEngine:
    """The units in order in this process, each tokenized on one shared pool."""

    def __init__(self, job: UnitJob, workers: int, progress: Progress) -> None:
        self.job, self.workers, self.progress = job, workers, progress
        self.pool = None
        self._pool_context = None
        if workers > 1:
            self._pool_context = pipeline.make_pool(workers, job.tokenizer_json, job.settings)
            self.pool = self._pool_context.__enter__()

    def run(self, work: list[tuple[Unit, int | None]], done: Done) -> None:
        for unit, held in work:
            seen = [0]

            def progress(tokens: int, read: int, seen: list[int] = seen) -> None:
                self.progress.tokens_within(tokens - seen[0])
                seen[0] = tokens
                self.progress.within(read)

            self.progress.starting(unit.index)
            try:
                record = run_unit(self.job, unit, held, self.workers, self.pool, progress)
            except (BrokenProcessPool, StoreFailed) as exc:  # as a Ray task's failure
                why = (str(exc) if isinstance(exc, StoreFailed) else "a worker process of the "
                       "pool died (killed by a signal or for lack of memory)")
                raise RunStopped(f"{unit.describe()}: {why}; the finished units are kept: re-run "
                                 "the same command to do the rest") from None
            self.progress.unit_done(record, tokens_seen=seen[0])
            done(record)

    def close(self) -> None:
        if self._pool_context is not None:
            self._pool_context.__exit__(None, None, None)
            self._pool_context = self.pool = None


def open_engine(name: str, job: UnitJob, workers: int, address: str | None,
                progress: Progress) -> Engine:
    if name == "local":
        if address is not None:
            raise BertgpuError("--ray-address: only with --engine ray")
        return LocalEngine(job, workers, progress)
    if name == "ray":
        from bertgpu.data.ray_engine import RayEngine

        return RayEngine(job, address, workers, progress)
    raise BertgpuError(f"--engine {name!r}: unknown; expected one of {', '.join(ENGINES)}")


def run_all(engine: Engine, units: list[Unit], finished: dict[int, dict[str, Any]],
            validation_docs: int | None) -> dict[int, dict[str, Any]]:
    """Every unit's record, in a dict by unit index: ``finished`` ones kept, the rest run.

    A file read in parts that a unit skips (--skip-bad) is left out whole (`left_out`), and so
    are the documents its parts held out of the first N: the units after it that now hold them
    run again, until every unit holds what the corpus that is kept gives it."""
    records = dict(finished)
    while due := _due(units, records, validation_docs):
        engine.run(due, lambda r: records.__setitem__(r["unit"], r))
    return records


def _due(units: list[Unit], records: dict[int, dict[str, Any]], validation_docs: int | None
         ) -> list[tuple[Unit, int | None]]:
    """What to run next: the first unit of the first N documents without its record, or run with
    another count of them left (``held_docs``; one at a time, as the next depends on it), else
    every unit without a record, or that held some and is past them now."""
    if validation_docs is None:
        return [(u, None) for u in units if u.index not in records]
    out, left, holding = left_out(units, records), validation_docs, set()
    for unit in units:
        if left <= 0:
            break
        if unit.index in out:  # (its record may come later: it is emptied whatever it holds)
            continue
        record = records.get(unit.index)
        if record is None or record.get("held_docs", left) != left:
            return [(unit, left)]
        left -= record["documents"]
        holding.add(unit.index)
    return [(u, 0) for u in units if u.index not in records or (
        u.index not in holding | out and records[u.index].get("held_docs", 0) != 0)]


def left_out(units: list[Unit], records: dict[int, dict[str, Any]]) -> set[int]:
    """The units that read a part of a file some unit skipped (--skip-bad): the file is left out
    whole, so they are emptied (`prepare`)."""
    bad = {path for r in records.values() for path, _ in r["skipped"]}
    return {u.index for u in units if any(not p.whole and str(p.src) in bad for p in u.pieces)}
