"""A fine-tuning run's output folder: what a new run to the same --out may replace (an earlier
fine-tuning output), the note when it will, and what a failed run leaves (OUT.tmp only when it
holds a checkpoint to resume from)."""

from __future__ import annotations

import json
import os
from pathlib import Path

FINETUNE_OUTPUT = "a fine-tuning output folder (the fine-tuned model and results.json)"


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
    from bertgpu.fsutil import is_scratch, newest_good, remove_scratch

    if is_scratch(work) and newest_good(work / "checkpoints") is None:
        remove_scratch(work, out)
