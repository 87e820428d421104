"""The report's system section: the GPUs (from the monitor's ``gpu.jsonl``) and the ranks.

Per run with GPU samples: one figure of temperature, utilisation, power (with the power limit
dashed) and SM clock against minutes since the first sample, one line per GPU; and a table per
GPU (means, peaks, how often it was throttled and why). Per run whose train records carry
``rank_compute_s`` (each rank's compute seconds, waits excluded, summed over the record's log
window): each rank's compute time per step (the window's sum over its step count) against the
step, and a table of each rank's mean per step and how often it was the slowest.

A log window is the steps since the previous train record, or since the step at which the
process that wrote the record started (the ``start`` record of a resumed run; records that a
resumed run logged again are dropped before). Runs of versions that wrote no ``start`` record
count from the previous train record (from step 0 for the first).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bertgpu.report.inputs import Source, num
from bertgpu.report.plots import axes, pyplot, save
from bertgpu.report.render import Block
from bertgpu.telemetry.monitor import BENIGN_THROTTLE

# (key, title, y label) of the four GPU panels.
_GPU_PANELS = (
    ("temp_c", "Temperature", "°C"),
    ("util_pct", "Utilisation", "%"),
    ("power_w", "Power draw", "W"),
    ("sm_clock_mhz", "SM clock", "MHz"),
)


def _stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name)


def _gpu_series(run: Source) -> dict[str, list[dict[str, Any]]]:
    """GPU label ("gpu0", "node1:gpu0") -> its samples, in file order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for node, records in (run.data.get("gpus") or {}).items():
        for r in records:
            label = f"{node}:gpu{r['gpu']}" if node else f"gpu{r['gpu']}"
            out.setdefault(label, []).append(r)
    return out


def _gpu_figure(run: Source, gpus: dict[str, list[dict[str, Any]]], folder: Path) -> str | None:
    times = [t for rs in gpus.values() for r in rs if (t := num(r.get("time"))) is not None]
    if not times:
        return None
    t0 = min(times)
    span = max(times) - t0
    unit, scale = ("hours", 3600.0) if span > 3 * 3600 else ("minutes", 60.0) if span > 120 \
        else ("seconds", 1.0)
    plt = pyplot()
    fig, panels = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    drawn = False
    for ax, (key, title, ylabel) in zip(panels.flat, _GPU_PANELS, strict=True):
        for i, (label, records) in enumerate(sorted(gpus.items())):
            pts = [((r["time"] - t0) / scale, v) for r in records
                   if num(r.get("time")) is not None and (v := num(r.get(key))) is not None]
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, color=f"C{i % 10}", label=label, linewidth=1.2,
                    marker="." if len(pts) <= 25 else None)
            drawn = True
            limits = [v for r in records if (v := num(r.get("power_limit_w"))) is not None]
            if key == "power_w" and limits:
                ax.axhline(max(limits), color=f"C{i % 10}", linestyle="--", alpha=0.5,
                           linewidth=1)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    if not drawn:
        plt.close(fig)
        return None
    for ax in panels[1]:
        ax.set_xlabel(f"{unit} since the first sample")
    panels[0][0].legend(fontsize=8)
    fig.suptitle(f"GPUs of {run.name} (power: dashed = limit)")
    return save(fig, folder, f"gpus_{_stem(run.name)}.png")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _gpu_rows(run: Source, gpus: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for label, records in sorted(gpus.items()):
        samples = [r for r in records if not r.get("lost")]

        def values(key: str, samples: list[dict[str, Any]] = samples) -> list[float]:
            return [v for r in samples if (v := num(r.get(key))) is not None]

        throttled = [r for r in samples
                     if any(x not in BENIGN_THROTTLE for x in r.get("throttle") or ())]
        reasons = sorted({x for r in throttled for x in r["throttle"] if x not in BENIGN_THROTTLE})
        lost = any(r.get("lost") for r in records)
        cells = [_fmt(_mean(values("util_pct")), "{:.0f} %"),
                 _fmt(max(values("temp_c"), default=None), "{:.0f} °C"),
                 _fmt(_mean(values("power_w")), "{:.0f} W"),
                 _fmt(max(values("power_limit_w"), default=None), "{:.0f} W"),
                 _fmt(_mean(values("sm_clock_mhz")), "{:.0f} MHz"),
                 _fmt(max(values("mem_used_gib"), default=None), "{:.1f} GiB"),
                 f"{100 * len(throttled) / len(samples):.0f} %" if samples else "",
                 ", ".join(reasons + (["lost mid-run"] if lost else []))]
        name = next((str(r["name"]) for r in records if r.get("name")), "")
        rows.append([run.name, label, name, str(len(samples)), *cells])
    return rows


def _fmt(v: float | None, text: str) -> str:
    return "" if v is None else text.format(v)


def _rank_times(records: list[dict[str, Any]]
                ) -> tuple[list[float], list[float], list[list[float | None]]]:
    """(step, steps in its log window, per-rank compute seconds per step) of each train record
    that carries ``rank_compute_s``: the record's window sums are divided by the window's steps
    (see the module docstring)."""
    steps, windows, times = [], [], []
    origin = 0.0  # the step after which the next train record's window starts
    for r in records:
        step = num(r.get("step"))
        if step is None:
            continue
        if r.get("kind") == "info" and r.get("event") == "start":
            origin = step  # a (resumed) process: its first window starts at its first step
            continue
        if r.get("kind") != "train":
            continue
        window, origin = step - origin, step
        v = r.get("rank_compute_s")
        if isinstance(v, list) and v and window > 0:
            steps.append(step)
            windows.append(window)
            times.append([None if (x := num(t)) is None else x / window for t in v])
    return steps, windows, times


def _rank_section(run: Source, folder: Path) -> list[Block]:
    steps, windows, times = _rank_times(run.data["records"])
    if not steps:
        return []
    ranks = max(len(t) for t in times)
    fig, ax = axes(f"Per-rank compute time per step ({run.name})", "optimizer step",
                   "seconds per step (excluding waits)")
    slowest = [0] * ranks
    for t in times:
        finite = [(v, i) for i, v in enumerate(t) if v is not None]
        if finite:
            slowest[max(finite)[1]] += 1
    for rank in range(ranks):
        pts = [(s, t[rank]) for s, t in zip(steps, times, strict=True)
               if rank < len(t) and t[rank] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), color=f"C{rank % 10}", label=f"rank {rank}",
                    marker="." if len(pts) <= 25 else None)
    ax.legend(fontsize=8)
    file = save(fig, folder, f"rank_step_time_{_stem(run.name)}.png")
    rows = []
    for rank in range(ranks):
        # the mean over steps: every window's seconds over every window's steps
        pairs = [(t[rank] * n, n) for t, n in zip(times, windows, strict=True)
                 if rank < len(t) and t[rank] is not None]
        mean = sum(s for s, _ in pairs) / sum(n for _, n in pairs) if pairs else None
        rows.append([f"{run.name} rank {rank}", _fmt(mean, "{:.4g} s"),
                     f"{slowest[rank]} of {len(times)}"])
    return [("table", ["", "mean compute time per step", "slowest in (log windows)"], rows),
            ("img", file, f"Per-rank compute time per step ({run.name})")]


def system_section(runs: list[Source], folder: Path) -> list[Block]:
    """The GPUs and ranks section of the pretraining runs; [] when none has such data."""
    blocks: list[Block] = []
    gpu_rows: list[list[str]] = []
    images: list[Block] = []
    for run in runs:
        gpus = _gpu_series(run)
        if gpus:
            gpu_rows += _gpu_rows(run, gpus)
            file = _gpu_figure(run, gpus, folder)
            if file:
                images.append(("img", file, f"GPUs of {run.name}"))
    if gpu_rows:
        blocks += [("h2", "GPUs"),
                   ("table", ["run", "GPU", "name", "samples", "mean util", "peak temp",
                              "mean power", "power limit", "mean SM clock", "peak memory",
                              "throttled", "throttle reasons"], gpu_rows),
                   ("p", "Throttled: share of samples with a clock event reason other than "
                         "idle or clocks set on purpose."), *images]
    ranks = [b for run in runs for b in _rank_section(run, folder)]
    if ranks:
        blocks += [("h2", "Ranks"),
                   ("p", "Each rank's compute time per optimizer step (waits for data and for "
                         "the other ranks excluded): the compute seconds a train record sums "
                         "over its log window, divided by the window's steps (the steps since "
                         "the previous train record, or since a resumed process started). In "
                         "data parallelism every step waits for the slowest rank."),
                   *ranks]
    return blocks
