"""Plot helpers of the report: matplotlib without a display, one style for every figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.report.fonts import fit_fonts, quiet_glyphs
from bertgpu.report.inputs import Source, num, series

_DPI = 120
INSTALL = "pip install 'bertgpu[report]'"
"""How to get matplotlib, which the plots need: the report extra (not a dependency)."""


class NoMatplotlib(BertgpuError, ImportError):
    """A plot asked for without matplotlib: one line for `bertgpu report` (whose scratch folder
    goes, so nothing is half written), and an ImportError for the bench commands that leave
    their plots out."""


def have_matplotlib() -> bool:
    """Whether plots can be drawn: the bench commands ask before any work, and leave their
    plots out (their table is the result), never a traceback after the tables were computed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot() -> Any:
    """matplotlib's pyplot for files; `NoMatplotlib` without it."""
    try:
        import matplotlib
    except ImportError:
        raise NoMatplotlib(f"report: the plots need matplotlib, which is not installed; "
                           f"expected `{INSTALL}`") from None

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, folder: Path, name: str) -> str:
    """Lay out and write ``fig``: text its font cannot draw (CJK run names) in an installed font
    that can, or one notice for the report (`fonts`), never matplotlib's warning per glyph."""
    fit_fonts(fig)
    with quiet_glyphs():
        fig.tight_layout()
        fig.savefig(folder / name, dpi=_DPI)
    pyplot().close(fig)
    return name


def thousands() -> Any:
    """A tick formatter with thousands separators: "600,000" (matplotlib's own wrote "600000"
    or "1e6"), "2.5" for a tick between whole numbers."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:,.0f}" if v == int(v) else f"{v:,.4g}")


def axes(title: str, xlabel: str, ylabel: str, size: tuple[float, float] = (7.5, 4.5)) -> Any:
    fig, ax = pyplot().subplots(figsize=size)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    from matplotlib.ticker import MaxNLocator

    # steps, epochs, workers: whole numbers at round intervals (10, 20, 30 for a run that logs
    # every 10 steps; the default's 12, 18, 24 fell between the points)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    return fig, ax


def run_plot(runs: list[Source], folder: Path, name: str, title: str, ylabel: str,
              curves: Sequence[tuple[str, str, str]], scale: float = 1.0,
              from_zero: bool = False) -> str | None:
    """One line per run and curve (kind, key, label suffix); runs share a colour; y ticks with
    thousands separators, and from 0 with `from_zero` (a rate, whose dips read as collapses on
    an axis cut above 0). None when no run has any of the curves (e.g. no eval rows: no val
    curve, and no empty plot)."""
    fig, ax = axes(title, "optimizer step", ylabel)
    drawn = False
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        for j, (kind, key, suffix) in enumerate(curves):
            xs, ys = series(run.data["records"], kind, key)
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
        pyplot().close(fig)
        return None
    if max(abs(y) for line in ax.lines for y in line.get_ydata()) >= 1e3:  # "600,000"
        ax.yaxis.set_major_formatter(thousands())
    if from_zero:
        ax.set_ylim(bottom=0)
    ax.legend()
    return save(fig, folder, name)


def bar_chart(folder: Path, name: str, title: str, ylabel: str, categories: list[str],
               series: list[tuple[str, list[float | None]]], fmt: str = ",.1f") -> str:
    """Grouped bars: one group per category, one bar per series, values written on the bars in
    one format (`fmt`: ",.0f" for tokens/s; "471.0" beside "1,486" read as two precisions)."""
    import numpy as np

    width = max(7.5, 0.9 * len(categories) * max(1, len(series)) ** 0.5 + 2)
    fig, ax = axes(title, "", ylabel, size=(min(width, 16.0), 4.8))
    x = np.arange(len(categories))
    w = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        ys = [np.nan if v is None else v for v in values]
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * w, ys, w, label=label, color=f"C{i % 10}")
        ax.bar_label(bars, labels=["" if v is None else format(v, fmt) for v in values],
                     fontsize=8, padding=2)
    ax.set_xticks(x, categories, rotation=20 if len(categories) > 6 else 0, ha="right"
                  if len(categories) > 6 else "center")
    ax.yaxis.set_major_formatter(thousands())  # "1,200", not "1200"
    ax.grid(True, axis="y", alpha=0.3)
    ax.grid(False, axis="x")
    ax.margins(y=0.12)
    if len(series) > 1 or series[0][0]:
        ax.legend()
    return save(fig, folder, name)


def hbar_chart(folder: Path, name: str, title: str, xlabel: str, labels: list[str],
               values: list[float | None], groups: list[str]) -> str:
    """One horizontal bar per row, top to bottom in row order, so that labels of any length
    stay readable (tilted labels under 16 vertical bars overlapped), coloured by group (e.g.
    the implementation: ours against transformers) with a legend, values as whole numbers with
    thousands separators at the bars' ends."""
    plt = pyplot()  # first: without matplotlib, its one-line error
    from matplotlib.patches import Patch

    longest = max((len(label) for label in labels), default=0)  # about 0.06 inch a character
    fig, ax = plt.subplots(figsize=(min(6.5 + 0.06 * longest, 16.0),
                                         max(2.6, 0.34 * len(labels) + 1.5)))
    colours = {g: f"C{i % 10}" for i, g in enumerate(dict.fromkeys(groups))}
    ys = list(range(len(labels)))
    bars = ax.barh(ys, [float("nan") if v is None else v for v in values],
                   color=[colours[g] for g in groups])
    ax.bar_label(bars, labels=["" if v is None else f"{v:,.0f}" for v in values], fontsize=8,
                 padding=3)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()  # the first row on top, as in the table
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_formatter(thousands())
    ax.grid(True, axis="x", alpha=0.3)
    ax.margins(x=0.12)
    if len(colours) > 1:
        ax.legend(handles=[Patch(color=c, label=g) for g, c in colours.items()])
    return save(fig, folder, name)


def scaling_plot(rows: list[dict[str, Any]], folder: Path, name: str, title: str) -> str | None:
    """Measured tokens/s against workers of one bench run (`sections.scaling_runs`), one line per
    accumulation setting, each with the ideal linear line from its smallest worker count;
    points annotated with their efficiency."""
    groups: dict[str, list[tuple[float, float, float | None]]] = {}
    for r in rows:
        w, t = num(r.get("workers")), num(r.get("tokens_per_s"))
        if w is None or t is None:
            continue
        key = f"accumulation {r['accumulation']}" if "accumulation" in r else "measured"
        groups.setdefault(key, []).append((w, t, num(r.get("efficiency"))))
    if not groups:
        return None
    fig, ax = axes(f"Scaling ({title}): tokens/s against workers", "workers",
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
    return save(fig, folder, name)
