"""The pretraining configuration schema, the sections every training job shares, and the
vocabularies of every setting: schema as code, files and the command line only override.

Every knob is a dataclass field with a default and a help text (`bertgpu pretrain --help-config`
prints them, see `help_text`). A TOML file only overrides defaults, the command line overrides
the file, unknown keys are errors with a suggestion, and the resolved configuration is written
to every run and checkpoint as `config.toml` (`render.dump_toml`)::

    bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base \\
        --train.global_batch_size 512 --optim.lr=1e-3 --optim.betas 0.9,0.98 --seed 3

Sections: `[model]` is the chosen architecture's own config class (models/<name>/config.py,
transformers' field names; `model.architecture` chooses it), `[data]` the shards and masking,
`[train]` what changes the result (batch, precision, length, cadence), `[impl]` what only changes
the speed and memory (device, micro batch, compile, unpadding, workers), `[optim]`, `[schedule]`,
`[checkpoint]`, `[distributed]`, `[logging]`. The engine and the loop take these sections as
they are; the fine-tuning schema (`finetune.py`) declares its flat keys with `overrides.reuse`
of these fields, so each knob and its help text are written once.

Batch semantics: `train.global_batch_size` sequences per optimizer step is the knob;
`impl.micro_batch_size` is per device; accumulation = global / (micro x world) is derived by
`resolve_batch`. The lr may be scaled from the batch it was tuned for (`scaled_lr`).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertgpu.config import continued
from bertgpu.config.overrides import (
    apply_dict,
    apply_overrides,
    field_type,
    is_value_of,
    option,
    parse_text,
    read_toml,
    type_name,
    word_keys,
)
from bertgpu.config.render import format_help
from bertgpu.config.sections import (
    BALANCE_MODES,
    COMM_HOOKS,
    COMPILE_MODES,
    CUDA_GRAPH_MODES,
    DECAYS,
    LR_SCALING,
    MAX_SEED,
    MAX_TIMEOUT_MINUTES,
    OPTIMIZERS,
    PRECISIONS,
    STRATEGIES,
    CheckpointSection,
    DataSection,
    DistributedSection,
    ImplSection,
    LoggingSection,
    OptimSection,
    ScheduleSection,
    TrainSection,
    check,
    check_choice,
    divisor_up_to,
    name_the_source,
    one_warmup,
    resolve_batch,
)
from bertgpu.data.manifest import OBJECTIVES
from bertgpu.errors import BertgpuError
from bertgpu.models import build


@dataclass
class PretrainConfig:
    """Everything `bertgpu pretrain` needs; `config.toml` in a run folder is this, resolved."""

    seed: int = option(0, "seed of initialisation, data order and masking (also --seed N)")
    out: str | None = option(None,
                             "run folder: config, metrics, checkpoints, export (also --out DIR)")
    init: str | None = option(
        None, "continue pretraining from these weights: a run folder, a checkpoint folder or a "
        "Hugging Face BERT / ModernBERT folder (also --init PATH); [model] comes from its "
        "config.json")
    resume_optimizer: bool = option(
        False, "with init from a bertgpu run: also take its optimizer state (the schedule still "
        "starts fresh; also --resume-optimizer)")
    requires_init: bool = option(
        False, "the recipe continues pretrained weights (domain-adapt, bert-base-phase2, "
        "modern-base-8k): without init it is an error, not a randomly initialised model")
    model: Any = option(factory=lambda: build.spec("bert").pretraining_config(),
                        help="the architecture's own config (Hugging Face names): "
                             "model.architecture chooses it, BERT-base by default")
    data: DataSection = option(factory=DataSection, help="token shards and masking")
    train: TrainSection = option(factory=TrainSection, help="batch, precision, length, cadence")
    impl: ImplSection = option(factory=ImplSection,
                               help="device, micro batch, compile, unpadding, workers")
    optim: OptimSection = option(factory=OptimSection, help="optimizer and learning rate")
    schedule: ScheduleSection = option(factory=ScheduleSection, help="learning-rate schedule")
    checkpoint: CheckpointSection = option(factory=CheckpointSection, help="checkpoint cadence")
    distributed: DistributedSection = option(factory=DistributedSection,
                                             help="DDP or FSDP, buckets, gradient compression")
    logging: LoggingSection = option(factory=LoggingSection,
                                     help="metric sinks (W&B, MLflow, TensorBoard) and "
                                          "the GPU monitor")


# Short command-line spellings of frequently used keys.
PRETRAIN_ALIASES: dict[str, str] = {"data": "data.dir", "out": "out", "seed": "seed"}


def help_text() -> str:
    """Every key of the pretraining schema with its type, default and help (`--help-config`),
    the `[model]` keys of every registered architecture included."""
    text = format_help(PretrainConfig())
    for name in build.ARCHITECTURES:
        if name != PretrainConfig().model.architecture:
            model = build.spec(name).pretraining_config()
            text += (f"\n[model] with architecture = {name!r}\n"
                     + format_help(model, prefix="model."))
    return text


def takes_word(key: str, word: str) -> bool:
    """Whether `--KEY WORD` among `bertgpu pretrain`'s words sets KEY to WORD, so that WORD is
    not the recipe: not a word ending in .toml (a recipe, never a value here), not an option,
    not a non-bool after a bool key (`--impl.compile` alone means true). KEY is looked up in
    every architecture's schema; an unknown one takes the word (its error names the key)."""
    if word.endswith(".toml"):
        return False
    return is_value_of(_key_type(key), word)


def expected_value(key: str) -> str:
    """What `--KEY` takes, in an error's words ("true or false"); KEY as `takes_word` has it."""
    return type_name(_key_type(key))


def _key_type(key: str) -> Any:
    """The type of command-line KEY (dashes or aliases allowed) in the first architecture's
    schema that has it; None for an unknown key."""
    key = key.replace("-", "_")
    key = PRETRAIN_ALIASES.get(key, key)
    for name in build.ARCHITECTURES:
        tp = field_type(PretrainConfig(model=build.spec(name).pretraining_config()), key)
        if tp is not None:
            return tp
    return None


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                check_batch: bool = True) -> PretrainConfig:
    """Defaults <- TOML file (optional) <- command-line overrides, then `validate` (the global
    batch against the micro batch too unless `check_batch` is False: a caller that knows its
    number of devices checks it with them, `check_batch_for`). The `[model]` section is the
    config class of the architecture that the file or the command line names
    (`model.architecture`, the command line winning; BERT when neither does)."""
    data = read_toml(path) if path is not None else {}
    words = list(overrides or [])
    asked, where = _architecture_given(data, words, str(path))
    init = continued.init_asked(data, words)
    if init is not None:  # continued pretraining: the model is the init's (config/continued.py)
        model = continued.init_model(init, asked, where)
    else:
        model = build.spec(asked or "bert").pretraining_config()
    base = dataclasses.replace(model)
    cfg = PretrainConfig(model=model)
    _refuse_other_architectures_keys(cfg.model, data.get("model", {}), words, str(path), init)
    apply_dict(cfg, data, str(path))
    apply_overrides(cfg, words, "command line", PRETRAIN_ALIASES)
    one_warmup(cfg.schedule, data.get("schedule", {}), word_keys(words, PRETRAIN_ALIASES))
    if init is not None:
        given = {key.replace("-", "_"): str(path) for key in data.get("model", {})}
        given.update((key, "command line") for key, _ in _model_words(words))
        continued.check_recipe(cfg.model, base, given, init)
    try:
        validate(cfg, check_batch)
    except BertgpuError as e:
        line_keys = word_keys(words, PRETRAIN_ALIASES)
        raise name_the_source(e, data, str(path), line_keys) from None
    return cfg


def _model_words(words: list[str]) -> list[tuple[str, str | None]]:
    """(field, value text) of the `--model.FIELD value` / `--model.FIELD=value` words."""
    found = []
    for i, word in enumerate(words):
        if not word.startswith("--model."):
            continue
        key, eq, text = word[len("--model."):].partition("=")
        if not eq:
            following = words[i + 1] if i + 1 < len(words) else None
            text = following if following is not None and not following.startswith("--") else None
        found.append((key.replace("-", "_"), text))
    return found


def _architecture_given(data: dict[str, Any], words: list[str], source: str
                        ) -> tuple[str | None, str]:
    """(model.architecture of the command line, else of the file, else None; where it was
    given); a one-line error for a name that is not registered."""
    asked, where = data.get("model", {}).get("architecture"), source
    for key, text in _model_words(words):
        if key == "architecture" and text is not None:
            asked, where = text, "command line"
    if asked is not None and asked not in build.ARCHITECTURES:
        raise BertgpuError(f"{where}: model.architecture = {asked!r}: expected one of "
                           f"{', '.join(build.ARCHITECTURES)}")
    return asked, where


def _refuse_other_architectures_keys(model: Any, table: dict[str, Any], words: list[str],
                                     source: str, init: str | None = None) -> None:
    """A `[model]` key that another architecture has and this one does not (a silent no-op
    otherwise) is an error that says what this architecture calls the same knob, if anything.
    With `init` the architecture is the init's, so such a key means a recipe written for
    another architecture, and the error says that (continued.refuse_other_architecture)."""
    spec = build.spec(model.architecture)
    own = {f.name for f in dataclasses.fields(model)}
    given = [(key.replace("-", "_"), value, source, False) for key, value in table.items()]
    given += [(key, text, "command line", True) for key, text in _model_words(words)]
    found = []  # (key, value, where, the architecture it belongs to)
    for key, value, where, is_text in given:
        if key in own:
            continue
        for name in build.ARCHITECTURES:
            other = build.spec(name).config_class
            types = typing.get_type_hints(other)
            if name == spec.name or key not in types:
                continue
            if is_text and value is not None:
                try:
                    value = parse_text(value, types[key])
                except ValueError:
                    pass
            found.append((key, value, where, name))
            break
    if not found:
        return
    if init is not None:
        continued.refuse_other_architecture(init, spec.name, found)
    key, value, where, name = found[0]
    instead = spec.equivalents.get(key, ())
    hint = (f" (for {spec.name}: {', '.join('model.' + n for n in instead)})"
            if instead else "")
    raise BertgpuError(f"{where}: model.{key} = {value!r}: a {name} field, not one of "
                       f"{spec.name}{hint}")


# Validation and batch arithmetic

def validate(cfg: PretrainConfig, check_batch: bool = True) -> PretrainConfig:
    """Range and consistency checks; raises BertgpuError naming the key. Returns `cfg`.
    `check_batch` False leaves the global batch's divisibility to the caller, which checks it
    against micro batch x devices (`check_batch_for`)."""
    _validate_model(cfg)
    check(0 <= cfg.seed <= MAX_SEED, "seed", cfg.seed, f"an integer from 0 to {MAX_SEED}")
    check(cfg.init is not None or not cfg.resume_optimizer, "resume_optimizer", True,
          "false unless init names the run whose optimizer state to take")
    _validate_data(cfg.data)
    _validate_train(cfg.train)
    _validate_impl(cfg.impl, cfg.train, check_batch)
    _validate_optim(cfg.optim)
    _validate_schedule(cfg.schedule, cfg.train)
    _validate_checkpoint(cfg.checkpoint)
    _validate_distributed(cfg.distributed)
    if cfg.distributed.strategy == "fsdp":
        check(cfg.impl.compile_mode not in CUDA_GRAPH_MODES, "impl.compile_mode",
              cfg.impl.compile_mode, "default or max-autotune-no-cudagraphs with "
              "distributed.strategy fsdp (its collectives run between the graphs' kernels)")
    cfg.logging.validate()
    return cfg


def _validate_model(cfg: PretrainConfig) -> None:
    """The architecture's own checks (its config class), and next-sentence prediction only for an
    architecture with that head."""
    m = cfg.model
    check_choice("model.architecture", m.architecture, tuple(build.ARCHITECTURES))
    spec = build.spec(m.architecture)
    # the file named one architecture, the command line another
    if not isinstance(m, spec.config_class):
        raise BertgpuError(f"config: model.architecture = {m.architecture!r} but the [model] "
                           f"section holds {type(m).__name__} fields; name the architecture once")
    m.validate(prefix="config: model.")
    problem = m.export_problem()
    if problem is not None:  # refused now, not after training: a run ends with its export
        raise BertgpuError(f"config: model.{problem}; a pretraining run exports its model, so "
                           "it cannot start")
    if not spec.has_nsp:
        check(cfg.train.with_nsp is not True, "train.with_nsp", cfg.train.with_nsp,
              f"false or none: {spec.title} has no next-sentence head")
        check(cfg.data.objective != "mlm+nsp", "data.objective", cfg.data.objective,
              f"mlm or none: {spec.title} has no next-sentence head")


def _validate_data(d: DataSection) -> None:
    if d.objective is not None:
        check_choice("data.objective", d.objective, OBJECTIVES)
    check(0.0 < d.mask_rate < 1.0, "data.mask_rate", d.mask_rate, "a number in (0, 1)")
    check(0.0 < d.eval_mask_rate < 1.0, "data.eval_mask_rate", d.eval_mask_rate,
          "a number in (0, 1)")


def _validate_train(t: TrainSection) -> None:
    if t.budget_hours is None:  # 0 (no step limit) only where the budget ends the run
        check(t.max_steps > 0, "train.max_steps", t.max_steps,
              "a positive integer (0, no step limit, only with train.budget_hours set)")
    else:
        check(t.max_steps >= 0, "train.max_steps", t.max_steps,
              "0 (no step limit: train.budget_hours ends the run) or a positive integer")
        check(t.budget_hours > 0 and math.isfinite(t.budget_hours), "train.budget_hours",
              t.budget_hours,
               "a positive number of hours")
    check(t.global_batch_size > 0, "train.global_batch_size", t.global_batch_size,
          "a positive integer")
    check_choice("train.precision", t.precision, PRECISIONS)
    check(t.grad_clip >= 0, "train.grad_clip", t.grad_clip, "0 (off) or a positive number")
    check(t.max_nonfinite_steps >= 1, "train.max_nonfinite_steps", t.max_nonfinite_steps,
          "1 or more")
    check(t.eval_every_steps >= 0, "train.eval_every_steps", t.eval_every_steps, "0 or more")
    check(t.eval_sequences >= 0, "train.eval_sequences", t.eval_sequences, "0 or more")
    check(t.log_every_steps >= 1, "train.log_every_steps", t.log_every_steps, "1 or more")


def _validate_impl(i: ImplSection, t: TrainSection, check_batch: bool = True) -> None:
    # the spelling only: whether this machine has the device is the command's check (torch)
    check(i.device in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", i.device),
          "impl.device", i.device, "auto, cpu, cuda, cuda:N or mps")
    if isinstance(i.micro_batch_size, str):
        check(i.micro_batch_size == "auto", "impl.micro_batch_size", i.micro_batch_size,
              "a positive integer or auto")
    else:
        check(i.micro_batch_size > 0, "impl.micro_batch_size", i.micro_batch_size,
              "a positive integer")
        # Blind to the number of devices: a caller that knows it checks the whole rule instead
        # (one message naming micro batch x devices; this one's fix could still fail that).
        if check_batch:
            check(t.global_batch_size % i.micro_batch_size == 0, "train.global_batch_size",
                  t.global_batch_size,
                  f"a multiple of impl.micro_batch_size ({i.micro_batch_size}), or a micro batch "
                  f"that divides it (e.g. "
                  f"{divisor_up_to(t.global_batch_size, i.micro_batch_size)})")
    check(i.unpad in (True, False, "auto"), "impl.unpad", i.unpad, "true, false or auto")
    check(i.num_workers >= 0, "impl.num_workers", i.num_workers, "0 or more")
    check(i.bucket_window >= 0, "impl.bucket_window", i.bucket_window, "0 or more")
    check_choice("impl.compile_mode", i.compile_mode, COMPILE_MODES)
    if i.compile_mode in CUDA_GRAPH_MODES:  # CUDA graphs replay one shape
        check(i.unpad is not True, "impl.unpad", i.unpad,
              f"auto or false with impl.compile_mode {i.compile_mode} (padding-free batches change "
              "their token count from batch to batch; auto runs padded batches there)")
        check(i.bucket_window == 0, "impl.bucket_window", i.bucket_window,
              f"0 with impl.compile_mode {i.compile_mode} (bucketed batches change their width)")


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
    check(0.0 <= s.min_lr_ratio <= 1.0, "schedule.min_lr_ratio", s.min_lr_ratio,
          "a number in [0, 1]")
    check(s.power > 0, "schedule.power", s.power, "a positive number")
    check(0.0 <= s.decay_fraction <= 1.0, "schedule.decay_fraction", s.decay_fraction,
          "a number in [0, 1]")
    s.validate()  # schedule.decay_span


def _validate_checkpoint(c: CheckpointSection) -> None:
    check(c.every_steps >= 0, "checkpoint.every_steps", c.every_steps, "0 or more")
    check(c.keep_last >= 0, "checkpoint.keep_last", c.keep_last, "0 (keep all) or more")
    if c.every_minutes is not None:
        check(c.every_minutes > 0, "checkpoint.every_minutes", c.every_minutes, "a positive number")
    check(c.grace_s > 0, "checkpoint.grace_s", c.grace_s, "a positive number of seconds")


def _validate_distributed(dist: DistributedSection) -> None:
    check(dist.bucket_cap_mb > 0, "distributed.bucket_cap_mb", dist.bucket_cap_mb,
          "a positive integer")
    check_choice("distributed.comm_hook", dist.comm_hook, COMM_HOOKS)
    check_choice("distributed.strategy", dist.strategy, STRATEGIES)
    if dist.strategy != "fsdp":
        for key, on in (("distributed.shard_within_node", dist.shard_within_node),
                        ("distributed.cpu_offload", dist.cpu_offload)):
            check(not on, key, on, "false with distributed.strategy ddp (it is an fsdp option)")
    else:
        check(dist.comm_hook == "none", "distributed.comm_hook", dist.comm_hook,
              "none with distributed.strategy fsdp (compression hooks are DDP's; FSDP reduces in "
              "fp32, or halves the all-gather with train.precision bf16)")
        # Refused rather than ignored: the shares would stay equal whatever the ranks' speeds.
        check(dist.balance == "none", "distributed.balance", dist.balance,
              "none with distributed.strategy fsdp (every layer's all-gather makes the other "
              "ranks wait for a slow one inside their own step, so no rank measures slower and "
              "the shares would stay equal)")
    check(0 < dist.timeout_minutes <= MAX_TIMEOUT_MINUTES, "distributed.timeout_minutes",
          dist.timeout_minutes, f"a positive number, at most {MAX_TIMEOUT_MINUTES:g}")
    check_choice("distributed.balance", dist.balance, BALANCE_MODES)
    check(dist.balance_every_steps >= 1, "distributed.balance_every_steps",
          dist.balance_every_steps, "1 or more")


def check_batch_for(cfg: PretrainConfig, world_size: int) -> None:
    """The global batch against micro batch x `world_size` devices (`resolve_batch`'s one-line
    error), before anything runs; an `auto` micro batch is resolved and checked later."""
    if not isinstance(cfg.impl.micro_batch_size, str):
        resolve_batch(cfg.train.global_batch_size, cfg.impl.micro_batch_size, world_size)


def check_start(cfg: PretrainConfig, recipe: str | None, words: list[str],
                allow_data_change: bool = False) -> None:
    """What `bertgpu pretrain` refuses of its loaded config (`recipe` and the command line's
    `words`) before anything runs, beyond `validate`: a recipe that continues pretrained weights
    (`requires_init`) without an init, and a resume of the run in `out` with another seed."""
    continued.refuse_without_init(cfg.requires_init, cfg.init, words, str(recipe))
    given = any(w.partition("=")[0] == "--seed" for w in words)
    unseeded = (read_toml(recipe).get("seed", 0) if recipe else 0) if given else None
    check_resume_seed(cfg, allow_data_change, unseeded)


def check_resume_seed(cfg: PretrainConfig, allow_data_change: bool = False,
                      unseeded: int | None = None) -> None:
    """The seed orders and masks the training samples, so resuming the run in `cfg.out` (its
    newest checkpoint's config.toml) with another seed is refused in one line naming both and
    the ways on, unless `allow_data_change` (as another shard set or masking): the resumed steps
    then take the new seed's order and masks from the run's position. `unseeded`: the seed
    without the command line's --seed (None: none given), to say whether dropping it resumes."""
    from bertgpu.step_folders import complete_steps

    steps = complete_steps(Path(cfg.out) / "checkpoints") if cfg.out else []
    path = steps[-1][1] / "config.toml" if steps else None
    if path is None or allow_data_change or not path.is_file():
        return
    try:
        saved = read_toml(path).get("seed")
    except BertgpuError:  # unreadable: the resume itself says what is wrong with it
        return
    if isinstance(saved, int) and saved != cfg.seed:
        raise BertgpuError(
            f"{cfg.out}: the run was trained with seed {saved} and this command gives seed "
            f"{cfg.seed} (the seed orders and masks its samples); to resume it "
            f"{'drop --seed or ' if unseeded == saved else ''}give --seed {saved}, for a new run "
            f"give another --out, or pass --allow-data-change to go on in seed {cfg.seed}'s "
            "order and masks")


def resolve_with_nsp(with_nsp: bool | None, objective: str, source: str = "data") -> bool:
    """Whether to train the NSP head: `train.with_nsp` if set, else from the shard set's objective.
    NSP needs sentence pairs, so with_nsp true on MLM-only shards is an error."""
    if objective not in OBJECTIVES:
        raise BertgpuError(f"{source}: objective {objective!r}: expected one of "
                           f"{', '.join(OBJECTIVES)}")
    if with_nsp is None:
        return objective == "mlm+nsp"
    if with_nsp and objective != "mlm+nsp":
        raise BertgpuError(
            f"{source}: train.with_nsp is true but the shards have objective {objective} (no "
            "sentence pairs); prepare the data with objective mlm+nsp or set train.with_nsp false"
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


