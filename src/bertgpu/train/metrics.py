"""Throughput, memory, the start-up table and the metrics log.

Every log line answers "is it healthy and how fast?" (STYLE.md habit 5): loss, lr, grad norm,
tokens/s, MFU, memory and ETA, with the same keys on the console and in ``RUN_DIR/metrics.jsonl``
and units in the key names (``tokens_per_s``, ``mem_peak_gib``, ``elapsed_s``).

Typical use in a training loop (rank 0 logs, other ranks get a logger that does nothing)::

    tput = Throughput(n_devices=world_size)
    log = MetricsLogger(run_dir, is_main=rank == 0, total_steps=cfg.max_steps, initial_step=step)
    log.print(format_startup_table([("global batch", "256 sequences"), ...]))
    for step in range(step + 1, cfg.max_steps + 1):
        ...
        tput.update(tokens=global_batch * seq_len, sequences=global_batch)
        rates = tput.rates()
        log.log(step, "train", loss=loss, lr=lr, grad_norm=gn, **rates,
                mfu=mfu(rates.get("tokens_per_s", 0.0), fpt, peak, world_size), **device_memory())
    log.close()

``mfu`` (from `flops.py`) is a fraction (0.42 means 42 %); the console shows it as a percentage.
Nothing here imports torch, tqdm or TensorBoard at module import time.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from bertgpu.errors import BertgpuError

_GIB = float(1 << 30)


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


def gpu_utilisation(device: Any = None) -> dict[str, float]:
    """``gpu_util_pct`` and ``gpu_mem_used_gib`` (the whole device, as nvidia-smi shows) from
    NVML, or ``{}`` when nvidia-ml-py is not installed, there is no GPU, or NVML fails.

    Goes through ``torch.cuda.utilization``, which maps torch's device index to NVML's under
    ``CUDA_VISIBLE_DEVICES``.
    """
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        return {}
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        out = {"gpu_util_pct": float(torch.cuda.utilization(device))}
        out["gpu_mem_used_gib"] = torch.cuda.device_memory_used(device) / _GIB
        return out
    except Exception:  # NVML missing driver, permissions, MIG: degrade silently
        return {}


# --------------------------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------------------------


class Throughput:
    """Rates over a rolling window of the last ``window`` updates.

    Call ``update`` once per optimizer step with that step's totals over *all* devices (tokens
    and sequences actually processed, padding included when the model computed on it). The
    first rate is available after the first update (measured from construction or ``reset``);
    call ``reset()`` just before the loop so start-up time (compilation, data warm-up) does not
    dilute it.
    """

    def __init__(
        self,
        window: int = 20,
        n_devices: int = 1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if window < 1:
            raise ValueError("Throughput: window must be >= 1")
        if n_devices < 1:
            raise ValueError("Throughput: n_devices must be >= 1")
        self.window = window
        self.n_devices = n_devices
        self._clock = clock
        self.tokens = 0
        self.sequences = 0
        self.steps = 0
        self._points: deque[tuple[float, int, int, int]] = deque(maxlen=window + 1)
        self.reset()

    def reset(self) -> None:
        """Forget the window (not the cumulative counts) and start measuring from now."""
        self._points.clear()
        self._points.append((self._clock(), self.tokens, self.sequences, self.steps))

    def update(self, tokens: int, sequences: int, steps: int = 1) -> None:
        """Record that ``steps`` steps covering ``tokens`` / ``sequences`` have finished now."""
        self.tokens += int(tokens)
        self.sequences += int(sequences)
        self.steps += int(steps)
        self._points.append((self._clock(), self.tokens, self.sequences, self.steps))

    def rates(self) -> dict[str, float]:
        """``tokens_per_s``, ``tokens_per_s_per_device``, ``sequences_per_s``,
        ``sequences_per_s_per_device``, ``steps_per_s``, ``step_time_s``; ``{}`` before the first
        update (or when no time has passed)."""
        if len(self._points) < 2:
            return {}
        t0, tok0, seq0, st0 = self._points[0]
        t1, tok1, seq1, st1 = self._points[-1]
        dt = t1 - t0
        if dt <= 0:
            return {}
        tokens_per_s = (tok1 - tok0) / dt
        sequences_per_s = (seq1 - seq0) / dt
        steps_per_s = (st1 - st0) / dt
        out = {
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_device": tokens_per_s / self.n_devices,
            "sequences_per_s": sequences_per_s,
            "sequences_per_s_per_device": sequences_per_s / self.n_devices,
            "steps_per_s": steps_per_s,
        }
        if steps_per_s > 0:
            out["step_time_s"] = 1.0 / steps_per_s
        return out


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def format_startup_table(rows: Iterable[tuple[str, str]], title: str | None = None) -> str:
    """A two-column table for the start-up summary: names left-aligned and padded to the
    longest, two spaces of indent, e.g. ``"  per-device batch  32 sequences"``; ``title`` (if
    given) is the first line."""
    rows = [(str(k), str(v)) for k, v in rows]
    width = max((len(k) for k, _ in rows), default=0)
    lines = [title] if title else []
    lines += [f"  {k.ljust(width)}  {v}".rstrip() for k, v in rows]
    return "\n".join(lines)


def _si(x: float) -> str:
    """123456 -> '123.5k'."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.1f}" if abs(x) < 100 else f"{x:.0f}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


# Console short forms, in display order; other keys follow as ``key value``.
_SHORT: dict[str, tuple[str, Callable[[Any], str]]] = {
    "loss": ("loss", lambda v: f"{v:.4f}"),
    "mlm_loss": ("mlm", lambda v: f"{v:.4f}"),
    "nsp_loss": ("nsp", lambda v: f"{v:.4f}"),
    "lr": ("lr", lambda v: f"{v:.2e}"),
    "grad_norm": ("gnorm", lambda v: f"{v:.3g}"),
    "tokens_per_s": ("tok/s", _si),
    "sequences_per_s": ("seq/s", _si),
    "step_time_s": ("step", lambda v: f"{v:.3g}s"),
    "mfu": ("MFU", lambda v: f"{100 * v:.1f}%"),
    "mem_peak_gib": ("mem", lambda v: f"{v:.2f}GiB"),
}
# Kept in metrics.jsonl but too much for one console line.
_CONSOLE_SKIP = {
    "time",
    "elapsed_s",
    "tokens_per_s_per_device",
    "sequences_per_s_per_device",
    "steps_per_s",
    "mem_rss_gib",
    "mem_reserved_gib",
}


def _short_value(v: Any) -> str:
    if v is None:
        return "nan"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _console_fields(scalars: dict[str, Any]) -> list[str]:
    parts = []
    for key, (label, fmt) in _SHORT.items():
        if key in scalars:
            v = scalars[key]
            parts.append(f"{label} {'nan' if v is None else fmt(v)}")
    for key, v in scalars.items():
        if key not in _SHORT and key not in _CONSOLE_SKIP:
            parts.append(f"{key} {_short_value(v)}")
    return parts


def _clean(value: Any) -> Any:
    """A JSON-ready scalar: tensors and numpy scalars unwrapped, floats to 6 significant
    digits, non-finite floats to None (written as null: valid JSON, read back as NaN)."""
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
    """One log call -> one line in ``metrics.jsonl``, the console and TensorBoard (rank 0 only).

    - ``metrics.jsonl`` is appended to (a resumed run continues the same file), flushed after
      every line. Each line: ``step``, ``kind`` ("train", "eval" or "info"), ``time`` (unix s),
      ``elapsed_s``, then the scalars. Non-finite floats are written as ``null``.
    - Console: on a terminal a tqdm bar (ETA from tqdm) whose postfix shows the last train
      scalars; otherwise (a log file, Slurm) one plain line every ``log_every`` train steps with
      the same fields and an ETA. Eval and info events always print a line.
    - TensorBoard scalars ``KIND/KEY`` under ``RUN_DIR/tensorboard`` when
      ``torch.utils.tensorboard`` imports (the tensorboard package is optional).

    ``initial_step`` and ``elapsed_offset_s`` come from the checkpoint when resuming, so the bar,
    the ETA and ``elapsed_s`` continue where the run stopped. A logger with ``is_main=False``
    does nothing.
    """

    def __init__(
        self,
        run_dir: Path | str | None,
        is_main: bool,
        total_steps: int | None,
        tensorboard: bool = True,
        progress: bool = True,
        log_every: int = 10,
        initial_step: int = 0,
        elapsed_offset_s: float = 0.0,
        stream: IO[str] | None = None,
    ) -> None:
        self.is_main = is_main
        self.total_steps = total_steps
        self.log_every = max(1, int(log_every))
        self.elapsed_offset_s = float(elapsed_offset_s)
        self.path: Path | None = None
        self._start = time.monotonic()
        self._stream = stream if stream is not None else sys.stdout
        self._file: IO[str] | None = None
        self._bar: Any = None
        self._tb: Any = None
        # For the plain-line ETA: (monotonic time, step) at the first train log of this process.
        self._eta_origin: tuple[float, int] | None = None
        self._closed = False
        self._progress = progress
        if not is_main:
            return
        if run_dir is not None:
            run_dir = Path(run_dir)
            run_dir.mkdir(parents=True, exist_ok=True)
            self.path = run_dir / "metrics.jsonl"
            self._file = self._open_for_append(self.path)
            if tensorboard:
                self._tb = _summary_writer(run_dir / "tensorboard")
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

    @staticmethod
    def _open_for_append(path: Path) -> IO[str]:
        # A run killed mid-write may leave a last line without its newline: start on a fresh one.
        needs_newline = False
        if path.exists() and path.stat().st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        f = open(path, "a", encoding="utf-8")  # closed in close()
        if needs_newline:
            f.write("\n")
        return f

    @property
    def elapsed_s(self) -> float:
        """Training wall-clock seconds, including those before a resume."""
        return self.elapsed_offset_s + time.monotonic() - self._start

    def log(self, step: int, kind: str, **scalars: Any) -> dict[str, Any] | None:
        """Record one event; returns the record written (None on a non-main rank).

        ``None`` scalars are dropped (e.g. ``mfu`` on unknown hardware); tensors are unwrapped.
        """
        if kind not in ("train", "eval", "info"):
            raise ValueError(f"MetricsLogger.log: kind must be train, eval or info, got {kind!r}")
        if not self.is_main or self._closed:
            return None
        record: dict[str, Any] = {
            "step": int(step),
            "kind": kind,
            "time": round(time.time(), 3),
            "elapsed_s": round(self.elapsed_s, 3),
        }
        for key, value in scalars.items():
            if value is None:
                continue
            if key in ("step", "kind"):
                raise ValueError(f"MetricsLogger.log: {key!r} is reserved")
            record[key] = _clean(value)
        if self._file is not None:
            self._file.write(json.dumps(record, allow_nan=False) + "\n")
            self._file.flush()
        if self._tb is not None:
            for key, value in record.items():
                if key not in ("step", "kind", "time") and isinstance(value, (int, float)):
                    if not isinstance(value, bool):
                        self._tb.add_scalar(f"{kind}/{key}", value, global_step=int(step))
        self._console(record)
        return record

    def _console(self, record: dict[str, Any]) -> None:
        step, kind = record["step"], record["kind"]
        scalars = {k: v for k, v in record.items() if k not in ("step", "kind")}
        fields = _console_fields(scalars)
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
            eta = self._eta(now, step)
            if eta is not None:
                fields.append(f"ETA {_duration(eta)}")
        where = f"step {step}/{self.total_steps}" if self.total_steps else f"step {step}"
        self.print(" | ".join([f"{kind} {where}", *fields]))

    def _eta(self, now: float, step: int) -> float | None:
        if self.total_steps is None or self._eta_origin is None:
            return None
        t0, s0 = self._eta_origin
        if step <= s0 or now <= t0:
            return None
        return (self.total_steps - step) * (now - t0) / (step - s0)

    def print(self, msg: str) -> None:
        """Print a message on rank 0 without breaking the progress bar."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.write(msg, file=self._stream)
        else:
            print(msg, file=self._stream, flush=True)

    def close(self) -> None:
        """Flush and close the file, the bar and TensorBoard; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._file is not None:
            self._file.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: IO[str]) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _summary_writer(log_dir: Path) -> Any:
    """A TensorBoard SummaryWriter, or None when the tensorboard package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # ImportError without tensorboard; anything odd in its import chain
        return None
    return SummaryWriter(log_dir=str(log_dir))


def read_metrics(path: Path | str, drop_superseded: bool = False) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (or a run folder holding one), ``null`` read as NaN.

    A last line cut short by a crash is skipped; a broken line elsewhere raises BertgpuError.
    With ``drop_superseded``, the train/eval records of steps that a resumed run went through
    again (those between the last checkpoint and the crash) keep only their latest version. A
    resume is recognised by a train step that does not increase.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise BertgpuError(f"{path}: cannot read metrics ({e.strerror or e})") from None
    records: list[dict[str, Any]] = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == last:
                break
            raise BertgpuError(
                f"{path}:{i + 1}: found {line[:60]!r}, expected one JSON object per line"
            ) from None
        records.append({k: float("nan") if v is None else v for k, v in record.items()})
    if drop_superseded:
        records = _drop_superseded(records)
    return records


def _drop_superseded(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Within one run, train steps strictly increase (at most one train record per optimizer
    # step). A train record at or below the last train step marks a resume from a checkpoint:
    # the earlier train and eval records from that step on are superseded.
    keep: list[dict[str, Any]] = []
    last_train: int | None = None
    for rec in records:
        kind, step = rec.get("kind"), rec.get("step")
        if kind == "train" and isinstance(step, int):
            if last_train is not None and step <= last_train:
                keep = [
                    r
                    for r in keep
                    if r.get("kind") not in ("train", "eval") or r.get("step", -1) < step
                ]
            last_train = step
        keep.append(rec)
    return keep
