"""Which folder `bertgpu watch RUN_DIR` follows: the run folder itself, the OUT.tmp of a
fine-tuning run still in progress beside it, or one a run is about to make (waited for); any
other folder (a checkpoint of a run, a shard set, a folder of runs, a user's) is refused in one
line that says what it is and, where there is one, which run to watch instead."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.step_folders import run_of_checkpoint
from bertgpu.telemetry.console import duration

RUN_MARKS = ("config.toml", "checkpoints", "metrics.jsonl", "results.json")
"""What a run folder holds once it got going (pretrain writes config.toml before its first
record; a finished fine-tuning run has results.json)."""


def is_run(folder: Path) -> bool:
    return any((folder / mark).exists() for mark in RUN_MARKS)


def runs_in(folder: Path) -> list[str]:
    """The names of the run folders in `folder` (a fine-tuning OUT.tmp named as OUT), else those
    one level further down as SUB/RUN (`bertgpu glue`'s OUT holds TASK/seed_N)."""
    names = {e.name.removesuffix(".tmp") for e in folder.iterdir()
             if e.is_dir() and is_run(e)}
    if not names:
        names = {f"{d.name}/{e.name.removesuffix('.tmp')}"
                 for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")
                 for e in d.iterdir() if e.is_dir() and is_run(e)}
    return sorted(names)


def resolve(folder: Path) -> Path:
    """The folder to follow: `folder`, or the OUT.tmp of a fine-tuning run in progress beside
    it. A run's folder in its first seconds holds nothing but hidden files (pretrain's lock
    file, the scratch mark of a fine-tuning's OUT.tmp): it is waited for; a folder holding
    other things and none of a run's marks is refused (runs/ for runs/base, say)."""
    if (folder / "metrics.jsonl").is_file():
        return folder
    run = run_of_checkpoint(folder)
    if run is not None:  # its config.toml would pass for a run that has not started yet
        raise BertgpuError(f"{folder}: a checkpoint of the run {run}, not a run folder (watch "
                           f"the run: bertgpu watch {run})")
    running = folder.with_name(folder.name + ".tmp")
    if (running / "metrics.jsonl").is_file():
        return running  # a fine-tuning run still in progress
    if (folder / "manifest.json").is_file():
        raise BertgpuError(f"{folder}: a shard set (manifest.json of bertgpu prepare), not a run "
                           "folder; expected a run folder (metrics.jsonl) of bertgpu pretrain "
                           "or finetune")
    if folder.is_dir():
        if is_run(folder):
            return folder
        if running.is_dir():
            return running  # a fine-tuning run starting in OUT.tmp
        held = sorted(e.name for e in folder.iterdir() if not e.name.startswith("."))
        if not held:
            return folder  # a run that has not written its first record yet
        runs = runs_in(folder)
        if runs:
            shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
            raise BertgpuError(f"{folder}: not a run; it holds the run{'s' * (len(runs) > 1)} "
                               f"{shown} (watch one: bertgpu watch {folder / runs[0]})")
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise BertgpuError(f"{folder}: not a run folder (it holds {shown}); expected a run "
                           "folder of bertgpu pretrain or finetune (config.toml, checkpoints/, "
                           "metrics.jsonl or results.json), or an empty one a run is starting in")
    if not folder.exists() and running.is_dir():
        return running  # a fine-tuning run starting: OUT.tmp has no record yet
    problem = "is a file" if folder.exists() else "does not exist"
    raise BertgpuError(f"{folder}: {problem}; expected a run folder (metrics.jsonl) of "
                       "bertgpu pretrain or finetune")


def not_made_yet(folder: Path) -> bool:
    """Neither `folder` nor its OUT.tmp exists, in a folder that does: a run about to make it
    (`bertgpu pretrain ... --out OUT &` just started), not a typo in the folder it goes in."""
    return (not folder.exists() and not folder.with_name(folder.name + ".tmp").exists()
            and folder.parent.is_dir())


def wait_for(folder: Path, interval: float, console: Any) -> None:
    """One status line, redrawn every `interval` seconds, until the run makes `folder`."""
    from rich.live import Live
    from rich.text import Text

    t0 = time.monotonic()
    with Live(console=console, auto_refresh=False, transient=True) as live:
        while not_made_yet(folder):
            live.update(Text(f"bertgpu watch  {folder}  ·  waiting for it (or {folder.name}.tmp) "
                             f"to appear: {duration(time.monotonic() - t0)}", style="bold"),
                        refresh=True)
            time.sleep(interval)


__all__ = ["RUN_MARKS", "is_run", "not_made_yet", "resolve", "runs_in", "wait_for"]
