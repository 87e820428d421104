"""GLUE-dev table: fine-tune every task x seed, take the median over seeds, average the tasks.

    bertgpu glue --data-dir glue_data --init runs/base --out glue/base
    bertgpu glue --data-dir glue_data --init runs/base --out glue/base --tasks cola sst2 rte \\
        --seeds 1 2 3 --epochs 3 --lr 2e-5 --reference bert-base-cramming sidsite-8gb
    bertgpu glue --data-dir glue_data --init runs/base --out glue/base --nproc 2

Each run is `finetune.finetune(TASK, ...)` into OUT/TASK/seed_N/; a task/seed whose results.json
exists is not run again (re-running the command only fills the gaps) unless --force; the same
--force command re-run after a stop keeps the runs it had finished (glue_force.py). The table
reports each task's final-epoch dev metrics, median over seeds, and the GLUE average in the
"glue-score" convention of `eval_metrics` (task score = mean of its official metrics, MNLI's
matched and mismatched averaged so it counts once, unweighted mean over the tasks shown). It is
written to OUT/glue_results.md and OUT/glue_results.json with the fine-tuning protocol named.

Reference rows (--reference) are published figures, quoted as published: their protocols and
averaging conventions differ from ours and from each other (see their `note`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertgpu import glue_force, glue_reuse
from bertgpu.config.sections import seed_number
from bertgpu.errors import BertgpuError
from bertgpu.glue_protocol import other_settings, peak_lr, protocol_text, subset_text
from bertgpu.tasks.finetune_output import json_text
from bertgpu.tasks.glue import remove_stale_submission, write_submission

ACCEPTS_OVERRIDES = True
LAUNCHES_WORKERS = True
CONVENTION = "glue-score"
CONVENTION_TEXT = ("task score = mean of its official metrics (MRPC/QQP F1 and accuracy, STS-B "
                   "Pearson and Spearman; each metric the median over seeds), MNLI = mean of -m "
                   "and -mm (counts once), average = "
                   "unweighted mean over the tasks shown, WNLI included when shown")

# Published GLUE-dev figures (/work/shared/ANCHORS.md); columns as in our table.
REFERENCES: dict[str, dict[str, Any]] = {
    "bert-base-cramming": {
        "label": "BERT-base, Cramming protocol (published)",
        "columns": {},
        "average": "80.9",
        "source": "Geiping & Goldstein 2022, Cramming: Training a Language Model on a Single GPU "
                  "in One Day",
        "note": "average only, as published",
    },
    "cramming-1gpu-24h": {
        "label": "Cramming, 1 GPU x 24 h (published)",
        "columns": {"MNLI-m": 84.1, "MNLI-mm": 84.6, "QQP": 87.5, "SST-2": 92.0, "CoLA": 53.3},
        "average": "78.6-80.7",
        "source": "cramming model card",
        "note": "average range as published over its model variants",
    },
    "sidsite-8gb": {
        "label": "BERT from scratch on one 8 GB GPU, ~100 h (published)",
        "columns": {"MNLI-m": 79.3, "MNLI-mm": 80.1, "SST-2": 89.1, "STS-B": 61.9, "RTE": 55.9,
                    "QNLI": 86.3, "QQP": 86.4, "MRPC": 74.8, "CoLA": 41.0},
        "average": "72.7",
        "source": "sidsite.com, BERT from scratch on one 8 GB GPU",
        "note": "average as published",
    },
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.allow_abbrev = False  # `--seed` must not be read as an abbreviation of `--seeds`
    parser.add_argument("--data-dir", required=True,
                        help="GLUE root: CoLA/, SST-2/, ... (official or HF layout)")
    parser.add_argument("--init", required=True,
                        help="run folder, checkpoint folder, HF BERT or ModernBERT folder, or "
                             "random")
    parser.add_argument("--config-from",
                        help="with --init random: folder whose config.json and tokenizer to use")
    parser.add_argument("--out", required=True,
                        help="output folder: TASK/seed_N/ runs and glue_results.{md,json}")
    parser.add_argument("--tasks", nargs="+",
                        help="tasks to run (default all nine), any alias: cola sst2 mnli ...")
    parser.add_argument("--seeds", nargs="+", type=seed_number, default=[1],
                        help="fine-tuning seeds (default 1)")
    parser.add_argument("--reference", nargs="*", default=None, choices=sorted(REFERENCES),
                        help="published rows to print beside ours (the flag alone: all)")
    parser.add_argument("--skip-missing", action="store_true",
                        help="skip tasks whose folder is missing")
    parser.add_argument("--force", action="store_true",
                        help="re-run task/seeds that already have results.json")
    parser.add_argument("--predict-test", action="store_true",
                        help="also predict every test set and write the GLUE leaderboard files "
                             "to OUT/submission/ and OUT/submission.zip: each task from its seed "
                             "with the best dev score, AX (the diagnostic set) from MNLI's")
    parser.epilog = ("Fine-tuning overrides as in `bertgpu finetune`: --epochs 3 --lr 2e-5 "
                     "--global_batch_size 32 --max_seq_len 128 (--seed is set from --seeds)")


def check_before_launch(args: argparse.Namespace, nproc: int) -> None:
    """A typo in the fine-tuning overrides, an --out that is a file or an --init that is not a
    model fails here, once, before any run or worker starts."""
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.finetune import tokenizer_for
    from bertgpu.locks import check_free

    _check_out(args.out)
    check_free(args.out, "bertgpu glue")
    load_finetune_config(None, args.overrides)
    tokenizer_for(str(args.init), args.config_from)


OTHER_OUTPUTS = ("config.json", "model.safetensors", "pytorch_model.bin", "checkpoints",
                 "metrics.jsonl", "manifest.json")
"""What a model, run or shard set folder holds at its top and a GLUE output never does."""


def _check_out(out: str | os.PathLike[str]) -> None:
    from bertgpu.errors import BertgpuError
    from bertgpu.fsutil import check_output_folder

    check_output_folder(out, "an output folder (a folder per task and seed, and the table)")
    folder = Path(out)
    other = ([n for n in OTHER_OUTPUTS if (folder / n).exists()]
             + sorted(p.parent.name + "/" + p.name for p in folder.glob("*/train.tsv")))[:1]
    if other:  # glue writes TASK/seed_N/ beside what it finds: it would mix into their folder
        raise BertgpuError(f"{out}: holds {other[0]}, so it is a model, run, shard set or data "
                           "folder, not a GLUE output; expected a new folder, or an earlier "
                           "`bertgpu glue` output")
    theirs = [n for n in ("submission", "submission.zip") if (folder / n).exists()]
    ours = ("glue_results.json", glue_force.MARKER, glue_force.WRITING)  # (glue_force.py)
    if theirs and not any((folder / n).is_file() for n in ours):
        raise BertgpuError(f"{out}: holds {' and '.join(theirs)}, which no earlier `bertgpu glue` "
                           "wrote here (no glue_results.json) and which this command replaces "
                           "or removes; move them away, or choose another --out")


def main(args: argparse.Namespace) -> int:
    check_before_launch(args, 1)
    summary = run(args.data_dir, args.init, args.out, tasks=args.tasks, seeds=args.seeds,
                  overrides=args.overrides, force=args.force, skip_missing=args.skip_missing,
                  references=(sorted(REFERENCES) if args.reference == [] else args.reference),
                  config_from=args.config_from,
                  predict_test=args.predict_test)
    return summary.get("exit_status", 143) if summary.get("preempted") else 0


def run(data_dir: str | os.PathLike[str], init: str | os.PathLike[str], out: str | os.PathLike[str],
        tasks: list[str] | None = None, seeds: list[int] | None = None,
        overrides: list[str] | None = None, force: bool = False, skip_missing: bool = False,
        references: list[str] | None = None,
        config_from: str | os.PathLike[str] | None = None,
        predict_test: bool = False) -> dict[str, Any]:
    """Fine-tune every task x seed (skipping finished ones) and write the table; returns the
    content of glue_results.json, or finetune's {"preempted": True, ...} when a run was stopped
    by a signal (its checkpoint kept: re-running the command resumes it; no table is written).

    Every task's files are found before the first run, and a finished run made with another init
    checkpoint, other settings or another --data-dir is refused (the table would mix them under
    one protocol) unless --force. A run folder's newest checkpoint is taken once, here: every run
    starts from it, even when pretraining saves a newer one meanwhile. Without --predict-test,
    the OUT/submission/ and .zip of an earlier one are removed (they belonged to another table)."""
    from bertgpu.locks import output_lock

    _check_out(out)
    with output_lock(out, "bertgpu glue", hold=os.environ.get("RANK", "0") == "0"):
        return _run(data_dir, init, out, tasks, seeds, overrides, force, skip_missing, references,
                    config_from, predict_test)


def _run(data_dir: str | os.PathLike[str], init: str | os.PathLike[str],
         out: str | os.PathLike[str], tasks: list[str] | None, seeds: list[int] | None,
         overrides: list[str] | None, force: bool, skip_missing: bool,
         references: list[str] | None, config_from: str | os.PathLike[str] | None,
         predict_test: bool) -> dict[str, Any]:
    from bertgpu import finetune
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.tasks import glue as tasks_mod
    from bertgpu.tasks.glue_job import data_files
    from bertgpu.tasks.init_model import load_from, resolve_init
    from bertgpu.train import distributed

    overrides = list(overrides or [])
    seeds = list(seeds or [1])
    if len(set(seeds)) != len(seeds):
        raise BertgpuError(f"--seeds {' '.join(map(str, seeds))}: each seed once")
    cfg = load_finetune_config(None, overrides)
    if any(w.lstrip("-").split("=")[0].replace("-", "_") in ("seed", "train.seed")
           for w in overrides):
        raise BertgpuError("--seed: use --seeds N [N ...] with bertgpu glue")
    chosen = [tasks_mod.get_task(t) for t in tasks] if tasks else list(tasks_mod.TASKS.values())
    chosen = list({t.key: t for t in chosen}.values())  # "mnli-m mnli-mm" is one task
    for name in references or []:
        if name not in REFERENCES:
            raise BertgpuError(f"--reference {name}: expected one of "
                               f"{', '.join(sorted(REFERENCES))}")
    out = Path(out)
    ckpt = resolve_init(str(init))

    present, skipped = _find_tasks(data_dir, chosen, skip_missing)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    known: dict[str, Any] = {}  # as_used, read once from the init's config.json; files per task

    def same_settings(task: Any, seed: int) -> Callable[[Path, dict[str, Any]], None]:
        """check_same_settings of a finished run of `task` and `seed`."""
        def check(path: Path, results: dict[str, Any]) -> None:
            if "used" not in known:
                known["used"] = glue_reuse.as_used(cfg, init, config_from)
            if task.name not in known:  # hashed once a task, not once a seed
                known[task.name] = data_files(data_dir, task)
            glue_reuse.check_same_settings(path, results, cfg, seed, init, config_from, ckpt,
                                           data_dir, known["used"], known[task.name], world)
        return check

    if not force:  # before any training: a finished run of other settings stops the command
        for task in present:
            for seed in seeds:
                path = glue_reuse.finished_results(out / task.name / f"seed_{seed}")
                if path is not None:
                    same_settings(task, seed)(path, _read_results(path))

    glue_reuse.read_before_training(present, seeds, out, force, data_dir, cfg.skip_malformed,
                                    predict_test)
    # One process group for all runs; each run's DDP model is gone before it is torn down.
    with distributed.process_group(cfg.device, cfg.timeout_minutes):
        main = distributed.is_main()
        key = glue_force.settings_key(init, ckpt, config_from, data_dir, cfg, predict_test, world)
        start = glue_force.begin(out, key) if force and main else None
        if main and not force:
            _restore_markdown(out)
        runs: dict[str, dict[int, dict[str, Any]]] = {}
        for task in present:
            runs[task.name] = {}
            for seed in seeds:
                run_dir = out / task.name / f"seed_{seed}"
                done = run_dir / "results.json"
                # rank 0 decides (it may move the run into place), every rank follows
                if not distributed.any_true(main and _keeps(
                        run_dir, f"{task.name} seed {seed}", force, predict_test, start,
                        same_settings(task, seed))):
                    result = finetune.finetune(task.key, data_dir, load_from(str(init), ckpt),
                                               run_dir, cfg, ["--seed", str(seed)],
                                               config_from=config_from,
                                               predict_test=predict_test, force=True)
                    if result.get("preempted"):
                        return result  # its checkpoint is kept; the same command resumes it
                distributed.barrier()  # rank 0 wrote results.json
                runs[task.name][seed] = _read_results(done)
        summary = summarise(runs, chosen, seeds, cfg, str(init), references or [], skipped,
                            data=str(Path(data_dir).resolve()))
        summary["init_checkpoint"] = ckpt.record() if ckpt is not None else None
        if distributed.is_main():
            if predict_test:
                glue_force.writing(out)
                summary["submission"] = write_submission(out, runs)
            else:
                remove_stale_submission(out)
            write_table(summary, out)
            glue_force.finish(out)
        distributed.barrier()
        return summary


def _keeps(run_dir: Path, what: str, force: bool, predict_test: bool, start: float | None,
           same_settings: Callable[[Path, dict[str, Any]], None]) -> bool:
    """Rank 0: whether the finished run in `run_dir` counts in the table as it is (said on
    stdout), else it is trained (again). A run whose last move a stop cut short is moved into
    place first. With `force`, only one this --force command finished since `start`
    (glue_force.kept); with `predict_test`, one that wrote its test predictions."""
    glue_reuse.finish_cut_move(run_dir)
    if not (run_dir / "results.json").is_file():
        return False
    if predict_test and not (run_dir / "submission").is_dir():
        if not force:
            print(f"{what}: ran without --predict-test; run again for its test predictions",
                  flush=True)
        return False
    if not force:
        print(f"{what}: results.json exists, not re-run (--force to redo)", flush=True)
        return True
    if glue_force.kept(run_dir / "results.json", start, same_settings):
        print(f"{what}: finished by this --force command before it stopped (the same settings), "
              "not re-run", flush=True)
        return True
    return False


def _read_results(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise BertgpuError(f"{path}: unreadable results ({e}); delete it or pass --force") from None


def _find_tasks(data_dir: str | os.PathLike[str], chosen: list[Any],
                skip_missing: bool) -> tuple[list[Any], list[str]]:
    """The tasks whose train and dev files are there, and the names of those skipped (only with
    --skip-missing; at least one task must be left)."""
    from bertgpu.tasks import glue as tasks_mod

    present, skipped = [], []
    for task in chosen:
        try:
            for split in ("train", *task.dev_splits):
                tasks_mod.find_split_file(data_dir, task, split)
        except BertgpuError as e:
            if not skip_missing:
                raise BertgpuError(f"{e} (pass --skip-missing to leave {task.name} out)") from None
            skipped.append(task.name)
            continue
        present.append(task)
    if not present:
        raise BertgpuError(f"{data_dir}: none of the tasks asked for has its files "
                           f"({', '.join(skipped)}); expected a GLUE folder (CoLA/, SST-2/, ...)")
    return present, skipped


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def summarise(runs: dict[str, dict[int, dict[str, Any]]], chosen: list[Any], seeds: list[int],
              cfg: Any, init: str, references: list[str], skipped: list[str],
              data: str | None = None) -> dict[str, Any]:
    """Medians over seeds per official metric; a column (a split's task score) is the mean of
    its metrics' medians, so the metrics the table shows add up to its columns (medians of the
    per-seed columns mixed seeds: STS-B showed Pearson 90.2 of one seed and Spearman 76.3 of
    another beside a column of 80.6). The average is in our convention. `data`: the GLUE folder
    every run read (absolute)."""
    from bertgpu.config.overrides import config_to_dict
    from bertgpu.tasks import metrics as eval_metrics
    from bertgpu.tasks.glue import column_name

    per_task: dict[str, Any] = {}
    columns: dict[str, float] = {}
    for task in chosen:
        if task.name not in runs:
            continue
        results = runs[task.name]
        splits = list(next(iter(results.values()))["metrics"])
        med_metrics = {s: {m: _median([r["metrics"][s][m] for r in results.values()])
                           for m in task.metrics}
                       for s in splits}
        by_split = {column_name(task, s): eval_metrics.task_score(task, med_metrics[s])
                    for s in splits}
        cols = sorted({c for r in results.values() for c in r["columns"]},
                      key=lambda c: (c != task.name and c != "MNLI-m", c))
        med_cols = {c: by_split[c] if c in by_split
                    else _median([r["columns"][c] for r in results.values()]) for c in cols}
        per_task[task.name] = {
            "columns": med_cols,
            "metrics": med_metrics,
            "score": float(sum(med_cols.values()) / len(med_cols)),
            "per_seed": {str(s): r["columns"] for s, r in results.items()},
        }
        columns.update(med_cols)
    c = config_to_dict(cfg)
    recorded = [r.get("config", {}) for per_seed in runs.values() for r in per_seed.values()]
    for key in ("lr", "epochs"):  # chosen by model size: what the runs (one init) resolved
        if c[key] is None and recorded:
            c[key] = recorded[0].get(key)
    # As used (results.json max_seq_len: the request, or the task's 128 capped at the model's
    # positions); the request alone for runs that did not record it.
    used = sorted({r["max_seq_len"] for per_seed in runs.values() for r in per_seed.values()
                   if isinstance(r.get("max_seq_len"), int)})
    seq = (used[0] if len(used) == 1 else "/".join(map(str, used))) if used else (
        c["max_seq_len"] or 128)
    protocol = {
        "epochs": c["epochs"], "lr": peak_lr(runs, c), "global_batch_size": c["global_batch_size"],
        "max_seq_len": seq, "warmup_fraction": c["warmup_fraction"],
        "decay": c["decay"], "weight_decay": c["weight_decay"], "precision": c["precision"],
        "seeds": seeds,
        "aggregate": f"median over {len(seeds)} seed{'s' * (len(seeds) > 1)} per metric",
        "checkpoint": "final epoch",
        "optimizer": c["optimizer"],
        "lr_scaling": None if c["lr_scaling"] == "none" else {
            "lr": c["lr"], "rule": c["lr_scaling"],
            "reference_batch_size": c["reference_batch_size"]},
        "max_train_examples": c["max_train_examples"], "max_eval_examples": c["max_eval_examples"],
        "other": other_settings(c),
    }
    # in words too: `bertgpu report` quotes them (it does not import the commands)
    protocol.update(text=protocol_text(protocol), subset=subset_text(protocol))
    return {
        "init": init,
        "data": data,
        "convention": CONVENTION,
        "convention_text": CONVENTION_TEXT,
        "protocol": protocol,
        "config": c,
        "tasks": per_task,
        "columns": columns,
        "average": eval_metrics.glue_average(columns) if columns else None,
        "skipped": skipped,
        "references": [{"name": n, **REFERENCES[n]} for n in references],
    }


def _checkpoint_text(record: dict[str, Any] | None) -> str:
    """" (checkpoint `PATH`, step N)": which weights every run of the table started from."""
    if not record:
        return ""
    step = f", step {record['step']}" if record.get("step") is not None else ""
    return f" (checkpoint `{record['path']}`{step})"


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}"


def render_markdown(summary: dict[str, Any]) -> str:
    """The table as markdown: one row for us, one per reference; then per-task metrics."""
    p = summary["protocol"]
    cols = list(summary["columns"])
    subset = subset_text(p)
    lines = [
        "# GLUE dev results" + (" (subset)" if subset else ""),
        "",
        f"Model: `{summary['init']}`" + _checkpoint_text(summary.get("init_checkpoint")),
        "",
        *([f"**{subset}.**", ""] if subset else []),
        f"Protocol: {protocol_text(p)}.",
        "",
        f"Average: \"{summary['convention']}\" convention: {summary['convention_text']}.",
        "",
        "| model | " + " | ".join(cols) + " | average |",
        "|---|" + "---:|" * (len(cols) + 1),
        f"| ours{' (subset)' if subset else ''} | "
        + " | ".join(_fmt(summary["columns"][c]) for c in cols)
        + f" | {_fmt(summary['average'])} |",
    ]
    for ref in summary["references"]:
        lines.append(f"| {ref['label']} | " + " | ".join(_fmt(ref["columns"].get(c)) for c in cols)
                     + f" | {ref['average']} |")
    if summary["references"]:
        lines += ["", "Published rows are quoted as published (their own protocols and averaging; "
                      "empty cells were not reported or not in this table):"]
        lines += [f"- {r['label']}: {r['source']}; {r['note']}." for r in summary["references"]]
    lines += ["", "| task | metrics (median) | score per seed |", "|---|---|---|"]
    for name, t in summary["tasks"].items():
        metrics = "; ".join(f"{s}: " + ", ".join(f"{k} {v:.1f}" for k, v in m.items())
                            for s, m in t["metrics"].items())
        seeds = ", ".join(f"{s}: " + "/".join(f"{v:.1f}" for v in c.values())
                          for s, c in t["per_seed"].items())
        lines.append(f"| {name} | {metrics} | {seeds} |")
    if summary["skipped"]:
        lines += ["", f"Skipped (no data folder): {', '.join(summary['skipped'])}."]
    sub = summary.get("submission")
    if sub:
        chosen = ", ".join(f"{n} {s}" for n, s in sub["seeds"].items())
        lines += ["", f"Test predictions for the GLUE leaderboard: `{sub['zip']}` (each task "
                      f"from its seed with the best dev score: {chosen})"
                      + (f"; missing: {', '.join(sub['missing'])}." if sub["missing"] else ".")]
    return "\n".join(lines) + "\n"


def write_table(summary: dict[str, Any], out: Path) -> None:
    """OUT/glue_results.json and .md, and the table on stdout. Never a pair that disagrees (a
    stop between their renames left the new json, which `bertgpu report` reads, beside the old
    md): both are written to .tmp, the old md removed, then the json renamed and the md. A stop
    between leaves the json without its md, which the next `glue` writes from it."""
    out.mkdir(parents=True, exist_ok=True)
    md = render_markdown(summary)
    files = (("glue_results.json", json_text(summary, indent=2, allow_nan=False) + "\n"),
             ("glue_results.md", md))
    for name, text in files:
        (out / (name + ".tmp")).write_text(text, encoding="utf-8")
    (out / "glue_results.md").unlink(missing_ok=True)
    for name, _ in files:
        os.replace(out / (name + ".tmp"), out / name)
    print(md, flush=True)


def _restore_markdown(out: Path) -> None:
    """The glue_results.md of a glue_results.json whose md a stop kept from being renamed
    (`write_table`); one that does not read as a table is left as it is."""
    path = out / "glue_results.json"
    if not path.is_file() or (out / "glue_results.md").exists():
        return
    try:
        md = render_markdown(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        return
    tmp = out / "glue_results.md.tmp"
    tmp.write_text(md, encoding="utf-8")
    os.replace(tmp, out / "glue_results.md")


if __name__ == "__main__":  # pragma: no cover
    from bertgpu.cli import main as cli_main

    sys.exit(cli_main(["glue", *sys.argv[1:]]))
