"""What a pretraining run folder may be, and what a resume may change.

`check_run_folder`: a new or empty `--out`, or the folder of an earlier run (never a user's files
or a shard set). `check_device`: `impl.device` is one this machine has. `check_same_model`: a
resume keeps the checkpoint's `[model]` (dropout and initialisation aside). `config_text`: the
config.toml of a run, the values it used (`resolved_config`). `keep_config_history`: a resume
with other settings says which, and keeps the earlier config.toml as `config.step_N.toml`.
`check_not_past_max_steps`: a resume never starts past train.max_steps. `check_resumable`: a run
that finished and lost its checkpoints is not started over. `bertgpu pretrain` calls them before
anything loads (and before `--nproc` starts workers).
`checkpoint_budget`: the budget clock a checkpoint stored (is a finished budget run finished for
this config too?). `run_folder_lock`: one `bertgpu pretrain` at a time writes a run folder (two
would interleave checkpoints and metrics.jsonl and overwrite each other's export).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import RUN_LOCK
from bertgpu.locks import can_lock, release, try_flock
from bertgpu.telemetry.sinks import flatten_config

RUN_FILES = ("config.toml", "metrics.jsonl", "checkpoints")
"""What an earlier `bertgpu pretrain` leaves in its run folder; a non-empty --out holds one."""
OTHER_OUTPUTS = ("manifest.json", "results.json")
"""A shard set's and a fine-tuning's own files: such a folder is not a run to resume."""
LOCK_FILE = RUN_LOCK
"""Held (flock) by the process that trains in the run folder; left behind, never a sign of a run."""
SHARED_CHECK = ".bertgpu-shared-check"
"""Rank 0's token at a job's start-up (train/rank_agreement.py), which every other rank must read
back; removed once read, and never a sign of a run when a killed job left it."""
RESOLVED = {"impl.micro_batch_size": "auto", "data.objective": "none", "train.with_nsp": "none",
            "impl.device": "auto", "impl.compile": "auto", "impl.unpad": "auto"}
"""Keys whose config.toml value is the one the run used, with the placeholder a config may give
them (as TOML reads it): the micro batch `auto` picked, the shard set's objective, whether the
NSP head trains, and the device kind, compile and unpad settings `auto` resolved to."""


def check_run_folder(run_dir: Path, inputs: dict[str, str | None] | None = None) -> None:
    """`run_dir` does not exist, is empty, or is a run folder of an earlier pretrain (RUN_FILES):
    a run never writes its checkpoints, export and tokenizer among a user's files or into a
    shard set. Nor inside one of its `inputs` ({flag: folder}: the shard set, the init): a run in
    the shard set's tokenizer/ copied that folder into itself until the recursion limit, and one
    beside the shards was deleted by the next `prepare --overwrite`."""
    from bertgpu.fsutil import within

    _check_run_folder(run_dir)
    check_resumable(run_dir)
    for flag, folder in (inputs or {}).items():
        local = folder and "://" not in str(folder) and Path(folder).exists()
        if local and within(run_dir, folder):
            raise BertgpuError(f"{run_dir}: lies inside {folder} ({flag}), which the run reads; "
                               "expected a run folder outside it (e.g. runs/NAME beside it)")


def _check_run_folder(run_dir: Path) -> None:
    from bertgpu.fsutil import check_output_folder
    from bertgpu.step_folders import run_of_checkpoint

    check_output_folder(run_dir, "a run folder")
    run = run_of_checkpoint(run_dir)
    if run is not None:  # its config.toml would pass for a run's, its checksums then fail
        raise BertgpuError(f"{run_dir}: a checkpoint of the run {run}, not a run folder; "
                           f"expected a new or empty folder, or a run folder to resume ({run} "
                           "resumes from its newest good checkpoint)")
    if not run_dir.is_dir():
        return
    names = sorted(e.name + ("/" if e.is_dir() else "") for e in run_dir.iterdir()
                   if e.name not in (LOCK_FILE, SHARED_CHECK))
    found = {n.rstrip("/") for n in names}
    if not names or (found & set(RUN_FILES) and not found & set(OTHER_OUTPUTS)):
        return
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise BertgpuError(f"{run_dir}: a folder that is not a pretraining run (it holds {shown}); "
                       "expected a new or empty folder, or a run folder to resume (config.toml, "
                       "metrics.jsonl, checkpoints/)")


def check_resumable(run_dir: Path) -> None:
    """A run folder without a checkpoint starts over, as after a crash before the first one;
    refuse it in one line when the run got further: it finished (an end record of max_steps or
    budget in metrics.jsonl) or left its Hugging Face export hf/. Its checkpoints were removed
    (to free disk, say), and starting over trained from random weights, cut its metrics.jsonl,
    replaced config.toml and overwrote hf/, all without a word. A run stopped (preempted, an
    error) before its first checkpoint produced no model: it starts over, as before."""
    from bertgpu.step_folders import complete_steps
    from bertgpu.telemetry.records import read_metrics

    if not run_dir.is_dir() or complete_steps(run_dir / "checkpoints"):
        return
    hf = run_dir / "hf"
    export = hf.is_dir() and any(hf.iterdir())
    metrics = run_dir / "metrics.jsonl"
    try:
        records = read_metrics(metrics) if metrics.is_file() else []
    except BertgpuError:  # a broken line: the export alone decides
        records = []
    ends = [r for r in records if r.get("kind") == "info" and r.get("event") == "end"
            and r.get("reason") in ("max_steps", "budget")]
    if not ends and not export:
        return
    steps = [r["step"] for r in (ends or records) if isinstance(r.get("step"), int)]
    if ends:
        held = (f"a run that finished at step {steps[-1] if steps else '?'} "
                f"({ends[-1]['reason']}, its end record in metrics.jsonl)")
    else:
        held = f"a run that trained to step {max(steps)}" if steps else "a run"
    held += " and its Hugging Face export hf/" if export else ""
    raise BertgpuError(
        f"{run_dir}: holds {held}, but no checkpoint to resume from (checkpoints/ is empty or "
        "gone); restore its checkpoints/ to train on, or give another --out (or remove "
        f"{run_dir}) to start over")


def check_device(device: str) -> None:
    """impl.device is one this machine has: CUDA visible (and cuda:N in range), MPS built in."""
    if device in ("auto", "cpu"):
        return
    import torch

    cuda = torch.cuda.is_available()
    others = "auto or cpu" + (" or cuda" if cuda else "")
    if device == "mps":
        if not torch.backends.mps.is_available():
            raise BertgpuError(f"config: impl.device = 'mps': PyTorch has no MPS device on this "
                               f"machine; expected {others}")
        return
    if not cuda:
        raise BertgpuError(f"config: impl.device = {device!r}: no CUDA device is visible to this "
                           f"process; expected {others}")
    count, index = torch.cuda.device_count(), device.partition(":")[2]
    if index and int(index) >= count:
        raise BertgpuError(f"config: impl.device = {device!r}: {count} GPU"
                           f"{'s are' if count > 1 else ' is'} visible; expected cuda:N with N in "
                           f"[0, {count}), or cuda")


def resolved_config(cfg: Any, micro_batch_size: int, objective: str, with_nsp: bool) -> Any:
    """`cfg` (a PretrainConfig) with the values the run uses for its placeholders (RESOLVED):
    what config.toml, the checkpoints' copies and the metric sinks get."""
    return dataclasses.replace(
        cfg, impl=dataclasses.replace(cfg.impl, micro_batch_size=micro_batch_size),
        data=dataclasses.replace(cfg.data, objective=objective),
        train=dataclasses.replace(cfg.train, with_nsp=with_nsp))


def config_text(cfg: Any, world_size: int, accumulation: int) -> str:
    """config.toml of a run: the resolved `cfg` (`resolved_config`), after a comment with the
    number of devices (no setting holds it: --nproc or torchrun chose it) and the batch
    arithmetic. The comment is no setting: a resume on other devices changes none."""
    from bertgpu.config.render import dump_toml

    t, i = cfg.train, cfg.impl
    devices = f"{world_size} device{'s' if world_size != 1 else ''}"
    return (f"# resolved for {devices}: global batch {t.global_batch_size} = micro batch "
            f"{i.micro_batch_size} x accumulation {accumulation} x {devices}\n" + dump_toml(cfg))


def keep_config_history(run_dir: Path, text: str, step: int, asked: str | None = None) -> None:
    """A run resumed at `step` with other settings (lr, global batch, schedule: what may
    change) says which in one line, and keeps the run's config.toml of the steps before as
    `config.step_N.toml` (N = `step`; `config.step_N.2.toml`, ... when the run resumes at N
    again with other settings) before `text` replaces it: the run folder keeps the settings of
    every stretch of steps.

    `asked`: the config as given (TOML), when `text` holds resolved values (RESOLVED). A key asked
    as its placeholder, or one that the earlier config.toml holds as its placeholder (written
    before config.toml held resolved values), is compared as asked: the same command run again
    changes no setting, even where `auto` picks another micro batch on this start."""
    from bertgpu.config.overrides import read_toml, tomllib

    path = run_dir / "config.toml"
    if not path.is_file():
        return
    try:
        before: dict[str, Any] | None = flatten_config(read_toml(path))
    except BertgpuError:  # unreadable: kept aside all the same
        before = None
    after = flatten_config(tomllib.loads(text))
    given = flatten_config(tomllib.loads(asked)) if asked is not None else after
    if before is None:
        changed = ["(the run's config.toml could not be read)"]
    else:
        # A key the earlier config.toml lacks (a setting added since that run started) counts as
        # what this version reads it as, its default: an upgrade mid-run changes no setting.
        before = {**{k: v for k, v in _as_read_now(path).items() if k in after}, **before}
        changed = [f"{k} {shown_value(after.get(k, 'unset'))} "
                   f"(was {shown_value(before.get(k, 'unset'))})"
                   for k in sorted(set(after) | set(before)) if after.get(k) != before.get(k)
                   and not _as_asked(k, before.get(k), given.get(k)) and k != "out"
                   and not _same_folder(k, before.get(k), after.get(k))]
        # (`out` is where the run folder is, not how it trains: a copy resumed changes nothing)
    if not changed:
        return
    earlier, aside, k = path.read_bytes(), run_dir / f"config.step_{step}.toml", 1
    while aside.exists() and aside.read_bytes() != earlier:  # resumed at `step` before
        k += 1
        aside = run_dir / f"config.step_{step}.{k}.toml"
    if not aside.exists():
        tmp = aside.with_name(aside.name + ".tmp")
        tmp.write_bytes(earlier)
        os.replace(tmp, aside)
    print(f"{run_dir}: resuming at step {step} with changed settings: {', '.join(changed)} "
          f"(the earlier config.toml is kept as {aside.name})", flush=True)


def _same_folder(key: str, before: Any, after: Any) -> bool:
    """`data.dir` spelled two ways for one folder (`./work/data`, an absolute path) is no
    change. Named from another working folder it cannot be told apart from other shards (with
    --allow-data-change a resume takes those silently), so it is still said."""
    if key != "data.dir" or not isinstance(before, str) or not isinstance(after, str):
        return False
    try:
        return os.path.samefile(before, after)
    except OSError:
        return False


def _as_read_now(path: Path) -> dict[str, Any]:
    """config.toml at `path` as this version loads it, flattened: the keys it lacks at their
    defaults. Empty when this version cannot load it (a key since removed, say)."""
    from bertgpu.config import render, schema
    from bertgpu.config.overrides import tomllib

    try:
        cfg = schema.load_config(str(path), [], check_batch=False)
        return flatten_config(tomllib.loads(render.dump_toml(cfg)))
    except Exception:  # noqa: BLE001 - best effort: its keys are then compared as they are
        return {}


def _as_asked(key: str, before: Any, given: Any) -> bool:
    """A resolved key (RESOLVED) that this run asked as its placeholder, or that the earlier
    config.toml holds as its placeholder: no changed setting, whatever it resolved to."""
    placeholder = RESOLVED.get(key)
    return placeholder is not None and placeholder in (before, given)


def shown_value(value: Any) -> str:
    """A config value as a setting's line shows it (true, a,b, 1e-05)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(shown_value, value))
    return str(value)


def _may_change_on_resume(key: str) -> bool:
    """[model] keys a resumed run may change: dropout rates, and the initialisation (which a
    resumed run does not use). Every other key shapes the weights or what they compute."""
    return "dropout" in key or key.startswith("initializer")


def check_same_model(checkpoint: Path, model_fields: dict[str, Any],
                     optim_name: str | None = None) -> None:
    """Refuse to resume from `checkpoint` with another model: its config.toml's [model] against
    this run's, every key but dropout and initialisation. Other head counts keep every weight's
    shape, so comparing the weights would miss them. With `optim_name`, another optimizer is
    refused too: its state is the saved one's (resuming LAMB's as AdamW's was a traceback)."""
    from bertgpu.config import overrides, schema

    path = checkpoint / "config.toml"
    if not path.is_file():
        return
    config = schema.load_config(str(path), [])
    if optim_name is not None and config.optim.name != optim_name:
        raise BertgpuError(
            f"{checkpoint}: the run resumes from this checkpoint, whose optimizer state is "
            f"{config.optim.name}'s, not {optim_name}'s; resume with --optim.name "
            f"{config.optim.name}, or give another --out (--init {checkpoint} continues from "
            f"its weights with a fresh {optim_name})")
    saved = overrides.config_to_dict(config.model)  # as read here
    keys = sorted(set(saved) | set(model_fields))
    differ = [k for k in keys if not _may_change_on_resume(k)
              and saved.get(k) != model_fields.get(k)]
    if differ:
        diffs = ", ".join(f"{k} {saved.get(k)} there, {model_fields.get(k)} here" for k in differ)
        raise BertgpuError(
            f"{checkpoint}: the run resumes from this checkpoint, whose model differs from the "
            f"config's ({diffs}); resume with the run's [model] settings ({path}), or give "
            "another --out for a new run")


def check_not_past_max_steps(run_dir: Path, max_steps: int) -> None:
    """Refuse to resume a run whose newest checkpoint is past `max_steps` (0: no step limit):
    the loop would take no step and evaluate, export and end the run as finished at a step
    beyond the one asked for. Called for a run that did not finish at that checkpoint (a
    finished one is answered by `pretrain.finished_run`), before anything is written."""
    from bertgpu.step_folders import complete_steps

    steps = complete_steps(run_dir / "checkpoints")
    if not max_steps or not steps or steps[-1][0] <= max_steps:
        return
    step = steps[-1][0]
    raise BertgpuError(f"{run_dir}: the newest checkpoint is step {step}, past train.max_steps "
                       f"{max_steps}; give train.max_steps of at least {step} to go on (or use "
                       f"that checkpoint as it is: bertgpu export {run_dir} --step {step} "
                       "--out DIR)")


def checkpoint_budget(checkpoint: Path) -> dict[str, float] | None:
    """The budget clock stored in `checkpoint` (train_state.pt's "budget": `elapsed_s` trained
    and the `budget_s` the run had then), or None: a step run's checkpoint, or a state that
    cannot be read (the resume itself then says what is wrong with it). Memory-mapped, so the
    optimizer state in the same file is not read."""
    import torch

    from bertgpu.train.checkpoint import STATE_FILE

    try:
        state = torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=True,
                           mmap=True)
    except Exception:  # noqa: BLE001 - unreadable: not this function's to report
        return None
    budget = state.get("budget") if isinstance(state, dict) else None
    if not isinstance(budget, dict):
        return None
    try:
        return {"elapsed_s": float(budget["elapsed_s"]), "budget_s": float(budget["budget_s"])}
    except (KeyError, TypeError, ValueError):
        return None


def _holder(fd: int) -> str:
    """' (pid N on HOST)' from the lock file the holder wrote, or ''."""
    try:
        words = os.pread(fd, 200, 0).decode("utf-8", "replace").split()
    except OSError:
        return ""
    return f" (pid {words[0]} on {words[1]})" if len(words) == 2 else ""


@contextlib.contextmanager
def run_folder_lock(run_dir: Path, hold: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on RUN_DIR/LOCK_FILE while training, or refuse in one line when
    another process holds it. `hold=False` (the other ranks; a launcher checking before it starts
    workers, see `check_run_folder_free`) does nothing. Where the file system cannot lock (some
    network file systems), the run goes on unlocked, as before this lock existed."""
    if not can_lock(hold):
        yield
        return
    made = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise BertgpuError(f"{run_dir}: cannot write the run folder here ({e.strerror}); expected "
                           "a folder this user may create and write") from None
    try:
        taken = try_flock(fd)
        if taken is None:  # no locks on this file system
            yield
            return
        if not taken:
            raise BertgpuError(
                f"{run_dir}: another bertgpu pretrain{_holder(fd)} is training in this run folder; "
                "wait for it to end or stop it, or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield
    finally:
        release(fd)  # releases the lock
        _remove_if_unused(run_dir, made)


def _remove_if_unused(run_dir: Path, made: list[Path]) -> None:
    """A run that stopped before it wrote anything (a bad shard set, a model that does not fit
    it) leaves no folder behind: the folders this lock made are removed when the lock file is
    all they hold. (Other commands refused a folder that looked empty and held the lock file.)"""
    if not made:
        return
    try:
        if [e.name for e in run_dir.iterdir()] != [LOCK_FILE]:
            return
        (run_dir / LOCK_FILE).unlink()
        for folder in made:  # run_dir first, then the parents it needed
            folder.rmdir()
    except OSError:
        pass


def check_run_folder_free(run_dir: Path) -> None:
    """Refuse now, before `--nproc` starts workers, a run folder that another process trains in
    (the worker of rank 0 takes the lock itself)."""
    if (Path(run_dir) / LOCK_FILE).is_file():
        with run_folder_lock(Path(run_dir)):
            pass
