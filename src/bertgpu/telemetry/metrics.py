"""Memory, the metrics log and the progress line (throughput: `throughput.py`).

Every log line answers "is it healthy and how fast?" (STYLE.md habit 5): loss, lr, grad norm,
tokens/s, MFU, memory and ETA, with the same keys on the console and in ``RUN_DIR/metrics.jsonl``
and units in the key names (``tokens_per_s``, ``mem_peak_gib``, ``elapsed_s``).

Typical use in a training loop (rank 0 logs, other ranks get a logger that does nothing)::

    tput = Throughput(n_devices=world_size, compile_events=compile_events, skip_first=True)
    log = MetricsLogger(run_dir, is_main=rank == 0, total_steps=cfg.max_steps, initial_step=step)
    log.print(format_startup_table([("global batch", "256 sequences"), ...]))
    for step in range(step + 1, cfg.max_steps + 1):
        ...
        tput.update(tokens=real_tokens, sequences=global_batch)  # all devices, padding not counted
        rates = tput.rates()
        log.log(step, "train", loss=loss, lr=lr, grad_norm=gn, **rates, **tput.compile_fields(),
                mfu=mfu(rates["tokens_per_s"], fpt, peak, world_size) if rates else None,
                **device_memory())
    log.close()

``mfu`` (from `flops.py`) is a fraction (0.42 means 42 %); the console shows it as a percentage.
The sinks (TensorBoard, W&B, MLflow) and the GPU monitor are plugged in by
``run_logger.open_logger``; the loop does not know which exist. Nothing here imports torch, tqdm or
TensorBoard at module import time.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from bertgpu.telemetry.console import console_fields, duration
from bertgpu.telemetry.records import cut_after, launcher_fields, open_for_append
from bertgpu.telemetry.sinks import Sink, SinkFanout, TensorBoardSink, sink_scalars, system_scalars
from bertgpu.telemetry.throughput import Throughput

# Re-exported: callers have always found them here.
__all__ = ["MetricsLogger", "Throughput", "device_memory", "gpu_utilisation"]

_GIB = float(1 << 30)
# Info events for the readers of metrics.jsonl only (`bertgpu watch`: the host and pid of a run,
# and of the launcher that may restart it), neither printed (the start-up table says it) nor
# sent to the sinks (no numbers to plot).
FILE_ONLY_EVENTS = ("start",)


# --------------------------------------------------------------------------------------------
# Memory and GPU state
# --------------------------------------------------------------------------------------------


def _peak_rss_gib() -> float | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return peak / _GIB if sys.platform == "darwin" else peak * 1024 / _GIB


def _current_rss_gib() -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024 / _GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def device_memory(device: Any = None) -> dict[str, float]:
    """Memory in GiB, keys ready for ``MetricsLogger.log``.

    On CUDA (``device`` a CUDA device, or None while CUDA is available and initialised):
    ``mem_peak_gib`` (``torch.cuda.max_memory_allocated``: what the tensors needed) and
    ``mem_reserved_gib`` (``max_memory_reserved``: what the caching allocator took). Otherwise
    the process: ``mem_peak_gib`` (peak RSS) and ``mem_rss_gib`` (current RSS).
    """
    use_cuda = False
    if device is not None and str(device).startswith("cuda"):
        use_cuda = True
    elif device is None and "torch" in sys.modules:
        import torch

        use_cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    if use_cuda:
        import torch

        return {
            "mem_peak_gib": torch.cuda.max_memory_allocated(device) / _GIB,
            "mem_reserved_gib": torch.cuda.max_memory_reserved(device) / _GIB,
        }
    out: dict[str, float] = {}
    peak, rss = _peak_rss_gib(), _current_rss_gib()
    if peak is not None:
        out["mem_peak_gib"] = peak
    if rss is not None:
        out["mem_rss_gib"] = rss
    return out


def gpu_utilisation(device: Any = None, monitor: Any = None) -> dict[str, float]:
    """``gpu_util_pct`` and ``gpu_mem_used_gib`` of ``device`` (the whole device, as nvidia-smi
    shows) from the GPU monitor's latest sample; ``{}`` without a monitor (no nvidia-ml-py, no
    GPU, monitoring off) or before its first sample. A logger with a monitor adds these keys
    to its train records by itself."""
    return monitor.device_stats(device) if monitor is not None else {}


# The dtype whose peak a run's MFU is over, by its precision: fp32 matrix products run as TF32
# where the card has it (as train/loop_state.device_mfu reckons).
def device_fields(device: Any, precision: Any = None) -> dict[str, Any]:
    """What a run was measured on, for its ``start`` record: ``device`` ("cuda", "cpu"),
    ``device_name`` (a CUDA card's), ``torch`` (its version) and, where its MFU has a peak,
    ``peak_tflops`` with ``peak_source`` (BERTGPU_PEAK_TFLOPS on any device, else a GPU's table
    entry for the run's precision): a report of the run names them beside its MFU, as `bench
    model` does beside its rows. {} without a device."""
    if device is None:
        return {}
    import torch

    from bertgpu.errors import BertgpuError
    from bertgpu.telemetry.flops import RUN_PEAK_DTYPE, peak_and_source

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    out: dict[str, Any] = {"device": device.type, "device_name": name,
                           "torch": torch.__version__}
    if precision in RUN_PEAK_DTYPE:
        try:
            peak = peak_and_source(name, RUN_PEAK_DTYPE[precision])
            out["peak_tflops"], out["peak_source"] = peak
        except BertgpuError:  # a malformed BERTGPU_PEAK_TFLOPS: the train records say so
            pass
    return out


def _clean(value: Any, key: str = "") -> Any:
    """A JSON-ready scalar: tensors and numpy scalars unwrapped, floats to 6 significant
    digits, non-finite floats to None (written as null: valid JSON, read back as NaN). Per-rank
    keys (``rank_*``, e.g. ``rank_compute_s``) take a list of such scalars, one per rank."""
    if key.startswith("rank_") and isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, bool) or isinstance(value, int) or isinstance(value, str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.6g}")
    raise TypeError(f"metrics: cannot log {type(value).__name__} value {value!r}")


# --------------------------------------------------------------------------------------------
# The logger
# --------------------------------------------------------------------------------------------


class MetricsLogger:
    """One log call -> one line in ``metrics.jsonl``, the console and the sinks (rank 0 only).

    - ``metrics.jsonl`` is appended to (a resumed run continues the same file, after removing
      the records of the steps past ``initial_step``, which it goes through again), flushed
      after every line. Each line: ``step``, ``kind`` ("train", "eval" or "info"), ``time``
      (unix s), ``elapsed_s``, then the scalars. Non-finite floats are written as ``null``.
    - Console: on a terminal a tqdm bar (ETA from tqdm) whose postfix shows the last train
      scalars; otherwise (a log file, Slurm) one plain line every ``log_every`` train steps with
      the same fields and an ETA. Eval and info events always print a line, except the
      ``start`` event (host and pid, for ``bertgpu watch``), which only goes to the file.
    - Sinks (``sinks.Sink``: W&B, MLflow, ...) get every record, on a background thread;
      ``tensorboard`` adds TensorBoard scalars ``KIND/KEY`` under ``RUN_DIR/tensorboard`` when
      the tensorboard package is installed (a resumed run has its readers drop the earlier
      events of the steps past ``initial_step``, as the file drops their records).
    - With a GPU ``monitor`` (``monitor.GpuMonitor``), train records also carry this process's
      GPU (``gpu_util_pct``, ``gpu_mem_used_gib`` of ``device``) and the node's extremes
      (``gpu_temp_max_c``, ``gpu_util_min_pct``), the console line ends with the monitor's
      summary, and the sinks get the latest sample of every GPU as kind "system".

    ``initial_step`` and ``elapsed_offset_s`` come from the checkpoint when resuming, so the bar,
    the ETA and ``elapsed_s`` continue where the run stopped. ``elapsed_s`` is wall-clock time
    (see the property), not a budget run's clock: the training loop's train records carry that
    one as ``budget_elapsed_s`` and ``budget_left_s`` (``train/schedule.BudgetClock``, which
    starts with the step loop and carries over restarts). With a wall-clock budget the plain
    line's ETA is whichever ends the run first: the steps left at this process's step rate, or
    the budget left, as ``bertgpu watch`` reckons it: the record's ``budget_left_s``, the clock
    the run stops on; for a caller whose records carry none, ``budget_s`` (or
    ``train.budget_hours`` of the config given to ``log_config``) minus ``elapsed_s``. A logger
    with ``is_main=False`` writes nothing. The logger closes its sinks and its monitor.
    """

    def __init__(
        self,
        run_dir: Path | str | None,
        is_main: bool,
        total_steps: int | None = None,
        tensorboard: bool = True,
        progress: bool = True,
        log_every: int = 10,
        initial_step: int = 0,
        elapsed_offset_s: float = 0.0,
        stream: IO[str] | None = None,
        sinks: Sequence[Sink] = (),
        monitor: Any = None,
        device: Any = None,
        budget_s: float | None = None,
    ) -> None:
        self.is_main = is_main
        self.total_steps = total_steps
        self.budget_s = budget_s
        self.log_every = max(1, int(log_every))
        self.elapsed_offset_s = float(elapsed_offset_s)
        self.path: Path | None = None
        self.monitor = monitor
        self.device = device
        self._precision: Any = None  # the config's train.precision (log_config): its MFU's peak
        self._start = time.monotonic()
        self._stream = stream if stream is not None else sys.stdout
        self._file: IO[str] | None = None
        self._write_failed = False  # a write to metrics.jsonl failed (a full disk)
        self._bar: Any = None
        self._sinks: SinkFanout | None = None
        self._monitor_seen = 0  # the monitor's sample count last forwarded to the sinks
        # For the plain-line ETA: (monotonic time, step) at the first train log of this process.
        self._eta_origin: tuple[float, int] | None = None
        self._closed = False
        self._progress = progress
        if not is_main:
            return
        sinks = list(sinks)
        if run_dir is not None:
            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            self.path = run_dir / "metrics.jsonl"
            self._file = open_for_append(self.path)  # (its writes go to the end as it is then)
            cut_after(self.path, initial_step)  # the steps this run goes through (again)
            tb = TensorBoardSink.open_if_installed(
                run_dir / "tensorboard", purge_after=initial_step) if tensorboard else None
            sinks += [tb] if tb is not None else []
        if sinks:
            self._sinks = SinkFanout(sinks)
        if progress and _isatty(self._stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_steps,
                initial=initial_step,
                unit="step",
                file=self._stream,
                dynamic_ncols=True,
                mininterval=1.0,
                smoothing=0.05,
            )

    @property
    def sink_names(self) -> list[str]:
        """The sinks still working, e.g. ``["wandb", "tensorboard"]``."""
        return [s.name for s in self._sinks.sinks] if self._sinks is not None else []

    @property
    def elapsed_s(self) -> float:
        """Training wall-clock seconds, including those before a resume: since this logger
        opened, plus ``elapsed_offset_s`` (what the checkpoint resumed from stored of the run's
        earlier processes). Start-up before the logger opens is not in it, nor, after a crash,
        the time since that checkpoint; a budget run's clock is ``budget_elapsed_s``."""
        return self.elapsed_offset_s + time.monotonic() - self._start

    def log_config(self, config: dict[str, Any]) -> None:
        """Hand the resolved configuration to every sink (metrics.jsonl does not carry it:
        ``config.toml`` beside it does); its ``train.budget_hours``, when set, is the budget of
        the ETA unless ``budget_s`` was given."""
        train = config.get("train") if isinstance(config, dict) else None
        hours = train.get("budget_hours") if isinstance(train, dict) else None
        self._precision = train.get("precision") if isinstance(train, dict) else None
        if self.budget_s is None and isinstance(hours, (int, float)) and hours > 0:
            self.budget_s = float(hours) * 3600.0
        if self.is_main and self._sinks is not None and not self._closed:
            self._sinks.log_config(config)

    def log(self, step: int, kind: str, **scalars: Any) -> dict[str, Any] | None:
        """Record one event; returns the record written (None on a non-main rank).

        ``None`` scalars are dropped (e.g. ``mfu`` on unknown hardware); tensors are unwrapped.
        """
        if kind not in ("train", "eval", "info"):
            raise ValueError(f"MetricsLogger.log: kind must be train, eval or info, got {kind!r}")
        if self.monitor is not None:
            self.monitor.step = int(step)
        if not self.is_main or self._closed:
            return None
        record: dict[str, Any] = {
            "step": int(step),
            "kind": kind,
            "time": round(time.time(), 3),
            "elapsed_s": round(self.elapsed_s, 3),
        }
        if kind == "train":
            scalars = {**self._gpu_scalars(), **scalars}
        elif kind == "info" and scalars.get("event") == "start":
            # the launcher that restarts the job should this process die without an end record
            scalars = {**launcher_fields(), **device_fields(self.device, self._precision),
                       **scalars}
        for key, value in scalars.items():
            if value is None:
                continue
            if key in ("step", "kind"):
                raise ValueError(f"MetricsLogger.log: {key!r} is reserved")
            record[key] = _clean(value, key)
        if self._file is not None and not self._write_failed:
            try:
                self._file.write(json.dumps(record, allow_nan=False) + "\n")
                self._file.flush()
            except OSError as e:  # a full disk: named, and not tried again (nor at close)
                self._write_failed = True
                if e.filename is None:
                    e.filename = str(self.path)
                raise
        if kind == "info" and record.get("event") in FILE_ONLY_EVENTS:
            return record
        if self._sinks is not None:
            self._sinks.log(int(step), kind, sink_scalars(record))
            if kind == "train":
                self._forward_system(int(step))
        self._console(record)
        return record

    def _gpu_scalars(self) -> dict[str, float]:
        if self.monitor is None:
            return {}
        out = gpu_utilisation(self.device, self.monitor)
        samples = list(self.monitor.latest().values())
        temps = [s["temp_c"] for s in samples if "temp_c" in s]
        utils = [s["util_pct"] for s in samples if "util_pct" in s]
        if temps:
            out["gpu_temp_max_c"] = max(temps)
        if utils:
            out["gpu_util_min_pct"] = min(utils)
        return out

    def _forward_system(self, step: int) -> None:
        if (self.monitor is None or self._sinks is None
                or self.monitor.samples == self._monitor_seen):
            return
        self._monitor_seen = self.monitor.samples
        self._sinks.log(step, "system", system_scalars(list(self.monitor.latest().values())))

    def _console(self, record: dict[str, Any]) -> None:
        step, kind = record["step"], record["kind"]
        scalars = {k: v for k, v in record.items() if k not in ("step", "kind")}
        fields = console_fields(scalars)
        if kind == "train" and self.monitor is not None:
            gpus = self.monitor.summary()
            if gpus:
                fields.append(gpus)
        if kind == "train" and self._bar is not None:
            if step > self._bar.n:
                self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(" | ".join(fields), refresh=False)
            return
        if kind == "train":
            now = time.monotonic()
            if self._eta_origin is None:
                self._eta_origin = (now, step)
            due = step % self.log_every == 0 or step == self.total_steps
            if not self._progress or not due:
                return
            eta = self._eta(now, step, record.get("budget_left_s"))
            if eta is not None:
                fields.append(f"ETA {duration(eta)}")
        where = f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"
        self.print(" | ".join([f"{kind} {where}", *fields]))

    def _eta(self, now: float, step: int, budget_left_s: Any = None) -> float | None:
        """Seconds left: the steps left at this process's step rate, and the budget left
        (`budget_left_s` of the record: the budget clock's; else `budget_s` - `elapsed_s`);
        whichever is less (None when neither is known yet)."""
        left = []
        if self.total_steps and self._eta_origin is not None:
            t0, s0 = self._eta_origin
            if step > s0 and now > t0:
                left.append(max(self.total_steps - step, 0) * (now - t0) / (step - s0))
        if isinstance(budget_left_s, (int, float)):
            # The clock the stop decision uses. `elapsed_s` is another (it counts a continued
            # run's first evaluation, for one): the budget left by it disagreed with the stop.
            left.append(max(float(budget_left_s), 0.0))
        elif self.budget_s:
            left.append(max(self.budget_s - self.elapsed_s, 0.0))
        return min(left) if left else None

    def print(self, msg: str) -> None:
        """Print a message on rank 0 without breaking the progress bar."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.write(msg, file=self._stream)
        else:
            print(msg, file=self._stream, flush=True)

    def close(self) -> None:
        """Flush and close the file, the bar, the sinks and the monitor; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self.monitor is not None:
            self.monitor.close()
        if self._bar is not None:
            self._bar.close()
        if self._sinks is not None:
            self._sinks.close()
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                if not self._write_failed:  # else the same failure again, over the first one
                    raise

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
