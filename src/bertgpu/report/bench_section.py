"""The report's section of a bench result file (`bench model`, `bench scaling` and other rows
with tokens/s): its tables and throughput plots."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from bertgpu.report.bench_rows import model_table
from bertgpu.report.bench_tables import bench_table
from bertgpu.report.inputs import Source, num
from bertgpu.report.plots import bar_chart, scaling_plot
from bertgpu.report.render import Block

# Row label fields of a bench table, in the order they name a configuration.
_BENCH_LABEL_KEYS = ("bench", "arch", "model", "size", "micro_batch", "seq_len", "batch",
                     "lengths", "padding", "compile_mode", "dtype", "device")


def _bench_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Name each row by the configuration fields that differ between rows (all if none do)."""
    keys = [k for k in _BENCH_LABEL_KEYS if any(k in r for r in rows)]
    varying = [k for k in keys if len({str(r.get(k)) for r in rows}) > 1] or keys
    devices = len({measured_on(r) for r in rows}) > 1  # rows of two cards: which is which
    return [" / ".join([*(str(r[k]) for k in varying if r.get(k) not in (None, "")),
                        *([measured_on(r)] if devices and measured_on(r) else [])])
            or f"row {i + 1}" for i, r in enumerate(rows)]


def scaling_runs(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The bench runs that appended the rows of a scaling file, in file order, as (label,
    rows): grouped by ``run_id``, or by ``time`` for rows of versions that wrote no run id (a
    run stamps all its rows with one time); rows with neither form one group, labelled ""."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        key = next((str(r[k]) for k in ("run_id", "time") if r.get(k) not in (None, "")), "")
        groups.setdefault(key, []).append(r)
    return list(groups.items())


def _scaling_blocks(rows: list[dict[str, Any]], folder: Path, stem: str,
                    name: str, path: Path) -> list[Block]:
    """One table and one plot per bench run in the file: runs appended to one file measured
    other machines, settings or loads, so each is drawn against its own baseline."""
    runs = scaling_runs(rows)
    blocks: list[Block] = []
    if len(runs) > 1:
        blocks.append(("p", f"{len(runs)} bench runs appended to this file, each with its own "
                            "table and plot: their speedup and efficiency are against the run's "
                            "own 1-worker point, the ideal line starts at the run's smallest "
                            "worker count."))
    for n, (label, group) in enumerate(runs):
        if len(runs) > 1:
            blocks.append(("p", f"Run {label}:" if label else "Rows without a run id or time:"))
        blocks += bench_table(group, path)
        title = f"{name}, run {label}" if len(runs) > 1 and label else name
        file = scaling_plot([r for r in group if num(r.get("workers")) is not None], folder,
                            f"{stem}_scaling{f'_{n}' if len(runs) > 1 else ''}.png", title)
        if file:
            blocks.append(("img", file, f"Scaling: tokens/s against workers ({title})"
                           if len(runs) > 1 else "Scaling: tokens/s against workers"))
    return blocks


def _peak_note(rows: list[dict[str, Any]]) -> str | None:
    """The peak TFLOP/s the rows' MFU is over, as `bench model` records it beside each MFU
    (``peak_tflops``, ``peak_source``); None when no row has both (rows of older versions)."""
    peaks = sorted({(p, str(r.get("peak_source") or "source not recorded")) for r in rows
                    if num(r.get("mfu")) is not None and (p := num(r.get("peak_tflops")))})
    if not peaks:
        return None
    said = ", ".join(f"{p:g} TFLOP/s ({source})" for p, source in peaks)
    return f"MFU is model FLOP/s over the peak of one device: {said}."


def _run_time(row: dict[str, Any]) -> str:
    """When the `bench model` run that wrote a row started, to the second ("" without a time):
    a run stamps all its rows with one time."""
    t = num(row.get("time"))
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t is not None else ""


def measured_on(row: dict[str, Any]) -> str:
    """"NVIDIA H200 (torch 2.11.0+cu130)" for a `bench model` row or a run's start record (""
    without a device; a null name, read back as NaN, is no name)."""
    if not isinstance(row.get("device"), str) or not row["device"]:
        return ""
    name = row.get("device_name") if isinstance(row.get("device_name"), str) else None
    return f"{name or row['device']} (torch {row.get('torch', '?')})"


def bench_section(source: Source, folder: Path, index: int) -> list[Block]:
    rows = source.data
    columns = list(dict.fromkeys(k for r in rows for k in r))
    blocks: list[Block] = [("h2", f"Benchmark: {source.name}"), ("p", f"From `{source.path}`.")]
    tps = [c for c in columns if c == "tokens_per_s" or c.startswith("tokens_per_s.")]
    stem = f"bench{index}_{re.sub(r'[^A-Za-z0-9_-]+', '_', source.name)}"
    if any(num(r.get("workers")) is not None for r in rows) and "tokens_per_s" in columns:
        return blocks + _scaling_blocks(rows, folder, stem, source.name, source.path)
    if rows and all(r.get("bench") == "model" for r in rows):  # the table the run printed
        # a table per device and run: runs on two cards, or two runs on one, appended to one
        # --out file had merged into one table whose rows could not be told apart
        by_run: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            by_run.setdefault((measured_on(r), _run_time(r)), []).append(r)
        for (where, when), group in by_run.items():
            said = [f"Measured on {where}" if where else "",
                    f"by the run of {when}" if len({w for _, w in by_run}) > 1 else ""]
            if any(said):
                blocks.append(("p", f"{' '.join(s for s in said if s)}; every field of each row "
                                    f"is in `{source.path}`."))
            blocks.append(("table", *model_table(group)))
            if note := _peak_note(group):
                blocks.append(("p", note))
    else:
        blocks += bench_table(rows, source.path)
        if note := _peak_note(rows):
            blocks.append(("p", note))
    if tps:
        labels = _bench_labels(rows)
        series = [(c.removeprefix("tokens_per_s").lstrip(".") or "",
                   [num(r.get(c)) for r in rows]) for c in tps]
        if any(v is not None for _, vs in series for v in vs):
            file = bar_chart(folder, f"{stem}.png", f"Throughput: {source.name}", "tokens/s",
                              labels, series)
            blocks.append(("img", file, "Throughput per configuration"))
    return blocks
