"""The quality benchmark's rows (`bertgpu bench quality`, quality.jsonl) as tables and a plot.

Every row has ``"bench": "quality"``, a ``run_id`` (the benchmark run that wrote it: a file
accumulates runs, each is rendered on its own) and a ``kind``:

- ``pretrain``, one per recipe: ``name``, ``recipe``, ``architecture``, ``params``, ``steps``,
  ``tokens_seen``, ``wall_s``, ``val_mlm_loss`` / ``val_mlm_acc`` (the last evaluation, masked at
  ``eval_mask_rate`` on ``val_sequences`` held-out sequences) and ``curve``: every evaluation as
  ``{"step", "elapsed_s", "tokens_seen", "val_mlm_loss", "val_mlm_acc"}``;
- ``finetune``, one per recipe x init (``pretrained`` / ``random``) x labelled task: ``scores``
  by ``seeds``, their ``median``, ``min``, ``max`` and ``spread`` (max - min);
- ``projection``: a GPU projection (tokens/s x budget from an assumed MFU) or a published
  token count to compare it with.

The bench writes its quality.md from these same functions, so the report and the bench agree.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bertgpu.report.inputs import num
from bertgpu.report.render import Block


def _f(v: Any, fmt: str) -> str:
    return "" if num(v) is None else format(v, fmt)


def _count(v: Any) -> str:
    if num(v) is None:
        return ""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.3g}{unit}"
    return f"{v:.0f}"


def _minutes(v: Any) -> str:
    if num(v) is None:
        return ""
    return f"{v:.0f} s" if v < 90 else f"{v / 60:.1f} min"


# What the pretraining table's rate is, said under it: not the rate of the logged intervals
# that `bertgpu report RUN` and the console show.
RATE_NOTE = ("tokens / wall-clock s: tokens seen over the wall-clock of the run's last train "
             "record (its first step, compilation, evaluations and checkpoints included), the "
             "rate the budget buys; `bertgpu report` of a run folder shows tokens over the time "
             "of the logged intervals, which leave out the first step, compiling steps, "
             "evaluations and checkpoints, so it is usually higher.")


def pretrain_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["recipe", "architecture", "parameters", "steps", "tokens seen", "wall-clock",
              "tokens / wall-clock s", "val MLM loss", "val MLM accuracy"]
    cells = []
    for r in rows:
        if r.get("kind") != "pretrain":
            continue
        wall, tokens = r.get("wall_s"), r.get("tokens_seen")
        rate = tokens / wall if isinstance(wall, (int, float)) and wall and tokens else None
        cells.append([str(r.get("name")), str(r.get("architecture", "")), _count(r.get("params")),
                      _f(r.get("steps"), ","), _count(tokens), _minutes(wall), _f(rate, ",.0f"),
                      _f(r.get("val_mlm_loss"), ".3f"), _f(100 * r["val_mlm_acc"], ".1f") + " %"
                      if isinstance(r.get("val_mlm_acc"), float) else ""])
    return header, cells


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per recipe and task: the pretrained and random-init medians, the benefit (difference of
    the medians), the seed spread (the larger of the two max - min) and whether benefit > spread;
    neither of the last two when either init ran one seed: no spread was measured."""
    by_key: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("kind") == "finetune":
            by_key.setdefault((r["name"], r["task"]), {})[r["init"]] = r
    out = []
    for (name, task), inits in by_key.items():
        pre, rnd = inits.get("pretrained"), inits.get("random")
        row: dict[str, Any] = {"name": name, "task": task, "pretrained": pre, "random": rnd,
                               "metric": (pre or rnd or {}).get("metric", "")}
        if pre and rnd:
            row["benefit"] = pre["median"] - rnd["median"]
            # one seed has no spread (0 by construction, which any benefit would beat)
            if not any(len(r.get("scores") or ()) < 2 for r in (pre, rnd)):
                row["spread"] = max(pre["spread"], rnd["spread"])
                row["beats_spread"] = row["benefit"] > row["spread"]
        out.append(row)
    return out


def _score(r: dict[str, Any] | None) -> str:
    if not r:
        return ""
    if len(r.get("scores", [])) < 2:
        return _f(r.get("median"), ".1f")
    return f"{r['median']:.1f} ({r['min']:.1f}-{r['max']:.1f})"


ONE_SEED = "n/a (one seed)"
"""The seed spread and its verdict of a set fine-tuned with one seed: none measured."""


def downstream_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["recipe", "task", "metric", "pretrained: median (min-max)",
              "random init: median (min-max)", "benefit", "seed spread", "benefit > spread"]
    cells = []
    for c in comparisons(rows):
        verdict = ("yes" if c["beats_spread"] else "no") if "beats_spread" in c else \
            ONE_SEED if "benefit" in c else ""
        cells.append([c["name"], c["task"], c["metric"], _score(c["pretrained"]),
                      _score(c["random"]), _f(c.get("benefit"), "+.1f"),
                      _f(c.get("spread"), ".1f") if "beats_spread" in c else verdict, verdict])
    return header, cells


def projection_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    header = ["model", "hardware and time", "tokens", "how the number is obtained"]
    cells = [[str(r.get("model")), str(r.get("hardware", "")), _count(r.get("tokens")),
              str(r.get("source", ""))]
             for r in rows if r.get("kind") == "projection"]
    return header, cells


def curve_plot(rows: list[dict[str, Any]], folder: Path, name: str) -> str | None:
    """Validation MLM loss against wall-clock minutes and against tokens seen, one line per
    recipe; None when no recipe has an evaluation."""
    runs = [r for r in rows if r.get("kind") == "pretrain" and r.get("curve")]
    if not runs:
        return None
    from bertgpu.report.plots import pyplot, save

    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, r in enumerate(runs):
        pts = [p for p in r["curve"] if isinstance(p.get("val_mlm_loss"), (int, float))]
        ys = [p["val_mlm_loss"] for p in pts]
        style = {"color": f"C{i % 10}", "marker": "o", "markersize": 3, "label": str(r.get("name"))}
        axes[0].plot([p["elapsed_s"] / 60.0 for p in pts], ys, **style)
        axes[1].plot([p.get("tokens_seen", math.nan) / 1e6 for p in pts], ys, **style)
    mask = runs[0].get("eval_mask_rate", 0.15)
    for ax, xlabel in ((axes[0], "wall-clock (minutes)"), (axes[1], "tokens seen (millions)")):
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
    axes[0].set_ylabel(f"validation MLM loss (masked at {mask:.0%})")
    axes[0].set_title("Held-out loss against wall-clock")
    axes[1].set_title("... and against tokens seen")
    return save(fig, folder, name)


def _describe(rows: list[dict[str, Any]]) -> str:
    pre = [r for r in rows if r.get("kind") == "pretrain"]
    if not pre:
        return ""
    r = pre[0]
    seeds = next((x["seeds"] for x in rows if x.get("kind") == "finetune"), None)
    text = (f"Budget {r.get('budget', '?')} per recipe on {r.get('device', '?')}; corpus "
            f"{r.get('corpus', '?')}; one tokenizer and shard set for all; validation: the same "
            f"{r.get('val_sequences', '?')} held-out sequences masked at "
            f"{r.get('eval_mask_rate', 0.15):.0%} for every recipe.")
    if seeds:
        text += (f" Fine-tuning: seeds {', '.join(map(str, seeds))}; median and min-max over them; "
                 "the random twin has the recipe's architecture and fresh weights; benefit = "
                 "difference of the medians, seed spread = the larger max - min of the two.")
    return text


def quality_blocks(rows: list[dict[str, Any]], folder: Path | None, stem: str) -> list[Block]:
    """Blocks of every benchmark run in `rows` (by run_id); plots go into `folder` (None: none)."""
    blocks: list[Block] = []
    run_ids = list(dict.fromkeys(str(r.get("run_id", "")) for r in rows))
    for n, run_id in enumerate(run_ids):
        group = [r for r in rows if str(r.get("run_id", "")) == run_id]
        blocks.append(("h2", f"Quality per unit of compute ({run_id})" if run_id
                       else "Quality per unit of compute"))
        text = _describe(group)
        if text:
            blocks.append(("p", text))
        for title, (header, cells), note in (
                ("Pretraining, one row per recipe:", pretrain_table(group), RATE_NOTE),
                ("Fine-tuning, pretrained vs random init:", downstream_table(group), None),
                ("GPU projection:", projection_table(group), None)):
            if cells:
                blocks += [("p", title), ("table", header, cells)] + ([("p", note)] if note else [])
        plot = curve_plot(group, folder, f"{stem}_{n}.png" if len(run_ids) > 1 else f"{stem}.png") \
            if folder is not None else None
        if plot:
            blocks.append(("img", plot, "Validation MLM loss against wall-clock and tokens"))
    return blocks
