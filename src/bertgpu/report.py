"""Reports: a markdown (and optionally HTML) page with tables and plots of runs and evaluations.

    bertgpu report runs/base runs/large eval/glue bench.jsonl --out report/ --format both

Each PATH is one of (recognised in this order):

- a GLUE folder (``glue_results.json``, from ``bertgpu glue``): scores per task column, a bar chart;
- a fine-tuning folder (``results.json``, from ``bertgpu finetune``): scores, curves per epoch;
- a pretraining run folder (``metrics.jsonl``, ``config.toml``): a summary table (steps, tokens,
  final losses, throughput, MFU, memory, wall time) and loss / accuracy / lr / tokens/s plots with
  all runs on the same axes;
- a bench result file (``*.jsonl`` from ``bertgpu bench model|scaling``): its rows as a table, and
  tokens/s per configuration, or tokens/s against workers with the ideal linear line.

``OUT/README.md`` holds the report, ``OUT/index.html`` the same as one self-contained page, and the
plots are PNG files next to them. OUT is written as ``OUT.tmp`` and renamed into place, replacing
an existing report. Missing keys and null (NaN) values are skipped, never plotted as zeros.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import replace_dir

__all__ = ["Source", "add_arguments", "build_report", "load_source", "main", "pretrain_summary"]

FORMATS = ("md", "html", "both")
_DPI = 120
# Row label fields of a bench table, in the order they name a configuration.
_BENCH_LABEL_KEYS = ("bench", "model", "size", "seq_len", "batch", "dtype", "device")

Block = tuple[Any, ...]  # ("h2", text) | ("p", text) | ("table", header, rows) | ("img", file, alt)


@dataclass
class Source:
    """One input of the report: ``kind`` is "pretrain", "finetune", "glue" or "bench"."""

    kind: str
    name: str
    path: Path
    data: Any


# --- Reading the inputs ----------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertgpuError(f"{path}: cannot read ({e}); expected a JSON object") from None
    if not isinstance(data, dict):
        raise BertgpuError(f"{path}: found a JSON {type(data).__name__}, expected an object")
    return data


def _read_config(path: Path) -> dict[str, Any]:
    from bertgpu.train.overrides import read_toml

    try:
        return read_toml(path)
    except BertgpuError:
        return {}  # the config only adds a description line; the metrics are the report


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"tokens_per_s": {"a": 1}}`` -> ``{"tokens_per_s.a": 1}``; lists become text."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        elif isinstance(value, list):
            out[name] = " ".join(str(v) for v in value)
        else:
            out[name] = value
    return out


def _read_bench(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise BertgpuError(f"{path}:{i + 1}: found {line[:60]!r}, expected one JSON object "
                               "per line") from None
        if isinstance(row, dict):
            rows.append(_flatten(row))
    if not rows:
        raise BertgpuError(f"{path}: no result rows; expected a JSONL file from bertgpu bench")
    return rows


def load_source(path: Path | str) -> Source:
    """Recognise and read one report input (see the module docstring for the kinds)."""
    from bertgpu.train.metrics import read_metrics

    path = Path(path)
    if not path.exists():
        raise BertgpuError(f"{path}: does not exist")
    if path.is_file():
        if path.name == "metrics.jsonl":
            return load_source(path.parent)
        if path.name in ("glue_results.json", "results.json"):
            return load_source(path.parent)
        if path.suffix == ".jsonl":
            return Source("bench", path.stem, path, _read_bench(path))
    else:
        if (path / "glue_results.json").is_file():
            return Source("glue", path.name, path, _read_json(path / "glue_results.json"))
        if (path / "results.json").is_file():
            return Source("finetune", path.name, path, _read_json(path / "results.json"))
        if (path / "metrics.jsonl").is_file():
            records = read_metrics(path, drop_superseded=True)
            config = _read_config(path / "config.toml")
            return Source("pretrain", path.name, path, {"records": records, "config": config})
    raise BertgpuError(
        f"{path}: not a pretraining run (metrics.jsonl), fine-tuning folder (results.json), "
        "GLUE folder (glue_results.json) or bench result file (*.jsonl)"
    )


# --- Numbers and formatting ------------------------------------------------------------------


def _num(value: Any) -> float | None:
    """A finite float, or None for anything else (null/NaN, text, booleans, missing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the records of ``kind``, non-finite values skipped."""
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind:
            x, y = _num(r.get("step")), _num(r.get(key))
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
    return xs, ys


def _last(records: list[dict[str, Any]], kind: str, key: str) -> float | None:
    ys = _series(records, kind, key)[1]
    return ys[-1] if ys else None


def pretrain_summary(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """The numbers of a run's summary table; None where the run did not log them.

    Throughput and MFU are means over the logged train intervals, leaving out the first when
    there are three or more (it includes start-up: compilation, data warm-up).
    """

    def rate(key: str) -> float | None:
        ys = _series(records, "train", key)[1]
        ys = ys[1:] if len(ys) >= 3 else ys
        return sum(ys) / len(ys) if ys else None

    steps = [s for s in (_num(r.get("step")) for r in records if r.get("kind") == "train") if s]
    elapsed = [e for e in (_num(r.get("elapsed_s")) for r in records) if e is not None]
    mem = _series(records, "train", "mem_peak_gib")[1]
    worlds = [w for w in (_num(r.get("world_size")) for r in records) if w is not None]
    return {
        "steps": max(steps) if steps else None,
        "tokens_seen": _last(records, "train", "tokens_seen"),
        "train_loss": _last(records, "train", "loss"),
        "val_mlm_loss": _last(records, "eval", "val_mlm_loss"),
        "val_mlm_acc": _last(records, "eval", "val_mlm_acc"),
        "val_nsp_acc": _last(records, "eval", "val_nsp_acc"),
        "tokens_per_s": rate("tokens_per_s"),
        "tokens_per_s_per_device": rate("tokens_per_s_per_device"),
        "mfu": rate("mfu"),
        "mem_peak_gib": max(mem) if mem else None,
        "wall_s": max(elapsed) if elapsed else None,
        "world_size": worlds[-1] if worlds else None,
    }


def _fmt_count(v: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.2f}{unit}"
    return f"{v:.0f}"


def _fmt_duration(s: float) -> str:
    s = int(round(s))
    h, m = divmod(s // 60, 60)
    return f"{h} h {m:02d} min" if h else f"{m} min {s % 60:02d} s" if m else f"{s} s"


def _fmt_value(v: Any) -> str:
    """A table cell: numbers to 4 significant digits, missing as an empty cell."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1e4 else f"{v:.4g}"
    return str(v)


_SUMMARY_ROWS: tuple[tuple[str, str, Callable[[float], str]], ...] = (
    ("steps", "optimizer steps", lambda v: f"{v:,.0f}"),
    ("tokens_seen", "tokens seen", _fmt_count),
    ("train_loss", "final train loss", lambda v: f"{v:.4f}"),
    ("val_mlm_loss", "final val MLM loss", lambda v: f"{v:.4f}"),
    ("val_mlm_acc", "final val MLM accuracy", lambda v: f"{100 * v:.2f} %"),
    ("val_nsp_acc", "final val NSP accuracy", lambda v: f"{100 * v:.2f} %"),
    ("tokens_per_s", "mean tokens/s (all devices)", lambda v: f"{v:,.0f}"),
    ("tokens_per_s_per_device", "mean tokens/s per device", lambda v: f"{v:,.0f}"),
    ("world_size", "devices", lambda v: f"{v:.0f}"),
    ("mfu", "mean MFU", lambda v: f"{100 * v:.1f} %"),
    ("mem_peak_gib", "peak memory", lambda v: f"{v:.2f} GiB"),
    ("wall_s", "wall time", _fmt_duration),
)


def _model_line(config: dict[str, Any]) -> str | None:
    m, t = config.get("model", {}), config.get("train", {})
    if not isinstance(m, dict) or "hidden_size" not in m:
        return None
    parts = [f"{m.get('num_hidden_layers', '?')} layers x {m.get('hidden_size')} hidden, "
             f"{m.get('num_attention_heads', '?')} heads, vocab {m.get('vocab_size', '?')}"]
    if isinstance(t, dict) and "global_batch_size" in t:
        parts.append(f"global batch {t['global_batch_size']}, {t.get('precision', '?')}")
    return "; ".join(parts)


# --- Plots -----------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, folder: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(folder / name, dpi=_DPI)
    _pyplot().close(fig)
    return name


def _axes(title: str, xlabel: str, ylabel: str, size: tuple[float, float] = (7.5, 4.5)) -> Any:
    fig, ax = _pyplot().subplots(figsize=size)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, epochs, workers
    return fig, ax


def _run_plot(runs: list[Source], folder: Path, name: str, title: str, ylabel: str,
              curves: Sequence[tuple[str, str, str]], scale: float = 1.0) -> str | None:
    """One line per run and curve (kind, key, label suffix); runs share a colour. None when
    no run has any of the curves (e.g. no eval rows: no val curve, and no empty plot)."""
    fig, ax = _axes(title, "optimizer step", ylabel)
    drawn = False
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        for j, (kind, key, suffix) in enumerate(curves):
            xs, ys = _series(run.data["records"], kind, key)
            if not xs:
                continue
            style = {"linestyle": "-"} if kind == "train" else {"linestyle": "--", "marker": "o"}
            if j and kind == "train":
                style = {"linestyle": ":"}
            if len(xs) <= 25:  # few points (a short or young run): show each one
                style.setdefault("marker", ".")
            ax.plot(xs, [y * scale for y in ys], color=colour,
                    label=f"{run.name} {suffix}".strip(),
                    markersize=4, **style)
            drawn = True
    if not drawn:
        _pyplot().close(fig)
        return None
    ax.legend()
    return _save(fig, folder, name)


def _pretrain_plots(runs: list[Source], folder: Path) -> list[tuple[str, str]]:
    """(file, caption) of every plot drawn."""
    has = {k for r in runs for rec in r.data["records"] for k in rec}
    mlm = "mlm_loss" if "mlm_loss" in has else "loss"
    specs = [
        ("loss.png", "Loss", "cross-entropy (nats)",
         [("train", mlm, "train MLM" if mlm == "mlm_loss" else "train"),
          ("eval", "val_mlm_loss", "val MLM")], 1.0),
        ("mlm_accuracy.png", "Masked-token accuracy", "accuracy (%)",
         [("train", "mlm_acc", "train"), ("eval", "val_mlm_acc", "val")], 100.0),
        ("learning_rate.png", "Learning rate", "learning rate", [("train", "lr", "")], 1.0),
        ("throughput.png", "Throughput", "tokens/s",
         [("train", "tokens_per_s", "all devices"),
          ("train", "tokens_per_s_per_device", "per device")]
         if any(_has_multi_device(r) for r in runs) else [("train", "tokens_per_s", "")], 1.0),
    ]
    out = []
    for file, title, ylabel, curves, scale in specs:
        if _run_plot(runs, folder, file, title, ylabel, curves, scale):
            out.append((file, title))
    return out


def _has_multi_device(run: Source) -> bool:
    a = _series(run.data["records"], "train", "tokens_per_s")[1]
    b = _series(run.data["records"], "train", "tokens_per_s_per_device")[1]
    return bool(b) and any(abs(x - y) > 1e-6 * max(abs(x), 1.0) for x, y in zip(a, b, strict=False))


def _bar_chart(folder: Path, name: str, title: str, ylabel: str, categories: list[str],
               series: list[tuple[str, list[float | None]]]) -> str:
    """Grouped bars: one group per category, one bar per series, values written on the bars."""
    import numpy as np

    width = max(7.5, 0.9 * len(categories) * max(1, len(series)) ** 0.5 + 2)
    fig, ax = _axes(title, "", ylabel, size=(min(width, 16.0), 4.8))
    x = np.arange(len(categories))
    w = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        ys = [np.nan if v is None else v for v in values]
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * w, ys, w, label=label, color=f"C{i % 10}")
        ax.bar_label(bars, labels=["" if v is None else f"{v:.1f}" if abs(v) < 1e3 else f"{v:,.0f}"
                                     for v in values],
                     fontsize=8, padding=2)
    ax.set_xticks(x, categories, rotation=20 if len(categories) > 6 else 0, ha="right"
                  if len(categories) > 6 else "center")
    ax.grid(True, axis="y", alpha=0.3)
    ax.grid(False, axis="x")
    ax.margins(y=0.12)
    if len(series) > 1 or series[0][0]:
        ax.legend()
    return _save(fig, folder, name)


# --- Sections --------------------------------------------------------------------------------


def _pretrain_section(runs: list[Source], folder: Path) -> list[Block]:
    blocks: list[Block] = [("h2", "Pretraining")]
    for run in runs:
        line = _model_line(run.data["config"])
        if line:
            blocks.append(("p", f"{run.name} ({run.path}): {line}."))
    summaries = [pretrain_summary(r.data["records"]) for r in runs]
    rows = []
    for key, label, fmt in _SUMMARY_ROWS:
        cells = [fmt(s[key]) if s[key] is not None else "" for s in summaries]
        if any(cells):
            rows.append([label, *cells])
    if not rows:
        return [*blocks, ("p", "No train or eval records logged yet.")]
    blocks.append(("table", ["", *[r.name for r in runs]], rows))
    blocks.append(("p", "Means of tokens/s and MFU leave out the first logged interval "
                        "(start-up) when a run logged three or more."))
    for file, caption in _pretrain_plots(runs, folder):
        blocks.append(("img", file, caption))
    return blocks


def _finetune_section(runs: list[Source], folder: Path) -> list[Block]:
    rows = []
    for r in runs:
        d = r.data
        metrics = d.get("metrics") if isinstance(d.get("metrics"), dict) else {}
        text = "; ".join(
            f"{split}: " + ", ".join(f"{k} {_fmt_value(_num(v))}" for k, v in m.items())
            for split, m in metrics.items() if isinstance(m, dict))
        train_s = _num(d.get("train_seconds")) or _num(d.get("seconds"))
        rows.append([r.name, str(d.get("task", "")), _fmt_value(_num(d.get("score"))), text,
                     str(len(d["epochs"])) if isinstance(d.get("epochs"), list) else "",
                     _fmt_value(d.get("steps")), _fmt_duration(train_s) if train_s else "",
                     _fmt_value(_num(d.get("train_examples_per_s")))])
    blocks: list[Block] = [("h2", "Fine-tuning"), ("table", [
        "run", "task", "score", "final metrics", "epochs", "steps", "train time",
        "train examples/s"], rows)]
    curves = [(r, [e for e in r.data.get("epochs") or [] if isinstance(e, dict)]) for r in runs]
    if any(eps for _, eps in curves):
        from matplotlib.ticker import MaxNLocator

        plt = _pyplot()
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title, ylabel in ((a1, "train_loss", "Fine-tuning train loss", "loss"),
                                       (a2, "score", "Fine-tuning dev score", "score (0-100)")):
            for i, (r, eps) in enumerate(curves):
                pts = [(e.get("epoch"), _num(e.get(key))) for e in eps]
                pts = [(x, y) for x, y in pts if _num(x) is not None and y is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", color=f"C{i % 10}",
                            label=f"{r.name} ({r.data.get('task', '')})")
            ax.set_title(title)
            ax.set_xlabel("epoch")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            if ax.lines:
                ax.legend()
        blocks.append(("img", _save(fig, folder, "finetune.png"), "Fine-tuning curves"))
    return blocks


def _glue_columns(summary: dict[str, Any]) -> dict[str, float]:
    """Task column -> score: the summary's ``columns``, else each task's score or number."""
    cols = summary.get("columns")
    if isinstance(cols, dict) and cols:
        return {str(k): v for k, v in cols.items() if _num(v) is not None}
    out = {}
    for name, t in (summary.get("tasks") or {}).items():
        v = t.get("score") if isinstance(t, dict) else t
        if _num(v) is not None:
            out[str(name)] = float(v)
    return out


def _glue_section(sources: list[Source], folder: Path) -> list[Block]:
    cols_by = [_glue_columns(s.data) for s in sources]
    columns = list(dict.fromkeys(c for cols in cols_by for c in cols))
    rows = []
    for s, cols in zip(sources, cols_by, strict=True):
        avg = _num(s.data.get("average"))
        rows.append([s.name, *[_fmt_value(cols.get(c)) for c in columns], _fmt_value(avg)])
        for ref in s.data.get("references") or []:
            if isinstance(ref, dict) and isinstance(ref.get("columns"), dict):
                label = ref.get("label") or ref.get("name") or "reference"
                rows.append([str(label), *[_fmt_value(ref["columns"].get(c)) for c in columns],
                             _fmt_value(ref.get("average"))])
    blocks: list[Block] = [("h2", "GLUE (dev)")]
    for s in sources:
        if s.data.get("convention_text"):
            blocks.append(("p", f"{s.name}: average convention: {s.data['convention_text']}."))
    blocks.append(("table", ["model", *columns, "average"], rows))
    if columns:
        cats = [*columns, "average"]
        series = [(s.name, [cols.get(c) for c in columns] + [_num(s.data.get("average"))])
                  for s, cols in zip(sources, cols_by, strict=True)]
        file = _bar_chart(folder, "glue.png", "GLUE dev scores per task", "score (0-100)", cats,
                          series)
        blocks.append(("img", file, "GLUE dev scores per task"))
    return blocks


def _bench_labels(rows: list[dict[str, Any]]) -> list[str]:
    """Name each row by the configuration fields that differ between rows (all if none do)."""
    keys = [k for k in _BENCH_LABEL_KEYS if any(k in r for r in rows)]
    varying = [k for k in keys if len({str(r.get(k)) for r in rows}) > 1] or keys
    return [" / ".join(str(r[k]) for k in varying if r.get(k) not in (None, "")) or f"row {i + 1}"
            for i, r in enumerate(rows)]


def _bench_section(source: Source, folder: Path, index: int) -> list[Block]:
    rows = source.data
    columns = list(dict.fromkeys(k for r in rows for k in r))
    cells = []
    for r in rows:
        line = []
        for c in columns:
            v = r.get(c)
            if c == "time" and _num(v) is not None and v > 1e9:  # unix time -> readable
                line.append(time.strftime("%Y-%m-%d %H:%M", time.localtime(v)))
            else:
                line.append(_fmt_value(v))
        cells.append(line)
    blocks: list[Block] = [("h2", f"Benchmark: {source.name}"), ("p", f"From `{source.path}`."),
                           ("table", columns, cells)]
    tps = [c for c in columns if c == "tokens_per_s" or c.startswith("tokens_per_s.")]
    stem = f"bench{index}_{re.sub(r'[^A-Za-z0-9_-]+', '_', source.name)}"
    scaling = [r for r in rows if _num(r.get("workers")) is not None]
    if scaling and "tokens_per_s" in columns:
        file = _scaling_plot(scaling, folder, f"{stem}_scaling.png", source.name)
        if file:
            blocks.append(("img", file, "Scaling: tokens/s against workers"))
    elif tps:
        labels = _bench_labels(rows)
        series = [(c.removeprefix("tokens_per_s").lstrip(".") or "",
                   [_num(r.get(c)) for r in rows]) for c in tps]
        if any(v is not None for _, vs in series for v in vs):
            file = _bar_chart(folder, f"{stem}.png", f"Throughput: {source.name}", "tokens/s",
                              labels, series)
            blocks.append(("img", file, "Throughput per configuration"))
    return blocks


def _scaling_plot(rows: list[dict[str, Any]], folder: Path, name: str, title: str) -> str | None:
    """Measured tokens/s against workers, one line per accumulation setting, each with the ideal
    linear line from its smallest worker count; points annotated with their efficiency."""
    groups: dict[str, list[tuple[float, float, float | None]]] = {}
    for r in rows:
        w, t = _num(r.get("workers")), _num(r.get("tokens_per_s"))
        if w is None or t is None:
            continue
        key = f"accumulation {r['accumulation']}" if "accumulation" in r else "measured"
        groups.setdefault(key, []).append((w, t, _num(r.get("efficiency"))))
    if not groups:
        return None
    fig, ax = _axes(f"Scaling ({title}): tokens/s against workers", "workers",
                    "tokens/s (all workers)")
    workers: set[float] = set()
    for i, (label, pts) in enumerate(groups.items()):
        pts.sort()
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        workers.update(xs)
        ax.plot(xs, ys, marker="o", color=f"C{i % 10}", label=label)
        ax.plot(xs, [ys[0] * x / xs[0] for x in xs], linestyle="--", color=f"C{i % 10}",
                alpha=0.6, label=f"ideal linear ({label})")
        for x, y, eff in pts:
            if eff is not None:
                ax.annotate(f"{100 * eff:.0f} %", (x, y), textcoords="offset points",
                            xytext=(0, 7), ha="center", fontsize=8)
    ax.set_xticks(sorted(workers))
    ax.set_ylim(bottom=0)
    ax.legend()
    return _save(fig, folder, name)


# --- Rendering -------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(blocks: list[Block]) -> str:
    lines: list[str] = []
    for b in blocks:
        if b[0] in ("h1", "h2"):
            lines += ["#" * int(b[0][1]) + " " + b[1], ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "img":
            lines += [f"![{b[2]}]({b[1]})", ""]
        elif b[0] == "table":
            header, rows = b[1], b[2]
            lines.append("| " + " | ".join(_md_cell(h) for h in header) + " |")
            lines.append("|" + "---|" + "---:|" * (len(header) - 1))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
            lines.append("")
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}h1,h2{border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;margin:1em 0;font-size:.92em}th,td{border:1px solid #ccc;
padding:.3em .7em}td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}tr:nth-child(even) td{background:#fafafa}img{max-width:100%;display:block;
margin:1em 0}code{background:#f3f3f3;padding:0 .2em}"""


def _html_text(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def render_html(blocks: list[Block]) -> str:
    e = html.escape
    body: list[str] = []
    for b in blocks:
        if b[0] in ("h1", "h2"):
            body.append(f"<{b[0]}>{e(b[1])}</{b[0]}>")
        elif b[0] == "p":
            body.append(f"<p>{_html_text(b[1])}</p>")
        elif b[0] == "img":
            body.append(f'<img src="{e(b[1])}" alt="{e(b[2])}">')
        elif b[0] == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in b[1])
            rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                           for row in b[2])
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>bertgpu report</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# --- Building --------------------------------------------------------------------------------


def _unique_names(sources: list[Source]) -> None:
    """Label each source by its folder name, adding the parent's where two would collide."""
    counts: dict[str, int] = {}
    for s in sources:
        counts[s.name] = counts.get(s.name, 0) + 1
    for s in sources:
        if counts[s.name] > 1:
            s.name = f"{s.path.parent.name}/{s.name}"


def _within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def build_report(paths: list[Path], out: Path, fmt: str = "md") -> Path:
    """Write the report of ``paths`` into ``out`` (README.md and/or index.html, PNG plots) and
    return ``out``. Raises BertgpuError naming any path that is not a known input."""
    if fmt not in FORMATS:
        raise BertgpuError(f"--format: found {fmt!r}, expected one of {', '.join(FORMATS)}")
    if not paths:
        raise BertgpuError("report: no inputs; expected run folders, GLUE/fine-tuning folders "
                           "or bench .jsonl files")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BertgpuError(f"{out}: exists and is not a folder; expected an output folder")
    for p in paths:
        if _within(Path(p), out) or _within(out, Path(p)):
            raise BertgpuError(f"{out}: overlaps the input {p}; expected a separate output folder")
    sources = [load_source(p) for p in paths]
    _unique_names(sources)

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # left over from an interrupted report
    tmp.mkdir(parents=True)
    try:
        blocks: list[Block] = [
            ("h1", "bertgpu report"),
            ("p", f"Generated {time.strftime('%Y-%m-%d %H:%M')} from: "
                  + ", ".join(f"`{s.path}`" for s in sources) + "."),
        ]
        by_kind = {k: [s for s in sources if s.kind == k] for k in ("pretrain", "finetune", "glue")}
        if by_kind["pretrain"]:
            blocks += _pretrain_section(by_kind["pretrain"], tmp)
        if by_kind["glue"]:
            blocks += _glue_section(by_kind["glue"], tmp)
        if by_kind["finetune"]:
            blocks += _finetune_section(by_kind["finetune"], tmp)
        for i, s in enumerate(s for s in sources if s.kind == "bench"):
            blocks += _bench_section(s, tmp, i)
        if fmt in ("md", "both"):
            (tmp / "README.md").write_text(render_markdown(blocks), encoding="utf-8")
        if fmt in ("html", "both"):
            (tmp / "index.html").write_text(render_html(blocks), encoding="utf-8")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return replace_dir(tmp, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                        help="pretraining run folders, fine-tuning or GLUE output folders, "
                             "bench result .jsonl files (any mix)")
    parser.add_argument("--out", type=Path, default=Path("report"),
                        help="output folder, replaced if it exists (default: report/)")
    parser.add_argument("--format", choices=FORMATS, default="md",
                        help="README.md, index.html, or both (default: md)")


def main(args: argparse.Namespace) -> int:
    out = build_report(list(args.paths), args.out, args.format)
    files = sorted(p.name for p in out.iterdir())
    print(f"report: wrote {out}/ ({', '.join(files)})", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    from bertgpu.cli import main as cli_main

    sys.exit(cli_main(["report", *sys.argv[1:]]))
