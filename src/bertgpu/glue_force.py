"""An interrupted `glue --force` is resumed by the same command, and its old table does not
outlive it.

`--force` trains every task/seed again, so a stop after 5 of 6 runs left no command that went
on: without --force the runs of the new settings were refused beside those of the old, with it
all 6 trained again. A --force run now writes OUT/glue_force.json when it starts (its settings'
`settings_key`) and removes it once its table is written; the same command finds the marker of
its own settings and keeps the runs finished since it was written (`kept`). A --force run of
other settings writes a marker of its own, and trains every run again.

The table of the old settings (glue_results.json and .md) and their submission go when the
--force run starts: `bertgpu report OUT` showed the old table as current beside new runs.

Any --predict-test run writes OUT/glue_writing.json before its submission (`writing`), removed
with the marker above once its table is written: a first run stopped between its submission and
its table left them without a table, and the same command refused them as another's (glue
refuses a submission/ or submission.zip no glue wrote, which it would replace or remove).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    from bertgpu.tasks.init_model import InitCheckpoint

MARKER = "glue_force.json"
WRITING = "glue_writing.json"
TABLE = ("submission.zip", "submission", "glue_results.json", "glue_results.md")
"""The earlier table's files, in the order they go: its json before its md, `bertgpu report`
reading the json."""


def settings_key(init: str | os.PathLike[str], ckpt: InitCheckpoint | None,
                 config_from: str | os.PathLike[str] | None, data_dir: str | os.PathLike[str],
                 cfg: Any, predict_test: bool, world_size: int) -> str:
    """sha256 of what makes a --force run's settings: the init checkpoint, the data folder, the
    settings that change a result (not how a run logs: RESUME_NEUTRAL), the test predictions and
    the processes. Not the tasks and seeds: a run of them finished with these settings counts."""
    from bertgpu.config.overrides import config_to_dict
    from bertgpu.tasks.finetune_output import RESUME_NEUTRAL

    config = {k: v for k, v in config_to_dict(cfg).items() if k not in RESUME_NEUTRAL}
    fields = {"init": str(init), "init_checkpoint": ckpt.record() if ckpt is not None else None,
              "config_from": str(config_from) if config_from else None,
              "data": str(Path(data_dir).resolve()), "config": config,
              "predict_test": predict_test, "world_size": world_size}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def begin(out: Path, key: str) -> float:
    """Rank 0, as a --force run starts training: the marker of `key` (kept when OUT holds one of
    the same settings, from the interrupted run), the earlier table and submission removed.
    Returns when the marker was written (its mtime, the file system's clock, as results.json's)."""
    import shutil

    path = out / MARKER
    try:
        same = json.loads(path.read_text(encoding="utf-8")).get("key") == key
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        same = False
    if not same:
        out.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({
            "key": key,
            "note": "a `bertgpu glue --force` run in progress or interrupted: the same command "
                    "keeps the runs it finished since this file was written, and removes this "
                    "file when its table is written"}, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    stale = [out / name for name in TABLE if (out / name).exists()]
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    if stale:
        print(f"{out}: removed the earlier table ({', '.join(p.name for p in stale)}): --force "
              "replaces its runs; the new one is written when every run has finished", flush=True)
    return path.stat().st_mtime


def kept(results: Path, start: float | None, check: Callable[[Path, dict[str, Any]], None]
         ) -> bool:
    """Whether a --force run keeps the finished run of `results` (TASK/seed_N/results.json):
    written since its marker (`start`, None: no marker) and made with its settings (`check`:
    glue_reuse.check_same_settings, which raises for another's)."""
    if start is None:
        return False
    try:
        if results.stat().st_mtime <= start:  # (a run takes longer than a tick of the clock)
            return False
        found = json.loads(results.read_text(encoding="utf-8"))
        check(results, found)
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, BertgpuError):
        return False
    return True


def writing(out: Path) -> None:
    """Rank 0, before it writes OUT/submission/ and submission.zip: they are glue's until its
    table is written (`finish`), which vouches for them from then on."""
    path = out / WRITING
    tmp = path.with_name(path.name + ".tmp")
    out.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps({
        "note": "a `bertgpu glue --predict-test` run writing its submission and table, or "
                "stopped while it did: the same command finishes them; removed once "
                "glue_results.json is written"}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def finish(out: Path) -> None:
    """Rank 0, once the table is written: the markers go (the next --force trains anew)."""
    (out / MARKER).unlink(missing_ok=True)
    (out / WRITING).unlink(missing_ok=True)
