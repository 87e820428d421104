"""The fine-tuning scaling study's rows (`bertgpu bench finetune-scaling`, finetune_scaling.jsonl)
as a table, the time split and two plots: the dev metric against aggregation per optimizer, and
efficiency against workers.

Every row has ``"bench": "finetune-scaling"``, a ``run_id`` (the study that wrote it: a file
accumulates studies, each is rendered on its own) and the numbers of one cell, read from that
run's results.json: ``optimizer``, ``lr_scaling``, ``seed``, ``workers``, ``aggregation``,
``global_batch``, ``steps``, ``peak_lr``, ``metric`` / ``metric_value`` (the final epoch's),
``train_seconds``, ``train_examples_per_s``, ``load_seconds``, ``eval_seconds``,
``data_wait_seconds`` / ``data_wait_share``, ``seconds``, ``wall_s``, ``speedup`` and
``efficiency`` (against ``reference_cell``), ``time_to_target_s`` / ``epochs_to_target`` with
``target``, and ``reference_only`` for the 1-worker baselines the grid did not ask for
(bench/finetune_scaling.py says how each is measured). The bench writes its markdown from these
same functions, so the report and the bench agree.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bertgpu.report.inputs import num
from bertgpu.report.render import Block


def _f(v: Any, fmt: str) -> str:
    return "" if num(v) is None else format(v, fmt)


def _to_target(r: dict[str, Any]) -> str:
    if num(r.get("time_to_target_s")) is None:
        return "not reached"
    return f"{r['time_to_target_s']:.1f} (epoch {r['epochs_to_target']})"


def _percent(v: Any) -> str:
    return "" if num(v) is None else f"{100 * v:.1f} %"


def cells_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One line per cell, in the study's order; `(ref)` marks the added 1-worker baselines."""
    metric = rows[0].get("metric", "score") if rows else "score"
    target = next((r["target"] for r in rows if r.get("target")), None)
    header = ["optimizer", "lr rule", "seed", "workers", "aggregation", "global batch", "steps",
              "peak lr", f"dev {metric}", *([f"time to {target} (s)"] if target else []), "train s",
              "train examples/s", "speedup", "efficiency", "load s", "eval s", "data wait"]
    cells = []
    for r in rows:
        ref = " (ref)" if r.get("reference_only") else ""
        cells.append([
            *(str(r.get(k)) for k in ("optimizer", "lr_scaling", "seed", "workers")),
            f"{r.get('aggregation')}{ref}", str(r.get("global_batch")), str(r.get("steps")),
            _f(r.get("peak_lr"), ".3g"), _f(r.get("metric_value"), ".1f"),
            *([_to_target(r)] if target else []),
            _f(r.get("train_seconds"), ".1f"), _f(r.get("train_examples_per_s"), ".1f"),
            _f(r.get("speedup"), ".2f"), _f(r.get("efficiency"), ".2f"),
            _f(r.get("load_seconds"), ".1f"), _f(r.get("eval_seconds"), ".1f"),
            _percent(r.get("data_wait_share"))])
    return header, cells


def time_split(rows: list[dict[str, Any]]) -> str:
    """Where the study's time went, summed over its cells (rank 0's clocks)."""
    def total(key: str) -> float:
        return sum(num(r.get(key)) or 0.0 for r in rows)

    run = total("seconds")
    if run <= 0:
        return ""
    load, train, evals = total("load_seconds"), total("train_seconds"), total("eval_seconds")
    waits = total("data_wait_seconds")
    launch = (total("wall_s") - run) / len(rows)
    eval_rate = statistics.median(num(r.get("eval_examples_per_s")) or 0.0 for r in rows)
    train_rate = statistics.median(num(r.get("train_examples_per_s")) or 0.0 for r in rows)
    return (f"Time split over the {len(rows)} cells ({run:.0f} s of run time in all, rank 0): "
            f"loading (tokenizer, reading and encoding, model) {100 * load / run:.1f} %, training "
            f"{100 * train / run:.1f} % (of which building batches on the host "
            f"{100 * waits / max(train, 1e-9):.1f} %), evaluation (sharded over the workers, "
            f"scored on rank 0) {100 * evals / run:.1f} %, the rest (export, results) "
            f"{100 * (run - load - train - evals) / run:.1f} %. Starting each cell's processes "
            f"(imports, launcher, rendezvous) added {launch:.1f} s per cell. Median rates: "
            f"training {train_rate:.1f} examples/s (all workers), evaluation {eval_rate:.1f} "
            "sequences/s per worker (forward passes alone).")


def _median_by(rows: list[dict[str, Any]], group: tuple[str, ...], x: str, y: str
               ) -> dict[tuple[Any, ...], list[tuple[float, float]]]:
    """group -> sorted (x, median of y over the rows with that x: the seeds)."""
    acc: dict[tuple[Any, ...], dict[float, list[float]]] = {}
    for r in rows:
        xv, yv = num(r.get(x)), num(r.get(y))
        if xv is not None and yv is not None:
            acc.setdefault(tuple(r.get(k) for k in group), {}).setdefault(xv, []).append(yv)
    return {g: sorted((xv, statistics.median(ys)) for xv, ys in pts.items())
            for g, pts in acc.items()}


def _label(optimizer: Any, rule: Any, rules: set[Any]) -> str:
    return f"{optimizer}" + (f", lr {rule}" if len(rules) > 1 else "")


def metric_plot(rows: list[dict[str, Any]], folder: Path, name: str) -> str | None:
    """Dev metric against aggregation (log scale), a colour per optimizer (and lr rule), a line
    style per worker count; the median over seeds."""
    groups = _median_by(rows, ("optimizer", "lr_scaling", "workers"), "aggregation",
                        "metric_value")
    if not groups:
        return None
    from bertgpu.report.plots import axes, save

    metric = rows[0].get("metric", "score")
    fig, ax = axes(f"Dev {metric} against aggregation",
                   "aggregation (micro batches per worker per step)", f"dev {metric} (final epoch)")
    kinds = list(dict.fromkeys((g[0], g[1]) for g in groups))
    workers = sorted({g[2] for g in groups})
    rules = {g[1] for g in groups}
    styles = ("-", "--", ":", "-.")
    for (opt, rule, w), pts in groups.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                color=f"C{kinds.index((opt, rule)) % 10}",
                linestyle=styles[workers.index(w) % len(styles)],
                label=f"{_label(opt, rule, rules)}, {w:g} worker{'s' if w != 1 else ''}")
    ax.set_xscale("log", base=2)
    ticks = sorted({p[0] for pts in groups.values() for p in pts})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.legend(fontsize=8)
    return save(fig, folder, name)


def efficiency_plot(rows: list[dict[str, Any]], folder: Path, name: str) -> str | None:
    """Efficiency against workers (the grid's cells), a colour per aggregation, a line style per
    optimizer (and lr rule); the median over seeds; 1.0 (perfect) dashed."""
    grid = [r for r in rows if not r.get("reference_only")]
    groups = _median_by(grid, ("aggregation", "optimizer", "lr_scaling"), "workers", "efficiency")
    if not groups:
        return None
    from bertgpu.report.plots import axes, save

    fig, ax = axes("Scaling efficiency against workers (same global batch on 1 worker = 1.0)",
                   "workers", "efficiency = speedup / workers")
    aggs = sorted({g[0] for g in groups})
    kinds = list(dict.fromkeys((g[1], g[2]) for g in groups))
    rules = {g[2] for g in groups}
    styles = ("-", "--", ":", "-.")
    for (agg, opt, rule), pts in groups.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                color=f"C{aggs.index(agg) % 10}",
                linestyle=styles[kinds.index((opt, rule)) % len(styles)],
                label=f"aggregation {agg}, {_label(opt, rule, rules)}")
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_xticks(sorted({p[0] for pts in groups.values() for p in pts}))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return save(fig, folder, name)


def _describe(rows: list[dict[str, Any]]) -> str:
    r = rows[0]
    threads = r.get("threads_per_worker")
    rules = ", ".join(sorted({str(x.get("lr_scaling")) for x in rows}))
    return (f"Task {r.get('task')}, init `{r.get('init')}`, on {r.get('device')}"
            + (f", {threads} thread(s) per worker" if threads else "")
            + f"; micro batch {r.get('micro_batch_size')} per worker, global batch = micro x "
            f"aggregation x workers; peak lr {r.get('lr')} scaled from global batch "
            f"{r.get('reference_batch_size')} by the lr rule ({rules}). Speedup = train "
            "examples/s over the 1-worker cell at the same global batch (aggregation x workers), "
            "efficiency = speedup / workers; (ref) marks those 1-worker cells when the grid did "
            "not ask for them. Times are rank 0's, from each run's results.json; time to target "
            "is the train time at the first epoch whose dev metric reaches it.")


def study_blocks(rows: list[dict[str, Any]], folder: Path | None, stem: str) -> list[Block]:
    """Blocks of every study in `rows` (by run_id); plots go into `folder` (None: none)."""
    blocks: list[Block] = []
    run_ids = list(dict.fromkeys(str(r.get("run_id", "")) for r in rows))
    for n, run_id in enumerate(run_ids):
        group = [r for r in rows if str(r.get("run_id", "")) == run_id]
        suffix = f"_{n}" if len(run_ids) > 1 else ""
        blocks += [("h2", f"Fine-tuning scaling ({run_id})"), ("p", _describe(group))]
        if group[0].get("command"):
            blocks.append(("p", f"`{group[0]['command']}`"))
        blocks.append(("table", *cells_table(group)))
        text = time_split(group)
        if text:
            blocks.append(("p", text))
        if folder is None:
            continue
        for plot, caption in ((metric_plot, "Dev metric against aggregation"),
                              (efficiency_plot, "Efficiency against workers")):
            kind = "metric" if plot is metric_plot else "efficiency"
            file = plot(group, folder, f"{stem}{suffix}_{kind}.png")
            if file:
                blocks.append(("img", file, caption))
    return blocks
