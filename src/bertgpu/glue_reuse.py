"""Whether `bertgpu glue` may count a finished run in its table: the same init checkpoint, data
files and settings as this command's (lr, epochs and max_seq_len compared as used, given or
chosen by the model), and every task still to run readable before the first one trains.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    from bertgpu.tasks.init_model import InitCheckpoint


def read_before_training(present: list[Any], seeds: list[int], out: Path, force: bool,
                          data_dir: str | os.PathLike[str], skip_malformed: bool,
                          predict_test: bool = False) -> None:
    """Read the train and dev files of every task still to run, before the first one trains: a
    malformed row in QQP's train.tsv stopped the command after CoLA, SST-2, MRPC and STS-B had
    trained, and its advice (--skip_malformed true) then refused those runs as made otherwise.
    With `predict_test`, its test files too (those there, as the run reads them): a malformed
    SST-2 test.tsv stopped the command after CoLA had trained. A finished run without test
    predictions runs again then, so its files are read as well."""
    from bertgpu.tasks import glue as tasks_mod
    from bertgpu.tasks import glue_files
    from bertgpu.tasks.glue_job import read_test_splits

    for task in present:
        runs = [out / task.name / f"seed_{s}" for s in seeds]
        if not force and all((run / "results.json").is_file()
                             and (not predict_test or (run / "submission").is_dir())
                             for run in runs):
            continue
        # (the run itself says how many rows it skipped, and which test file is missing)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for split in ("train", *task.dev_splits):
                glue_files.read_examples(task, tasks_mod.find_split_file(data_dir, task, split),
                                         skip_malformed=skip_malformed)
            if predict_test:
                read_test_splits(task, data_dir)


def check_same_settings(path: Path, results: dict[str, Any], cfg: Any, seed: int,
                         init: str | os.PathLike[str],
                         config_from: str | os.PathLike[str] | None,
                         ckpt: InitCheckpoint | None = None,
                         data_dir: str | os.PathLike[str] | None = None,
                         used: dict[str, Any] | None = None,
                         files: dict[str, dict[str, str]] | None = None,
                         world_size: int = 1) -> None:
    """A finished run counts in this command's table only when it was made the same way: from
    the same checkpoint `ckpt` (what `init` resolved to: init_model.resolve_init; None for
    random), not merely the same --init, whose newest checkpoint moves while pretraining goes
    on, with the same settings (`used`: `as_used`'s), on the same --data-dir (compared resolved:
    a relative path recorded, resolved from here, matches the same folder given absolutely), the
    same task files (`files`: `glue_job.data_files` now) and the same steps per epoch on this
    command's `world_size` devices (an epoch's last, smaller step is left out when a device would
    get no sequence of it)."""
    from bertgpu.tasks.init_model import checkpoint_change

    differs = _config_differences(results, cfg, seed, used)
    then = (results.get("init"), results.get("config_from"))
    now = (str(init), str(config_from) if config_from else None)
    changes = []
    if ckpt is None or then[0] == "random":
        if then[0] != now[0]:
            changes.append(f"init {then[0]} (now {now[0]})")
    else:
        change = checkpoint_change(results.get("init_checkpoint"), then[0], ckpt)
        if change is not None:
            changes.append(f"init {change}")
    if then[1] != now[1]:
        changes.append(f"config_from {then[1]} (now {now[1]})")
    recorded = results.get("data")
    if (data_dir is not None and isinstance(recorded, str)
            and Path(recorded).resolve() != Path(data_dir).resolve()):
        changes.append(f"data {recorded} (now {data_dir})")
    elif files and isinstance(results.get("data_files"), dict):
        changes += _changed_files(results["data_files"], files)
    changes += _steps_change(results, cfg, world_size)
    differs = ", ".join([*changes, differs] if differs else changes)
    if differs:
        raise BertgpuError(f"{path}: made with {differs}; a table would mix the two settings: "
                           "pass --force to re-run it with this command's, or use another --out")


def _steps_change(results: dict[str, Any], cfg: Any, world_size: int) -> list[str]:
    """The steps per epoch a finished run took on its devices, where this command's would take
    others (a seed trained on 2 processes, 3 sequences left out of each epoch, had counted in
    a table with seeds trained on 1)."""
    from bertgpu.tasks.finetuning import epoch_steps

    then, n, g = results.get("world_size"), results.get("train_sequences"), cfg.global_batch_size
    if not all(isinstance(v, int) and v > 0 for v in (then, n, g)) or then == world_size:
        return []
    before, now = epoch_steps(n, g, then), epoch_steps(n, g, world_size)
    return [] if before == now else [f"{then} process{'es' if then > 1 else ''}, {before} steps "
                                     f"an epoch (now {now} on {world_size})"]


def _changed_files(recorded: dict[str, Any], now: dict[str, dict[str, str]]) -> list[str]:
    """The task's files that differ from those a finished run recorded (their sha256): a dev set
    edited in place under the same --data-dir scored seeds of one table on two sets."""
    return [f"{now[split]['file']} changed since (another sha256)" for split in sorted(now)
            if isinstance(recorded.get(split), dict)
            and recorded[split].get("sha256") != now[split]["sha256"]]


def as_used(cfg: Any, init: str | os.PathLike[str],
             config_from: str | os.PathLike[str] | None) -> dict[str, Any]:
    """lr, epochs and max_seq_len as a run of this command uses them: given, or chosen by model
    size and positions (what a finished run's results.json records either way)."""
    from bertgpu.config.finetune import finetune_defaults
    from bertgpu.models.hf_io import read_config, resolve_checkpoint_folder
    from bertgpu.tasks.glue_job import DEFAULT_MAX_SEQ_LEN
    from bertgpu.tasks.init_model import sequence_length

    model = config_from if str(init) == "random" else init
    hidden = read_config(resolve_checkpoint_folder(model)).get("hidden_size")
    lr, epochs = finetune_defaults(int(hidden)) if isinstance(hidden, int) else (None, None)
    seq, _ = sequence_length(cfg, DEFAULT_MAX_SEQ_LEN, str(init), config_from)
    return {"lr": cfg.lr if cfg.lr is not None else lr, "max_seq_len": seq,
            "epochs": cfg.epochs if cfg.epochs is not None else epochs}


def _config_differences(results: dict[str, Any], cfg: Any, seed: int,
                        used: dict[str, Any] | None = None) -> str:
    """"epochs 2 (now 3), ..." for settings that differ between a finished run and this command.
    `used` (`as_used`): lr, epochs and max_seq_len compared as used, given or chosen by the
    model (an lr given once and left to the model size the next time mixed two lrs in one
    table; max_seq_len 128 given was refused against the default's 128)."""
    from bertgpu.config.overrides import config_to_dict
    from bertgpu.tasks.finetune_output import RESUME_NEUTRAL  # (how it logs, not what it learns)

    now = {**config_to_dict(cfg), "seed": seed}
    then = {**results.get("config", {})}
    if used:  # results.json's config has lr and epochs as used, its max_seq_len as given
        then["max_seq_len"] = results.get("max_seq_len", then.get("max_seq_len"))
        now.update((k, v) for k, v in used.items() if v is not None)
    defaults = config_to_dict(type(cfg)())
    # lr / epochs left to the model size (None) were recorded as the run resolved them; a key
    # newer than the run's results.json counts as its default, and so does a default an older
    # bertgpu recorded as its value (doc_stride 128, none now).
    former = {"doc_stride": 128}
    return ", ".join(f"{k} {then.get(k)} (now {v})" for k, v in now.items()
                     if then.get(k, defaults.get(k)) != v and k not in RESUME_NEUTRAL
                     and not (v is None and k in ("lr", "epochs"))
                     and not (v is None and k in former and then.get(k) == former[k]))


def finished_results(run_dir: Path) -> Path | None:
    """The results.json of the finished run in TASK/seed_N, None if none: that of its
    TASK/seed_N.tmp when a stop cut the run's last move (`finish_cut_move`; newer than a
    seed_N there, which it replaces), else its own."""
    from bertgpu.fsutil import is_scratch

    work = run_dir.with_name(run_dir.name + ".tmp")
    if is_scratch(work) and (work / "results.json").is_file():
        return work / "results.json"
    return run_dir / "results.json" if (run_dir / "results.json").is_file() else None


def finish_cut_move(run_dir: Path) -> None:
    """Rank 0: a TASK/seed_N.tmp that holds its results.json finished, a stop cutting its last
    move short (its checkpoints dropped, seed_N.tmp renamed seed_N): the move is finished here,
    as `finetune` does (finetune_output.finished_run). glue runs finetune with force, which
    skipped that: the seed trained again from scratch."""
    from bertgpu.fsutil import replace_dir
    from bertgpu.tasks.finetune_output import FINETUNE_OUTPUT, drop_checkpoints, is_finetune_output

    work = run_dir.with_name(run_dir.name + ".tmp")
    if finished_results(run_dir) != work / "results.json":
        return
    warnings.warn(f"{work}: holds this run finished, its last move cut short by a stop; moved "
                  f"to {run_dir}", stacklevel=2)
    drop_checkpoints(work)
    replace_dir(work, run_dir, replaces=is_finetune_output, what=FINETUNE_OUTPUT)
