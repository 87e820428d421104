"""The sinks' side of ``MetricsLogger`` (telemetry/metrics.py): the ``Sink`` protocol, the numbers
of a record a sink gets, and ``SinkFanout``, which hands every event to every sink on one
background thread, so a slow tracking server never stalls a training step. The sinks themselves
are in telemetry/sinks.py.

An exit that cannot wait for the logger to close, a preemption grace that ran out
(train/preemption.py ends the process with ``os._exit``, which skips every close), first calls
``close_open`` with the seconds it kept for it (``close_reserve_s``): without it the TensorBoard
event file lost its last records, the MLflow run stayed RUNNING and the W&B run unfinished.
"""

from __future__ import annotations

import math
import queue
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bertgpu.telemetry.monitor import slowdown_reasons


class Sink(Protocol):
    """One place metrics go. Called from one thread at a time, never concurrently: the sink
    thread, or at an exit that cannot wait a thread of its own for `close` (`close_open`). A sink
    may say how many seconds its `close` needs at most as ``close_s`` (else DEFAULT_CLOSE_S)."""

    name: str

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None: ...

    def log_config(self, config: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def sink_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics record for a sink: no bookkeeping keys, no text or booleans,
    no NaN; a per-rank list ``rank_compute_s`` becomes ``rank_compute_s/0``, ``/1``, ..."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "kind", "time"):
            continue
        values = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, v in values:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                out[key if i is None else f"{key}/{i}"] = v
    return out


def system_scalars(samples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """GPU samples -> ``{"gpu0/temp_c": 65.0, ...}`` for the sinks' "system" kind."""
    out: dict[str, float] = {}
    for s in samples:
        for key, value in s.items():
            if key not in ("time", "step", "gpu") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):
                out[f"gpu{s['gpu']}/{key}"] = value
        if "throttle" in s:  # idle or clocks set on purpose is not throttled (as the console)
            out[f"gpu{s['gpu']}/throttled"] = float(bool(slowdown_reasons(s["throttle"])))
    return out


DEFAULT_CLOSE_S = 1.0
"""The seconds a sink's `close` is assumed to need when it does not say (`close_s`)."""

_open: set[SinkFanout] = set()  # fan-outs whose sinks are not all closed yet
_open_lock = threading.Lock()


def close_reserve_s() -> float:
    """The seconds the sinks still open in this process need to close, side by side (the
    largest `close_s`); 0.0 when none is open. train/preemption.py keeps them from its grace."""
    with _open_lock:
        fanouts = list(_open)
    return max((getattr(sink, "close_s", DEFAULT_CLOSE_S)
                for fanout in fanouts for sink in fanout.open_sinks()), default=0.0)


def close_open(timeout_s: float) -> None:
    """Close every sink still open in this process, returning within `timeout_s` whatever they
    do (`SinkFanout.close_within`): for an exit that cannot wait for the sinks' owner, a
    preemption's grace that ran out (train/preemption.py ends the process with os._exit, which
    would leave the TensorBoard file without its last records, the MLflow run RUNNING and the
    W&B run unfinished)."""
    end = time.monotonic() + timeout_s
    with _open_lock:
        fanouts = list(_open)
    closers = [threading.Thread(target=f.close_within, args=(timeout_s,), daemon=True,
                                name="bertgpu-sinks-exit") for f in fanouts]
    for t in closers:
        t.start()
    for t in closers:
        t.join(max(0.0, end - time.monotonic()))


class SinkFanout:
    """Hands every event to every sink on one daemon thread, in order."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self._queue: queue.Queue[tuple[str, tuple[Any, ...]] | None] = queue.Queue()
        self._closed = False
        # Who calls which sink: the sink the sink thread is in, and the sinks whose close has
        # begun (on the sink thread, or on one of `close_within`'s), which nothing calls again.
        self._lock = threading.Lock()
        self._busy: Sink | None = None
        self._done: set[int] = set()  # id() of the sinks
        self._thread = threading.Thread(target=self._run, name="bertgpu-sinks", daemon=True)
        with _open_lock:
            _open.add(self)
        self._thread.start()

    def open_sinks(self) -> list[Sink]:
        """The working sinks whose close has not begun."""
        with self._lock:
            return [s for s in self.sinks if id(s) not in self._done]

    def log(self, step: int, kind: str, scalars: Mapping[str, float]) -> None:
        if scalars and not self._closed:
            self._queue.put(("log", (step, kind, dict(scalars))))

    def log_config(self, config: Mapping[str, Any]) -> None:
        if not self._closed:
            self._queue.put(("log_config", (dict(config),)))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            method, args = item
            if method == "drained":  # close_within's mark: every event before it delivered
                args[0].set()
                continue
            for sink in list(self.sinks):
                self._call(sink, method, args)
        for sink in list(self.sinks):
            self._call(sink, "close", ())
        with _open_lock:
            _open.discard(self)

    def _call(self, sink: Sink, method: str, args: tuple[Any, ...]) -> None:
        with self._lock:
            if id(sink) in self._done:  # closed, or being closed by `close_within`
                return
            self._busy = sink
            if method == "close":
                self._done.add(id(sink))
        try:
            getattr(sink, method)(*args)
        except Exception as e:  # a sink must not end a training run
            self._failed(sink, method, e)
        finally:
            with self._lock:
                self._busy = None

    def _failed(self, sink: Sink, method: str, e: Exception) -> None:
        if sink in self.sinks:
            self.sinks.remove(sink)
        print(f"bertgpu: the {sink.name} sink failed in {method} ({type(e).__name__}: "
              f"{str(e)[:200]}); it is off for the rest of the run", file=sys.stderr, flush=True)

    def _close_one(self, sink: Sink) -> None:
        try:
            sink.close()
        except Exception as e:  # noqa: BLE001 - as on the sink thread
            self._failed(sink, "close", e)

    def close(self, timeout_s: float = 120.0) -> None:
        """Deliver what is queued, close every sink, and wait (at most ``timeout_s``)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            print(f"bertgpu: metric sinks still busy after {timeout_s:.0f} s; not waiting",
                  file=sys.stderr, flush=True)

    def close_within(self, timeout_s: float) -> None:
        """Close every sink, returning within `timeout_s` whatever they do (an exit that cannot
        wait). The sink thread first delivers what is queued (half the time at most); then every
        sink not closed yet is closed side by side, each from a thread of its own, except one
        the sink thread is still in (a slow call: no sink is called from two threads at once),
        and a sink not reached by then misses the records still queued for it."""
        end = time.monotonic() + timeout_s
        drained = threading.Event()
        first, self._closed = not self._closed, True
        self._queue.put(("drained", (drained,)))
        if first:
            self._queue.put(None)  # then the sink thread ends (the sinks closed here it skips)
        half = time.monotonic() + timeout_s / 2
        while not drained.wait(0.01) and self._thread.is_alive() and time.monotonic() < half:
            pass
        with self._lock:
            rest = [s for s in self.sinks if id(s) not in self._done and s is not self._busy]
            self._done.update(id(s) for s in rest)
        closers = [threading.Thread(target=self._close_one, args=(s,), daemon=True,
                                    name=f"bertgpu-sink-{s.name}") for s in rest]
        for t in closers:
            t.start()
        for t in [*closers, self._thread]:
            t.join(max(0.0, end - time.monotonic()))


__all__ = ["DEFAULT_CLOSE_S", "Sink", "SinkFanout", "close_open", "close_reserve_s",
           "sink_scalars", "system_scalars"]
