"""`bertgpu finetune`: one GLUE task, SQuAD v1.1/v2.0, or your own labelled files, from our run
folder or any Hugging Face BERT.

    bertgpu finetune sst2 --data glue_data --init runs/base --out ft/sst2
    bertgpu finetune mnli --data glue_data/MNLI --init bert-base-uncased/ --out ft/mnli \\
        --epochs 3 --lr 2e-5 --global_batch_size 32 --precision bf16 --nproc 2
    bertgpu finetune squad --data squad/ --init runs/base --out ft/squad
                                      # (squad/ holds train-v1.1.json, dev-v1.1.json)
    bertgpu finetune squad2 --train-file train-v2.0.json --dev-file dev-v2.0.json --init hf/ \\
        --out ft/sq2
    bertgpu finetune rte --data glue_data --init random --config-from runs/base --out ft/rte-random
    bertgpu finetune classify --train-file train.csv --dev-file dev.csv --init runs/base \\
        --out ft/mine
    bertgpu finetune ner --train-file train.conll --dev-file dev.conll --init runs/base --out ft/ner

    from bertgpu.finetune import finetune
    results = finetune("sst2", "glue_data", "runs/base", "ft/sst2", overrides=["--epochs", "2"])

Overrides are the flat `FinetuneConfig` keys (config/finetune.py), `--epochs 3 --lr=2e-5`
(`--help-config` lists them); `--train.epochs 3` is accepted as the same key. The lr and the
epochs default by model size (`finetune_config.finetune_defaults`); the start-up table and
results.json's config say what was used. `--max_seq_len` defaults to the task's (128, SQuAD
384) capped at the model's max_position_embeddings (results.json: `max_seq_len`, as used); a
larger value is refused before anything loads. SQuAD's `--doc_stride` likewise: the default (128)
becomes half of a question's window where it does not fit, a value given that does not fit is
refused (results.json: `doc_stride`, as used). GLUE .tsv rows with the wrong number of columns,
and null texts in Hugging Face exports, stop the run unless `--skip_malformed true`.

`classify` (sequence classification, text pairs, `--regression`) and `ner` (token classification)
read CSV / TSV / JSONL, and CoNLL for ner; `--text-field`, `--text-pair-field` and
`--label-field` name the columns (tasks/classify.py and ner.py); labels go into config.json.

`--init` is a bertgpu run folder (its latest checkpoint, tokenizer from RUN_DIR/tokenizer), a
checkpoint folder, or a Hugging Face BERT or ModernBERT folder with its tokenizer files;
`random` builds the architecture of `--config-from FOLDER` with fresh weights (the "no
pretraining" baseline). results.json's `init_checkpoint` records the folder loaded (a run's
step_N, its step and sha256). An init's classifier of the task's size is kept when its labels
are the task's (put in the task's order) or unnamed, else started fresh (tasks/init_model.py).

This module wires the job (tasks/registry.py), the fine-tuning task (tasks/finetuning.py), the
engine and the one training loop (train/loop.py).

OUT/ (written as OUT.tmp and renamed when complete): results.json (metrics per epoch, final and
best, resolved config, speed, device), metrics.jsonl, model/ (Hugging Face export), predictions.json
(SQuAD; v2.0 adds null_odds.json, span_predictions.json), submission/*.tsv (GLUE, --predict-test).
OUT.tmp/checkpoints/ holds resumable checkpoints while the run lasts (`--checkpoint_every_steps`,
always on SIGTERM, and with --predict-test the last step's, before the test predictions): the same
command resumes there, and after the end does nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.config.finetune import (
    FinetuneConfig,
    check_batch,
    job_config,
    load_finetune_config,
    peak_lr,
    resolve_finetune,
)
from bertgpu.config.overrides import config_to_dict
from bertgpu.config.render import format_help
from bertgpu.errors import BertgpuError
from bertgpu.finetune_results import write_results
from bertgpu.fsutil import make_scratch
from bertgpu.locks import check_free, output_lock
from bertgpu.tasks.finetune_output import (
    check_out,
    discard_unresumable,
    finished_key,
    finished_run,
    note_replaced,
    record_request_key,
    resumable,
    run_identity,
    scaling_note,
)
from bertgpu.tasks.init_model import (
    InitCheckpoint,
    build_model,
    find_tokenizer,
    head_rows,
    load_from,
    resolve_init,
    sequence_length,
    tokenizer_for,
)
from bertgpu.tasks.job_request import JobRequest
from bertgpu.tasks.request_key import request_key

if TYPE_CHECKING:
    from bertgpu.tasks.finetuning import Job
    from bertgpu.tasks.glue import Example, GlueTask

ACCEPTS_OVERRIDES = True
LAUNCHES_WORKERS = True
__all__ = ["finetune", "finetune_examples", "build_model", "find_tokenizer", "sequence_length",
           "tokenizer_for"]


# --------------------------------------------------------------------------------------------
# Entry points


def finetune(task: str, data: str | os.PathLike[str] | None, init: str | os.PathLike[str],
             out: str | os.PathLike[str], cfg: FinetuneConfig | None = None,
             overrides: list[str] | None = None, *,
             config_from: str | os.PathLike[str] | None = None,
             train_file: str | os.PathLike[str] | None = None,
             dev_file: str | os.PathLike[str] | None = None,
             predict_test: bool = False, text_field: str | None = None,
             text_pair_field: str | None = None, label_field: str | None = None,
             regression: bool = False, force: bool = False) -> dict[str, Any]:
    """Fine-tune on GLUE task `task` (any alias), `squad` / `squad2`, or your own files (`classify`,
    `ner`) and return results.json's content. `data`: the GLUE root or task folder; for SQuAD a
    folder with train-v1.1.json and dev-v1.1.json (v2.0 for squad2) unless `train_file` /
    `dev_file` name them; classify and ner take `train_file` and `dev_file`, with the column
    names and `regression` as tasks/classify.py and tasks/ner.py describe. A run finished at
    `out` with the same init, data and settings is not run again unless `force`."""
    from bertgpu.tasks import squad_job  # (the task modules import torch: not for --help)
    from bertgpu.tasks.registry import task_module

    check_out(out)
    cfg = load_finetune_config(cfg, overrides)
    request = JobRequest(task, data=data, train_file=train_file, dev_file=dev_file,
                         predict_test=predict_test, text_field=text_field,
                         text_pair_field=text_pair_field, label_field=label_field,
                         regression=regression)
    module = task_module(task)
    module.check_request(request)  # flag errors before the tokenizer loads
    init_s = str(init)
    tok_dir = tokenizer_for(init_s, config_from)
    ckpt = resolve_init(init_s)
    seq = sequence_length(cfg, module.DEFAULT_MAX_SEQ_LEN, load_from(init_s, ckpt), config_from)
    # results.json keeps cfg as given (and the stride used beside it)
    job_cfg = job_config(cfg, seq[0], windows=module is squad_job)

    def early_key(world_size: int) -> str:  # a finished run seen before any encoding
        return request_key(request, module.input_files(request), init_s, ckpt, config_from,
                           tok_dir, cfg, seq[0], world_size)

    return _run(lambda tokenizer: module.build_job(request, tokenizer, job_cfg), init_s,
                Path(out), cfg, tok_dir, config_from, seq, ckpt, force, early_key)


def finetune_examples(task: GlueTask | str, train: list[Example], dev: list[Example],
                      init: str | os.PathLike[str], out: str | os.PathLike[str],
                      cfg: FinetuneConfig | None = None, overrides: list[str] | None = None, *,
                      config_from: str | os.PathLike[str] | None = None,
                      name: str | None = None) -> dict[str, Any]:
    """Fine-tune on in-memory examples scored like GLUE task `task` (its kind, number of labels
    and official metrics), e.g. the demo's polarity sentences as an SST-2-style task."""
    from bertgpu.tasks import glue as glue_tasks
    from bertgpu.tasks.glue_job import DEFAULT_MAX_SEQ_LEN, examples_job

    check_out(out)
    t = glue_tasks.get_task(task)
    cfg = load_finetune_config(cfg, overrides)
    init_s = str(init)
    tok_dir = tokenizer_for(init_s, config_from)
    ckpt = resolve_init(init_s)
    seq = sequence_length(cfg, DEFAULT_MAX_SEQ_LEN, load_from(init_s, ckpt), config_from)
    job_cfg = job_config(cfg, seq[0], windows=False)

    def job_fn(tokenizer: Any) -> tuple[Job, dict[str, Any]]:
        job = examples_job(t, list(train), [("dev", list(dev))], tokenizer, job_cfg,
                           name or "in-memory examples")
        if name:
            job.name = name
        return job, {"data": "in-memory examples", "task_key": t.key, "kind": t.kind}

    return _run(job_fn, init_s, Path(out), cfg, tok_dir, config_from, seq, ckpt)


# --------------------------------------------------------------------------------------------
# One run: job -> model -> engine -> loop -> results


def _run(job_fn: Callable[[Any], tuple[Job, dict[str, Any]]], init: str, out: Path,
         cfg: FinetuneConfig, tok_dir: Path, config_from: Any,
         seq: tuple[int, str], ckpt: InitCheckpoint | None, force: bool = False,
         early_key: Callable[[int], str] | None = None) -> dict[str, Any]:
    from bertgpu.train import distributed

    t_start = time.perf_counter()  # one run at a time writes OUT (through OUT.tmp): locks.py
    with output_lock(out, "bertgpu finetune", hold=os.environ.get("RANK", "0") == "0"), \
            distributed.process_group(cfg.device, cfg.timeout_minutes) as info:
        return _run_in_group(job_fn, init, out, cfg, tok_dir, config_from, seq, ckpt, info,
                             t_start, force, early_key)


def _run_in_group(job_fn: Callable[[Any], tuple[Job, dict[str, Any]]], init: str, out: Path,
                  cfg: FinetuneConfig, tok_dir: Path, config_from: Any, seq: tuple[int, str],
                  ckpt: InitCheckpoint | None, info: Any, t_start: float,
                  force: bool = False, early_key: Callable[[int], str] | None = None
                  ) -> dict[str, Any]:
    """The run itself: its model, engine and loop die with this frame, before the process group
    is torn down (distributed.process_group). `seq`: the tokens per sequence (`sequence_length`)
    and its start-up note; `ckpt`: the checkpoint `init` resolved to (None for random); `force`:
    train even when `out` holds this run finished; `early_key`: the run's `request_key` on a
    number of processes, which finds it finished before its data is encoded."""
    from bertgpu.data.tokenizer_folder import load_tokenizer
    from bertgpu.train import distributed

    check_batch(cfg, info.world_size)  # before anything loads
    early = early_key(info.world_size) if early_key is not None and info.is_main else None
    done = _finished(out, early, "request_key", info, force)
    if done is not None:
        return done
    # Loading, timed apart from training and evaluation (results.json: load_seconds): the
    # tokenizer, reading and encoding the data, then the model, the engine (and DDP).
    t_load = time.perf_counter()
    tokenizer = load_tokenizer(tok_dir)
    pad_id = tokenizer.token_to_id("[PAD]")
    if pad_id is None:
        raise BertgpuError(f"{tok_dir}: the tokenizer has no [PAD] token (expected a "
                           "BERT vocabulary)")
    job, extra = job_fn(tokenizer)
    load_data_s = time.perf_counter() - t_load
    model = build_model(load_from(init, ckpt), job.head, job.num_labels, cfg,
                        str(config_from) if config_from else None, labels=job.labels, job=job)
    cfg, size_note = resolve_finetune(cfg, model.config.hidden_size)
    vocab = model.config.vocab_size
    if tokenizer.get_vocab_size() > vocab:
        raise BertgpuError(f"{tok_dir}: the tokenizer has {tokenizer.get_vocab_size()} tokens but "
                           f"the model's config.json says vocab_size {vocab}; expected the model's "
                           "own tokenizer")
    # the checkpoint too: a resumed run must not record another than its weights came from
    identity = run_identity({"task": job.name, **extra, "init": init,
                             "init_checkpoint": ckpt.record() if ckpt else None,
                             "config_from": str(config_from)},
                            config_to_dict(cfg), job, info.world_size)
    key = finished_key(identity, bool(job.predict_test))
    done = _finished(out, key, "run_key", info, force)
    if done is not None:
        if early and done.get("request_key") != early:  # rank 0: found here, not before encoding
            done = record_request_key(out, done, early)
        return done
    if info.is_main:
        note_replaced(out, job.name)
    work = out.with_name(out.name + ".tmp")
    try:
        loop, task = _build_loop(job, model, cfg, info, pad_id, work, tok_dir, identity, init,
                                 size_note, extra, seq, ckpt)
        timing = {"load_seconds": time.perf_counter() - t_load, "load_data_seconds": load_data_s}
        result = loop.run()
    except Exception:
        if info.is_main:
            discard_unresumable(work, out)
        raise
    if result.preempted:
        return {"preempted": True, "step": result.step, "exit_status": result.exit_status}
    results: dict[str, Any] = {}
    if info.is_main:
        timing["seconds"] = time.perf_counter() - t_start
        results = write_results(job, task, loop, result,
                                {**extra, "run_key": key, "request_key": early}, cfg, init,
                                config_from, tok_dir, out, info, timing, seq[0], ckpt)
    distributed.barrier()
    return results


def _finished(out: Path, key: str | None, field: str, info: Any, force: bool
              ) -> dict[str, Any] | None:
    """The results.json of this run finished at `out` (`key` in its `field`), on every rank once
    rank 0 has said so; None to train (`force`, another run's, or no key to compare)."""
    from bertgpu.train import distributed

    done = finished_run(out, key, field) if info.is_main and key and not force else None
    if not distributed.any_true(done is not None):  # rank 0 read it; every rank ends alike
        return None
    if done is not None:
        print(f"{done.get('task')}: {out} already holds this fine-tuning (the same init, data "
              "and settings); nothing to do (--force trains it again)", flush=True)
    return done or {}


def _build_loop(job: Job, model: Any, cfg: FinetuneConfig, info: Any, pad_id: int, work: Path,
                tok_dir: Path, identity: str, init: str, size_note: str, extra: dict[str, Any],
                seq: tuple[int, str], ckpt: InitCheckpoint | None) -> tuple[Any, Any]:
    """The training loop of one fine-tuning run in `work` (OUT.tmp), resumed from its checkpoint
    when `work` holds one of the same run (`identity`), else started afresh. `cfg` is resolved
    (lr and epochs set); `size_note` says which of them were chosen by model size; `seq` the
    tokens per sequence and how they were chosen. `work` is made (or emptied) only once the
    engine is built, so a failure before leaves no folder behind. With test predictions the
    trained step is checkpointed before its export: they come after the loop, outside its stop
    handling, and a stop there (a whole MNLI or QQP test set) threw the training away; the same
    command resumes at that step, trains nothing and predicts (write_results drops it)."""
    import torch

    from bertgpu.config.finetune import as_sections, doc_stride_note
    from bertgpu.config.sections import resolved_unpad
    from bertgpu.models.hf_export import save_pretrained
    from bertgpu.tasks.finetune_output import warn_batch_over_set, warn_left_out
    from bertgpu.tasks.finetuning import FinetuneTask, steps_per_epoch
    from bertgpu.telemetry import flops, run_logger
    from bertgpu.train import distributed, loop, readback, schedule
    from bertgpu.train.checkpoint import load_resume
    from bertgpu.train.engine import build_engine, seed_dropout
    from bertgpu.train.pretrain_startup import lamb_note

    resume = load_resume(work, info)
    if resume is not None and not resumable(work, resume[0], identity, say=info.is_main):
        resume = None  # an interrupted run of other settings or data: start over

    world = info.world_size
    micro, accumulation = check_batch(cfg, world)
    per_epoch = steps_per_epoch(job, cfg.global_batch_size, world)
    warn_left_out(job, cfg.global_batch_size, world, say=info.is_main)
    sec = as_sections(cfg, max_steps=per_epoch * cfg.epochs, eval_every=per_epoch,
                      micro_batch_size=micro)
    model = model.to(torch.device(info.device))  # then padding-free on CUDA in bf16/fp16
    model.unpad_enable(resolved_unpad(sec.impl.unpad, info.device, sec.train.precision))
    lr = peak_lr(cfg)  # after --lr_scaling; cfg.lr stays the lr as given (results.json: both)
    engine, timer = build_engine(model, info, lr=lr, train=sec.train, optim=sec.optim,
                                 impl=sec.impl, dist=sec.distributed)
    engine.advice = readback.FINETUNING_ADVICE  # its options, if it diverges
    seed_dropout(cfg.seed, info.rank)
    task = FinetuneTask(job, model, pad_id=pad_id, seed=cfg.seed,
                        global_batch_size=cfg.global_batch_size, micro_batch_size=micro,
                        epochs=cfg.epochs, eval_batch_size=cfg.eval_batch_size,
                        autocast=engine.autocast, info=info,
                        work_dir=work if info.is_main else None,
                        export=lambda: save_pretrained(model, work / "model", tokenizer=tok_dir))
    if info.is_main:
        if resume is None:  # one left over from an interrupted run is removed
            make_scratch(work, work.with_name(work.name.removesuffix(".tmp")))
        work.mkdir(parents=True, exist_ok=True)
    distributed.barrier()  # the warnings once --out is known to be a place this run can write
    warn_batch_over_set(job, cfg, lr, world, say=info.is_main)  # lr kept: scaled for cfg's batch
    schedule.warn_warmup(sec.schedule, sec.train, lr, say=info.is_main, knobs=schedule.FINETUNE)
    note = lamb_note(sec.optim, keys=("optimizer", "weight_decay"))  # LAMB that is AdamW
    if note and info.is_main:
        warnings.warn(note, stacklevel=2)
    seq_len, seq_row = seq[0], f"{seq[0]}" + (f" ({seq[1]})" if seq[1] else "")
    if job.head == "qa":
        seq_row += f", doc stride {doc_stride_note(cfg, seq_len)}"
    rows = [
        ("task", job.name), ("init", init),
        *([("init checkpoint", ckpt.text())] if ckpt is not None else []),
        ("train sequences", f"{len(job.train):,}"),
        ("eval", ", ".join(f"{e.name} {len(e.data):,}" for e in job.evals)),
        ("max sequence length", seq_row),
        ("global batch / micro / accumulation",
         f"{cfg.global_batch_size} / {micro} / {accumulation}"),
        ("steps", f"{task.total_steps:,} ({cfg.epochs} epochs x {task.steps_per_epoch})"),
        ("learning rate", f"{lr:.3g} ({cfg.optimizer}, warm-up {cfg.warmup_fraction:.0%}, "
                          f"{cfg.decay} decay" + scaling_note(cfg) + ")"),
        *([("by model size", size_note)] if size_note else []),
        *(head_rows(model) if resume is None else []),  # else the head is the checkpoint's
    ]
    logging, sink_config = run_logger.renamed_run(sec.logging, work, config_to_dict(cfg), dict(
        task=job.name, **extra, init=init, init_checkpoint=ckpt, max_seq_len=seq_len))
    lp = loop.Loop(task, model, engine, info, run_dir=work, train=sec.train, schedule=sec.schedule,
                   peak_lr=lr, checkpoint=sec.checkpoint, dist=sec.distributed, logging=logging,
                   seed=cfg.seed, config=sink_config, title="bertgpu finetune", startup_rows=rows,
                   checkpoint_files=lambda: {"finetune.json": identity},
                   final_checkpoint=bool(job.predict_test),
                   comm_timer=timer, resume=resume, task_name=job.name,
                   flops_per_token=flops.finetune_flops_per_token(
                       model, map(len, job.train.ids), job.head))
    # The task's per-epoch records carry the loop's cumulative train time (time-to-target).
    task.clock = lambda: (lp.result.train_s, lp.result.data_s) if lp.result else (0.0, 0.0)
    return lp, task


# --------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.allow_abbrev = False  # else `--seed` would be taken for a prefix of a longer flag
    parser.add_argument("task", nargs="?",
                        help="GLUE task (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli; any "
                             "alias), squad / squad2, or classify / ner (your own labelled files)")
    parser.add_argument("--data",
                        help="GLUE root or task folder; SQuAD: folder with train-/dev-v1.1.json "
                             "(squad2: train-/dev-v2.0.json)")
    parser.add_argument("--init",
                        help="run folder, checkpoint folder, Hugging Face BERT or ModernBERT "
                             "folder, or random")
    parser.add_argument("--config-from",
                        help="with --init random: folder whose config.json (and tokenizer) to use")
    parser.add_argument("--out", help="output folder (results.json, metrics.jsonl, model/)")
    parser.add_argument("--train-file",
                        help="SQuAD training JSON (instead of --data); classify / ner: the "
                             "training file (.csv, .tsv, .jsonl; ner also CoNLL)")
    parser.add_argument("--dev-file",
                        help="SQuAD dev JSON (instead of --data); classify / ner: the dev file")
    parser.add_argument("--text-field",
                        help="classify: text column (default text); ner: tokens column of "
                             ".jsonl/.csv files (default tokens)")
    parser.add_argument("--text-pair-field",
                        help="classify: second text column for pair tasks (default: none)")
    parser.add_argument("--label-field",
                        help="classify: label column (default label); ner: tags column of "
                             ".jsonl/.csv files (default tags)")
    parser.add_argument("--regression", action="store_true",
                        help="classify: labels are numeric scores (Pearson/Spearman), not classes")
    parser.add_argument("--predict-test", action="store_true",
                        help="GLUE: also write test-set predictions in leaderboard format to "
                             "OUT/submission/")
    parser.add_argument("--force", action="store_true",
                        help="train again when --out holds this run finished (the same init, data "
                             "and settings), which is otherwise left as it is")
    parser.add_argument("--help-config", action="store_true", help="list every config key and exit")
    parser.epilog = ("Overrides: --key value (or --train.key value), e.g. --epochs 3 --lr "
                     "2e-5 --seed 1")


def check_before_launch(args: argparse.Namespace, nproc: int) -> None:
    """Validate once, before `--nproc N` starts N workers."""
    missing = [flag for flag, v in (("TASK", args.task), ("--init", args.init),
                                    ("--out", args.out)) if not v]
    if missing and not args.help_config:
        raise BertgpuError(f"missing {', '.join(missing)} (bertgpu finetune TASK --data DIR --init "
                           "FOLDER --out DIR)")
    if args.out:
        check_out(args.out)
        check_free(args.out, "bertgpu finetune")  # a locked --out: before any worker starts
    cfg = load_finetune_config(None, args.overrides)
    check_batch(cfg, nproc)
    if args.init:  # the init folder and its tokenizer (the workers would each fail on it)
        tokenizer_for(str(args.init), args.config_from)
    if args.task:  # the task's own checks of its flags and files (tasks/registry.py)
        from bertgpu.tasks import squad_job
        from bertgpu.tasks.registry import task_module

        module = task_module(args.task)
        module.check_request(JobRequest(
            args.task, data=args.data, train_file=args.train_file, dev_file=args.dev_file,
            predict_test=args.predict_test, text_field=args.text_field,
            text_pair_field=args.text_pair_field, label_field=args.label_field,
            regression=args.regression))
        if args.init:  # --max_seq_len (and SQuAD's --doc_stride) against the model's positions
            seq = sequence_length(cfg, module.DEFAULT_MAX_SEQ_LEN, str(args.init),
                                  args.config_from)
            job_config(cfg, seq[0], windows=module is squad_job)


def resume_hint(args: argparse.Namespace) -> str | None:
    """After a failed `--nproc` job: what re-running the same command will do."""
    from bertgpu.train.checkpoint import hint_for

    out = Path(args.out)
    return hint_for(out.with_name(out.name + ".tmp"))


def main(args: argparse.Namespace) -> int:
    if args.help_config:
        print(format_help(FinetuneConfig))
        return 0
    check_before_launch(args, int(os.environ.get("WORLD_SIZE", "1")))  # a worker: its world
    res = finetune(args.task, args.data, args.init, args.out,
                   load_finetune_config(None, args.overrides), config_from=args.config_from,
                   train_file=args.train_file, dev_file=args.dev_file,
                   predict_test=args.predict_test, text_field=args.text_field,
                   text_pair_field=args.text_pair_field, label_field=args.label_field,
                   regression=args.regression, force=args.force)
    return res.get("exit_status", 143) if res.get("preempted") else 0


if __name__ == "__main__":  # pragma: no cover
    from bertgpu.cli import main as cli_main

    sys.exit(cli_main(["finetune", *sys.argv[1:]]))
