"""How the report writes numbers in its tables: counts, durations, plain values, GLUE scores."""

from __future__ import annotations

import math
from typing import Any

from bertgpu.report.inputs import num


def fmt_count(v: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.2f}{unit}"
    return f"{v:.0f}"


def fmt_duration(s: float) -> str:
    """"1 h 05 min", "2 min 03 s", "42 s"; under 10 s to two significant digits ("0.08 s",
    not "0 s")."""
    if s < 9.5:
        return f"{s:.2g} s"
    s = int(round(s))
    h, m = divmod(s // 60, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s % 60:02d} s" if m else f"{s} s"


def fmt_value(v: Any) -> str:
    """A table cell: numbers to 4 significant digits, missing as an empty cell."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


def fmt_score(v: Any) -> str:
    """A score (0-100; a GLUE cell, a fine-tuning metric) to one decimal, as `bertgpu glue`'s own
    table and the published tables give it."""
    return f"{v:.1f}" if num(v) is not None and not isinstance(v, bool) else fmt_value(v)
