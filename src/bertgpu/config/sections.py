"""The sections every training job shares and the vocabularies of their settings: `[data]`,
`[train]` (what changes the result), `[impl]` (what changes only speed and memory), `[optim]`,
`[schedule]`, `[checkpoint]`, `[distributed]`, `[logging]`. The pretraining schema (`schema.py`)
holds them with `[model]` and validates them; fine-tuning (`finetune.py`) declares its flat keys
from these fields. The engine and the loop take these sections as they are.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Literal

from bertgpu.config.overrides import option
from bertgpu.errors import BertgpuError


@dataclass
class DataSection:
    """Where the token shards are and how they are masked."""

    dir: str | None = option(None, "shard set written by `bertgpu prepare` (also --data DIR)")
    objective: str | None = option(
        None, "expected objective, mlm or mlm+nsp; checked against the manifest (none = accept the "
              "manifest's)"
    )
    mask_rate: float = option(0.15, "fraction of tokens predicted (0.15 BERT, 0.3 MosaicBERT)")
    eval_mask_rate: float = option(
        0.15, "fraction of tokens masked in validation, single tokens even with whole-word "
              "masking, fixed so that recipes with other training rates or masking compare"
    )
    whole_word_masking: bool = option(
        False, "mask all tokens of a word together (WordPiece '##', byte-level BPE 'Ġ' and "
               "Metaspace '▁' word starts, or the shards' segmenter words)")


MAX_SEED = 2**32 - 1


def seed_number(text: str) -> int:
    """An argparse type for seeds: an integer from 0 to 2**32 - 1, the range every generator a run
    seeds takes (numpy refuses a negative one deep inside a run)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a seed (an integer of 0 or more), found "
                                         f"{text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {MAX_SEED}, found {value}")
    return value


PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class TrainSection:
    """What is trained and how: batch, precision, length of training, evaluation and logging
    cadence. Changing one of these changes the result (`[impl]` holds what does not)."""

    max_steps: int = option(10000, "optimizer steps; in budget mode an upper bound (0 = none)")
    global_batch_size: int = option(256, "sequences per optimizer step, over all devices and "
                                         "micro batches")
    precision: str = option("fp32", "fp32, bf16 (autocast) or fp16 (autocast + loss scaling)")
    grad_clip: float = option(1.0, "clip the global gradient L2 norm to this (0 = no clipping)")
    budget_hours: float | None = option(None, "wall-clock budget; the schedule follows "
                                              "elapsed/budget (none = step-based)")
    max_nonfinite_steps: int = option(5, "abort after this many non-finite steps in a row "
                                         "(fp16 overflows with a finite loss count once the "
                                         "loss scale is below 1)")
    eval_every_steps: int = option(1000, "evaluate on the validation split every N steps (0 = "
                                         "only at the end)")
    eval_sequences: int = option(
        1600, "validation sequences per evaluation, the first N of the split (0 = all of it); "
              "the same for any micro batch and device count")
    log_every_steps: int = option(10, "console and metrics.jsonl line every N steps")
    with_nsp: bool | None = option(None,
                                   "train the NSP head (none = when the data objective is mlm+nsp)")


COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
"""The torch.compile modes that replay CUDA graphs (on CUDA; elsewhere as the others)."""


@dataclass
class ImplSection:
    """How the computation is carried out: the same result (to floating-point rounding) whatever
    these say, only the speed and memory change (Cramming's split of train and impl)."""

    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps (auto = CUDA when visible)")
    micro_batch_size: int | str = option(
        32, "sequences per forward pass per device; \"auto\" = the largest that fits the device's "
            "memory"
    )
    compile: bool | Literal["auto"] = option(
        "auto", "torch.compile the model: true, false or auto (on CUDA, off elsewhere)")
    compile_mode: str = option(
        "default", "torch.compile mode: default, max-autotune-no-cudagraphs (matrix products "
                   "autotuned, epilogues fused: a longer compile), reduce-overhead or "
                   "max-autotune (CUDA graphs, which replay one shape: every batch padded to "
                   "the same shapes, impl.unpad auto runs padded; not with fsdp, unpad true or "
                   "bucket_window)"
    )
    unpad: bool | Literal["auto"] = option(
        "auto", "run the encoder on real tokens only (padding-free, the same math); \"auto\" = "
                "on CUDA in bf16/fp16, where the flash kernel runs, off elsewhere"
    )
    gradient_checkpointing: bool = option(False, "recompute activations in backward: less "
                                                 "memory, ~30% more compute")
    num_workers: int = option(2, "data-loader worker processes per rank (0 = in the main process)")
    bucket_window: int = option(
        0, "sort each window of N micro batches of a step by length so each pads to its own "
           "longest (0 = off)"
    )

    def compile_on(self, device_type: str) -> bool:
        """Whether to torch.compile the model on a device of `device_type` ("cuda", "cpu", ...):
        "auto" compiles on CUDA only (on the CPU compiling costs minutes and gains little)."""
        return device_type == "cuda" if self.compile == "auto" else bool(self.compile)

    def cuda_graphs(self, device_type: str) -> bool:
        """Whether the compiled model replays CUDA graphs on a device of `device_type`."""
        return (device_type == "cuda" and self.compile_on(device_type)
                and self.compile_mode in CUDA_GRAPH_MODES)


def resolved_unpad(unpad: bool | str, device: str, precision: str,
                   cuda_graphs: bool = False) -> bool:
    """`impl.unpad` as a yes/no for a run on `device` ("cuda", "cuda:1", "cpu", ...) in
    `precision`: "auto" is on where unpadded attention has its fused kernel (CUDA, bf16/fp16:
    models/flash.py) and off elsewhere, where it would scatter rows back to (B, T) per layer, and
    off under `cuda_graphs`, which replay one shape where unpadded batches change their token
    count (padded batches run through the same flash kernel on CUDA)."""
    if isinstance(unpad, bool):
        return unpad
    return str(device).startswith("cuda") and precision in ("bf16", "fp16") and not cuda_graphs


OPTIMIZERS = ("adamw", "lamb", "radam")
LR_SCALING = ("none", "linear", "sqrt")


@dataclass
class OptimSection:
    """Optimizer and the peak learning rate."""

    name: str = option("adamw", "adamw, lamb (You et al. 2019, large batches) or radam")
    lr: float = option(1e-4, "peak learning rate (before lr_scaling)")
    weight_decay: float = option(0.01, "decoupled weight decay; never on biases and LayerNorm")
    betas: tuple[float, float] = option((0.9, 0.999), "Adam moment decay rates, e.g. 0.9,0.98")
    eps: float = option(1e-6, "Adam epsilon")
    reference_batch_size: int | None = option(None, "global batch the lr was tuned for (needed "
                                                    "by lr_scaling)")
    lr_scaling: str = option("none", "scale lr by global/reference batch: none, linear or sqrt")


DECAYS = ("linear", "cosine", "constant", "polynomial", "triangle", "one-cycle", "wsd")
DECAY_SPANS = ("after_warmup", "whole_run")
SPANNED_DECAYS = ("linear", "cosine", "polynomial")
"""The decays `schedule.decay_span = "whole_run"` applies to. The others have no span to move:
constant does not decay, wsd decays over its own last `decay_fraction`, and triangle / one-cycle
peak at the warm-up's end by definition."""


def check_decay_span(decay: str, span: str) -> None:
    """Refuse, naming schedule.decay_span, a span that is not one of DECAY_SPANS, or "whole_run"
    with a decay it does not apply to."""
    check_choice("schedule.decay_span", span, DECAY_SPANS)
    check(span == "after_warmup" or decay in SPANNED_DECAYS, "schedule.decay_span", span,
          f"after_warmup with schedule.decay {decay!r} (whole_run applies to "
          f"{', '.join(SPANNED_DECAYS)})")


@dataclass
class ScheduleSection:
    """Shape of lr(progress); progress = step/max_steps, or elapsed/budget in budget mode."""

    warmup_steps: int | None = option(None, "warm-up length in steps (wins over warmup_fraction in "
                                             "the same file; the command line's one wins)")
    warmup_fraction: float | None = option(0.01, "warm-up as a fraction of training (budget mode: "
                                                 "of the budget)")
    decay: str = option("linear", "linear, cosine, constant, polynomial, triangle / one-cycle, wsd "
                                  "(warmup-stable-decay)")
    min_lr_ratio: float = option(0.0, "final lr as a fraction of the peak")
    power: float = option(1.0, "exponent of the polynomial decay")
    decay_fraction: float = option(0.1, "wsd: the lr stays at its peak, then decays (1 - sqrt) "
                                        "over this last fraction of training")
    decay_span: str = option(
        "after_warmup", "what linear, cosine and polynomial decay over: after_warmup (from the "
                        "warm-up's end to the run's, as transformers' schedulers) or whole_run "
                        "(progress 0 to 1, the warm-up overriding its start, so the lr steps "
                        "down to the decay's value at the warm-up's end: NVIDIA's BERT "
                        "PolyWarmUpScheduler and BERT's TF optimization.py); the other decays "
                        "take after_warmup only")

    def validate(self) -> None:
        """Raise BertgpuError naming the field when decay_span does not fit the decay."""
        check_decay_span(self.decay, self.decay_span)


@dataclass
class CheckpointSection:
    """When checkpoints are written; re-running the same command resumes from the latest."""

    every_steps: int = option(1000, "write a checkpoint every N steps (0 = only at the end)")
    keep_last: int = option(3, "keep the newest N checkpoints (0 = keep all)")
    every_minutes: float | None = option(None,
                                         "also write one every N minutes of wall time (none = off)")
    async_save: bool = option(
        True, "write checkpoints in the background: training waits only while the state is "
              "copied to host memory (the stall, logged), then goes on while a thread writes, "
              "checksums and seals it; falls back to writing in place when the host copy would "
              "not fit in memory (said at start-up); false = always in place")
    grace_s: float = option(
        25.0, "from the first SIGTERM/SIGINT the run ends within this many seconds: with a "
              "checkpoint of the last completed step when its write fits, else keeping the newest "
              "one (Slurm and Kubernetes allow 30 s by default)")


COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")
STRATEGIES = ("ddp", "fsdp")
WANDB_MODES = ("auto", "online", "offline")
BALANCE_MODES = ("none", "auto")
MAX_TIMEOUT_MINUTES = 1e9
"""distributed.timeout_minutes' ceiling (about 1,900 years; timedelta overflowed near 1.5e12)."""


@dataclass
class DistributedSection:
    """How several processes share the work: replicated (DDP) or sharded (FSDP2) models."""

    strategy: str = option(
        "ddp", "ddp (every rank holds the whole model and optimizer) or fsdp (parameters, "
               "gradients and optimizer state sharded over the ranks: torch's FSDP2, for models "
               "that do not fit)")
    shard_within_node: bool = option(
        False, "fsdp on several nodes: shard within each node and replicate across nodes (HSDP)")
    cpu_offload: bool = option(
        False, "fsdp: keep the sharded parameters, gradients and optimizer state in CPU memory "
               "(less GPU memory, a slower step)")
    bucket_cap_mb: int = option(25, "DDP gradient bucket size in MB (larger: fewer all-reduces, "
                                    "less overlap)")
    gradient_as_bucket_view: bool = option(True, "gradients alias the all-reduce buckets (saves "
                                                 "one gradient copy)")
    comm_hook: str = option("none", "gradient compression: none, bf16, fp16 (half the bytes) or "
                                    "powersgd (rank 1, changes the math)")
    measure_comm: bool = option(True, "time the gradient all-reduce and log comm_share (the part "
                                      "not hidden behind backward)")
    timeout_minutes: float = option(
        60.0, "how long any rank may wait in a collective (a hung rank ends the job after this) "
              "before failing"
    )
    balance: str = option(
        "none", "share the global batch by measured speed (auto: for unequal or throttling GPUs; "
                "ddp only) or equally (none)"
    )
    balance_every_steps: int = option(50, "with balance = auto: measure each rank's speed over N "
                                          "steps, then re-share")


@dataclass
class LoggingSection:
    """Metric sinks (rank 0 only) and the GPU monitor; metrics.jsonl is always written."""

    tensorboard: bool | None = option(None, "TensorBoard scalars in RUN_DIR/tensorboard (none = "
                                            "when tensorboard is installed)")
    wandb: bool = option(False, "log to Weights & Biases (pip install 'bertgpu[wandb]')")
    wandb_project: str = option("bertgpu", "W&B project")
    wandb_entity: str | None = option(None, "W&B team or user (none = your default entity)")
    wandb_run_name: str | None = option(None, "W&B run name (none = the run folder's name)")
    wandb_mode: str = option("auto", "online, offline (upload later: wandb sync "
                                     "RUN_DIR/wandb/offline-run-*) or auto (WANDB_MODE if set, "
                                     "else online when an API key is set up, else offline)")
    mlflow: bool = option(False, "log to MLflow (pip install 'bertgpu[mlflow]')")
    mlflow_tracking_uri: str | None = option(None, "MLflow tracking server or store (none = a file "
                                                   "store in RUN_DIR/mlruns)")
    mlflow_experiment: str = option("bertgpu", "MLflow experiment")
    mlflow_run_name: str | None = option(None, "MLflow run name (none = the run folder's name)")
    gpu_monitor_interval_s: float = option(
        5.0, "sample every GPU of the node (NVML) every N seconds into RUN_DIR/gpu.jsonl (0 = off)")

    def validate(self) -> None:
        """Raise BertgpuError naming the field when a value is out of range."""
        if self.wandb_mode not in WANDB_MODES:
            raise BertgpuError(f"logging.wandb_mode: found {self.wandb_mode!r}, expected one of "
                               f"{', '.join(WANDB_MODES)}")
        if not (self.gpu_monitor_interval_s == 0 or self.gpu_monitor_interval_s >= 0.1):
            raise BertgpuError(f"logging.gpu_monitor_interval_s: found "
                               f"{self.gpu_monitor_interval_s}, expected 0 (off) or >= 0.1")


def check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise BertgpuError(f"config: {key} = {value!r}: expected {expected}")


def name_the_source(error: BertgpuError, data: dict[str, Any], file: str,
                    line_keys: set[str]) -> BertgpuError:
    """`check`'s "config: KEY = VALUE: expected ..." with "config" replaced by where KEY was set:
    the command line (`line_keys`, which win) or `file` (its TOML `data`). The same error for a
    key set nowhere (a default that another setting rules out) or another message."""
    head, sep, rest = str(error).partition(" = ")
    key = head.removeprefix("config: ")
    if not sep or key == head:
        return error
    if key in line_keys:
        return BertgpuError(f"command line: {key} = {rest}")
    node: Any = data
    for part in key.split("."):
        node = {k.replace("-", "_"): v for k, v in node.items()} if isinstance(node, dict) else {}
        if part not in node:
            return error
        node = node[part]
    return BertgpuError(f"{file}: {key} = {rest}")


def check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    check(value in choices, key, value, "one of " + ", ".join(choices))


def divisor_up_to(n: int, limit: int) -> int:
    """The largest divisor of `n` (> 0) that is at most `limit`: a micro batch that splits `n`
    sequences into whole micro batches."""
    return max(d for d in range(1, min(n, limit) + 1) if n % d == 0)


def resolve_batch(global_batch_size: int, micro_batch_size: int | str, world_size: int) -> int:
    """Accumulation steps = global / (micro x world); BertgpuError when it does not divide, with
    settings that do (`batch_fixes`)."""
    if isinstance(micro_batch_size, str):
        raise BertgpuError(
            f"impl.micro_batch_size {micro_batch_size!r}: resolve it to an integer before "
            "resolve_batch"
        )
    if global_batch_size <= 0 or micro_batch_size <= 0 or world_size <= 0:
        raise BertgpuError(
            f"train.global_batch_size {global_batch_size}, impl.micro_batch_size "
            f"{micro_batch_size}, {world_size} devices: all must be positive"
        )
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step:
        devices = "device" if world_size == 1 else "devices"
        raise BertgpuError(
            f"train.global_batch_size {global_batch_size} is not divisible by "
            f"impl.micro_batch_size {micro_batch_size} × {world_size} {devices} = {per_step}; "
            f"expected {batch_fixes(global_batch_size, micro_batch_size, world_size)}")
    return global_batch_size // per_step


def batch_fixes(batch: int, micro: int, world: int, flag: str = "--train.global_batch_size",
                micro_flag: str = "--impl.micro_batch_size") -> str:
    """What divides: every device takes an equal share of each step's `batch` sequences, in whole
    micro batches. When `world` shares `batch`, a micro batch that divides the share; otherwise
    the nearest multiples of `world`, each with the largest micro batch up to `micro` that
    divides its share; then the nearest multiples of `micro` x `world` (the micro batch kept),
    unless `micro` is 1: those are the multiples of `world` already named.
    `flag` and `micro_flag` name the two settings (fine-tuning's are flat)."""
    per_step = micro * world
    if batch % world == 0:
        share = batch // world
        head = (f"a micro batch that divides the {share} sequences per device, e.g. "
                f"{micro_flag} {divisor_up_to(share, micro)}")
    else:
        near = _nearest(batch, world)
        head = (f"a global batch that the {world} devices share equally (a multiple of {world}) "
                "in whole micro batches, e.g. ")
        if micro == 1:  # the multiples of micro x world are these: each said once (it said twice)
            return head + " or ".join(f"{flag} {b}" for b in (
                near if len(near) > 1 else (world, 2 * world)))
        head += ", ".join(f"{flag} {b}" + (f" {micro_flag} {m}" if m != micro else "")
                          for b, m in ((b, divisor_up_to(b // world, micro)) for b in near))
    return f"{head}, or a multiple of {per_step} for micro batch {micro}: {flag} " + " or ".join(
        map(str, _nearest(batch, per_step)))


def _nearest(batch: int, step: int) -> list[int]:
    """The positive multiples of `step` nearest `batch`, below and above."""
    return [b for b in (batch - batch % step, batch - batch % step + step) if b > 0]


def one_warmup(schedule: ScheduleSection, table: dict[str, Any], line_keys: set[str]) -> None:
    """The warm-up is `schedule.warmup_steps` or `schedule.warmup_fraction`. In a file (the
    `[schedule]` `table`) warmup_steps wins, as a run's config.toml holds both; on the command
    line (`line_keys`) both is an error (unless one is "none"), and the one given there wins
    over the file's (a file's warmup_steps silently outranked a `--schedule.warmup_fraction`
    asked for on the command line)."""
    steps, fraction = "schedule.warmup_steps", "schedule.warmup_fraction"
    set_both = schedule.warmup_steps is not None and schedule.warmup_fraction is not None
    if steps in line_keys and fraction in line_keys and set_both:
        raise BertgpuError("command line: --schedule.warmup_steps and --schedule.warmup_fraction "
                           "are both given: the warm-up is one of them; keep one")
    if (fraction in line_keys and steps not in line_keys and set_both
            and any(key.replace("-", "_") == "warmup_steps" for key in table)):
        schedule.warmup_steps = None
