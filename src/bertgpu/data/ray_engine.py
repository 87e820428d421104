"""`bertgpu prepare --engine ray`: the work units as Ray tasks, on the cluster a user already runs.

    ray start --head --port 6379                    # on the head node; `ray start --address
                                                    # HEAD:6379` on each of the others
    bertgpu prepare --corpus s3://bucket/corpus/ --tokenizer tok/ --out s3://bucket/data/ \\
        --engine ray --ray-address HEAD:6379

Each unit is one task (`unit_job.run_unit` on one CPU of a worker, tokenizing single-threaded):
it reads its pieces, writes its shards and its record straight to the output, and returns the
record to the driver, which seals the set once every unit is done (`output.WorkFolder`). The
job (tokenizer files included: a worker may be another machine) is put in the object store
once. Inputs and output must be paths every worker can read and write: URLs (s3://, gs://, ...)
or a shared filesystem. Every node needs bertgpu (the same version) and the extras of the
formats and protocols read.

Without --ray-address (and no Ray already initialised in this process) a local cluster of
--workers CPUs is started and shut down at the end. A task whose worker dies is retried by Ray
(TASK_RETRIES times); after that the run stops with one line, keeping the finished units, and
the same command redoes only the rest. BERTGPU_FAULTS of the driver reaches the workers.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from typing import Any

from bertgpu.data.engines import Done, Progress, RunStopped
from bertgpu.data.unit_job import UnitJob, run_unit
from bertgpu.data.units import Unit
from bertgpu.errors import BertgpuError
from bertgpu.testing import faults

TASK_RETRIES = 2
CONNECT_TIMEOUT_S = 10.0
UNITS_PER_WORKER = 4
"""A Ray worker process runs at most this many units, then Ray starts a fresh one: inside a Ray
worker the native heap grew by about 10-30 MB per unit (one worker: 225 MB after its first
64 MiB unit, 381 MB after its seventh; the same units in one plain process stay flat), so a
worker's memory is bounded by a few units whatever the corpus size
(benchmarks/prepare_engines.py). A fresh worker costs a few seconds against a unit's ~30 s."""


def _ray():
    try:
        import ray
    except ImportError:
        raise BertgpuError("--engine ray: Ray is not installed; expected `pip install "
                           "'bertgpu[ray]'`") from None
    return ray


def check_address(address: str, source: str = "--ray-address ") -> None:
    """Refuse at once an address where nothing listens (Ray itself would retry for minutes);
    ``source`` (the flag, or "RAY_ADDRESS=") names where it came from in the message."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[-1].rstrip("/")
    host, colon, port = host_port.rpartition(":")
    if not colon:
        host, port = host_port, "6379"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise BertgpuError(f"{source}{address}: no Ray cluster answers ({exc}); expected "
                           "the address `ray start --head` printed (HOST:6379)") from None


def check_shared_inputs(paths: list, flag: str = "--corpus") -> None:
    """Refuse, before any work, a memory:// input: each Ray worker is another process with a
    memory:// store of its own, empty, so every unit failed with "no such file" for a file the
    driver had just listed."""
    for path in paths:
        if isinstance(path, str) and path.startswith("memory://"):
            raise BertgpuError(f"{flag} {path} with --engine ray: Ray's workers are other "
                               "processes and cannot read this process's memory:// store; "
                               "expected a path every worker can read (a local or shared "
                               "folder, an object store's URL), or --engine local")


def _stop_handlers() -> dict[int, object]:
    """SIGTERM's and SIGINT's handlers now (main thread only: no other thread may set them)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    return {sig: h for sig, h in handlers.items() if h is not None}  # (None: not set by Python)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def prepare_unit(job: UnitJob, unit: Unit, held: int | None,
                 fault_plan: str | None) -> dict[str, Any]:
    """The Ray task: one unit, single-threaded (the cluster's CPUs are the parallelism), under
    the driver's BERTGPU_FAULTS (set here, not in a runtime_env: that would start new
    workers)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if fault_plan:
        os.environ[faults.ENV] = fault_plan
    else:
        os.environ.pop(faults.ENV, None)
    try:
        return run_unit(job, unit, held)
    finally:
        _release_heap()


def _release_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing):
    what one unit freed stays free for the next instead of being counted to the worker."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class RayEngine:
    """Units as Ray tasks, completed in any order."""

    def __init__(self, job: UnitJob, address: str | None, workers: int,
                 progress: Progress) -> None:
        ray = _ray()
        self.ray, self.progress = ray, progress
        source = "--ray-address "
        if address is None and os.environ.get("RAY_ADDRESS"):  # Ray's own convention: join it
            address, source = os.environ["RAY_ADDRESS"], "RAY_ADDRESS="
        if address is not None:
            check_address(address, source)
        self.started = False
        if not ray.is_initialized():
            options = dict(include_dashboard=False, log_to_driver=False,
                           logging_level=logging.ERROR)
            kept = _stop_handlers()  # ray.init puts its own SIGTERM handler in: sys.exit(15)
            try:
                if address is not None:
                    ray.init(address=address, **options)
                else:  # "local": a cluster of its own, even where `ray start` left one
                    ray.init(address="local", num_cpus=workers, **options)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                what = (f"{source}{address}: cannot join the Ray cluster" if address is not None
                        else f"--engine ray: cannot start a local Ray cluster of {workers} CPUs")
                raise BertgpuError(f"{what} ({_one_line(exc)})") from None
            finally:  # bertgpu's: a SIGTERM stops the run and keeps its finished units
                for sig, handler in kept.items():
                    signal.signal(sig, handler)
            self.started = True
        self.task = ray.remote(max_calls=UNITS_PER_WORKER)(prepare_unit).options(
            num_cpus=1, max_retries=TASK_RETRIES, retry_exceptions=False)
        self.job = ray.put(job)
        self.fault_plan = os.environ.get(faults.ENV) or None

    def run(self, work: list[tuple[Unit, int | None]], done: Done) -> None:
        ray = self.ray
        pending = {self.task.remote(self.job, unit, held, self.fault_plan): unit
                   for unit, held in work}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    unit = pending.pop(ref)
                    record = self._result(ref, unit)
                    self.progress.unit_done(record)
                    done(record)
        finally:
            # A failure or a stop: stop the other tasks before the driver cleans up after them.
            # A cluster of our own goes down whole in `close`: a forced cancel there raced the
            # replies of tasks finishing meanwhile, and Ray's core worker aborted the driver
            # ("Tried to complete task that was not pending": exit 1 and a C++ dump, not 143).
            if pending and not self.started:
                for ref in pending:
                    ray.cancel(ref, force=True)
                ray.wait(list(pending), num_returns=len(pending), timeout=30)

    def _result(self, ref, unit: Unit) -> dict[str, Any]:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BertgpuError):  # bad input: the same one-line error
                raise BertgpuError(str(cause)) from None
            raise RunStopped(f"{unit.describe()}: failed on a Ray worker "
                             f"({_one_line(cause or exc)}); the finished units are kept: re-run "
                             "the same command to do the rest") from None
        except ray.exceptions.RayError as exc:
            raise RunStopped(f"{unit.describe()}: its Ray worker died ({_one_line(exc)[:300]}); "
                             "the finished units are kept: re-run the same command to do the "
                             "rest") from None

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
