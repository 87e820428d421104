"""Checkpoints that survive faults: `RUN_DIR/checkpoints/step_N/`.

A checkpoint folder holds::

    model.safetensors   weights (no pickle), tied tensors stored once each under every name; the
                        caller's layout (full_checkpoints: Hugging Face's, models/layout.py)
    train_state.pt      optimizer, engine, loader cursor, schedule clock, RNG states (plain tensors,
                        numbers, lists and dicts only, so it loads with
                        torch.load(weights_only=True))
    config.toml, config.json, ...   any extra files the caller passes
    checksums.json      size and sha256 of every file above
    COMPLETE            written last: its presence means every other file is whole

A sharded run (`distributed.strategy = "fsdp"`, train/checkpointer.py) writes the weights and the
optimizer state with torch.distributed.checkpoint instead: `.metadata` and one `__R_0.distcp` per
rank in the same folder, a train_state.pt without the optimizer, and the same checksums and
COMPLETE; `is_sharded_checkpoint` tells the two apart, and either resumes into either strategy.

Saving checks the free space first (a warning when the checkpoint will not fit), writes
everything into `step_N.tmp/`, seals it (checksums, then COMPLETE, all flushed) and swaps it in
(`fsutil.replace_dir`: new written, old renamed aside, new renamed in, old removed). Older
checkpoints are pruned only once the new one is in place, so `keep_last = 1` never leaves a
moment without a complete checkpoint; `keep_last` counts good checkpoints only (a damaged one is
removed, never kept in place of a good one: `_prune`). A write that fails removes the `.tmp` and
raises one line naming the folder and the cause: the bytes needed and free for a full disk, "not
writable" for a permission error; earlier checkpoints are untouched.

What a training job calls: `load_resume(run_dir, info)` on every rank before the loop (rank 0
repairs, finds the newest good checkpoint and broadcasts its step; the others open that step),
and from the loop, on rank 0::

    ...
    save_checkpoint(run_dir, step, model.state_dict(), train_state, extra_files, keep_last)
    check_free_space(run_dir)            # after a save but the run's last: warns if the next
                                         # one will not fit

"Complete" and "good" are defined once, in `fsutil`; `resume_checkpoint` and `latest_checkpoint`
skip a damaged newest checkpoint (truncated file, checksum mismatch, unreadable pickle) with a
warning that names what is wrong, and fall back to the previous one.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from bertgpu import errors, fsutil, step_folders
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import CHECKSUMS, COMPLETE
from bertgpu.testing import faults
from bertgpu.train import distributed, rank_agreement

CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index, beside its *.distcp shards
_RESERVED = (MODEL_FILE, STATE_FILE, CHECKSUMS, COMPLETE)
# Per tensor: zip record and alignment (torch.save), header entry (safetensors); generous.
_BYTES_PER_TENSOR = 4096

__all__ = [
    "CHECKPOINTS", "MODEL_FILE", "STATE_FILE", "check_free_space",
    "checkpoint_dir", "checkpoint_problem", "estimate_checkpoint_bytes", "is_sharded_checkpoint",
    "latest_checkpoint",
    "list_checkpoints", "load_checkpoint", "recover_checkpoints", "resume_checkpoint",
    "capture_rng", "rng_state", "save_checkpoint", "set_rng_state",
]


def _plain_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, each with storage of its own (safetensors refuses shared memory,
    e.g. the tied word-embedding / MLM-decoder weight)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # shared with an earlier tensor, or a view into a larger buffer
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def checkpoint_dir(run_dir: str | os.PathLike[str], step: int) -> Path:
    """Where step N of a run is saved: RUN_DIR/checkpoints/step_N."""
    return Path(run_dir) / CHECKPOINTS / f"step_{step}"


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first (not verified: see `latest_checkpoint`)."""
    return step_folders.complete_steps(Path(run_dir) / CHECKPOINTS)


def checkpoint_problem(path: str | os.PathLike[str]) -> str | None:
    """None when the checkpoint folder is good, else what is wrong (incomplete, a file missing or
    truncated, a checksum mismatch). Reads every file once."""
    return fsutil.verify_folder(Path(path))


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest good checkpoint of a run, or None when it has no complete one. Newer damaged
    ones are skipped with a warning; a run whose checkpoints are all damaged is an error."""
    return step_folders.newest_good(Path(run_dir) / CHECKPOINTS)


def resume_checkpoint(
    run_dir: str | os.PathLike[str],
) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]] | None:
    """(path, model_state, train_state) of the newest checkpoint that verifies *and* loads (a
    pickle that will not load counts as damage: warning, previous one), or None when the run has
    no complete checkpoint. Rank 0 calls this; the other ranks `load_checkpoint` the step it
    found."""
    return step_folders.newest_good(Path(run_dir) / CHECKPOINTS,
                              accept=lambda p: (p, *load_checkpoint(p)))


def recover_checkpoints(run_dir: str | os.PathLike[str]) -> list[str]:
    """Repair what a crash left in RUN_DIR/checkpoints (`step_folders.recover_leftovers`):
    restore a `step_N.old` whose `step_N` is missing, remove stale `.old` and `.tmp` folders.
    Call once at start-up on rank 0, before anything is saved or listed. Returns one line per
    action."""
    return step_folders.recover_leftovers(Path(run_dir) / CHECKPOINTS)


def estimate_checkpoint_bytes(
    model_state: Mapping[str, torch.Tensor],
    train_state: Mapping[str, Any],
    extra_files: Mapping[str, str | bytes] | None = None,
) -> int:
    """Bytes a checkpoint of this state will take: every tensor's bytes (tied ones once per
    name, as they are saved) plus a margin per tensor, plus the extra files."""
    total, stack = 0, [model_state, train_state]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size() + _BYTES_PER_TENSOR
        elif isinstance(x, Mapping):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    extra = sum(len(c.encode("utf-8") if isinstance(c, str) else c)
                for c in (extra_files or {}).values())
    return total + extra + (64 << 10)


def check_free_space(run_dir: str | os.PathLike[str], needed_bytes: int | None = None) -> bool:
    """Warn, and return False, when a checkpoint of `needed_bytes` (default: the size of the run's
    newest complete checkpoint) will not fit in the free space of RUN_DIR/checkpoints. One statfs
    and a listing: cheap enough to call after every save, so a filling disk is reported one
    checkpoint interval before it stops the run; not after the run's last checkpoint, which no
    other follows (its warning would be wrong)."""
    root = Path(run_dir) / CHECKPOINTS
    if needed_bytes is None:
        found = list_checkpoints(run_dir)
        if not found:
            return True
        needed_bytes = fsutil.folder_bytes(found[-1][1])
    free = fsutil.free_bytes(root)
    if needed_bytes <= free:
        return True
    warnings.warn(
        f"{root}: the next checkpoint needs about {fsutil.human_bytes(needed_bytes)} but only "
        f"{fsutil.human_bytes(free)} is free; it will fail unless space is freed",
        stacklevel=2,
    )
    return False


class _RecordingFile:
    """A file that remembers the OSError it raised: torch's zip writer swallows it and reports
    only "unexpected pos N vs M"."""

    def __init__(self, f: Any) -> None:
        self.f, self.error = f, None

    def write(self, data: Any) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def _torch_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        rec = _RecordingFile(f)
        try:
            torch.save(obj, rec)
        except RuntimeError:
            if rec.error is not None:
                raise rec.error from None
            raise


def _write_files(tmp: Path, tensors: dict[str, torch.Tensor], train_state: Mapping[str, Any],
                 extra: Mapping[str, bytes], step: int) -> None:
    tmp.mkdir(parents=True)
    faults.slow_write(step)
    fsutil.save_safetensors(tensors, tmp / MODEL_FILE)
    faults.check_write(tmp / MODEL_FILE)
    _torch_save(dict(train_state), tmp / STATE_FILE)
    faults.check_write(tmp / STATE_FILE)
    for name, data in extra.items():
        (tmp / name).write_bytes(data)
        faults.check_write(tmp / name)
    fsutil.seal(tmp, note=f"step {step}", after_write=faults.check_write)


def _save_failed(run_dir: Path, final: Path, exc: OSError, needed: int) -> BertgpuError:
    """The one line for a save that failed: why (space figures for a full disk only), the
    checkpoint a re-run resumes from, and what to fix first (`fsutil.write_problem`)."""
    why, fix = fsutil.write_problem(final.parent, exc, needed)
    kept = [p for _, p in list_checkpoints(run_dir) if fsutil.known_problem(p) is None]
    after = (f"{kept[-1].name} is intact: {fix} and re-run the same command to resume from it"
             if kept else f"no earlier checkpoint: {fix} and re-run the same command")
    return BertgpuError(f"{final.parent}: cannot write {final.name}: {why}; {after}")


def disk_full(folder: Path, needed: int) -> OSError | None:
    """ENOSPC for a save that failed without an OSError where `folder`'s file system has no room
    for its `needed` bytes: torch's zip writer (a sharded checkpoint's files) reports a full disk
    as "unexpected pos 704 vs 598", and the one line then said nothing of the disk."""
    if fsutil.free_bytes(folder) >= needed:
        return None
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))


def _prune(run_dir: Path, final: Path, step: int, keep_last: int) -> None:
    """Keep `final` and the keep_last - 1 newest good older checkpoints. An older damaged one
    (`fsutil.known_problem`: what start-up found, a checksum mismatch included, or a file cut
    short since) is removed with a warning and not counted: it would never resume, and keeping it
    in place of a good one left a run with fewer good checkpoints than asked for. Newer ones (left
    by a run that fell back to an earlier checkpoint, often because they are damaged) stay: a
    later save of that step replaces them, or they are older by the next save."""
    older = [p for s, p in list_checkpoints(run_dir) if s < step and p != final]
    good = []
    for path in older:
        problem = fsutil.known_problem(path)
        if problem is None:
            good.append(path)
            continue
        warnings.warn(f"{path}: removed, damaged: {problem}; checkpoint.keep_last counts "
                      "good checkpoints only", stacklevel=2)
        fsutil.remove_dir(path)
    for path in good[: max(0, len(good) - (keep_last - 1))]:
        fsutil.remove_dir(path)


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model_state: Mapping[str, torch.Tensor],
    train_state: Mapping[str, Any],
    extra_files: Mapping[str, str | bytes] | None = None,
    keep_last: int = 3,
) -> Path:
    """Write `RUN_DIR/checkpoints/step_N/` atomically, then keep only the `keep_last` newest
    (keep_last <= 0 keeps all). Returns the final folder. Call on rank 0 only.

    A failed write raises BertgpuError (folder, bytes needed and free) after removing the
    partial `step_N.tmp`; every earlier checkpoint is left as it was."""
    run_dir = Path(run_dir)
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + fsutil.TMP)
    extra: dict[str, bytes] = {}
    for name, content in (extra_files or {}).items():
        if os.sep in name or name in _RESERVED:
            raise ValueError(f"extra checkpoint file name {name!r} is not allowed")
        extra[name] = content.encode("utf-8") if isinstance(content, str) else content
    tensors = _plain_tensors(model_state)
    needed = estimate_checkpoint_bytes(tensors, train_state, extra)
    check_free_space(run_dir, needed)
    try:
        if tmp.exists():  # left over from a crash
            shutil.rmtree(tmp)
        _write_files(tmp, tensors, train_state, extra, step)
        # The same step may be saved again (e.g. the end of a resumed run): replaced, no gap.
        fsutil.replace_dir(tmp, final, between=faults.between_renames)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_failed(run_dir, final, exc, needed) from None
    if keep_last > 0:
        _prune(run_dir, final, step, keep_last)
    return final


def is_sharded_checkpoint(path: str | os.PathLike[str]) -> bool:
    """True for a torch.distributed.checkpoint folder (a sharded run's), False for the single
    files of model.safetensors + train_state.pt."""
    return (Path(path) / DCP_METADATA).is_file()


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model_state, train_state) of a checkpoint folder, on CPU. Refuses pickles that contain
    anything but tensors and plain containers (torch.load with weights_only=True). A sharded
    checkpoint gives an empty model_state: its weights and optimizer state are read straight
    into the (sharded or not) model by `checkpointer.restore`, never gathered whole."""
    from safetensors.torch import load_file

    folder = Path(path)
    model_path, state_path = folder / MODEL_FILE, folder / STATE_FILE
    sharded = is_sharded_checkpoint(folder)
    for p in (state_path,) if sharded else (model_path, state_path):
        if not p.is_file():
            raise BertgpuError(f"{folder}: not a complete checkpoint ({p.name} is missing)")
    try:
        model_state = {} if sharded else load_file(str(model_path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise BertgpuError(f"{model_path}: unreadable safetensors file ({exc})") from None
    try:
        train_state = torch.load(state_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BertgpuError(
            f"refusing to load {state_path}: not a plain tensor checkpoint ({first})"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise BertgpuError(f"{state_path}: unreadable checkpoint state ({exc})") from None
    if not isinstance(train_state, dict):
        raise BertgpuError(f"{state_path}: expected a dict of training state, found "
                           f"{type(train_state).__name__}")
    return model_state, train_state


def hint_for(run_dir: str | os.PathLike[str] | None) -> str:
    """What re-running the command of `run_dir` will do, for the last line of a failed job."""
    found = list_checkpoints(run_dir) if run_dir else []
    if not found:
        return "no checkpoint was written, so re-running the same command starts over"
    step, path = found[-1]
    return f"re-running the same command resumes from step {step} ({path})"


def load_resume(run_dir: Path, info: distributed.DistInfo
                ) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]] | None:
    """(path, model state, train state) of the checkpoint to resume from, the same on every
    rank, or None.

    Rank 0 first repairs what a crash may have left (a `step_N.old` whose `step_N` is missing,
    stale `.tmp`/`.old` folders), then takes the newest checkpoint that verifies against its
    checksums and loads (a damaged newer one is skipped with a warning naming the problem), and
    broadcasts its step; the other ranks load that step. Every rank then stops with one line
    when one cannot open it, or opened another checkpoint of that step (its checksums differ:
    a run folder at the same path on a node's own disk): the run folder must be on a filesystem
    shared by every node. One rank alone stopping left the others waiting in a collective: any
    error of rank 0's (an OSError or ValueError from a damaged file too) reaches the others as
    "rank 0 cannot resume: TYPE: MESSAGE"."""

    run_dir = Path(run_dir)
    found, refused = None, None
    if info.is_main:
        try:
            for line in recover_checkpoints(run_dir):
                print(f"{run_dir}: {line}", flush=True)
            found = resume_checkpoint(run_dir)
        except Exception as exc:  # every checkpoint damaged, or a file the OS fails to read
            if info.world_size == 1:  # (OSError) or a library refuses (ValueError): the
                raise  # others wait for its step, so they get its line
            refused = exc
    if info.world_size == 1:
        return found
    step, line = rank_agreement.rank_0s((int(found[0].name.split("_")[1]) if found else -1,
                                         None if refused is None else _said(refused)))
    if line is not None:
        raise refused or BertgpuError(f"rank 0 cannot resume: {line}")
    if step < 0:
        return None
    problem = None  # why this rank cannot open rank 0's step: said by every rank, not this one
    if not info.is_main:
        path = checkpoint_dir(run_dir, step)
        try:
            found = (path, *load_checkpoint(path)) if (path / COMPLETE).is_file() else None
            problem = None if found else f"{path} is not there"
        except Exception as exc:  # noqa: BLE001 - said by every rank, in one line
            problem = _said(exc)
    rank_agreement.same_checkpoint(found[0] if found else None, problem, info)
    return found


def _said(exc: Exception) -> str:
    """`exc` in one line: a BertgpuError's own, any other's type and message."""
    if isinstance(exc, BertgpuError):
        return errors.one_line(exc)
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def capture_rng() -> tuple[Any, ...]:
    """Python, numpy (global) and torch CPU/CUDA generator states as the generators give them:
    cheap enough to take before every step (the preemption snapshot); `rng_state(captured)`
    turns them into a checkpoint's plain values."""
    import numpy as np

    cuda = (torch.cuda.get_rng_state_all()
            if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
    return random.getstate(), np.random.get_state(legacy=True), torch.get_rng_state(), cuda


def rng_state(captured: tuple[Any, ...] | None = None) -> dict[str, Any]:
    """The generator states now (or as `capture_rng` took them) as plain values and tensors, so
    they survive `torch.load(weights_only=True)`."""
    py, np_state, cpu, cuda = captured if captured is not None else capture_rng()
    version, internal, gauss = py
    name, keys, pos, has_gauss, cached = np_state
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": cpu,
    }
    if cuda is not None:
        state["cuda"] = cuda
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what `rng_state()` captured (CUDA only when present in both)."""
    import numpy as np

    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss),
                         float(cached)))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = list(state["cuda"])[: torch.cuda.device_count()]
        for i, s in enumerate(cuda_states):
            torch.cuda.set_rng_state(s.cpu(), i)
