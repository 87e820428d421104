"""A fine-tuning run's output folder: what a new run to the same --out may replace (an earlier
fine-tuning output), the note when it will, what a failed run leaves (OUT.tmp only when it
holds a checkpoint to resume from), and which checkpoint in OUT.tmp a re-run resumes: one of the
same run (`run_identity`: task, init, data, the settings that change the result, the steps per
epoch). Another run's checkpoint is replaced, saying what changed. The number of processes is not
part of the run: a step's sequences and math do not depend on it, so a re-run on another number
resumes (as pretraining does), unless it changes the steps per epoch. A finished run's
results.json holds its `finished_key`: the same command again does nothing. Also the lines a run
prints of itself (metric_text, device_name, scaling_note)."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from bertgpu.tasks.finetuning import Job

FINETUNE_OUTPUT = "a fine-tuning output folder (the fine-tuned model and results.json)"


def json_text(value: Any, **kwargs: Any) -> str:
    """JSON of an output a user reads (results.json, predictions.jsonl, glue_results.json) as
    UTF-8 text: a label "正面", not "\\u6b63\\u9762", as SQuAD's predictions.json and the
    tokenizer files; readers parse either form to the same values (old files stay good). Escaped
    as before where it holds what UTF-8 cannot encode (a lone surrogate: a file name's
    undecodable bytes, a JSON "\\ud800" label)."""
    text = json.dumps(value, ensure_ascii=False, **kwargs)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, **kwargs)
    return text


def is_finetune_output(folder: Path) -> bool:
    """An earlier fine-tuning output, which a new run to the same --out replaces."""
    return (Path(folder) / "results.json").is_file()


def check_out(out: str | os.PathLike[str]) -> None:
    from bertgpu.fsutil import check_output_folder

    check_output_folder(out, FINETUNE_OUTPUT, replaces=is_finetune_output)


def note_replaced(out: Path, task: str) -> None:
    """An --out that holds an earlier fine-tuning is replaced when this run ends: say so at the
    start, naming what is there (a re-run of the same task, or another task's results)."""
    import warnings

    path = out / "results.json"
    if not path.is_file():
        return
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        what = f"{earlier.get('task')} from {earlier.get('init')}"
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        what = "its results.json is unreadable"
    warnings.warn(f"{out}: holds an earlier fine-tuning ({what}); this run of {task} replaces it "
                  "when it ends", stacklevel=2)


def discard_unresumable(work: Path, out: Path) -> None:
    """After a failure: OUT.tmp goes unless it holds a checkpoint to resume from (a run stopped
    part-way keeps it); without one it is only a half-written output."""
    from bertgpu.errors import BertgpuError
    from bertgpu.fsutil import is_scratch, remove_scratch
    from bertgpu.step_folders import newest_good

    if not is_scratch(work):
        return
    with warnings.catch_warnings():  # the resume said which were damaged (it said it twice)
        warnings.simplefilter("ignore")
        try:
            keep = newest_good(work / "checkpoints") is not None
        except BertgpuError:  # every one damaged: kept for the user to look at, as it was
            keep = True
    if not keep:
        remove_scratch(work, out)


RESUME_NEUTRAL = ("log_every_steps", "checkpoint_every_steps", "checkpoint_every_minutes",
                  "checkpoint_grace_s", "checkpoint_async_save", "timeout_minutes",
                  "eval_batch_size", "max_nonfinite_steps", "device", "logging")
"""Settings a resumed run may change: how it logs, checkpoints, waits and evaluates in batches,
not what it computes (a checkpoint was silently discarded for an added --log_every_steps)."""


def run_identity(fields: dict[str, Any], config: dict[str, Any], job: Job,
                 world_size: int) -> str:
    """What a checkpoint must match to be resumed (stored beside it as finetune.json): `fields`
    (task, init), the settings that change the result (`config` less RESUME_NEUTRAL), the data
    (`data_digest`) and the steps per epoch on `world_size` devices. The world size is stored to
    be named, not compared: step s trains on the same sequences, with the same loss
    normalisation, on any number of devices (tasks/finetuning.py), and the loop restores what is
    per rank (the dropout RNG) as for pretraining, reseeding it at another world size. Only the
    steps per epoch depend on it (an epoch's last, smaller step is taken only when every device
    gets a sequence of it), which moves every later step's sequences and the schedule's length."""
    from bertgpu.tasks.finetuning import steps_per_epoch

    kept = {k: v for k, v in config.items() if k not in RESUME_NEUTRAL}
    steps = steps_per_epoch(job, int(config["global_batch_size"]), world_size)
    fields = {k: v for k, v in fields.items() if k != "data_files"}  # data_digest's business
    return json.dumps({**fields, "config": kept, "data": data_digest(job),
                       "world_size": world_size, "steps_per_epoch": steps}, sort_keys=True)


def data_digest(job: Job) -> str:
    """sha256 of what a run trains and evaluates on (every sequence's tokens, token types and
    targets, in order, and each dev split's gold, `EvalSet.truth`): a checkpoint resumes only
    into the same data, whatever the files are called (a training file fixed after a crash was
    resumed into: epochs 1-4 on one dataset, 7-10 on another, reported as one run)."""
    h = hashlib.sha256()
    for ev in job.evals:  # the gold a dev split is scored against (corrected labels: another run)
        h.update(len(ev.truth).to_bytes(8, "little") + ev.truth)
    for enc in (job.train, *(ev.data for ev in job.evals)):
        rows = [enc.ids, enc.types, *(enc.token_targets[k] for k in sorted(enc.token_targets))]
        for seqs in rows:
            h.update(np.asarray([len(x) for x in seqs], dtype=np.int64).tobytes())
            if seqs:
                h.update(np.concatenate([np.asarray(x, dtype=np.int64) for x in seqs]).tobytes())
        for name in sorted(enc.targets):
            h.update(name.encode() + np.ascontiguousarray(enc.targets[name]).tobytes())
    return h.hexdigest()


def finished_key(identity: str, predict_test: bool) -> str:
    """What results.json records of its run (`run_key`): the sha256 of its `run_identity` less
    the world size, which changes no result unless the steps per epoch change with it, and
    whether it wrote test predictions (a run without them is not one with them)."""
    import hashlib

    fields = {k: v for k, v in json.loads(identity).items() if k != "world_size"}
    fields["predict_test"] = predict_test
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def finished_results(out: Path, key: str, field: str = "run_key") -> dict[str, Any] | None:
    """The results.json of a run at `out` that was this one (`finished_key`; `field`
    "request_key": tasks/request_key.py's, before the data is encoded), else None: the same
    command again after it finished changes nothing, as pretrain's does (it trained again and
    replaced the output). Results of an earlier version, without the key, are not this run's."""
    try:
        results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return results if isinstance(results, dict) and results.get(field) == key else None


def record_request_key(out: Path, results: dict[str, Any], key: str) -> dict[str, Any]:
    """`results` (OUT/results.json, this run finished by its `run_key`) with `key` as its
    `request_key`, written back (atomically, nothing else changed) where the early check missed
    it: results of an older bertgpu, without one, or of another number of processes. Else every
    later run of the same command encoded its data again before it said there was nothing to do.
    A results.json that cannot be rewritten stays as it is (a warning)."""
    if "request_key" in results:  # (in place, else after run_key, as write_results puts it)
        new = {**results, "request_key": key}
    else:
        new = {}
        for name, value in results.items():
            new[name] = value
            if name == "run_key":
                new["request_key"] = key
        new.setdefault("request_key", key)
    path = out / "results.json"
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json_text(new, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        warnings.warn(f"{path}: could not record its request_key ({e.strerror or e}); the same "
                      "command again encodes the data before it finds the run finished",
                      stacklevel=2)
        return results
    except BaseException:  # a stop half-way: no results.json.tmp left beside it
        tmp.unlink(missing_ok=True)
        raise
    return new


def drop_checkpoints(work: Path) -> None:
    """A finished run's checkpoints (OUT.tmp/checkpoints), each unsealed before it goes
    (`fsutil.remove_dir`): a stop midway leaves incomplete folders, which a resume skips, never
    a "complete" one with files missing, which it refused as damaged."""
    import shutil

    from bertgpu.fsutil import remove_dir

    folder = work / "checkpoints"
    if folder.is_dir() and not folder.is_symlink():
        for step in sorted(folder.iterdir()):
            if step.is_dir() and not step.is_symlink():
                remove_dir(step)
    shutil.rmtree(folder, ignore_errors=True)


def finished_run(out: Path, key: str, field: str = "run_key") -> dict[str, Any] | None:
    """`finished_results` of `out`, or of OUT.tmp when a stop cut this run's end short (after
    its results.json, while its checkpoints went or before OUT.tmp became OUT): that end is
    finished here (`drop_checkpoints`, the rename), not trained again."""
    from bertgpu.fsutil import is_scratch, replace_dir

    done = finished_results(out, key, field)
    work = out.with_name(out.name + ".tmp")
    if done is not None or not is_scratch(work) or finished_results(work, key, field) is None:
        return done
    warnings.warn(f"{work}: holds this fine-tuning finished, its last move cut short by a stop; "
                  f"moved to {out}", stacklevel=2)
    drop_checkpoints(work)
    replace_dir(work, out, replaces=is_finetune_output, what=FINETUNE_OUTPUT)
    return finished_results(out, key, field)


def metric_text(name: str, value: float | int) -> str:
    """A metric of the last line: a count whole (SQuAD's "total 60"), a score to 2 decimals."""
    return f"{name} {value}" if isinstance(value, int) else f"{name} {value:.2f}"


def scaling_note(cfg: Any) -> str:
    """The start-up table's lr scaling, e.g. ", 2e-05 x linear scaling from batch 32"."""
    if cfg.lr_scaling == "none":
        return ""
    return f", {cfg.lr:.3g} x {cfg.lr_scaling} scaling from batch {cfg.reference_batch_size}"


def device_name(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return (f"{device} ({platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads)")


def resumable(work: Path, checkpoint: Path, identity: str, say: bool = True) -> bool:
    """Whether `checkpoint` (OUT.tmp/checkpoints/step_N) is of this run, on any number of
    devices; if not, a one-line warning (when `say`) says what changed, and the run starts over
    (the checkpoint is replaced)."""
    try:
        stored = json.loads((checkpoint / "finetune.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = {}
    new = json.loads(identity)
    old_world, new_world = stored.pop("world_size", None), new.pop("world_size", None)
    if "steps_per_epoch" not in stored and old_world == new_world:
        # written before the identity held them: the same world size made the same steps
        stored["steps_per_epoch"] = new.get("steps_per_epoch")
    if stored == new:
        return True
    if not say:
        return False
    changes = []
    for key in sorted(set(stored) | set(new)):
        old_v, new_v = stored.get(key), new.get(key)
        if old_v == new_v:
            continue
        if key == "config" and isinstance(old_v, dict):
            changes += [f"{k} {old_v.get(k)} -> {new_v.get(k)}"
                        for k in sorted(set(old_v) | set(new_v)) if old_v.get(k) != new_v.get(k)]
        elif key == "data":
            changes.append("the training or evaluation data")
        elif key == "steps_per_epoch":
            if old_world == new_world or old_world is None:
                continue  # follows from another change listed (the data, the global batch)
            changes.append(f"world_size {old_world} -> {new_world}" + (
                f", which makes {old_v} -> {new_v} steps per epoch (an epoch's last, smaller "
                "step is taken only when every device gets a sequence of it)" if old_v else
                " (a checkpoint of an earlier version, which does not say its steps per epoch)"))
        else:
            changes.append(f"{key} {old_v} -> {new_v}")
    warnings.warn(f"{work}: its checkpoint ({checkpoint.name}) is of another run "
                  f"({', '.join(changes[:6]) or 'an older version'}); starting over",
                  stacklevel=2)
    return False


def warn_left_out(job: Job, global_batch_size: int, world_size: int, say: bool = True) -> None:
    """The start-up warning of an epoch whose last sequences no step takes: fewer than one per
    device (one process takes them in a last, smaller step; with --nproc 2 a 3-sequence set
    trained 2 steps an epoch where one process trained 4, without a word)."""
    n = len(job.train)
    left = n % global_batch_size
    if 0 < left < world_size and say:
        warnings.warn(f"{job.name}: the last {left} of {n} training sequences of each epoch are "
                      f"left out: a step takes at least one per device ({world_size}); a "
                      f"global_batch_size that leaves none, or fewer devices, keeps them",
                      stacklevel=2)


def warn_batch_over_set(job: Job, cfg: Any, lr: float, world_size: int, say: bool = True) -> None:
    """The start-up warning of a global batch larger than the training set: every step then holds
    the whole set, fewer sequences than the batch the start-up table, results.json and the GLUE
    protocol name, and an lr scaled by --lr_scaling was scaled for that batch, not the one
    trained (pretraining warns alike: loaders.repeats_note). The lr stays as configured, so that
    results do not change silently; the warning names the batch that would train as said, one
    check_batch takes (with a smaller --micro_batch_size when the given one x the devices is
    over the set: 10 sequences, --micro_batch_size 16 named a refused "--global_batch_size 10").
    Fewer sequences than devices: `warn_left_out` says what happens, no batch would fit."""
    n, g = len(job.train), cfg.global_batch_size
    if g <= n or n < world_size or not say:
        return
    unit = world_size * (cfg.micro_batch_size or 1)  # the largest batch <= n that check_batch takes
    fit = n // unit * unit
    if not fit:  # the micro batch x the devices is over the set: a micro batch that fits
        fit = n // world_size * world_size
        fit = f"{fit} --micro_batch_size {fit // world_size}"
    scaled = "" if cfg.lr_scaling == "none" else (
        f", and the lr {lr:.3g} ({cfg.lr:.3g} x {cfg.lr_scaling} scaling from batch "
        f"{cfg.reference_batch_size}) is scaled for a batch of {g}")
    warnings.warn(f"{job.name}: --global_batch_size {g} > the {n:,} training sequences: every "
                  f"step holds all {n:,} of them, not {g}{scaled}; --global_batch_size {fit} or "
                  "smaller trains at the batch it names", stacklevel=2)
