"""`bertgpu pretrain`: one entry point for 1 device, N local devices, or many machines.

    bertgpu pretrain configs/tiny.toml --data data/ --out runs/tiny
    bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base --nproc auto  # every GPU
    bertgpu pretrain configs/tiny.toml --data data/ --out runs/tiny --nproc 2   # 2 gloo CPU workers
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id JOB --max-restarts 3 -m bertgpu pretrain configs/bert-base.toml --data data/ \\
        --out runs/base

(`examples/slurm_pretrain.sbatch` is the Slurm version; `examples/multinode.md` explains it.)

Continued pretraining starts from the weights of a run, a checkpoint or a Hugging Face folder,
whose config.json is then the `[model]` section (config/continued.py, train/continued.py)::

    bertgpu pretrain configs/domain-adapt.toml --init hf/published --data data/ --out runs/adapted
    bertgpu pretrain configs/bert-base-phase2.toml --init runs/phase1 --data d512/ --out runs/p2

`--out` is a new or empty folder, or the run folder of an earlier pretrain. Running the same
command again on the same `--out` resumes from the latest checkpoint, bitwise exactly on CPU in
fp32; so does a torchrun restart (`--max-restarts`). A resume with other settings (lr, global
batch, schedule) says which in one line and keeps the run's earlier config.toml as
`config.step_N.toml` (N: the step it resumed from). Rank 0 picks the checkpoint and broadcasts
its step, so every rank resumes from the same one (`--out` must be on a filesystem every node
sees). Resuming at another world size continues with exactly the next samples. SIGTERM or
SIGINT (a preemption) ends the run within `checkpoint.grace_s` seconds, with a checkpoint of the
last completed step when it fits, and exit status 143 (130 for SIGINT).

This module only wires parts built elsewhere: the config (config/schema.py), the shard set and
loader (data/), the model (models/), the pretraining task (tasks/pretraining.py), the engine and
the one training loop (train/loop.py). `--nproc` is handled by the command line (cli.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.train.pretrain_startup import defaults_note, device_type, lamb_note, startup_rows
from bertgpu.train.rank_agreement import agree, startup_shared
from bertgpu.train.run_folder import (
    check_device,
    check_not_past_max_steps,
    check_run_folder,
    check_run_folder_free,
    check_same_model,
    checkpoint_budget,
    config_text,
    keep_config_history,
    resolved_config,
    run_folder_lock,
)

ACCEPTS_OVERRIDES = True
LAUNCHES_WORKERS = True
STARTUP_SHARED = True  # every rank meets the others at start-up (train/startup_gate.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", nargs="?", help="TOML recipe, e.g. configs/tiny.toml")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    # Declared (not left to the override parser) so `--data D` is never mistaken for the recipe.
    parser.add_argument("--data", default=None, help="shard set from bertgpu prepare (data.dir)")
    parser.add_argument("--out", default=None, help="run folder (out); re-running resumes from it")
    parser.add_argument("--init", default=None, metavar="PATH",
                        help="continue pretraining from a run folder, a checkpoint folder or a "
                             "Hugging Face BERT / ModernBERT folder (weights; [model] from its "
                             "config.json)")
    parser.add_argument("--resume-optimizer", action="store_true",
                        help="with --init from a bertgpu run: also take its optimizer state")
    parser.add_argument("--allow-data-change", action="store_true",
                        help="resume even though the shard set, the masking or the seed (the "
                             "sample order) differ from the checkpoint's")
    parser.epilog = ("Overrides: --section.key value (or =value), e.g. --train.max_steps 100 "
                     "--train.global_batch_size 256 --seed 1 --data DIR --out RUN_DIR")


def parse_arguments(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """The command line in any order (cli.py calls this instead of its own parse): each
    override takes its value first (`--train.max_steps 2` -> `--train.max_steps=2`), so the
    recipe is the one positional word left wherever it stands (argparse alone took the `2` of
    `--train.max_steps 2 configs/tiny.toml` as the recipe). A word ending in .toml is never an
    override's value, nor a word a bool key cannot take (`--impl.compile configs/x`); a second
    positional word is an error naming both, or, when it is one a bool key did not take
    (`--impl.compile maybe`), naming the key and its values, as `--impl.compile=maybe` does."""
    from bertgpu.config import schema

    declared = [s for s in parser._option_string_actions if s.startswith("--")]
    bound: list[str] = []
    refused: dict[str, str] = {}  # a word a bool key did not take -> that key's --flag
    i = 0
    while i < len(words):
        word, i = words[i], i + 1
        if word == "--":
            bound += words[i - 1:]
            break
        key = word[2:]
        is_override = (word.startswith("--") and len(word) > 2 and "=" not in word
                       and ("." in key or not any(s.startswith(word) for s in declared)))
        if is_override and i < len(words):
            if schema.takes_word(key, words[i]):
                word, i = f"{word}={words[i]}", i + 1
            elif not words[i].startswith("-") and not words[i].endswith(".toml"):
                refused.setdefault(words[i], word)
        bound.append(word)
    args, rest = parser.parse_known_args(bound)
    stray = [w for w in rest if not w.startswith("-")]
    if stray:
        # of two positional words, the one a bool key refused is its bad value, unless it is a
        # file (the recipe, as in `--impl.compile configs/x`): argparse may have taken either as
        # the recipe, so look at both
        for value in (args.recipe, *stray):
            if value in refused and not Path(value).is_file():
                flag = refused[value]
                raise BertgpuError(f"{flag} {value}: expected {schema.expected_value(flag[2:])}")
        raise BertgpuError(
            f"{stray[0]}: a second positional argument after the recipe {args.recipe}; expected "
            "one recipe (the positional argument) and overrides as --section.key value")
    args.overrides = rest
    return args


def _config(args: argparse.Namespace) -> Any:
    """The validated config of the command line, but for the global batch: the callers check it
    against micro batch x their number of devices (`schema.check_batch_for`), so that a batch
    they do not divide is one message naming both, not a first one for the micro batch alone."""
    from bertgpu.config import schema

    if args.recipe is not None and not Path(args.recipe).exists():
        raise BertgpuError(
            f"{args.recipe}: recipe not found (the one argument that is neither an option nor an "
            "option's value is taken as the recipe); expected a TOML file such as "
            "configs/tiny.toml")
    words = [f"--{key}={getattr(args, key)}" for key in ("data", "out", "init")
             if getattr(args, key, None) is not None]
    if getattr(args, "resume_optimizer", False):
        words.append("--resume_optimizer=true")
    cfg = schema.load_config(args.recipe, [*words, *args.overrides], check_batch=False)
    schema.check_start(cfg, args.recipe, args.overrides, getattr(args, "allow_data_change", False))
    return cfg


def check_config(cfg: Any) -> None:
    """What the config alone can refuse, before a process group, a shard or a model is made:
    data.dir and out given, out new or a run folder to resume, impl.device on this machine."""
    if not cfg.out and not cfg.data.dir:
        raise BertgpuError("config: data.dir and out are not set; give --data DIR (made by "
                           "bertgpu prepare) and --out RUN_DIR, e.g. bertgpu pretrain "
                           "configs/tiny.toml --data data/ --out runs/tiny")
    if not cfg.out:
        raise BertgpuError("config: out is not set; give --out RUN_DIR")
    if not cfg.data.dir:
        raise BertgpuError("config: data.dir is not set; give --data DIR (made by bertgpu prepare)")
    check_run_folder(Path(cfg.out), {"--data": cfg.data.dir, "--init": cfg.init})
    check_device(cfg.impl.device)
    # a logging sink's package (tensorboard, wandb, mlflow): missing, it is one line before the
    # run folder gets config.toml and the tokenizer (which a missing package used to leave)
    from bertgpu.telemetry.sinks import check_packages

    check_packages(cfg.logging)


def check_before_launch(args: argparse.Namespace, nproc: int) -> None:
    """Validate once, before `--nproc N` starts N workers, so a typo fails once, not N times."""
    from bertgpu.config import overrides, schema
    from bertgpu.step_folders import complete_steps
    from bertgpu.tasks.pretraining import PretrainData, open_checked

    cfg = _config(args)
    check_config(cfg)
    check_run_folder_free(Path(cfg.out))
    checkpoints = complete_steps(Path(cfg.out) / "checkpoints")
    if checkpoints:  # the workers would each refuse it, under the launcher's long report
        check_same_model(checkpoints[-1][1], overrides.config_to_dict(cfg.model), cfg.optim.name)
        if finished_run(cfg, say=False) is None:
            check_not_past_max_steps(Path(cfg.out), cfg.train.max_steps)
    # the shard set: the init's tokenizer's (first, as in build), and the model fits it
    data = PretrainData(cfg.data.dir, cfg.data.objective, cfg.train.with_nsp)
    if cfg.init and not checkpoints:  # a resume continues from its own checkpoint
        open_checked(cfg.init, data, warn=False)  # each worker's build warns
    data.check_model(overrides.config_to_dict(cfg.model), None)
    schema.check_batch_for(cfg, nproc)
    _check_gpu_count(nproc, cfg.impl.device)


def resume_hint(args: argparse.Namespace) -> str | None:
    """After a failed `--nproc` job: what re-running the same command will do."""
    from bertgpu.train.checkpoint import hint_for

    return hint_for(_config(args).out)


def main(args: argparse.Namespace) -> int:
    from bertgpu.config import schema

    if args.help_config:
        print(schema.help_text())
        return 0
    with startup_shared() as startup:  # a rank that fails before the group tells the others
        cfg = startup.cfg = _config(args)
        check_config(cfg)
        schema.check_batch_for(cfg, int(os.environ.get("WORLD_SIZE", "1")))  # a worker: its world
        if args.recipe is None and cfg.init is None and os.environ.get("RANK", "0") == "0":
            warnings.warn(defaults_note(cfg), stacklevel=1)
        result = run(cfg, allow_data_change=args.allow_data_change)
    return result.exit_status if result.preempted else 0


def _check_gpu_count(n: int, device: str) -> None:
    """One process per GPU: refuse more local processes than visible GPUs when training on CUDA."""
    if device not in ("auto", "cuda"):
        return
    import torch

    if torch.cuda.is_available() and n > torch.cuda.device_count():
        raise BertgpuError(
            f"--nproc {n}: only {torch.cuda.device_count()} GPUs are visible; expected at most "
            f"{torch.cuda.device_count()} (or --impl.device cpu for CPU workers)"
        )


@dataclass
class RunResult:
    """What `run` returns: where things are and the last numbers."""

    run_dir: Path
    step: int
    export_dir: Path | None = None
    preempted: bool = False
    last_eval: dict[str, float] = field(default_factory=dict)
    exit_status: int = 0


def run(cfg: Any, allow_data_change: bool = False) -> RunResult:
    """Train according to `cfg` (a validated `schema.PretrainConfig`)."""
    from bertgpu.train import distributed

    check_config(cfg)
    # Rank 0 holds the run folder's lock for the whole run (RANK is set by torchrun and --nproc
    # before the process group exists; the launcher itself checked the lock before starting us).
    with run_folder_lock(Path(cfg.out), hold=os.environ.get("RANK", "0") == "0"), \
            distributed.process_group(cfg.impl.device, cfg.distributed.timeout_minutes,
                                      strategy=cfg.distributed.strategy) as info:
        return _train(cfg, info, allow_data_change)


def _train(cfg: Any, info: Any, allow_data_change: bool) -> RunResult:
    """Build and run the loop; the loop (and the DDP or FSDP model in it) dies with this frame,
    before the process group is torn down. First the ranks agree on what they train."""
    agree(cfg, info, allow_data_change)
    done = finished_run(cfg, say=info.is_main)
    if done is not None:
        return done
    check_not_past_max_steps(Path(cfg.out), cfg.train.max_steps)
    res = build(cfg, info, allow_data_change).run()
    return RunResult(Path(cfg.out), res.step, res.export_dir, res.preempted, res.last_eval,
                     res.exit_status)


def finished_run(cfg: Any, say: bool = True) -> RunResult | None:
    """The run in `cfg.out` if it already ended at its newest checkpoint (an `end` record there,
    reason max_steps or budget), with its Hugging Face export written after that checkpoint, and
    this config would take no step from there: the step is at or past its train.max_steps, or
    (budget mode) its train.budget_hours is spent by the checkpoint's budget clock (the run ended
    on its budget and the budget was not raised since, or the clock is past the new one). A
    re-run of the finished command then says so in one line and returns, instead of evaluating
    and exporting the same weights again. None otherwise (no run, steps or budget left, an
    export missing)."""
    from bertgpu.config import overrides
    from bertgpu.fsutil import COMPLETE
    from bertgpu.step_folders import complete_steps
    from bertgpu.telemetry.records import read_metrics

    run_dir, t = Path(cfg.out), cfg.train
    steps = complete_steps(run_dir / "checkpoints")
    export = run_dir / "hf" / "model.safetensors"
    if not steps or not export.is_file():
        return None
    step, checkpoint = steps[-1]
    if export.stat().st_mtime < (checkpoint / COMPLETE).stat().st_mtime:
        return None
    metrics = run_dir / "metrics.jsonl"
    records = read_metrics(metrics) if metrics.is_file() else []
    ends = [r for r in records if r.get("kind") == "info" and r.get("event") == "end"]
    reason = ends[-1].get("reason") if ends and ends[-1].get("step") == step else None
    if reason not in ("max_steps", "budget"):
        return None
    if t.max_steps and step >= t.max_steps:
        why, knob = f"train.max_steps {t.max_steps}", "--train.max_steps"
    elif t.budget_hours and _budget_spent(checkpoint, t.budget_hours, reason):
        why, knob = f"train.budget_hours {t.budget_hours:g} spent", "--train.budget_hours"
    else:
        return None
    check_same_model(checkpoint, overrides.config_to_dict(cfg.model))
    if say:
        print(f"{run_dir}: finished at step {step} ({why}); nothing to train. Its Hugging Face "
              f"export: {run_dir / 'hf'} (raise {knob} to train on)", flush=True)
    return RunResult(run_dir, step, run_dir / "hf")


def _budget_spent(checkpoint: Path, budget_hours: float, reason: str) -> bool:
    """Whether a budget of `budget_hours` is used up at `checkpoint`, by the budget clock it
    stored: its elapsed time reaches the budget, or the run ended on its budget (`reason`) and
    this budget is not larger than the one it had."""
    clock = checkpoint_budget(checkpoint)
    if clock is None:
        return False
    budget_s = budget_hours * 3600.0
    return clock["elapsed_s"] >= budget_s or (reason == "budget" and budget_s <= clock["budget_s"])


def build(cfg: Any, info: Any, allow_data_change: bool = False) -> Any:
    """The training loop of a pretraining run, resumed from its newest checkpoint if any."""

    from bertgpu.config import overrides, render, schema
    from bertgpu.config.sections import resolved_unpad
    from bertgpu.data.loaders import PretrainLoader
    from bertgpu.data.masking import MaskingConfig
    from bertgpu.tasks.pretraining import (
        PretrainData,
        PretrainTask,
        checkpoint_files,
        copy_tokenizer,
    )
    from bertgpu.train import loop
    from bertgpu.train.checkpoint import load_resume
    from bertgpu.train.schedule import warmup_note

    check_config(cfg)  # before load_resume's collective: no rank has written anything yet
    run_dir, t, impl = Path(cfg.out), cfg.train, cfg.impl
    data = PretrainData(cfg.data.dir, cfg.data.objective, t.with_nsp)
    model_fields = overrides.config_to_dict(cfg.model)
    resume = load_resume(run_dir, info)
    if resume is not None:
        check_same_model(resume[0], model_fields, cfg.optim.name)
    # The init's tokenizer first: shards of another tokenizer fail check_model too, but its
    # hint (set model.pad_token_id ...) is one that --init refuses.
    init = _init_source(cfg, data, resume)
    data.check_model(model_fields, resume[2].get("tokenizer_hash") if resume else None)

    # Batch arithmetic, validated before any model is built.
    micro = (_auto_micro_batch(cfg, data, info) if impl.micro_batch_size == "auto"
             else impl.micro_batch_size)
    accumulation = schema.resolve_batch(t.global_batch_size, micro, info.world_size)
    # config.toml, the checkpoints' copies and the sinks get the values the run uses: the micro
    # batch, and impl.device, compile and unpad as the start-up's compute row (the device as its
    # kind, "cuda" and not rank 0's "cuda:0": every rank takes its own)
    kind = device_type(info)
    ran = dataclasses.replace(impl, device=kind if impl.device == "auto" else impl.device,
                              compile=impl.compile_on(kind), unpad=resolved_unpad(
                                  impl.unpad, info.device, t.precision, impl.cuda_graphs(kind)))
    resolved = resolved_config(dataclasses.replace(cfg, impl=ran), micro, data.train.objective,
                               data.with_nsp)
    text = config_text(resolved, info.world_size, accumulation)
    peak_lr = schema.scaled_lr(cfg.optim.lr, t.global_batch_size, cfg.optim.reference_batch_size,
                                   cfg.optim.lr_scaling)

    model, engine, timer, init_rows = _model_and_engine(cfg, model_fields, data.with_nsp, peak_lr,
                                                        info, init)
    if info.is_main:  # once the shards, the init and the model have passed their checks
        _warn_untrained_rows(cfg.model.vocab_size, data, cfg.init)

    masking = MaskingConfig(mask_rate=cfg.data.mask_rate, whole_word=cfg.data.whole_word_masking)
    # validation masks single tokens, as every recipe's: whole words would be a harder task
    eval_masking = MaskingConfig(mask_rate=cfg.data.eval_mask_rate, whole_word=False)
    loader = PretrainLoader(data.train, masking, t.global_batch_size, micro, rank=info.rank,
                            world_size=info.world_size, seed=cfg.seed, num_workers=impl.num_workers,
                            pin_memory=info.device.startswith("cuda"),
                            bucket_window=impl.bucket_window, allow_seed_change=allow_data_change,
                            static_shapes=impl.cuda_graphs(kind), compiled=ran.compile)
    # notes: in the warm-up, a batch larger than the split, word starts unused, unchecked init
    for note in (warmup_note(cfg.schedule, t, peak_lr), loader.repeats_note(), lamb_note(cfg.optim),
                 data.whole_word_note(cfg.data.whole_word_masking), data.unchecked_init_note()):
        if note and info.is_main:
            warnings.warn(note, stacklevel=2)
    task = PretrainTask(data, model, loader, masking, eval_masking, seed=cfg.seed, run_dir=run_dir,
                        eval_sequences=t.eval_sequences, autocast=engine.autocast, info=info,
                        allow_data_change=allow_data_change,
                        rows_vary=cfg.distributed.balance == "auto")
    training = loop.Loop(task, model, engine, info, run_dir=run_dir, train=t, schedule=cfg.schedule,
                         peak_lr=peak_lr, checkpoint=cfg.checkpoint, dist=cfg.distributed,
                         logging=cfg.logging, seed=cfg.seed,
                         config=overrides.config_to_dict(resolved), title="bertgpu pretrain",
                         startup_rows=[*startup_rows(cfg, data, model, peak_lr, micro,
                                                      accumulation, info), *init_rows],
                         checkpoint_files=lambda: checkpoint_files(text, model, run_dir),
                         final_checkpoint=True, flops_per_token=_flops_per_token(cfg, data),
                         comm_timer=timer, resume=resume, evaluate_first=init is not None)
    # Written once the checkpoint has been restored: a resume it refuses (another seed, other
    # data) leaves the run folder as it was.
    if info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume is not None:  # compared as asked where a value was resolved (auto, none)
            keep_config_history(run_dir, text, int(resume[2]["step"]), render.dump_toml(cfg))
        (run_dir / "config.toml").write_text(text, encoding="utf-8")
        copy_tokenizer(data, run_dir)
    return training


def _warn_untrained_rows(vocab_size: int, data: Any, init: str | None = None) -> None:
    """A model vocabulary over twice the tokenizer's: the rows past the tokenizer's ids never
    appear in a batch, so they stay at their initialisation (and cost memory and time). With
    `init` the vocabulary is the init's, and such a gap means shards of another tokenizer."""
    have = data.train.vocab_size
    if vocab_size <= 2 * have:
        return
    head = (f"model.vocab_size {vocab_size} is {vocab_size / have:.1f}x the shard set's "
            f"vocabulary ({have} tokens, {data.train.manifest_path}): its "
            f"{vocab_size - have:,} other rows are never trained; ")
    fix = (f"the shards were probably made with another tokenizer than {init}'s: prepare them "
           "with the init's vocabulary" if init else
           f"set model.vocab_size {have} (the tokenizer's size) to drop them")
    warnings.warn(head + fix, stacklevel=2)


def _init_source(cfg: Any, data: Any, resume: Any) -> Any:
    """The weights of `init` (config/continued.py, train/continued.py) for a new run, checked
    against the shards; None without init, or when the run resumes from its own checkpoint."""
    from bertgpu.tasks.pretraining import open_checked

    if not cfg.init or resume is not None:  # a run's own checkpoint is newer than the init
        return None
    return open_checked(cfg.init, data)


def _model_and_engine(cfg: Any, model_fields: dict[str, Any], with_nsp: bool, peak_lr: float,
                      info: Any, init: Any = None) -> Any:
    """The model (the same initial weights on every rank: the seed's, then `init`'s), its
    engine, and the start-up rows that say what `init` brought."""
    import torch

    from bertgpu.config import continued as continued_config
    from bertgpu.config.sections import resolved_unpad
    from bertgpu.models.build import build_model
    from bertgpu.train import continued
    from bertgpu.train.engine import build_engine, seed_dropout

    # the same initial weights on every rank (DDP also broadcasts rank 0's)
    torch.manual_seed(cfg.seed)
    model = build_model(model_fields, "pretraining", with_nsp=with_nsp)
    rows: list[tuple[str, str]] = []
    if init is not None:
        rows = continued.load_weights(model, init, cfg.resume_optimizer)
        changed = continued_config.changes(  # the [model] fields set otherwise than init's
            cfg.model, continued_config.init_model(cfg.init, None, "config"))
        if changed:
            rows.append(("init: model changed", ", ".join(changed)))
    elif cfg.init:
        rows = [("init", f"{cfg.init}: not read (the run resumes from its own checkpoint)")]
    model = model.to(torch.device(info.device))
    model.unpad_enable(resolved_unpad(cfg.impl.unpad, info.device, cfg.train.precision,
                                      cfg.impl.cuda_graphs(device_type(info))))
    model.gradient_checkpointing_enable(cfg.impl.gradient_checkpointing)
    engine, timer = build_engine(model, info, lr=peak_lr, train=cfg.train, optim=cfg.optim,
                                 impl=cfg.impl, dist=cfg.distributed)
    if init is not None and cfg.resume_optimizer:
        continued.load_optimizer_state(engine.optimizer, init, cfg.optim.name, model)
    seed_dropout(cfg.seed, info.rank)
    return model, engine, timer, rows


def _flops_per_token(cfg: Any, data: Any) -> float:
    """MFU's FLOPs per real token, rows as full (NSP's short rows: +0.05% at T=128, +1% at 512)."""
    from bertgpu.telemetry import flops

    return flops.flops_per_token_from_config(cfg.model, data.train.seq_len,
                                             mlm_fraction=cfg.data.mask_rate,
                                             with_nsp=data.with_nsp)


def _auto_micro_batch(cfg: Any, data: Any, info: Any) -> int:
    """impl.micro_batch_size = "auto": the largest micro batch that fits this device (probed with
    real steps on CUDA, estimated from free RAM elsewhere), the smallest over all ranks, rounded
    down to a divisor of the per-device batch so the global batch stays exact."""
    import torch

    from bertgpu.train import autobatch

    t, device = cfg.train, torch.device(info.device)
    found = autobatch.find_pretrain_micro_batch(  # collective: the smallest over all ranks
        cfg.model, seq_len=data.train.seq_len,
        device=device, dtype=t.precision, with_nsp=data.with_nsp,
        grad_ckpt=cfg.impl.gradient_checkpointing, compile=cfg.impl.compile_on(device.type),
        optimizer=cfg.optim.name, max_batch=max(t.global_batch_size // info.world_size, 1))
    micro, _ = autobatch.resolve_auto_batch(t.global_batch_size, info.world_size, found)
    if info.is_main:
        print(f"micro_batch_size auto: {found} fits, using {micro}", flush=True)
    return micro


if __name__ == "__main__":  # pragma: no cover
    from bertgpu.cli import main as cli_main

    sys.exit(cli_main(["pretrain", *sys.argv[1:]]))
