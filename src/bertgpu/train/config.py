"""The pretraining configuration schema and the vocabularies of every config: schema as code,
files and the command line only override.

Every knob is a dataclass field with a default and a help text (`bertgpu pretrain --help-config`
prints them, see `format_help`). A TOML file only overrides defaults, the command line overrides
the file, unknown keys are errors with a suggestion, and the resolved configuration is written
to every run and checkpoint as `config.toml` (`dump_toml`)::

    bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base \\
        --train.global_batch_size 512 --optim.lr=1e-3 --optim.betas 0.9,0.98 --seed 3

Batch semantics: `train.global_batch_size` sequences per optimizer step is the knob;
`train.micro_batch_size` is per device; accumulation = global / (micro x world) is derived by
`resolve_batch`. The lr may be scaled from the batch it was tuned for (`scaled_lr`).

The fine-tuning schema (`finetune_config.py`) takes its shared knobs from these sections with
`overrides.reuse`, so each knob and its help text are declared once. The parsing machinery
(`apply_dict`, `apply_overrides`, `dump_toml`, `format_help`) is in `overrides.py`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertgpu.data.shards import OBJECTIVES
from bertgpu.errors import BertgpuError
from bertgpu.models.build import ARCHITECTURES, model_config
from bertgpu.train.overrides import apply_dict, apply_overrides, option, read_toml
from bertgpu.train.sinks import LoggingSection

# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


@dataclass
class ModelSection:
    """Architecture, with Hugging Face config names: BertConfig's for bert (defaults: BERT-base),
    ModernBertConfig's for modernbert. Fields of the other architecture must stay at their defaults."""

    architecture: str = option(
        "bert", "bert (2018: learned positions, post-norm) or modernbert (RoPE, GeGLU, pre-norm, local/global attention)"
    )
    vocab_size: int = option(30522, "size of the WordPiece vocabulary (must match the data's tokenizer)")
    hidden_size: int = option(768, "width of the encoder (H)")
    num_hidden_layers: int = option(12, "number of transformer layers (L)")
    num_attention_heads: int = option(12, "attention heads per layer (A); hidden_size must divide by it")
    intermediate_size: int = option(3072, "width of the feed-forward layer (4H in BERT)")
    hidden_act: str = option("gelu", "feed-forward activation: gelu, gelu_new, relu, ...")
    hidden_dropout_prob: float = option(0.1, "dropout on embeddings and sub-layer outputs")
    attention_probs_dropout_prob: float = option(0.1, "dropout on attention probabilities")
    max_position_embeddings: int = option(512, "longest sequence the position table supports")
    type_vocab_size: int = option(2, "number of segment (token type) ids")
    initializer_range: float = option(0.02, "std of the normal weight initialisation")
    layer_norm_eps: float = option(1e-12, "LayerNorm epsilon")
    pad_token_id: int = option(0, "id of [PAD]")
    # ModernBERT only (transformers' ModernBertConfig names and defaults)
    hidden_activation: str = option("gelu", "modernbert: activation of the GeGLU input half: gelu, gelu_pytorch_tanh, relu, silu")
    norm_eps: float = option(1e-5, "modernbert: LayerNorm epsilon")
    norm_bias: bool = option(False, "modernbert: biases in the LayerNorms")
    attention_bias: bool = option(False, "modernbert: biases in Wqkv and the attention output")
    mlp_bias: bool = option(False, "modernbert: biases in the GeGLU block (Wi, Wo)")
    decoder_bias: bool = option(True, "modernbert: bias of the MLM decoder (its weight is the token embedding)")
    embedding_dropout: float = option(0.0, "modernbert: dropout after the embedding norm")
    attention_dropout: float = option(0.0, "modernbert: dropout on attention probabilities and output")
    mlp_dropout: float = option(0.0, "modernbert: dropout inside the GeGLU block")
    global_attn_every_n_layers: int = option(3, "modernbert: layers 0, n, 2n, ... attend globally, the others in a sliding window")
    local_attention: int = option(128, "modernbert: sliding-window width in tokens (half of it on each side)")
    global_rope_theta: float = option(160000.0, "modernbert: RoPE base of the global layers")
    local_rope_theta: float = option(10000.0, "modernbert: RoPE base of the sliding-window layers")
    initializer_cutoff_factor: float = option(2.0, "modernbert: truncate the normal initialisation at this many std")
    classifier_pooling: str = option("cls", "modernbert: fine-tuning pools the first token (cls) or the mean over tokens (mean)")




@dataclass
class DataSection:
    """Where the token shards are and how they are masked."""

    dir: str | None = option(None, "shard set written by `bertgpu prepare` (also --data DIR)")
    objective: str | None = option(
        None, "expected objective, mlm or mlm+nsp; checked against the manifest (none = accept the manifest's)"
    )
    mask_rate: float = option(0.15, "fraction of tokens predicted (0.15 BERT, 0.3 MosaicBERT)")
    eval_mask_rate: float = option(
        0.15, "fraction of tokens masked in validation, fixed so that recipes with other training rates compare"
    )
    whole_word_masking: bool = option(False, "mask all WordPieces of a word together")
    num_workers: int = option(2, "data-loader worker processes per rank (0 = in the main process)")
    bucket_window: int = option(
        0, "sort each window of N micro batches of a step by length so each pads to its own longest (0 = off)"
    )


PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class TrainSection:
    """Batch, precision, length of training, evaluation and logging cadence."""

    max_steps: int = option(10000, "optimizer steps; in budget mode an upper bound (0 = none)")
    global_batch_size: int = option(256, "sequences per optimizer step, over all devices and micro batches")
    micro_batch_size: int | str = option(
        32, "sequences per forward pass per device; \"auto\" = the largest that fits the device's memory"
    )
    precision: str = option("fp32", "fp32, bf16 (autocast) or fp16 (autocast + loss scaling)")
    grad_clip: float = option(1.0, "clip the global gradient L2 norm to this (0 = no clipping)")
    budget_hours: float | None = option(None, "wall-clock budget; the schedule follows elapsed/budget (none = step-based)")
    max_nonfinite_steps: int = option(5, "abort after this many non-finite steps in a row")
    eval_every_steps: int = option(1000, "evaluate on the validation split every N steps (0 = only at the end)")
    eval_batches: int = option(50, "micro batches per evaluation (0 = the whole validation split)")
    log_every_steps: int = option(10, "console and metrics.jsonl line every N steps")
    with_nsp: bool | None = option(None, "train the NSP head (none = when the data objective is mlm+nsp)")
    compile: bool = option(False, "torch.compile the model")
    unpad: bool = option(False, "run the encoder on real tokens only (padding-free; the same math)")
    gradient_checkpointing: bool = option(False, "recompute activations in backward: less memory, ~30% more compute")
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps (auto = CUDA when visible)")


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
    reference_batch_size: int | None = option(None, "global batch the lr was tuned for (needed by lr_scaling)")
    lr_scaling: str = option("none", "scale lr by global/reference batch: none, linear or sqrt")


DECAYS = ("linear", "cosine", "constant", "polynomial", "triangle", "one-cycle", "wsd")


@dataclass
class ScheduleSection:
    """Shape of lr(progress); progress = step/max_steps, or elapsed/budget in budget mode."""

    warmup_steps: int | None = option(None, "warm-up length in steps (wins over warmup_fraction)")
    warmup_fraction: float | None = option(0.01, "warm-up as a fraction of training (budget mode: of the budget)")
    decay: str = option("linear", "linear, cosine, constant, polynomial, triangle / one-cycle, wsd (warmup-stable-decay)")
    min_lr_ratio: float = option(0.0, "final lr as a fraction of the peak")
    power: float = option(1.0, "exponent of the polynomial decay")
    decay_fraction: float = option(0.1, "wsd: the lr stays at its peak, then decays (1 - sqrt) over this last fraction of training")


@dataclass
class CheckpointSection:
    """When checkpoints are written; re-running the same command resumes from the latest."""

    every_steps: int = option(1000, "write a checkpoint every N steps (0 = only at the end)")
    keep_last: int = option(3, "keep the newest N checkpoints (0 = keep all)")
    every_minutes: float | None = option(None, "also write one every N minutes of wall time (none = off)")


COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")
BALANCE_MODES = ("none", "auto")


@dataclass
class DistributedSection:
    """Data-parallel (DDP) gradient all-reduce; only used with more than one process."""

    bucket_cap_mb: int = option(25, "DDP gradient bucket size in MB (larger: fewer all-reduces, less overlap)")
    gradient_as_bucket_view: bool = option(True, "gradients alias the all-reduce buckets (saves one gradient copy)")
    comm_hook: str = option("none", "gradient compression: none, bf16, fp16 (half the bytes) or powersgd (rank 1, changes the math)")
    measure_comm: bool = option(True, "time the gradient all-reduce and log comm_share (the part not hidden behind backward)")
    timeout_minutes: float = option(
        60.0, "how long any rank may wait in a collective (a hung rank ends the job after this) before failing"
    )
    balance: str = option(
        "none", "share the global batch by measured speed (auto: for unequal or throttling GPUs) or equally (none)"
    )
    balance_every_steps: int = option(50, "with balance = auto: measure each rank's speed over N steps, then re-share")


@dataclass
class PretrainConfig:
    """Everything `bertgpu pretrain` needs; `config.toml` in a run folder is this, resolved."""

    seed: int = option(0, "seed of initialisation, data order and masking (also --seed N)")
    out: str | None = option(None, "run folder: config, metrics, checkpoints, export (also --out DIR)")
    model: ModelSection = option(factory=ModelSection, help="architecture (Hugging Face BertConfig names)")
    data: DataSection = option(factory=DataSection, help="token shards and masking")
    train: TrainSection = option(factory=TrainSection, help="batch, precision, length, cadence")
    optim: OptimSection = option(factory=OptimSection, help="optimizer and learning rate")
    schedule: ScheduleSection = option(factory=ScheduleSection, help="learning-rate schedule")
    checkpoint: CheckpointSection = option(factory=CheckpointSection, help="checkpoint cadence")
    distributed: DistributedSection = option(factory=DistributedSection, help="DDP buckets and gradient compression")
    logging: LoggingSection = option(factory=LoggingSection, help="metric sinks (W&B, MLflow, TensorBoard) and the GPU monitor")


# Short command-line spellings of frequently used keys.
PRETRAIN_ALIASES: dict[str, str] = {"data": "data.dir", "out": "out", "seed": "seed"}


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> PretrainConfig:
    """Defaults <- TOML file (optional) <- command-line overrides, then `validate`."""
    cfg = PretrainConfig()
    if path is not None:
        apply_dict(cfg, read_toml(path), str(path))
    apply_overrides(cfg, list(overrides or []), "command line", PRETRAIN_ALIASES)
    validate(cfg)
    return cfg


# --------------------------------------------------------------------------------------------
# Validation and batch arithmetic
# --------------------------------------------------------------------------------------------


def check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise BertgpuError(f"config: {key} = {value!r}: expected {expected}")


def check_choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    check(value in choices, key, value, "one of " + ", ".join(choices))


# Model fields that only one architecture reads, with what the other one calls the same knob.
_BERT_ONLY = {"hidden_act": "hidden_activation", "hidden_dropout_prob": "mlp_dropout, embedding_dropout",
              "attention_probs_dropout_prob": "attention_dropout", "layer_norm_eps": "norm_eps",
              "type_vocab_size": None}
_MODERNBERT_ONLY = {"hidden_activation": "hidden_act", "norm_eps": "layer_norm_eps", "norm_bias": None,
                    "attention_bias": None, "mlp_bias": None, "decoder_bias": None,
                    "embedding_dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
                    "mlp_dropout": "hidden_dropout_prob", "global_attn_every_n_layers": None,
                    "local_attention": None, "global_rope_theta": None, "local_rope_theta": None,
                    "initializer_cutoff_factor": None, "classifier_pooling": None}


def _validate_architecture(cfg: PretrainConfig) -> None:
    """model.architecture, fields set for the other architecture (a silent no-op otherwise), the
    ModernBERT fields (checked by the model's own config, so the rules live in one place), and
    ModernBERT's lack of an NSP head."""
    m = cfg.model
    check_choice("model.architecture", m.architecture, ARCHITECTURES)
    other = _MODERNBERT_ONLY if m.architecture == "bert" else _BERT_ONLY
    defaults = ModelSection()
    for key, instead in other.items():
        hint = f" (for {m.architecture}: model.{instead})" if instead else ""
        check(getattr(m, key) == getattr(defaults, key), f"model.{key}", getattr(m, key),
               f"the default: it applies to the other architecture only{hint}")
    if m.architecture != "modernbert":
        return
    try:
        model_config(dataclasses.asdict(m))
    except BertgpuError as e:  # "config field X: ..." from ModernBertConfig.validate
        raise BertgpuError("config: " + str(e).replace("config field ", "model.", 1)) from None
    check(cfg.train.with_nsp is not True, "train.with_nsp", cfg.train.with_nsp,
           "false or none: ModernBERT has no next-sentence head")
    check(cfg.data.objective != "mlm+nsp", "data.objective", cfg.data.objective,
           "mlm or none: ModernBERT has no next-sentence head")


def validate(cfg: PretrainConfig) -> PretrainConfig:
    """Range and consistency checks; raises BertgpuError naming the key. Returns `cfg`."""
    _validate_model(cfg)
    _validate_data(cfg.data)
    _validate_train(cfg.train)
    _validate_optim(cfg.optim)
    _validate_schedule(cfg.schedule, cfg.train)
    _validate_checkpoint(cfg.checkpoint)
    _validate_distributed(cfg.distributed)
    cfg.logging.validate()
    return cfg


def _validate_model(cfg: PretrainConfig) -> None:
    m = cfg.model
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
        check(getattr(m, key) > 0, f"model.{key}", getattr(m, key), "a positive integer")
    check(m.hidden_size % m.num_attention_heads == 0, "model.hidden_size", m.hidden_size,
           f"a multiple of model.num_attention_heads ({m.num_attention_heads})")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        check(0.0 <= getattr(m, key) < 1.0, f"model.{key}", getattr(m, key), "a number in [0, 1)")
    check(m.initializer_range > 0, "model.initializer_range", m.initializer_range, "a positive number")
    check(m.layer_norm_eps > 0, "model.layer_norm_eps", m.layer_norm_eps, "a positive number")
    check(0 <= m.pad_token_id < m.vocab_size, "model.pad_token_id", m.pad_token_id, "an id below vocab_size")
    _validate_architecture(cfg)


def _validate_data(d: DataSection) -> None:
    if d.objective is not None:
        check_choice("data.objective", d.objective, OBJECTIVES)
    check(0.0 < d.mask_rate < 1.0, "data.mask_rate", d.mask_rate, "a number in (0, 1)")
    check(0.0 < d.eval_mask_rate < 1.0, "data.eval_mask_rate", d.eval_mask_rate, "a number in (0, 1)")
    check(d.num_workers >= 0, "data.num_workers", d.num_workers, "0 or more")
    check(d.bucket_window >= 0, "data.bucket_window", d.bucket_window, "0 or more")


def _validate_train(t: TrainSection) -> None:
    check(t.max_steps >= 0, "train.max_steps", t.max_steps, "0 or more")
    if t.budget_hours is None:
        check(t.max_steps > 0, "train.max_steps", t.max_steps, "a positive integer (or set train.budget_hours)")
    else:
        check(t.budget_hours > 0 and math.isfinite(t.budget_hours), "train.budget_hours", t.budget_hours,
               "a positive number of hours")
    check(t.global_batch_size > 0, "train.global_batch_size", t.global_batch_size, "a positive integer")
    if isinstance(t.micro_batch_size, str):
        check(t.micro_batch_size == "auto", "train.micro_batch_size", t.micro_batch_size,
               "a positive integer or auto")
    else:
        check(t.micro_batch_size > 0, "train.micro_batch_size", t.micro_batch_size, "a positive integer")
        check(t.global_batch_size % t.micro_batch_size == 0, "train.global_batch_size",
               t.global_batch_size, f"a multiple of train.micro_batch_size ({t.micro_batch_size})")
    check_choice("train.precision", t.precision, PRECISIONS)
    check(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "0 (off) or a positive number")
    check(t.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", t.max_nonfinite_steps, "1 or more")
    check(t.eval_every_steps >= 0, "train.eval_every_steps", t.eval_every_steps, "0 or more")
    check(t.eval_batches >= 0, "train.eval_batches", t.eval_batches, "0 or more")
    check(t.log_every_steps >= 1, "train.log_every_steps", t.log_every_steps, "1 or more")


def _validate_optim(o: OptimSection) -> None:
    check_choice("optim.name", o.name, OPTIMIZERS)
    check(o.lr > 0 and math.isfinite(o.lr), "optim.lr", o.lr, "a positive number")
    check(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "0 or more")
    check(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas", o.betas,
           "two numbers in [0, 1), e.g. 0.9,0.999")
    check(o.eps > 0, "optim.eps", o.eps, "a positive number")
    check_choice("optim.lr_scaling", o.lr_scaling, LR_SCALING)
    if o.reference_batch_size is not None:
        check(o.reference_batch_size > 0, "optim.reference_batch_size", o.reference_batch_size,
               "a positive integer")
    if o.lr_scaling != "none":
        check(o.reference_batch_size is not None, "optim.reference_batch_size", None,
               f"the batch size optim.lr was tuned for (optim.lr_scaling is {o.lr_scaling})")


def _validate_schedule(s: ScheduleSection, t: TrainSection) -> None:
    check_choice("schedule.decay", s.decay, DECAYS)
    if s.warmup_steps is not None:
        check(s.warmup_steps >= 0, "schedule.warmup_steps", s.warmup_steps, "0 or more")
    if s.warmup_fraction is not None:
        check(0.0 <= s.warmup_fraction <= 1.0, "schedule.warmup_fraction", s.warmup_fraction,
               "a number in [0, 1]")
    if t.budget_hours is not None and s.warmup_steps is not None and t.max_steps == 0:
        check(False, "schedule.warmup_steps", s.warmup_steps,
               "none in budget mode without train.max_steps (use schedule.warmup_fraction)")
    check(0.0 <= s.min_lr_ratio <= 1.0, "schedule.min_lr_ratio", s.min_lr_ratio, "a number in [0, 1]")
    check(s.power > 0, "schedule.power", s.power, "a positive number")
    check(0.0 <= s.decay_fraction <= 1.0, "schedule.decay_fraction", s.decay_fraction, "a number in [0, 1]")


def _validate_checkpoint(c: CheckpointSection) -> None:
    check(c.every_steps >= 0, "checkpoint.every_steps", c.every_steps, "0 or more")
    check(c.keep_last >= 0, "checkpoint.keep_last", c.keep_last, "0 (keep all) or more")
    if c.every_minutes is not None:
        check(c.every_minutes > 0, "checkpoint.every_minutes", c.every_minutes, "a positive number")


def _validate_distributed(dist: DistributedSection) -> None:
    check(dist.bucket_cap_mb > 0, "distributed.bucket_cap_mb", dist.bucket_cap_mb, "a positive integer")
    check_choice("distributed.comm_hook", dist.comm_hook, COMM_HOOKS)
    check(dist.timeout_minutes > 0, "distributed.timeout_minutes", dist.timeout_minutes, "a positive number")
    check_choice("distributed.balance", dist.balance, BALANCE_MODES)
    check(dist.balance_every_steps >= 1, "distributed.balance_every_steps", dist.balance_every_steps, "1 or more")


def resolve_batch(global_batch_size: int, micro_batch_size: int | str, world_size: int) -> int:
    """Accumulation steps = global / (micro x world); BertgpuError when it does not divide."""
    if isinstance(micro_batch_size, str):
        raise BertgpuError(
            f"train.micro_batch_size {micro_batch_size!r}: resolve it to an integer before resolve_batch"
        )
    if global_batch_size <= 0 or micro_batch_size <= 0 or world_size <= 0:
        raise BertgpuError(
            f"train.global_batch_size {global_batch_size}, train.micro_batch_size {micro_batch_size}, "
            f"{world_size} devices: all must be positive"
        )
    per_step = micro_batch_size * world_size
    if global_batch_size % per_step:
        devices = "device" if world_size == 1 else "devices"
        raise BertgpuError(
            f"train.global_batch_size {global_batch_size} is not divisible by train.micro_batch_size "
            f"{micro_batch_size} × {world_size} {devices} = {per_step}; choose a global batch that "
            f"is a multiple of {per_step}"
        )
    return global_batch_size // per_step


def resolve_with_nsp(with_nsp: bool | None, objective: str, source: str = "data") -> bool:
    """Whether to train the NSP head: `train.with_nsp` if set, else from the shard set's objective.
    NSP needs sentence pairs, so with_nsp true on MLM-only shards is an error."""
    if objective not in OBJECTIVES:
        raise BertgpuError(f"{source}: objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if with_nsp is None:
        return objective == "mlm+nsp"
    if with_nsp and objective != "mlm+nsp":
        raise BertgpuError(
            f"{source}: train.with_nsp is true but the shards have objective {objective} (no sentence "
            f"pairs); prepare the data with objective mlm+nsp or set train.with_nsp false"
        )
    return with_nsp


def scaled_lr(lr: float, global_batch: int, reference_batch: int | None, rule: str) -> float:
    """The lr for `global_batch` given one tuned at `reference_batch`: linear (Goyal et al. 2017)
    or square-root (Krizhevsky 2014; what LAMB's paper uses) scaling; "none" returns `lr`."""
    if rule == "none":
        return lr
    if reference_batch is None or reference_batch <= 0:
        raise BertgpuError(f"optim.lr_scaling {rule}: needs a positive optim.reference_batch_size")
    ratio = global_batch / reference_batch
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    raise BertgpuError(f"optim.lr_scaling {rule!r}: expected one of {', '.join(LR_SCALING)}")


