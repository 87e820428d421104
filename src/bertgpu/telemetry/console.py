"""Console text for the training log and ``bertgpu watch``: short forms, units, durations.

The console shows the same keys as ``metrics.jsonl`` with shorter labels (``tok/s 123.5k``,
``MFU 42.1%``, ``compile 27.1 s``: the seconds of the steps that compiled, which the rates leave
out); keys that would crowd one line stay in the file only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def format_startup_table(rows: Iterable[tuple[str, str]], title: str | None = None) -> str:
    """A two-column table for the start-up summary: names left-aligned and padded to the
    longest, two spaces of indent, e.g. ``"  per-device batch  32 sequences"``; ``title`` (if
    given) is the first line."""
    rows = [(str(k), str(v)) for k, v in rows]
    width = max((len(k) for k, _ in rows), default=0)
    lines = [title] if title else []
    lines += [f"  {k.ljust(width)}  {v}".rstrip() for k, v in rows]
    return "\n".join(lines)


def si(x: float) -> str:
    """123456 -> '123.5k'."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.1f}" if abs(x) < 100 else f"{x:.0f}"


def duration(seconds: float) -> str:
    """3725 -> '1:02:05', 65 -> '01:05'."""
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


# Console short forms, in display order; other keys follow as ``key value``.
SHORT: dict[str, tuple[str, Callable[[Any], str]]] = {
    "loss": ("loss", lambda v: f"{v:.4f}"),
    "mlm_loss": ("mlm", lambda v: f"{v:.4f}"),
    "nsp_loss": ("nsp", lambda v: f"{v:.4f}"),
    "lr": ("lr", lambda v: f"{v:.2e}"),
    "grad_norm": ("gnorm", lambda v: f"{v:.3g}"),
    "tokens_per_s": ("tok/s", si),
    "sequences_per_s": ("seq/s", si),
    "step_time_s": ("step", lambda v: f"{v:.3g}s"),
    "mfu": ("MFU", lambda v: f"{100 * v:.1f}%"),
    "compile_s": ("compile", lambda v: f"{v:.1f} s"),
    "mem_peak_gib": ("mem", lambda v: f"{v:.2f}GiB"),
}
# Kept in metrics.jsonl but too much for one console line (the GPU keys are summed up by the
# monitor's one-line summary instead).
CONSOLE_SKIP = {
    "time",
    "elapsed_s",
    "budget_elapsed_s",  # a budget run's clock: the ETA shows what is left of it
    "budget_left_s",
    "tokens_per_s_per_device",
    "sequences_per_s_per_device",
    "steps_per_s",
    "mem_rss_gib",
    "mem_reserved_gib",
    "gpu_util_pct",
    "gpu_mem_used_gib",
    "gpu_temp_max_c",
    "gpu_util_min_pct",
    "rank_compute_s",
    "compile_steps",
    "error",  # an end record's: the command prints the exception itself
}
# Shown only when not zero: a run that compiled nothing need not say so on every line.
HIDE_ZERO = {"compile_s"}


def _short_value(v: Any) -> str:
    if v is None:
        return "nan"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def console_fields(scalars: dict[str, Any]) -> list[str]:
    """``["loss 2.0000", "lr 1.00e-04", ...]``: the known keys first, in ``SHORT``'s order."""
    parts = []
    for key, (label, fmt) in SHORT.items():
        if key in scalars:
            v = scalars[key]
            if key in HIDE_ZERO and not v:
                continue
            parts.append(f"{label} {'nan' if v is None else fmt(v)}")
    for key, v in scalars.items():
        if key not in SHORT and key not in CONSOLE_SKIP:
            parts.append(f"{key} {_short_value(v)}")
    return parts
