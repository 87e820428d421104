"""Checkpoint folders `ROOT/step_N/`, sealed as `fsutil` defines it. Their layout lives here
rather than in train/checkpoint.py because models/hf_io.py, which imports nothing from train/,
picks checkpoints too, and `bertgpu watch` knows a checkpoint folder when it is given one.

`complete_steps` lists them (a `step_N.old` stands in for a missing `step_N`: the moment between
the two renames), `newest_good` returns the newest good one, warning about each newer one it
skips (and remembering it: `fsutil.known_problem`, which retention asks at every save),
`recover_leftovers` repairs what a crash leaves (run once at start-up), and `run_of_checkpoint`
tells a checkpoint folder (or one inside it) from a run folder.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import (
    OLD,
    SCRATCH_MARK,
    TMP,
    FolderRemoved,
    fsync_dir,
    is_complete,
    remember_damage,
    verify_folder,
)

_STEP_RE = re.compile(r"^step_(\d+)(\.old)?$")
T = TypeVar("T")



def complete_steps(root: Path) -> list[tuple[int, Path]]:
    """Complete `step_N` folders under `root`, oldest first. A complete `step_N.old` counts as
    step N when `step_N` itself is not complete (a crash between the renames of replace_dir)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: dict[int, Path] = {}
    for entry in root.iterdir():
        m = _STEP_RE.match(entry.name)
        if not m or not entry.is_dir() or not is_complete(entry):
            continue
        step = int(m.group(1))
        if step not in found or m.group(2) is None:  # step_N wins over step_N.old
            found[step] = entry
    return sorted(found.items())


def run_of_checkpoint(path: str | os.PathLike[str]) -> Path | None:
    """RUN when `path` is a checkpoint folder RUN/checkpoints/step_N (.old, .tmp) of a run (RUN
    holds config.toml) or lies inside one; None otherwise."""
    path = Path(os.path.abspath(path))
    for p in (path, *path.parents):
        if (p.parent.name == "checkpoints" and re.match(r"^step_\d+(\.old|\.tmp)?$", p.name)
                and (p.parent.parent / "config.toml").is_file()):
            return p.parent.parent
    return None


def step_folder(root: Path, step: int) -> Path:
    """`root/step_N`, or `root/step_N.old` when only that one is complete."""
    path = Path(root) / f"step_{step}"
    old = path.with_name(path.name + OLD)
    return old if not is_complete(path) and is_complete(old) else path


def newest_good(root: Path, accept: Callable[[Path], T] | None = None,
                advice: str = "move the damaged folders away to start afresh") -> T | Path | None:
    """The newest good checkpoint under `root` (None if there is no complete one), passed through
    `accept` when given (e.g. a loader; a BertgpuError from it counts as damage too). Each newer
    damaged one is skipped with a warning that names what is wrong, and remembered
    (`known_problem`). When every complete checkpoint is damaged this is an error ending with
    `advice` (the caller's way out): starting afresh silently would throw the run away. A `step_N`
    folder without COMPLETE (not a `.tmp`: a save does not leave one; a damaged or hand-copied
    folder) newer than the one chosen counts as damaged too."""
    damaged = []
    complete = complete_steps(root)
    have = {step for step, _ in complete}
    unsealed = []
    if Path(root).is_dir():
        for entry in Path(root).iterdir():
            m = _STEP_RE.match(entry.name)
            if m and m.group(2) is None and entry.is_dir() and int(m.group(1)) not in have:
                unsealed.append((int(m.group(1)), entry))
    for _, path in sorted([*complete, *unsealed], reverse=True):
        problem = verify_folder(path)
        if problem is None:
            try:
                return path if accept is None else accept(path)
            except BertgpuError as e:
                problem = str(e)
        warnings.warn(f"{path}: skipped, {problem}; trying the previous checkpoint", stacklevel=2)
        remember_damage(path, problem)
        damaged.append(f"{path.name}: {problem}")
    if damaged:
        raise BertgpuError(f"{root}: no good checkpoint ({'; '.join(damaged)}); {advice}")
    return None


def again_if_removed(pick: Callable[[], T], then: str, attempts: int = 5) -> T:
    """`pick()`, called again when a checkpoint it reads is removed meanwhile (a run saving one
    every few seconds with keep_last 1: `FolderRemoved`), with a warning ending in `then`; the
    last attempt's FolderRemoved is the error."""
    for attempt in range(1, attempts + 1):
        try:
            return pick()
        except FolderRemoved as removed:
            if attempt == attempts:
                raise
            warnings.warn(f"{removed}; {then}", stacklevel=3)
    raise ValueError(f"attempts {attempts}: expected 1 or more")


def recover_leftovers(root: Path) -> list[str]:
    """Repair what a crash leaves under `root`: a complete `step_N.old` without `step_N` is renamed
    back; an `.old` beside a complete `step_N`, and every `.tmp`, are removed. Call once at
    start-up, before anything is saved. Returns one line per action."""
    root = Path(root)
    if not root.is_dir():
        return []
    done = []
    for entry in sorted(root.iterdir()):
        if not entry.is_dir() or not entry.name.startswith("step_"):
            continue
        if entry.name.endswith(TMP):
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"{entry}: removed (a save was interrupted)")
        elif entry.name.endswith(OLD):
            final = entry.with_name(entry.name[: -len(OLD)])
            if is_complete(final) or not is_complete(entry):
                shutil.rmtree(entry, ignore_errors=True)
                done.append(f"{entry}: removed (left over from a replacement)")
            elif not final.exists():
                (entry / SCRATCH_MARK).unlink(missing_ok=True)
                os.replace(entry, final)
                done.append(f"{final}: restored from {entry.name} (a replacement was interrupted)")
    fsync_dir(root)
    return done


__all__ = ["complete_steps", "newest_good", "recover_leftovers", "run_of_checkpoint",
           "step_folder"]
