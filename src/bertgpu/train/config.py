"""The pretraining configuration: schema as code, TOML files and dotted overrides on top.

Every knob is a dataclass field with a default and a help text (`bertgpu pretrain --help-config`
prints them, see `format_help`). A TOML file only overrides defaults, the command line overrides
the file, unknown keys are errors with a suggestion, and the resolved configuration is written
to every run and checkpoint as `config.toml` (`dump_toml`)::

    bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base \\
        --train.global_batch_size 512 --optim.lr=1e-3 --optim.betas 0.9,0.98 --seed 3

Batch semantics: `train.global_batch_size` sequences per optimizer step is the knob;
`train.micro_batch_size` is per device; accumulation = global / (micro x world) is derived by
`resolve_batch`. The lr may be scaled from the batch it was tuned for (`scaled_lr`).

The override machinery (`apply_dict`, `apply_overrides`) works on any dataclass, so fine-tuning
reuses it with a schema of its own.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.data.shards import OBJECTIVES
from bertgpu.errors import BertgpuError

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def _f(default: Any = dataclasses.MISSING, help: str = "", factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its help text in `metadata["help"]` (printed by --help-config)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


@dataclass
class ModelSection:
    """Architecture, with Hugging Face BertConfig's field names and defaults (BERT-base)."""

    vocab_size: int = _f(30522, "size of the WordPiece vocabulary (must match the data's tokenizer)")
    hidden_size: int = _f(768, "width of the encoder (H)")
    num_hidden_layers: int = _f(12, "number of transformer layers (L)")
    num_attention_heads: int = _f(12, "attention heads per layer (A); hidden_size must divide by it")
    intermediate_size: int = _f(3072, "width of the feed-forward layer (4H in BERT)")
    hidden_act: str = _f("gelu", "feed-forward activation: gelu, gelu_new, relu, ...")
    hidden_dropout_prob: float = _f(0.1, "dropout on embeddings and sub-layer outputs")
    attention_probs_dropout_prob: float = _f(0.1, "dropout on attention probabilities")
    max_position_embeddings: int = _f(512, "longest sequence the position table supports")
    type_vocab_size: int = _f(2, "number of segment (token type) ids")
    initializer_range: float = _f(0.02, "std of the normal weight initialisation")
    layer_norm_eps: float = _f(1e-12, "LayerNorm epsilon")
    pad_token_id: int = _f(0, "id of [PAD]")




@dataclass
class DataSection:
    """Where the token shards are and how they are masked."""

    dir: str | None = _f(None, "shard set written by `bertgpu prepare` (also --data DIR)")
    objective: str | None = _f(
        None, "expected objective, mlm or mlm+nsp; checked against the manifest (none = accept the manifest's)"
    )
    mask_rate: float = _f(0.15, "fraction of tokens predicted (0.15 BERT, 0.3 MosaicBERT)")
    whole_word_masking: bool = _f(False, "mask all WordPieces of a word together")
    num_workers: int = _f(2, "data-loader worker processes per rank (0 = in the main process)")
    bucket_window: int = _f(
        0, "sort each window of N micro batches of a step by length so each pads to its own longest (0 = off)"
    )


PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass
class TrainSection:
    """Batch, precision, length of training, evaluation and logging cadence."""

    max_steps: int = _f(10000, "optimizer steps; in budget mode an upper bound (0 = none)")
    global_batch_size: int = _f(256, "sequences per optimizer step, over all devices and micro batches")
    micro_batch_size: int | str = _f(
        32, "sequences per forward pass per device; \"auto\" = the largest that fits the device's memory"
    )
    precision: str = _f("fp32", "fp32, bf16 (autocast) or fp16 (autocast + loss scaling)")
    grad_clip: float = _f(1.0, "clip the global gradient L2 norm to this (0 = no clipping)")
    budget_hours: float | None = _f(None, "wall-clock budget; the schedule follows elapsed/budget (none = step-based)")
    max_nonfinite_steps: int = _f(5, "abort after this many non-finite steps in a row")
    eval_every_steps: int = _f(1000, "evaluate on the validation split every N steps (0 = only at the end)")
    eval_batches: int = _f(50, "micro batches per evaluation (0 = the whole validation split)")
    log_every_steps: int = _f(10, "console and metrics.jsonl line every N steps")
    with_nsp: bool | None = _f(None, "train the NSP head (none = when the data objective is mlm+nsp)")
    compile: bool = _f(False, "torch.compile the model")
    unpad: bool = _f(False, "run the encoder on real tokens only (padding-free; the same math)")
    gradient_checkpointing: bool = _f(False, "recompute activations in backward: less memory, ~30% more compute")
    device: str = _f("auto", "auto, cpu, cuda, cuda:N or mps (auto = CUDA when visible)")


OPTIMIZERS = ("adamw", "lamb", "radam")
LR_SCALING = ("none", "linear", "sqrt")


@dataclass
class OptimSection:
    """Optimizer and the peak learning rate."""

    name: str = _f("adamw", "adamw, lamb (You et al. 2019, large batches) or radam")
    lr: float = _f(1e-4, "peak learning rate (before lr_scaling)")
    weight_decay: float = _f(0.01, "decoupled weight decay; never on biases and LayerNorm")
    betas: tuple[float, float] = _f((0.9, 0.999), "Adam moment decay rates, e.g. 0.9,0.98")
    eps: float = _f(1e-6, "Adam epsilon")
    reference_batch_size: int | None = _f(None, "global batch the lr was tuned for (needed by lr_scaling)")
    lr_scaling: str = _f("none", "scale lr by global/reference batch: none, linear or sqrt")


DECAYS = ("linear", "cosine", "constant", "polynomial", "triangle", "one-cycle")


@dataclass
class ScheduleSection:
    """Shape of lr(progress); progress = step/max_steps, or elapsed/budget in budget mode."""

    warmup_steps: int | None = _f(None, "warm-up length in steps (wins over warmup_fraction)")
    warmup_fraction: float | None = _f(0.01, "warm-up as a fraction of training (budget mode: of the budget)")
    decay: str = _f("linear", "linear, cosine, constant, polynomial, triangle / one-cycle")
    min_lr_ratio: float = _f(0.0, "final lr as a fraction of the peak")
    power: float = _f(1.0, "exponent of the polynomial decay")


@dataclass
class CheckpointSection:
    """When checkpoints are written; re-running the same command resumes from the latest."""

    every_steps: int = _f(1000, "write a checkpoint every N steps (0 = only at the end)")
    keep_last: int = _f(3, "keep the newest N checkpoints (0 = keep all)")
    every_minutes: float | None = _f(None, "also write one every N minutes of wall time (none = off)")


COMM_HOOKS = ("none", "bf16", "fp16", "powersgd")


@dataclass
class DistributedSection:
    """Data-parallel (DDP) gradient all-reduce; only used with more than one process."""

    bucket_cap_mb: int = _f(25, "DDP gradient bucket size in MB (larger: fewer all-reduces, less overlap)")
    gradient_as_bucket_view: bool = _f(True, "gradients alias the all-reduce buckets (saves one gradient copy)")
    comm_hook: str = _f("none", "gradient compression: none, bf16, fp16 (half the bytes) or powersgd (rank 1, changes the math)")
    measure_comm: bool = _f(True, "time the gradient all-reduce and log comm_share (the part not hidden behind backward)")


@dataclass
class PretrainConfig:
    """Everything `bertgpu pretrain` needs; `config.toml` in a run folder is this, resolved."""

    seed: int = _f(0, "seed of initialisation, data order and masking (also --seed N)")
    out: str | None = _f(None, "run folder: config, metrics, checkpoints, export (also --out DIR)")
    model: ModelSection = _f(factory=ModelSection, help="architecture (Hugging Face BertConfig names)")
    data: DataSection = _f(factory=DataSection, help="token shards and masking")
    train: TrainSection = _f(factory=TrainSection, help="batch, precision, length, cadence")
    optim: OptimSection = _f(factory=OptimSection, help="optimizer and learning rate")
    schedule: ScheduleSection = _f(factory=ScheduleSection, help="learning-rate schedule")
    checkpoint: CheckpointSection = _f(factory=CheckpointSection, help="checkpoint cadence")
    distributed: DistributedSection = _f(factory=DistributedSection, help="DDP buckets and gradient compression")


# Short command-line spellings of frequently used keys.
PRETRAIN_ALIASES: dict[str, str] = {"data": "data.dir", "out": "out", "seed": "seed"}

# --------------------------------------------------------------------------------------------
# Typed values
# --------------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _type_name(tp: Any) -> str:
    args = _union_args(tp)
    if args is not None:
        return " or ".join("none" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)
        if inner and inner[-1] is not Ellipsis:
            return f"{len(inner)} comma-separated values ({_type_name(inner[0])} each)"
        return "comma-separated values"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


class _BadValue(ValueError):
    pass


def _parse_text(text: str, tp: Any) -> Any:
    """Command-line text -> a value of type `tp`."""
    args = _union_args(tp)
    if args is not None:
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        for a in args:  # first type that parses wins (int before str for int | str)
            if a is type(None):
                continue
            try:
                return _parse_text(text, a)
            except _BadValue:
                continue
        raise _BadValue(text)
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)
        parts = [p.strip() for p in text.strip().strip("()[]").split(",") if p.strip()]
        elem = inner[0] if inner else str
        if inner and inner[-1] is not Ellipsis and len(parts) != len(inner):
            raise _BadValue(text)
        return tuple(_parse_text(p, elem) for p in parts)
    if tp is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise _BadValue(text)
    try:
        if tp is int:
            value = float(text) if any(c in text for c in ".eE") else int(text)
            if isinstance(value, float):
                if not value.is_integer():
                    raise _BadValue(text)
                value = int(value)
            return value
        if tp is float:
            return float(text)
    except (TypeError, ValueError):
        raise _BadValue(text) from None
    if tp is str:
        return text
    raise _BadValue(text)


def _coerce(value: Any, tp: Any) -> Any:
    """A TOML value -> a value of type `tp` (ints accepted for floats, lists for tuples,
    the string "none" for optional fields, strings parsed like the command line)."""
    if isinstance(value, str) and tp is not str:
        return _parse_text(value, tp)
    args = _union_args(tp)
    if args is not None:
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a)
            except _BadValue:
                continue
        raise _BadValue(value)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise _BadValue(value)
        inner = typing.get_args(tp)
        if inner and inner[-1] is not Ellipsis and len(value) != len(inner):
            raise _BadValue(value)
        elem = inner[0] if inner else Any
        return tuple(v if elem is Any else _coerce(v, elem) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _BadValue(value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _BadValue(value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _BadValue(value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _BadValue(value)
    return value


# --------------------------------------------------------------------------------------------
# Applying files and overrides to any dataclass
# --------------------------------------------------------------------------------------------


def all_keys(cls_or_obj: Any, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a dataclass schema, e.g. ["seed", "out", "model.vocab_size", ...]."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    keys: list[str] = []
    for name, tp in _hints(cls).items():
        if name.startswith("_"):
            continue
        if _is_dataclass_type(tp):
            keys += all_keys(tp, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _unknown(key: str, obj: Any, source: str) -> BertgpuError:
    candidates = all_keys(obj)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # also try the last part alone ("max_stepz" -> "train.max_steps")
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in candidates}
        close = [by_leaf[m] for m in difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)]
    hint = f" (did you mean {close[0]}?)" if close else ""
    return BertgpuError(f"{source}: unknown key {key}{hint}")


def _resolve(obj: Any, key: str, source: str) -> tuple[Any, str, Any]:
    """(owner dataclass instance, field name, field type) of a dotted key."""
    parts = key.split(".")
    target = obj
    for i, part in enumerate(parts):
        hints = _hints(type(target))
        if part not in hints or part.startswith("_"):
            raise _unknown(key, obj, source)
        tp = hints[part]
        if i == len(parts) - 1:
            if _is_dataclass_type(tp):
                raise BertgpuError(f"{source}: {key} is a section; set one of its keys, e.g. {all_keys(tp, key + '.')[0]}")
            return target, part, tp
        if not _is_dataclass_type(tp):
            raise _unknown(key, obj, source)
        target = getattr(target, part)
    raise _unknown(key, obj, source)  # pragma: no cover - empty key


def set_value(obj: Any, key: str, value: Any, source: str, *, from_text: bool = False) -> None:
    """Set dotted `key` of dataclass `obj`, converting `value` to the field's type."""
    owner, name, tp = _resolve(obj, key, source)
    try:
        converted = _parse_text(value, tp) if from_text else _coerce(value, tp)
    except _BadValue:
        shown = value if from_text else json.dumps(value) if not isinstance(value, tuple) else list(value)
        raise BertgpuError(f"{source}: {key} = {shown}: expected {_type_name(tp)}") from None
    setattr(owner, name, converted)


def apply_dict(obj: Any, data: dict[str, Any], source: str, prefix: str = "") -> Any:
    """Apply a nested mapping (a parsed TOML file) to dataclass `obj` in place; returns `obj`."""
    for key, value in data.items():
        dotted = prefix + key.replace("-", "_")
        if isinstance(value, dict):
            owner = obj
            for part in filter(None, prefix.rstrip(".").split(".")):
                owner = getattr(owner, part)
            hints = _hints(type(owner))
            name = key.replace("-", "_")
            if name not in hints or not _is_dataclass_type(hints[name]):
                if name in hints:
                    raise BertgpuError(f"{source}: {dotted} = a table: expected {_type_name(hints[name])}")
                raise _unknown(dotted, obj, source)
            apply_dict(obj, value, source, prefix=dotted + ".")
        else:
            set_value(obj, dotted, value, source)
    return obj


def apply_overrides(
    obj: Any,
    overrides: list[str],
    source: str = "command line",
    aliases: dict[str, str] | None = None,
) -> Any:
    """Apply `--section.key value` / `--section.key=value` words to dataclass `obj` in place.

    Dashes in keys read as underscores (`--train.max-steps`); `aliases` maps short names to
    dotted keys (`--data DIR` -> data.dir); a bool key given without a value means true."""
    aliases = aliases or {}
    i = 0
    while i < len(overrides):
        word = overrides[i]
        if not word.startswith("--") or len(word) == 2:
            raise BertgpuError(
                f"{source}: unexpected argument {word!r}; overrides look like --section.key value"
            )
        body = word[2:]
        if "=" in body:
            key, text = body.split("=", 1)
            i += 1
        else:
            key, text = body, None
            i += 1
        key = key.replace("-", "_")
        key = aliases.get(key, key)
        _, _, tp = _resolve(obj, key, source)
        if text is None:
            nxt = overrides[i] if i < len(overrides) else None
            takes_next = nxt is not None and (not nxt.startswith("--") or _looks_numeric(nxt))
            if takes_next:
                text = nxt
                i += 1
            elif tp is bool or _union_args(tp) and bool in _union_args(tp):  # type: ignore[operator]
                text = "true"
            else:
                raise BertgpuError(f"{source}: --{key} needs a value ({_type_name(tp)})")
        set_value(obj, key, text, source, from_text=True)
    return obj


def _looks_numeric(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; errors name the file and the line."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise BertgpuError(f"{p}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise BertgpuError(f"{p}: invalid TOML: {exc}") from None


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


def _check(ok: bool, key: str, value: Any, expected: str) -> None:
    if not ok:
        raise BertgpuError(f"config: {key} = {value!r}: expected {expected}")


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, value, "one of " + ", ".join(choices))


def validate(cfg: PretrainConfig) -> PretrainConfig:
    """Range and consistency checks; raises BertgpuError naming the key. Returns `cfg`."""
    m, d, t, o, s, c = cfg.model, cfg.data, cfg.train, cfg.optim, cfg.schedule, cfg.checkpoint
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size"):
        _check(getattr(m, key) > 0, f"model.{key}", getattr(m, key), "a positive integer")
    _check(m.hidden_size % m.num_attention_heads == 0, "model.hidden_size", m.hidden_size,
           f"a multiple of model.num_attention_heads ({m.num_attention_heads})")
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
        _check(0.0 <= getattr(m, key) < 1.0, f"model.{key}", getattr(m, key), "a number in [0, 1)")
    _check(m.initializer_range > 0, "model.initializer_range", m.initializer_range, "a positive number")
    _check(m.layer_norm_eps > 0, "model.layer_norm_eps", m.layer_norm_eps, "a positive number")
    _check(0 <= m.pad_token_id < m.vocab_size, "model.pad_token_id", m.pad_token_id, "an id below vocab_size")

    if d.objective is not None:
        _choice("data.objective", d.objective, OBJECTIVES)
    _check(0.0 < d.mask_rate < 1.0, "data.mask_rate", d.mask_rate, "a number in (0, 1)")
    _check(d.num_workers >= 0, "data.num_workers", d.num_workers, "0 or more")
    _check(d.bucket_window >= 0, "data.bucket_window", d.bucket_window, "0 or more")

    _check(t.max_steps >= 0, "train.max_steps", t.max_steps, "0 or more")
    if t.budget_hours is None:
        _check(t.max_steps > 0, "train.max_steps", t.max_steps, "a positive integer (or set train.budget_hours)")
    else:
        _check(t.budget_hours > 0 and math.isfinite(t.budget_hours), "train.budget_hours", t.budget_hours,
               "a positive number of hours")
    _check(t.global_batch_size > 0, "train.global_batch_size", t.global_batch_size, "a positive integer")
    if isinstance(t.micro_batch_size, str):
        _check(t.micro_batch_size == "auto", "train.micro_batch_size", t.micro_batch_size,
               "a positive integer or auto")
    else:
        _check(t.micro_batch_size > 0, "train.micro_batch_size", t.micro_batch_size, "a positive integer")
        _check(t.global_batch_size % t.micro_batch_size == 0, "train.global_batch_size",
               t.global_batch_size, f"a multiple of train.micro_batch_size ({t.micro_batch_size})")
    _choice("train.precision", t.precision, PRECISIONS)
    _check(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "0 (off) or a positive number")
    _check(t.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", t.max_nonfinite_steps, "1 or more")
    _check(t.eval_every_steps >= 0, "train.eval_every_steps", t.eval_every_steps, "0 or more")
    _check(t.eval_batches >= 0, "train.eval_batches", t.eval_batches, "0 or more")
    _check(t.log_every_steps >= 1, "train.log_every_steps", t.log_every_steps, "1 or more")

    _choice("optim.name", o.name, OPTIMIZERS)
    _check(o.lr > 0 and math.isfinite(o.lr), "optim.lr", o.lr, "a positive number")
    _check(o.weight_decay >= 0, "optim.weight_decay", o.weight_decay, "0 or more")
    _check(len(o.betas) == 2 and all(0.0 <= b < 1.0 for b in o.betas), "optim.betas", o.betas,
           "two numbers in [0, 1), e.g. 0.9,0.999")
    _check(o.eps > 0, "optim.eps", o.eps, "a positive number")
    _choice("optim.lr_scaling", o.lr_scaling, LR_SCALING)
    if o.reference_batch_size is not None:
        _check(o.reference_batch_size > 0, "optim.reference_batch_size", o.reference_batch_size,
               "a positive integer")
    if o.lr_scaling != "none":
        _check(o.reference_batch_size is not None, "optim.reference_batch_size", None,
               f"the batch size optim.lr was tuned for (optim.lr_scaling is {o.lr_scaling})")

    _choice("schedule.decay", s.decay, DECAYS)
    if s.warmup_steps is not None:
        _check(s.warmup_steps >= 0, "schedule.warmup_steps", s.warmup_steps, "0 or more")
    if s.warmup_fraction is not None:
        _check(0.0 <= s.warmup_fraction <= 1.0, "schedule.warmup_fraction", s.warmup_fraction,
               "a number in [0, 1]")
    if t.budget_hours is not None and s.warmup_steps is not None and t.max_steps == 0:
        _check(False, "schedule.warmup_steps", s.warmup_steps,
               "none in budget mode without train.max_steps (use schedule.warmup_fraction)")
    _check(0.0 <= s.min_lr_ratio <= 1.0, "schedule.min_lr_ratio", s.min_lr_ratio, "a number in [0, 1]")
    _check(s.power > 0, "schedule.power", s.power, "a positive number")

    _check(c.every_steps >= 0, "checkpoint.every_steps", c.every_steps, "0 or more")
    _check(c.keep_last >= 0, "checkpoint.keep_last", c.keep_last, "0 (keep all) or more")
    if c.every_minutes is not None:
        _check(c.every_minutes > 0, "checkpoint.every_minutes", c.every_minutes, "a positive number")

    dist = cfg.distributed
    _check(dist.bucket_cap_mb > 0, "distributed.bucket_cap_mb", dist.bucket_cap_mb, "a positive integer")
    _choice("distributed.comm_hook", dist.comm_hook, COMM_HOOKS)
    return cfg


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


# --------------------------------------------------------------------------------------------
# Output: dict, TOML, help
# --------------------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (tuples become lists), ready for json.dumps."""

    def plain(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


def _toml_value(v: Any) -> str:
    if v is None:
        return '"none"'  # read back as None by optional fields
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(cfg: Any) -> str:
    """TOML text of a dataclass config: top-level keys, then one [table] per section. A None
    value is written as "none" so the file reads back to the same config."""
    top: list[str] = []
    tables: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            lines = [f"[{f.name}]"]
            lines += [f"{g.name} = {_toml_value(getattr(value, g.name))}" for g in dataclasses.fields(value)]
            tables.append("\n".join(lines))
        else:
            top.append(f"{f.name} = {_toml_value(value)}")
    return "\n\n".join(["\n".join(top)] + tables if top else tables) + "\n"


def format_help(cls: type = PretrainConfig) -> str:
    """Every key with its type, default and help text (for `--help-config`)."""
    lines: list[str] = []

    def walk(tp: type, prefix: str) -> None:
        hints = _hints(tp)
        for f in dataclasses.fields(tp):
            ftp = hints[f.name]
            if _is_dataclass_type(ftp):
                lines.append(f"\n[{prefix}{f.name}]  {f.metadata.get('help', '')}")
                walk(ftp, f"{prefix}{f.name}.")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            shown = "none" if default is None else ",".join(map(str, default)) if isinstance(default, tuple) else default
            lines.append(f"  --{prefix}{f.name} ({_type_name(ftp)}; default {shown})")
            lines.append(f"      {f.metadata.get('help', '')}")

    walk(cls, "")
    return "\n".join(lines).strip("\n") + "\n"
