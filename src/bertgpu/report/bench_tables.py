"""The tables of bench rows other than `bench model`'s (bench_rows.py): `bench scaling` rows and
`bench model --strategy` rows (``model_memory``) with the columns their own markdown shows, and
any other rows with every field; numbers as people read them (thousands separators, bytes in
MiB, ratios to two decimals). The report had dumped every field of every row: 19 snake_case
columns, "2317" where scaling.md shows "2,317", "17736968" bytes where the console said
"16.9 MiB", and the run's id and time repeated on every row. Fields that every row of a table
shares (the device, the shapes, the run and its time) are now said once, above it."""

from __future__ import annotations

import time
from typing import Any

from bertgpu.report.inputs import num
from bertgpu.report.render import Block

_MIB = float(1 << 20)

# (row key, heading, format): "mib" is bytes shown in MiB; None is the value as text.
_SCALING = [("workers", "workers", ","), ("accumulation", "accumulation", ","),
            ("global_batch", "global batch", ","), ("tokens_per_s", "tokens/s", ",.0f"),
            ("tokens_per_s_per_device", "tokens/s per device", ",.0f"),
            ("speedup", "speedup", ".2f"), ("efficiency", "efficiency", ".2f"),
            ("comm_share", "comm share", ".3f"), ("data_wait_share", "data wait share", ".3f")]
"""`bench scaling`'s columns, as its scaling.md shows them."""

_MEMORY = [("strategy", "strategy", None), ("ranks", "ranks", ","),
           ("params_bytes", "params MiB", "mib"), ("grads_bytes", "grads MiB", "mib"),
           ("optimizer_bytes", "optimizer MiB", "mib"), ("total_bytes", "total MiB", "mib"),
           ("step_ms", "step ms", ",.0f"), ("mem_peak_gib", "mem GiB", ".2f"),
           ("source", "source", None)]
"""`bench model --strategy`'s columns (bytes per rank), as its console table shows them."""

_SHARED = ("bench", "device", "size", "dtype", "micro_batch", "micro_batch_size", "seq_len",
           "recipe", "data", "run_id", "time")
"""Fields that describe the run rather than the row: said once when every row has one value."""

_NAMES = {"run_id": "run", "time": "measured", "micro_batch": "micro batch",
          "micro_batch_size": "micro batch", "seq_len": "sequence length"}


def _cell(key: str, value: Any, fmt: str | None = None) -> str:
    """One value: a unix ``time`` as a date, bytes in MiB, floats to `fmt` (by default whole
    numbers from 1,000 up with separators, smaller ones to 4 significant digits); "" missing."""
    if value is None or (isinstance(value, float) and num(value) is None):
        return ""
    if key == "time" and num(value) is not None and value > 1e9:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(value))
    if num(value) is None:
        return str(value)
    if fmt == "mib" or (fmt is None and key.endswith("_bytes")):
        return f"{value / _MIB:,.1f}"
    if fmt or key.startswith("tokens_per_s"):
        return format(value, fmt or ",.0f")
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.0f}" if abs(value) >= 1e3 else f"{value:.4g}"


def _heading(key: str) -> str:
    """"tokens/s (bertgpu)" for tokens_per_s.bertgpu (a nested field), "params MiB" for
    params_bytes, words for the rest."""
    if "." in key:
        head, _, rest = key.partition(".")
        return f"{_heading(head)} ({rest})"
    if key.endswith("_bytes"):
        return key.removesuffix("_bytes").replace("_", " ") + " MiB"
    return _NAMES.get(key, key.replace("_", " ").replace("tokens per s", "tokens/s"))


def bench_table(rows: list[dict[str, Any]], path: Any) -> list[Block]:
    """A line naming what every row shares, then a table of the rest: `bench scaling`'s and
    `bench model --strategy`'s columns for their rows, every field for others."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    shared = {}
    for k in (k for k in _SHARED if k in keys):
        values = {_cell(k, r.get(k)) for r in rows}  # as shown: times to the minute
        if len(values) == 1 and "" not in values:
            shared[k] = values.pop()
    if any(num(r.get("workers")) is not None for r in rows):
        spec = _SCALING
    elif all(r.get("bench") == "model_memory" for r in rows):
        spec = _MEMORY
    else:
        spec = [(k, _heading(k), None) for k in keys if k not in shared]
    varying = [(k, _heading(k), None) for k in _SHARED if k in keys and k not in shared
               and k not in {s[0] for s in spec}]
    columns = [c for c in varying + spec if any(r.get(c[0]) is not None for r in rows)]
    cells = [[_cell(k, r.get(k), fmt) for k, _, fmt in columns] for r in rows]
    blocks: list[Block] = []
    if shared:
        said = "; ".join(f"{_NAMES.get(k, k.replace('_', ' '))} {v}" for k, v in shared.items())
        blocks.append(("p", f"Every row: {said}. All fields of each row are in `{path}`."))
    blocks.append(("table", [h for _, h, _ in columns], cells))
    return blocks


__all__ = ["bench_table"]
