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
from bertgpu.report.plots import bar_chart, hbar_chart, scaling_plot
from bertgpu.report.render import Block

# Row label fields of a bench table, in the order they name a configuration, each with the
# name it is shown under ("" for values that say what they are: "bert", "padded", "bf16").
_BENCH_LABEL_KEYS = {"bench": "", "arch": "", "model": "", "size": "", "micro_batch": "micro",
                     "seq_len": "seq", "batch": "batch", "lengths": "lengths", "padding": "",
                     "compile_mode": "compile", "dtype": "", "device": ""}


def _bench_labels(rows: list[dict[str, Any]], leave_out: tuple[str, ...] = ()) -> list[str]:
    """Name each row by the configuration fields that differ between rows (all if none do and
    the rows are of one device and time), each under its name ("micro 2", not a bare "2"), then
    its device and its time (`row_times`) where the rows are of several; `leave_out`: fields
    said otherwise (the bars' colour)."""
    keys = [k for k in _BENCH_LABEL_KEYS if any(k in r for r in rows) and k not in leave_out]
    varying = [k for k in keys if len({str(r.get(k)) for r in rows}) > 1]
    devices = len({measured_on(r) for r in rows}) > 1  # rows of two cards: which is which
    times = row_times(rows) if all(r.get("bench") == "model" for r in rows) else [""] * len(rows)
    several_times = len(set(times)) > 1
    if not (varying or devices or several_times):
        varying = keys

    def field(k: str, v: Any) -> str:
        return f"{_BENCH_LABEL_KEYS[k]} {v}" if _BENCH_LABEL_KEYS[k] else str(v)

    return [", ".join([*(field(k, r[k]) for k in varying if r.get(k) not in (None, "")),
                       *([measured_on(r)] if devices and measured_on(r) else []),
                       *([f"at {when}"] if several_times and when else [])])
            or f"row {i + 1}" for i, (r, when) in enumerate(zip(rows, times, strict=True))]


def _chart_title(source: Source, rows: list[dict[str, Any]]) -> str:
    """"Throughput: NAME (DEVICE, DTYPE)": the device and dtype when all rows share one."""
    shared = [next(iter(v)) for v in ({measured_on(r).split(" (torch")[0] for r in rows},
                                      {str(r.get("dtype") or "") for r in rows})
              if len(v) == 1 and next(iter(v))]
    return f"Throughput: {source.name}" + (f" ({', '.join(shared)})" if shared else "")


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


def row_times(rows: list[dict[str, Any]]) -> list[str]:
    """Per `bench model` row, when its run wrote its first row ("" without a time), to the
    second, its date left out when all rows share one: the rows of a run share its ``run_id``
    (a preset's parts, one after another, stamp their own times). Rows of a version that wrote
    no run id go by their own time, the finest group that is surely one run's: runs appended to
    one file had merged into one table of identical-looking rows."""
    first: dict[str, Any] = {}
    for r in rows:
        if r.get("run_id") not in (None, ""):
            first.setdefault(str(r["run_id"]), r.get("time"))
    stamps = [time.localtime(t) if (t := num(first[str(r["run_id"])] if r.get("run_id")
                                             not in (None, "") else r.get("time"))) is not None
              else None for r in rows]
    one_day = len({time.strftime("%Y-%m-%d", t) for t in stamps if t is not None}) == 1
    fmt = "%H:%M:%S" if one_day else "%Y-%m-%d %H:%M:%S"
    return [time.strftime(fmt, t) if t is not None else "" for t in stamps]


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
        # a table per device and time (row_times): runs on two cards, or two on one, appended to
        # one --out file had merged into one table whose rows could not be told apart
        by_run: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r, when in zip(rows, row_times(rows), strict=True):
            by_run.setdefault((measured_on(r), when), []).append(r)
        for (where, when), group in by_run.items():
            said = [f"Measured on {where}" if where else "",
                    f"at {when}" if len({w for _, w in by_run}) > 1 else ""]
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
    if tps and all(r.get("bench") == "model" for r in rows) and tps == ["tokens_per_s"]:
        values = [num(r.get("tokens_per_s")) for r in rows]
        if any(v is not None for v in values):  # one bar per row, coloured by implementation
            file = hbar_chart(folder, f"{stem}.png", _chart_title(source, rows), "tokens/s",
                              _bench_labels(rows, leave_out=("model",)), values,
                              [str(r.get("model") or "") for r in rows])
            blocks.append(("img", file, "Throughput per configuration"))
    elif tps:
        labels = _bench_labels(rows)
        series = [(c.removeprefix("tokens_per_s").lstrip(".") or "",
                   [num(r.get(c)) for r in rows]) for c in tps]
        if any(v is not None for _, vs in series for v in vs):
            file = bar_chart(folder, f"{stem}.png", _chart_title(source, rows), "tokens/s",
                             labels, series, fmt=",.0f")
            blocks.append(("img", file, "Throughput per configuration"))
    return blocks
