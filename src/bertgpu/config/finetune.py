"""The fine-tuning configuration: flat keys (`--epochs 3 --lr 2e-5`, `--train.epochs` accepted too),
the shared knobs taken from the pretraining sections with `overrides.reuse` (one declaration and
help text each), and the learning rate and epochs that default by model size.

    cfg = load_finetune_config(None, ["--epochs", "2"])
    cfg, note = resolve_finetune(cfg, hidden_size=128)   # lr / epochs filled in by model size
    peak_lr(cfg)                                         # after lr_scaling (results.json: peak_lr)
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from types import SimpleNamespace

from bertgpu.config.overrides import apply_overrides, option, reuse
from bertgpu.config.schema import PretrainConfig, scaled_lr
from bertgpu.config.sections import (
    DECAYS,
    LR_SCALING,
    MAX_SEED,
    MAX_TIMEOUT_MINUTES,
    OPTIMIZERS,
    PRECISIONS,
    CheckpointSection,
    DistributedSection,
    ImplSection,
    LoggingSection,
    OptimSection,
    ScheduleSection,
    TrainSection,
    batch_fixes,
    check,
    check_choice,
)
from bertgpu.errors import BertgpuError


@dataclass
class FinetuneConfig:
    """Every knob of `bertgpu finetune` (flat keys); results.json records it resolved."""

    seed: int = reuse(PretrainConfig, "seed",
                      help="seed of the fresh head, data order and dropout (glue --seeds sets it)")
    max_seq_len: int | None = option(None, "tokens per sequence, longer inputs truncated (none = "
                                           "128, SQuAD 384; at most the model's "
                                           "max_position_embeddings)")
    doc_stride: int | None = option(None, "SQuAD: overlap in tokens of consecutive context "
                                          "windows (none = 128, or half of a question's window "
                                          "where 128 does not fit below it; a value given must "
                                          "be below max_seq_len - max_query_len - 3)")
    max_query_len: int = option(64, "SQuAD: question tokens kept")
    epochs: int | None = option(None, "passes over the training set (none = by model size: 3 past "
                                      "hidden size 512, 5 up to 512, 10 up to 256)")
    global_batch_size: int = reuse(TrainSection, "global_batch_size", 32)
    micro_batch_size: int | None = option(None, "sequences per forward pass per device (none = "
                                                "global / devices)")
    lr: float | None = reuse(OptimSection, "lr", None,
                             "peak learning rate (none = by model size: 2e-5 past hidden size 512, "
                             "1e-4 up to 512, 3e-4 up to 256)")
    lr_scaling: str = reuse(OptimSection, "lr_scaling")
    reference_batch_size: int | None = reuse(OptimSection, "reference_batch_size")
    weight_decay: float = reuse(OptimSection, "weight_decay")
    warmup_fraction: float = reuse(ScheduleSection, "warmup_fraction", 0.1)
    decay: str = reuse(ScheduleSection, "decay")
    precision: str = reuse(TrainSection, "precision")
    grad_clip: float = reuse(TrainSection, "grad_clip")
    optimizer: str = reuse(OptimSection, "name")
    eval_batch_size: int = option(64, "sequences per forward pass in evaluation")
    n_best: int = option(20, "SQuAD: start/end candidates per window")
    max_answer_len: int = option(30, "SQuAD: longest answer in tokens")
    null_threshold: float = option(0.0,
                                   "SQuAD v2: predict no answer when null - best span score > this "
                                   "(a run reports the best: dev best_f1_thresh; null_odds.json "
                                   "and span_predictions.json apply any without re-training)")
    max_train_examples: int | None = option(None,
                                            "use only the first N training examples (quick runs)")
    max_eval_examples: int | None = option(None,
                                           "evaluate on the first N examples of each dev split")
    skip_malformed: bool = option(False, "GLUE files: skip rows with the wrong number of "
                                         "columns (.tsv: the official QQP train.tsv has a few) "
                                         "or a null text (Hugging Face exports; a warning says "
                                         "how many) instead of stopping at the first")
    hidden_dropout_prob: float | None = option(None,
                                               "override the model's hidden dropout (none = keep)")
    log_every_steps: int = reuse(TrainSection, "log_every_steps")
    device: str = reuse(ImplSection, "device")
    budget_hours: float | None = reuse(TrainSection, "budget_hours")
    max_nonfinite_steps: int = reuse(TrainSection, "max_nonfinite_steps")
    checkpoint_every_steps: int = reuse(CheckpointSection, "every_steps", 0,
                                        "write a resumable checkpoint every N steps (0 = only "
                                        "when preempted)")
    checkpoint_every_minutes: float | None = reuse(CheckpointSection, "every_minutes")
    checkpoint_grace_s: float = reuse(CheckpointSection, "grace_s")
    checkpoint_async_save: bool = reuse(CheckpointSection, "async_save")
    timeout_minutes: float = reuse(DistributedSection, "timeout_minutes")
    logging: LoggingSection = option(
        factory=lambda: LoggingSection(tensorboard=False),
        help="metric sinks (W&B, MLflow, TensorBoard: off unless asked for) and the GPU monitor")


# Fine-tuning's lr and epochs when not given, by encoder width: (largest hidden_size, lr, epochs).
# BERT-base and -large (768, 1024): the BERT paper's setting (Devlin et al. 2019, appendix A.3:
# lr 5e-5 / 3e-5 / 2e-5, 2-4 epochs; 2e-5 and 3 epochs is also transformers' run_glue default).
# Small encoders move far less from a fresh head at those rates (Google's compact BERTs, Turc et
# al. 2019, search lr up to 3e-4). Measured (benchmarks/finetune_defaults.py, its docstring): on
# the NER fixture, 2e-5 x3 gives entity F1 9 (hidden 128) and 16 (hidden 384, all-MiniLM); 3e-4
# x10 gives 96.5 at hidden 128, 1e-4 x5 gives 100 at hidden 384.
FINETUNE_DEFAULTS: tuple[tuple[int, float, int], ...] = ((256, 3e-4, 10), (512, 1e-4, 5),
                                                         (1 << 30, 2e-5, 3))


def finetune_defaults(hidden_size: int) -> tuple[float, int]:
    """(lr, epochs) for an encoder of width `hidden_size` (FINETUNE_DEFAULTS)."""
    for widest, lr, epochs in FINETUNE_DEFAULTS:
        if hidden_size <= widest:
            return lr, epochs
    raise ValueError(f"hidden_size {hidden_size}: wider than every FINETUNE_DEFAULTS row")


def resolve_finetune(cfg: FinetuneConfig, hidden_size: int) -> tuple[FinetuneConfig, str]:
    """A copy of `cfg` with lr and epochs chosen by model size where they are None, and a line
    for the start-up table saying what was chosen ("" when both were given)."""
    lr, epochs = finetune_defaults(hidden_size)
    chosen = {k: v for k, v in (("lr", lr), ("epochs", epochs)) if getattr(cfg, k) is None}
    if not chosen:
        return cfg, ""
    note = ", ".join(f"{k} {v:g}" for k, v in chosen.items())
    return (dataclasses.replace(cfg, **chosen),
            f"{note} (hidden size {hidden_size}; set --lr / --epochs to change)")


def peak_lr(cfg: FinetuneConfig) -> float:
    """The peak lr a resolved `cfg` trains with: `lr` (the lr tuned at `reference_batch_size`)
    scaled to `global_batch_size` by `lr_scaling` (none, linear or sqrt: schema.scaled_lr, the
    rule pretraining applies). `lr` itself stays as given, so results.json's config re-runs the
    same way."""
    if cfg.lr is None:
        raise ValueError("peak_lr: resolve the config first (lr is None)")
    return scaled_lr(cfg.lr, cfg.global_batch_size, cfg.reference_batch_size, cfg.lr_scaling)


MIN_SEQ_LEN = 3
"""The shortest sequence that holds any text: [CLS] token [SEP] (a pair needs 5)."""


def check_batch(cfg: FinetuneConfig, world_size: int) -> tuple[int, int]:
    """(micro batch per device, accumulation steps) of `cfg` on `world_size` devices; a one-line
    error in the flat keys' names when the global batch does not divide: by micro batch x
    devices when --micro_batch_size was given, else by the devices (--nproc). Checked before the
    tokenizer, the data and the model load."""
    micro = cfg.micro_batch_size or max(cfg.global_batch_size // world_size, 1)
    per_step = micro * world_size
    if cfg.global_batch_size % per_step and cfg.micro_batch_size is None:
        # The micro batch is derived (global // devices): it only fails when the devices do not
        # share the global batch equally, so name what the user set, not a derived number.
        nearest = [b for b in (cfg.global_batch_size // world_size * world_size,
                               (cfg.global_batch_size // world_size + 1) * world_size) if b > 0]
        raise BertgpuError(f"--global_batch_size {cfg.global_batch_size} is not divisible by "
                           f"--nproc {world_size} (each device takes an equal share of every "
                           f"step); expected a multiple of {world_size}, e.g. --global_batch_size "
                           + " or ".join(map(str, nearest)))
    if cfg.global_batch_size % per_step:
        devices = "device" if world_size == 1 else "devices"
        raise BertgpuError(f"--global_batch_size {cfg.global_batch_size} is not divisible by "
                           f"--micro_batch_size {micro} x {world_size} {devices} = {per_step}; "
                           "expected " + batch_fixes(cfg.global_batch_size, micro, world_size,
                                                     "--global_batch_size", "--micro_batch_size"))
    return micro, cfg.global_batch_size // per_step


def resolve_seq_len(cfg: FinetuneConfig, task_default: int, limit: int, where: str
                    ) -> tuple[int, str]:
    """The tokens per sequence a run uses and a note for the start-up table: `max_seq_len` as
    given, else the task's default (`task_default`: 128, SQuAD 384) capped at the model's
    `limit` (its max_position_embeddings, read from `where`). A given value above the limit is
    a one-line error: those positions have no embedding."""
    if cfg.max_seq_len is not None:
        if cfg.max_seq_len > limit:
            raise BertgpuError(f"--max_seq_len {cfg.max_seq_len}: longer than the model's "
                               f"max_position_embeddings {limit} ({where}); expected at most "
                               f"{limit}")
        return cfg.max_seq_len, ""
    if task_default > limit:
        return limit, (f"the model's max_position_embeddings; the task's default is "
                       f"{task_default}")
    return task_default, "the task's default"


DEFAULT_DOC_STRIDE = 128
"""SQuAD's window overlap when --doc_stride is not given: Hugging Face run_qa.py's, for 384
tokens per window; half of a question's window where it does not fit (`question_doc_stride`)."""


def question_doc_stride(max_ctx: int) -> int:
    """The default overlap of the windows of a question that leaves `max_ctx` context tokens per
    window: DEFAULT_DOC_STRIDE when below them, else half of them (at least 1; 0 for a window of
    one token, which cannot overlap). squad.featurize picks it per question when no doc_stride
    is given. Taken once from the longest question a run allows (max_query_len) it was 1 at 48
    or 64 tokens, whatever the questions: windows overlapping by one token lost every answer
    across their edges."""
    if max_ctx > DEFAULT_DOC_STRIDE:
        return DEFAULT_DOC_STRIDE
    return max(0, min(max(1, max_ctx // 2), max_ctx - 1))


def window_stride(cfg: FinetuneConfig, max_seq_len: int) -> int | None:
    """The doc_stride squad.featurize takes with `max_seq_len` tokens per window. Given: used as
    given, or a one-line error when it is not below the window after the longest question (it
    used to be replaced by half a window without a word). Not given: DEFAULT_DOC_STRIDE when it
    fits below that window, so below every question's; else None, featurize's per question
    default (`question_doc_stride`). A max_seq_len too short for any window is featurize's
    error."""
    window = max_seq_len - cfg.max_query_len - 3  # [CLS] question [SEP] window [SEP]
    if cfg.doc_stride is None:
        return DEFAULT_DOC_STRIDE if window > DEFAULT_DOC_STRIDE else None
    if 1 < window <= cfg.doc_stride:
        raise BertgpuError(f"--doc_stride {cfg.doc_stride}: not below the {window} context tokens "
                           f"of a window (max_seq_len {max_seq_len} - max_query_len "
                           f"{cfg.max_query_len} - 3 for [CLS] [SEP] [SEP]); expected at most "
                           f"{window - 1}, or no --doc_stride (the default fits the window)")
    return cfg.doc_stride


def doc_stride(cfg: FinetuneConfig, max_seq_len: int) -> int | str:
    """SQuAD's window overlap as used with `max_seq_len` tokens per window, as results.json
    (`doc_stride`) and the start-up table say it: `window_stride`'s number, or, when featurize
    picks it per question, how ("half of each question's window (...)"). A run recorded before
    the per-question default has the number it used then (half the longest question's window)."""
    stride = window_stride(cfg, max_seq_len)
    if stride is not None:
        return stride
    # questions of `longest` tokens or more leave DEFAULT_DOC_STRIDE context tokens or fewer
    longest = max_seq_len - 3 - DEFAULT_DOC_STRIDE
    if longest <= 0:
        return (f"half of each question's window (the default {DEFAULT_DOC_STRIDE} does not fit "
                f"beside a question in {max_seq_len} tokens)")
    return (f"{DEFAULT_DOC_STRIDE}, or half of a question's window where {DEFAULT_DOC_STRIDE} "
            f"does not fit beside it in {max_seq_len} tokens (questions of {longest} "
            f"token{'s' if longest > 1 else ''} or more)")


def doc_stride_note(cfg: FinetuneConfig, max_seq_len: int) -> str:
    """The start-up table's doc stride: the value, or how it is chosen per question."""
    return f"{doc_stride(cfg, max_seq_len)}"


def job_config(cfg: FinetuneConfig, max_seq_len: int, *, windows: bool = True
               ) -> FinetuneConfig:
    """The config a task module builds its job with: `max_seq_len` as used (`resolve_seq_len`)
    and, for a task cut into windows (SQuAD, `windows`), the `doc_stride` it cuts them with
    (`window_stride`: None when chosen per question; a given one that does not fit is an error
    here, before anything loads). results.json records `cfg` itself, as given, and the stride
    used beside it (`doc_stride`)."""
    stride = window_stride(cfg, max_seq_len) if windows else cfg.doc_stride
    return dataclasses.replace(cfg, max_seq_len=max_seq_len, doc_stride=stride)


def _finetune_aliases() -> dict[str, str]:
    # `--train.epochs` / `--optim.lr` spellings map onto the flat keys.
    keys = list(FinetuneConfig.__dataclass_fields__)
    return {f"{section}.{k}": k for k in keys for section in ("train", "optim", "finetune")}


def load_finetune_config(cfg: FinetuneConfig | None = None,
                         overrides: list[str] | None = None) -> FinetuneConfig:
    """Defaults (or `cfg`, copied) <- command-line overrides, then range checks."""

    cfg = copy.deepcopy(cfg) if cfg is not None else FinetuneConfig()
    apply_overrides(cfg, list(overrides or []), "command line", _finetune_aliases())
    return validate_finetune(cfg)


def validate_finetune(cfg: FinetuneConfig) -> FinetuneConfig:
    """Range checks; BertgpuError naming the key."""
    def key_is(ok: bool, key: str, expected: str) -> None:
        check(ok, key, getattr(cfg, key), expected)

    for key in ("global_batch_size", "eval_batch_size", "max_query_len",
                "n_best", "max_answer_len", "log_every_steps", "max_nonfinite_steps"):
        key_is(getattr(cfg, key) > 0, key, "a positive integer")
    for key in ("epochs", "micro_batch_size", "max_train_examples", "max_eval_examples",
                "doc_stride"):
        key_is(getattr(cfg, key) is None or getattr(cfg, key) > 0, key,
               "a positive integer or none")
    key_is(cfg.max_seq_len is None or cfg.max_seq_len >= MIN_SEQ_LEN, "max_seq_len",
           f"at least {MIN_SEQ_LEN} ([CLS], a token, [SEP]) or none")
    key_is(cfg.lr is None or (cfg.lr > 0 and math.isfinite(cfg.lr)), "lr",
           "a positive number or none")
    key_is(0 <= cfg.seed <= MAX_SEED, "seed", f"an integer from 0 to {MAX_SEED}")
    key_is(cfg.weight_decay >= 0, "weight_decay", "0 or more")
    key_is(0.0 <= cfg.warmup_fraction <= 1.0, "warmup_fraction", "a number in [0, 1]")
    key_is(cfg.grad_clip >= 0, "grad_clip", "0 (off) or a positive number")
    check_choice("decay", cfg.decay, DECAYS)
    check_choice("precision", cfg.precision, PRECISIONS)
    check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
    check_choice("lr_scaling", cfg.lr_scaling, LR_SCALING)
    key_is(cfg.reference_batch_size is None or cfg.reference_batch_size > 0, "reference_batch_size",
           "a positive integer or none")
    key_is(cfg.lr_scaling == "none" or cfg.reference_batch_size is not None, "reference_batch_size",
           f"the global batch the lr was tuned for (lr_scaling is {cfg.lr_scaling})")
    key_is(cfg.hidden_dropout_prob is None or 0.0 <= cfg.hidden_dropout_prob < 1.0,
           "hidden_dropout_prob", "a number in [0, 1) or none")
    key_is(cfg.budget_hours is None or (cfg.budget_hours > 0 and math.isfinite(cfg.budget_hours)),
           "budget_hours", "a positive number of hours or none")
    key_is(cfg.checkpoint_every_steps >= 0, "checkpoint_every_steps", "0 or more")
    key_is(0 < cfg.timeout_minutes <= MAX_TIMEOUT_MINUTES, "timeout_minutes",
           f"a positive number, at most {MAX_TIMEOUT_MINUTES:g}")
    cfg.logging.validate()
    key_is(cfg.checkpoint_every_minutes is None or cfg.checkpoint_every_minutes > 0,
           "checkpoint_every_minutes", "a positive number or none")
    key_is(cfg.checkpoint_grace_s > 0, "checkpoint_grace_s", "a positive number of seconds")
    return cfg



def as_sections(cfg: FinetuneConfig, *, max_steps: int, eval_every: int, micro_batch_size: int
                ) -> SimpleNamespace:
    """The sections the engine and the loop take (`train`, `optim`, `schedule`, `impl`,
    `checkpoint`, `distributed`, `logging`), filled from the flat fine-tuning keys; `max_steps`
    and `eval_every` come from the data (epochs x steps per epoch, one evaluation per epoch).
    `cfg` must be resolved (lr set: `resolve_finetune`). Keys fine-tuning does not expose keep the
    sections' defaults."""
    return SimpleNamespace(
        train=TrainSection(max_steps=max_steps, global_batch_size=cfg.global_batch_size,
                           precision=cfg.precision, grad_clip=cfg.grad_clip,
                           budget_hours=cfg.budget_hours,
                           max_nonfinite_steps=cfg.max_nonfinite_steps, eval_every_steps=eval_every,
                           log_every_steps=cfg.log_every_steps),
        optim=OptimSection(name=cfg.optimizer, lr=cfg.lr, weight_decay=cfg.weight_decay,
                           lr_scaling=cfg.lr_scaling,
                           reference_batch_size=cfg.reference_batch_size),
        schedule=ScheduleSection(warmup_fraction=cfg.warmup_fraction, decay=cfg.decay),
        # No compile key: batches take several widths (bucket_width), a compile each, which a
        # run of minutes does not win back.
        impl=ImplSection(device=cfg.device, micro_batch_size=micro_batch_size, compile=False),
        checkpoint=CheckpointSection(every_steps=cfg.checkpoint_every_steps,
                                     every_minutes=cfg.checkpoint_every_minutes, keep_last=1,
                                     grace_s=cfg.checkpoint_grace_s,
                                     async_save=cfg.checkpoint_async_save),
        distributed=DistributedSection(timeout_minutes=cfg.timeout_minutes),
        logging=cfg.logging,
    )
