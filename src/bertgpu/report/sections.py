"""The report's sections: pretraining runs, fine-tuning folders, GLUE tables (benchmarks:
bench_results.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertgpu.report.bench_results import (
    measured_on,
    scaling_runs,  # noqa: F401 (its former home)
)
from bertgpu.report.formats import fmt_count, fmt_duration, fmt_score, fmt_value
from bertgpu.report.inputs import Source, num, pretrain_summary, runs_of, series
from bertgpu.report.plots import bar_chart, pyplot, run_plot, save
from bertgpu.report.render import Block

_fmt_duration = fmt_duration  # its former name, which tests import

_SUMMARY_ROWS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("ended", "how the run ended", str),
    ("steps", "optimizer steps", lambda v: f"{v:,.0f}"),
    ("tokens_seen", "tokens seen", fmt_count),
    ("train_loss", "final train loss", lambda v: f"{v:.4f}"),
    ("val_mlm_loss", "final val MLM loss", lambda v: f"{v:.4f}"),
    ("val_mlm_acc", "final val MLM accuracy", lambda v: f"{100 * v:.2f} %"),
    ("val_nsp_acc", "final val NSP accuracy", lambda v: f"{100 * v:.2f} %"),
    ("tokens_per_s", "tokens/s (all devices; tokens / time of the logged intervals)",
     lambda v: f"{v:,.0f}"),
    ("tokens_per_s_per_device", "tokens/s per device (likewise)", lambda v: f"{v:,.0f}"),
    ("world_size", "devices", lambda v: v if isinstance(v, str) else f"{v:.0f}"),
    ("device", "measured on", str),
    ("mfu", "MFU (weighted by interval time)", lambda v: f"{100 * v:.1f} %"),
    ("mfu_peak", "MFU is over the peak of one device", str),
    ("compile_s", "time in steps that compiled", lambda v: f"{v:.1f} s"),
    ("mem_peak_gib", "peak memory", lambda v: f"{v:.2f} GiB"),
    ("wall_s", "wall time (of the kept timeline: work lost to a crash not counted)", fmt_duration),
    ("checkpoints", "checkpoints", lambda v: f"{v:.0f}"),
    ("checkpoint_stall_s", "mean checkpoint stall (training waits)", lambda v: f"{v:.3g} s"),
    ("checkpoint_stall_max_s", "longest checkpoint stall", lambda v: f"{v:.3g} s"),
    ("checkpoint_write_s", "mean background checkpoint write", lambda v: f"{v:.3g} s"),
)


def _model_line(config: dict[str, Any]) -> str | None:
    m, t = config.get("model", {}), config.get("train", {})
    if not isinstance(m, dict) or "hidden_size" not in m:
        return None
    arch = {"bert": "BERT", "modernbert": "ModernBERT"}.get(str(m.get("architecture", "bert")),
                                                             str(m.get("architecture")))
    parts = [f"{arch}, {m.get('num_hidden_layers', '?')} layers x {m.get('hidden_size')} hidden, "
             f"{m.get('num_attention_heads', '?')} heads, vocab {m.get('vocab_size', '?')}"]
    d = config.get("data", {})
    if isinstance(d, dict) and "mask_rate" in d:  # what the MLM losses of two runs measure
        whole = ", whole words" if d.get("whole_word_masking") else ""
        parts.append(f"{100 * float(d['mask_rate']):g}% masked{whole}")
    if isinstance(t, dict) and "global_batch_size" in t:
        parts.append(f"global batch {t['global_batch_size']}, {t.get('precision', '?')}")
    return "; ".join(parts)


def _run_device(records: list[dict[str, Any]], mfu: float | None) -> dict[str, str | None]:
    """``device`` (where the run was measured: "NVIDIA H200 (torch 2.11.0+cu130)") and
    ``mfu_peak`` (the peak its MFU is over, with its source), from its start records: a resumed
    run names each in turn when they changed. None where no start record has them (runs of
    older versions): the report says nothing rather than guess."""
    starts = [r for r in records if r.get("kind") == "info" and r.get("event") == "start"]
    where = runs_of([measured_on(r) for r in starts if r.get("device")])
    peaks = runs_of([f"{p:g} TFLOP/s ({r.get('peak_source') or 'source not recorded'})"
                     for r in starts if (p := num(r.get("peak_tflops")))])
    return {"device": " then ".join(where) or None,
            "mfu_peak": " then ".join(peaks) if peaks and mfu is not None else None}


def _pretrain_plots(runs: list[Source], folder: Path) -> list[tuple[str, str]]:
    """(file, caption) of every plot drawn."""
    has = {k for r in runs for rec in r.data["records"] for k in rec}
    mlm = "mlm_loss" if "mlm_loss" in has else "loss"
    what = "MLM loss" if mlm == "mlm_loss" else "loss"
    specs = [
        ("loss.png", f"Train and validation {what} by optimizer step", "cross-entropy (nats)",
         [("train", mlm, "train MLM" if mlm == "mlm_loss" else "train"),
          ("eval", "val_mlm_loss", "val MLM")], 1.0, False),
        ("mlm_accuracy.png", "Masked-token accuracy, train and validation", "accuracy (%)",
         [("train", "mlm_acc", "train"), ("eval", "val_mlm_acc", "val")], 100.0, False),
        ("learning_rate.png", "Learning rate schedule", "learning rate",
         [("train", "lr", "")], 1.0, False),
        ("throughput.png", "Training throughput over each logged interval", "tokens/s",
         [("train", "tokens_per_s", "all devices"),
          ("train", "tokens_per_s_per_device", "per device")]
         if any(_has_multi_device(r) for r in runs) else [("train", "tokens_per_s", "")], 1.0,
         True),
    ]
    out = []
    for file, title, ylabel, curves, scale, from_zero in specs:
        if run_plot(runs, folder, file, title, ylabel, curves, scale, from_zero):
            out.append((file, title))
    return out


def _has_multi_device(run: Source) -> bool:
    a = series(run.data["records"], "train", "tokens_per_s")[1]
    b = series(run.data["records"], "train", "tokens_per_s_per_device")[1]
    return bool(b) and any(abs(x - y) > 1e-6 * max(abs(x), 1.0) for x, y in zip(a, b, strict=False))


# --- Sections --------------------------------------------------------------------------------


def _earlier_configs(run_dir: Path) -> list[tuple[int, str]]:
    """(step, file name) of the config.step_N.toml files a resume with changed settings kept,
    by step: config.toml holds only the latest settings."""
    found = []
    for path in Path(run_dir).glob("config.step_*.toml"):
        parts = path.name.removeprefix("config.step_").removesuffix(".toml").split(".")
        if all(p.isdigit() for p in parts) and len(parts) in (1, 2):  # N, or N.K: again at N
            found.append((int(parts[0]), int(parts[1]) if len(parts) == 2 else 1, path.name))
    return [(step, name) for step, _, name in sorted(found)]


def pretrain_section(runs: list[Source], folder: Path) -> list[Block]:
    blocks: list[Block] = [("h2", "Pretraining")]
    for run in runs:
        line = _model_line(run.data["config"])
        earlier = _earlier_configs(run.path)
        if line and earlier:  # the settings shown are the latest stretch's
            line += (f" (settings of the latest stretch: the run resumed with other settings at "
                     f"step {', '.join(str(s) for s, _ in earlier)}; the earlier ones are in "
                     f"{', '.join(name for _, name in earlier)})")
        if line:
            blocks.append(("p", f"{run.name} ({run.path}): {line}."))
    summaries = [pretrain_summary(r.data["records"]) for r in runs]
    for run, summary in zip(runs, summaries, strict=True):
        summary.update(_run_device(run.data["records"], summary["mfu"]))
    # a run with only its start record: its world size and elapsed 0 read as "devices 1" and
    # "wall time 0 s" of a run that did something
    waiting = [not any(r.get("kind") in ("train", "eval") or r.get("event") == "end"
                       for r in run.data["records"]) for run in runs]
    summaries = [dict.fromkeys(s) if w else s for s, w in zip(summaries, waiting, strict=True)]
    if any(waiting) and not all(waiting):
        names = ", ".join(run.name for run, w in zip(runs, waiting, strict=True) if w)
        blocks.append(("p", f"{names}: no train or eval records logged yet."))
    rows = []
    for key, label, fmt in _SUMMARY_ROWS:
        cells = [fmt(s[key]) if s[key] is not None else "" for s in summaries]
        if any(cells):
            rows.append([label, *cells])
    if not rows:
        return [*blocks, ("p", "No train or eval records logged yet.")]
    blocks.append(("table", ["", *[r.name for r in runs]], rows))
    blocks.append(("p", "Tokens/s and MFU are over the time of the logged intervals, which "
                        "leave out the first step and the steps that compiled (runs that log "
                        "compile time); for older runs, without the first logged interval "
                        "(start-up) when a run logged three or more."))
    for file, caption in _pretrain_plots(runs, folder):
        blocks.append(("img", file, caption))
    return blocks


def _in_progress_note(run: Source) -> str:
    """What the row of a fine-tuning run without results.json (still in OUT.tmp) shows."""
    d = run.data
    at = (f" (epoch {fmt_value(d['latest_epoch'])}, step {fmt_value(d['latest_step'])})"
          if d.get("latest_step") is not None else "")
    scores = (f"its score is that of its latest evaluation{at}" if d.get("latest")
              else "it has no evaluation yet")
    return (f"{run.name} has not finished: it is in progress in `{run.path}` ({d['ended']}); "
            f"{scores}, its steps are those done so far, and its train loss per epoch is only "
            "in the results.json of a finished run.")


def init_text(d: dict[str, Any]) -> str:
    """What a fine-tuning run or GLUE folder started from, as its results record it: "random"
    (fresh weights) or the folder loaded, with its checkpoint's step when one was recorded; ""
    where nothing is recorded (a run in progress, an older version)."""
    init = d.get("init")
    if not isinstance(init, str) or not init:
        return ""
    ckpt = d.get("init_checkpoint")
    step = ckpt.get("step") if isinstance(ckpt, dict) else None
    return f"{init} (step {step})" if isinstance(step, int) else init


def finetune_section(runs: list[Source], folder: Path) -> list[Block]:
    """One row per fine-tuning run; scores and metrics (0-100) to one decimal, as the GLUE
    table gives them (they were to 4 significant digits: "58.33" beside GLUE's "58.3")."""
    rows, notes = [], []
    for r in runs:
        d = r.data
        metrics = d.get("metrics") if isinstance(d.get("metrics"), dict) else {}
        text = "; ".join(
            f"{split}: " + ", ".join(f"{k} {fmt_score(num(v))}" for k, v in m.items())
            for split, m in metrics.items() if isinstance(m, dict))
        steps = fmt_value(d.get("steps"))
        if d.get("in_progress"):  # its records' metrics (split_metric keys), not results.json's
            text = ", ".join(f"{k} {fmt_score(num(v))}" for k, v in d["latest"].items())
            text = f"latest: {text}" if text else ""
            steps += f" of {fmt_value(d['max_steps'])}" if d.get("max_steps") and steps else ""
            notes.append(("p", _in_progress_note(r)))
        train_s = num(d.get("train_seconds")) or num(d.get("seconds"))
        rows.append([r.name, str(d.get("task", "")), init_text(d),
                     fmt_score(num(d.get("score"))), text,
                     str(len(d["epochs"])) if isinstance(d.get("epochs"), list) else "",
                     steps, fmt_duration(train_s) if train_s else "",
                     fmt_value(num(d.get("train_examples_per_s")))])
    header = ["run", "task", "init", "score", "final metrics", "epochs", "steps", "train time",
              "train examples/s"]
    if not any(row[2] for row in rows):  # results of versions that recorded no init
        header, rows = [h for h in header if h != "init"], [row[:2] + row[3:] for row in rows]
    blocks: list[Block] = [("h2", "Fine-tuning"), ("table", header, rows), *notes]
    curves = [(r, [e for e in r.data.get("epochs") or [] if isinstance(e, dict)]) for r in runs]
    if any(eps for _, eps in curves):
        plt = pyplot()  # first: without matplotlib, its one-line error
        from matplotlib.ticker import MaxNLocator

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title, ylabel in ((a1, "train_loss", "Fine-tuning train loss", "loss"),
                                       (a2, "score", "Fine-tuning dev score", "score (x 100)")):
            for i, (r, eps) in enumerate(curves):
                pts = [(e.get("epoch"), num(e.get(key))) for e in eps]
                pts = [(x, y) for x, y in pts if num(x) is not None and y is not None]
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
        blocks.append(("img", save(fig, folder, "finetune.png"), "Fine-tuning curves"))
    return blocks


def _glue_columns(summary: dict[str, Any]) -> dict[str, float]:
    """Task column -> score: the summary's ``columns``, else each task's score or number."""
    cols = summary.get("columns")
    if isinstance(cols, dict) and cols:
        return {str(k): v for k, v in cols.items() if num(v) is not None}
    out = {}
    for name, t in (summary.get("tasks") or {}).items():
        v = t.get("score") if isinstance(t, dict) else t
        if num(v) is not None:
            out[str(name)] = float(v)
    return out


def _glue_protocol(p: Any) -> str:
    """The fine-tuning protocol of a GLUE folder, as `bertgpu glue` words it in its own table."""
    if not isinstance(p, dict) or not p:
        return "protocol: not recorded (glue_results.json of an older version)"
    if isinstance(p.get("text"), str):  # its own words: optimizer, lr as used, other settings
        return f"protocol: {p['text']}"

    def get(key: str) -> Any:
        return p.get(key, "?")

    epochs, lr, warmup, seeds = get("epochs"), p.get("lr"), get("warmup_fraction"), get("seeds")
    return (f"protocol: fine-tuning {epochs} epoch{'' if epochs == 1 else 's'}, lr "
            f"{'by model size' if lr is None else format(lr, 'g') if num(lr) is not None else lr} "
            f"({get('decay')} decay, "
            f"{format(warmup, '.0%') if num(warmup) is not None else warmup} warm-up), batch "
            f"{get('global_batch_size')}, max_seq_len {get('max_seq_len')}, {get('precision')}, "
            f"seeds {' '.join(map(str, seeds)) if isinstance(seeds, list) else seeds}; each cell "
            f"is the {get('aggregate')} of the {get('checkpoint')} dev score")


def _glue_subset(summary: dict[str, Any]) -> str | None:
    """Why a folder's table of --max_eval_examples / --max_train_examples runs is not GLUE dev
    (in its protocol's words; an older one's from its config), or None for a full table."""
    p, cfg = summary.get("protocol"), summary.get("config")
    if isinstance(p, dict) and "subset" in p:
        return p["subset"] if isinstance(p["subset"], str) else None
    flags = " ".join(f"--{k} {cfg[k]}" for k in ("max_eval_examples", "max_train_examples")
                     if isinstance(cfg, dict) and cfg.get(k) is not None)
    return (f"Subset ({flags}): not comparable with full GLUE dev results or published rows"
            if flags else None)


def _glue_task_scores(summary: dict[str, Any]) -> dict[str, float]:
    """Task -> score of a GLUE folder's task table: MNLI once, as its average counts it."""
    tasks = summary.get("tasks")
    out = {}
    for name, t in (tasks.items() if isinstance(tasks, dict) else ()):
        v = num(t.get("score") if isinstance(t, dict) else t)
        if v is not None:
            out[str(name)] = v
    return out


def _task_count(summary: dict[str, Any], cols: dict[str, float]) -> int:
    """How many tasks a folder's average is over: its task table, else its columns with MNLI's
    two (-m, -mm) counted once."""
    return len(_glue_task_scores(summary)) or len({re.sub(r"-mm?$", "", c) for c in cols})


def _shared_tasks(sources: list[Source]) -> list[str]:
    """The tasks every GLUE folder has a score of, in the first folder's order."""
    scores = [_glue_task_scores(s.data) for s in sources]
    return [t for t in scores[0] if all(t in sc for sc in scores[1:])]


def _published_shared_average(ref: dict[str, Any], sources: list[Source]) -> float | None:
    """A published row's mean over the tasks our rows share, as our "average (shared tasks)"
    cells are: each task the mean of its columns (MNLI's -m and -mm once); None when the row
    did not publish every one of them. Its own average, of all its tasks, sat under that
    header before."""
    task_columns: dict[str, list[str]] = {}
    for s in sources:
        for name, t in (s.data.get("tasks") or {}).items():
            cols = t.get("columns") if isinstance(t, dict) else None
            task_columns.setdefault(name, list(cols) if isinstance(cols, dict) and cols
                                    else [name])
    per_task = []
    for task in _shared_tasks(sources):
        values = [num(ref["columns"].get(c)) for c in task_columns.get(task, [task])]
        if any(v is None for v in values):
            return None
        per_task.append(sum(values) / len(values))
    return sum(per_task) / len(per_task) if per_task else None


def _glue_averages(sources: list[Source], cols_by: list[dict[str, float]]
                   ) -> tuple[str, list[float | None], list[str], str | None]:
    """The average column of our GLUE rows: (header, values, cells, note or None).

    Each folder averages the tasks it ran, so rows over different task sets (a 5-task run beside
    a 3-task one) are not comparable; yet a reader scans that column to rank the runs. So the
    column then holds the mean over the tasks every row has ("glue-score" convention: the
    unweighted mean of task scores), and a note names those tasks and quotes each folder's own
    average. Where that cannot be computed (no shared task, another or an unrecorded convention,
    no task table), each cell says how many tasks it averages and the chart leaves it out."""
    own = [num(s.data.get("average")) for s in sources]
    if len({frozenset(cols) for cols in cols_by}) <= 1:
        return "average", own, [fmt_score(v) for v in own], None
    scores = [_glue_task_scores(s.data) for s in sources]
    shared = _shared_tasks(sources)
    counts = [_task_count(s.data, cols) for s, cols in zip(sources, cols_by, strict=True)]
    owns = ", ".join(f"{s.name} {fmt_score(v) or 'none'} ({n} task{'s' * (n != 1)})"
                     for s, v, n in zip(sources, own, counts, strict=True))
    if shared and all(s.data.get("convention") == "glue-score" for s in sources):
        values: list[float | None] = [sum(sc[t] for t in shared) / len(shared) for sc in scores]
        note = (f"The GLUE rows cover different tasks, so their average column is over the "
                f"{len(shared)} task{'s' * (len(shared) != 1)} every row has: "
                f"{', '.join(shared)} (\"glue-score\" convention: the unweighted mean of those "
                f"task scores). Each folder's own average, over all its tasks: {owns}.")
        return "average (shared tasks)", values, [fmt_score(v) for v in values], note
    why = ("no task is in every row" if not shared and all(scores) else
           "not every folder records its task scores in the \"glue-score\" convention")
    note = (f"The GLUE rows cover different tasks and their averages are not comparable: each "
            f"average is over its own tasks, and the count is beside it ({why}, so no common "
            f"average is given): {owns}.")
    cells = [f"{fmt_score(v)} ({n} task{'s' * (n != 1)})" if v is not None else ""
             for v, n in zip(own, counts, strict=True)]
    return "average (own tasks)", [None] * len(own), cells, note


def _glue_model(summary: dict[str, Any]) -> str:
    """"`runs/base` (checkpoint `.../step_60`, step 60)": what a GLUE folder evaluated, as
    `bertgpu glue` names it above its own table; "" for a folder that does not record it."""
    init = summary.get("init")
    if not isinstance(init, str) or not init:
        return ""
    ckpt = summary.get("init_checkpoint")
    if not isinstance(ckpt, dict) or not ckpt.get("path"):
        return f"`{init}`"
    step = f", step {ckpt['step']}" if isinstance(ckpt.get("step"), int) else ""
    return f"`{init}` (checkpoint `{ckpt['path']}`{step})"


def _glue_breakdown(sources: list[Source], names: list[str]) -> list[list[str]]:
    """Per folder and task: its metrics (each the aggregate over seeds) and each seed's score,
    as `bertgpu glue`'s own table gives them: an STS-B cell of -15.8 is then seen to be
    Pearson -31.6 and Spearman 0.0, seeds 43.3 and -74.9."""
    rows = []
    for s, row_name in zip(sources, names, strict=True):
        for name, t in (s.data.get("tasks") or {}).items():
            if not isinstance(t, dict):
                continue
            metrics = "; ".join(
                f"{split}: " + ", ".join(f"{k} {fmt_score(v)}" for k, v in m.items())
                for split, m in (t.get("metrics") or {}).items() if isinstance(m, dict))
            seeds = ", ".join(
                f"{seed}: " + "/".join(fmt_score(v) for v in c.values())
                for seed, c in (t.get("per_seed") or {}).items() if isinstance(c, dict))
            if metrics or seeds:
                rows.append([row_name, str(name), metrics, seeds])
    return rows


def _reference_line(label: str, ref: dict[str, Any]) -> str:
    said = [str(ref[k]) for k in ("source", "note") if ref.get(k)]
    return f"{label}: {'; '.join(said)}." if said else f"{label}: no source recorded."


def glue_section(sources: list[Source], folder: Path) -> list[Block]:
    """Our row of each GLUE folder (its protocol and average convention named), then the
    published rows they asked for, each once, quoted as published with its source and note."""
    cols_by = [_glue_columns(s.data) for s in sources]
    subsets = [_glue_subset(s.data) for s in sources]
    names = [f"{s.name} (subset)" if sub else s.name
             for s, sub in zip(sources, subsets, strict=True)]
    columns = list(dict.fromkeys(c for cols in cols_by for c in cols))
    avg_header, averages, avg_cells, avg_note = _glue_averages(sources, cols_by)
    rows = [[name, *[fmt_score(cols.get(c)) for c in columns], cell]
            for name, cols, cell in zip(names, cols_by, avg_cells, strict=True)]
    refs: dict[str, dict[str, Any]] = {}  # label -> reference; two folders may ask for one
    for s in sources:
        for ref in s.data.get("references") or []:
            if isinstance(ref, dict) and isinstance(ref.get("columns"), dict):
                refs.setdefault(str(ref.get("label") or ref.get("name") or "reference"), ref)
    shared_avg = avg_header == "average (shared tasks)"
    rows += [[label, *[fmt_score(ref["columns"].get(c)) for c in columns],
              fmt_score(_published_shared_average(ref, sources) if shared_avg
                        else ref.get("average"))] for label, ref in refs.items()]
    if refs and shared_avg:
        avg_note = (avg_note or "") + (
            " The published rows' cells in that column are likewise the mean of their published "
            "scores of those tasks (empty where they did not publish all of them), not their own "
            "averages: " + ", ".join(f"{label} {fmt_score(ref.get('average')) or 'none'}"
                                     for label, ref in refs.items()) + ".")
    blocks: list[Block] = [("h2", "GLUE (dev)")]
    for s, sub in zip(sources, subsets, strict=True):
        model = _glue_model(s.data)
        text = (f"{s.name}: {sub + '. ' if sub else ''}{_glue_protocol(s.data.get('protocol'))}."
                + (f" Model: {model}." if model else ""))
        if s.data.get("convention_text"):
            name = f"\"{s.data['convention']}\" " if s.data.get("convention") else ""
            text += (f" Average of the {s.name} row (not of the published rows, which keep "
                     f"their own): {name}convention: {s.data['convention_text']}.")
        blocks.append(("p", text))
    blocks.append(("table", ["model", *columns, avg_header], rows))
    if avg_note:
        blocks.append(("p", avg_note))
    if refs:
        blocks.append(("p", "Published rows are quoted as published (their own protocols and "
                            "averaging; empty cells were not reported or not in this table):"))
        blocks.append(("list", [_reference_line(label, ref) for label, ref in refs.items()]))
    if breakdown := _glue_breakdown(sources, names):
        blocks += [("p", "Per task: the metrics behind each cell and each seed's score:"),
                   ("table", ["model", "task", "metrics", "score per seed"], breakdown)]
    if columns:
        # averages of different task sets never stand side by side: none when not comparable
        with_avg = avg_note is None or any(v is not None for v in averages)
        cats = [*columns, avg_header] if with_avg else columns
        series = [(name, [cols.get(c) for c in columns] + ([avg] if with_avg else []))
                  for name, cols, avg in zip(names, cols_by, averages, strict=True)]
        file = bar_chart(folder, "glue.png", "GLUE dev scores per task", "score (x 100)", cats,
                          series)
        blocks.append(("img", file, "GLUE dev scores per task"))
    return blocks
