"""What a re-run of `bertgpu tokenizer` or `bertgpu prepare` finds at its finished output.

A script ``tokenizer && prepare && pretrain`` can be run again as a whole: the same command on
the same corpus with the same settings finds its output finished and does nothing (one line
saying so, exit 0), as `pretrain` does with a finished run. An output made from another corpus
or with other settings is an error that names the difference (``--seq-len 128 (asked 256)``),
not a bare "already exists".

Each output keeps the record of what it was made from:

- a shard set, ``prepared-from.json``: prepare's plan (`prepare.prepare` builds it: the tokenizer's
  hash, the settings, the work units and each corpus file's version, `sources.file_version`);
- a tokenizer folder, ``trained-from.json``: the settings and each corpus file's version.

A file's version is its size and modification time (or a store's ETag): a corpus copied or
touched since counts as changed. A local file is recorded by its resolved path (`resolved_paths`):
``corpus.txt``, ``./corpus.txt`` and ``$PWD/corpus.txt``, or a relative path from another folder,
name the same corpus; an older record's relative paths are read against the current folder.
A project folder moved or copied whole (`_same_when_moved`: the same files, relative to the
folder they share, of the same versions) re-runs as the same.
An output of an older bertgpu, without its record, is refused as before (the user decides:
--overwrite for a shard set, another --out for a tokenizer).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertgpu.data.sources import is_url, local_path
from bertgpu.errors import BertgpuError

PREPARED = "prepared-from.json"
TRAINED = "trained-from.json"

# prepare's plan: settings (`UnitJob.settings`) and job list, by the flag that sets them
SETTING_FLAGS = {"seed": "--seed", "objective": "--objective", "seq_len": "--seq-len",
                 "short_seq_prob": "--short-seq-prob", "segmenter": "--whole-word-segmenter"}
JOB_FLAGS = ("--format", "--text-field", "--skip-bad", "--validation-fraction",
             "--validation-docs", "--shard-size", "--chunk-docs", None)  # (None: the id dtype)
TOKENIZER_FLAGS = {"vocab_size": "--vocab-size", "cased": "--cased", "min_frequency":
                   "--min-frequency", "strip_accents": "--strip-accents", "format": "--format",
                   "text_field": "--text-field", "skip_bad": "--skip-bad",
                   "limit_alphabet": "--limit-alphabet", "sample_bytes": "--sample-bytes"}


def same_as_prepared(out: str, manifest: str | None, prepared: str | None,
                     plan: dict[str, Any]) -> bool:
    """Whether the shard set at ``out`` (its manifest.json and prepared-from.json texts, None
    when absent) was prepared from ``plan``: True, nothing to do; False, no shard set there.
    A shard set made otherwise raises a one-line error naming how."""
    if manifest is None:
        return False
    if prepared is None:
        raise BertgpuError(f"{out}: already exists and is not empty; expected a new folder (or "
                           "--overwrite)")
    try:
        before = _sizes_read_on(resolved_paths(json.loads(prepared)), plan)
    except json.JSONDecodeError:
        before = {}
    if _without_version(before) == _without_version(plan) or _same_when_moved(before, plan):
        return True
    diffs = _plan_differences(*_compared(before, plan))
    raise BertgpuError(f"{out}: holds a shard set prepared {'; '.join(diffs)}; expected a new "
                       "folder, or --overwrite to replace it")


def resolved_paths(record: Any, base: str | None = None, mark_base: bool = False) -> Any:
    """``record`` (a plan or a tokenizer's record) with each local corpus path (the keys of its
    versions, its units' pieces' ``src``) absolute and resolved against ``base`` (default: the
    current folder), URLs as they are: the same file given another way (``./corpus.txt``,
    ``$PWD/corpus.txt``, a relative path from another folder) is the same corpus. A record of an
    older bertgpu held paths as written; read against the current folder, the same command from
    the same folder still finds its output.

    ``mark_base`` (prepare's plan): a record that named a file by a relative path keeps ``base``
    as ``read_from``, which a finished set's comparison ignores: the units' own records name
    their files as written, so a stopped run resumed from another folder redoes its units
    rather than mix two spellings of one file (--skip-bad leaves a file out by its name)."""
    if not isinstance(record, dict):
        return record
    base = os.getcwd() if base is None else base
    out = _paths_mapped(record, lambda path: _resolved(path, base))
    versions = record.get("versions")
    relative = any(not is_url(local_path(path)) and not os.path.isabs(local_path(path))
                   for path in (versions if isinstance(versions, dict) else ()))
    if mark_base and relative:
        out["read_from"] = base
    return out


def _resolved(path: str, base: str) -> str:
    text = local_path(path)  # (a file:// URL is the local file it names)
    if is_url(text):
        return path
    full = os.path.join(base, text)
    # an older record's relative path that names no file here stays as written: an error names
    # it as the user gave it, not as a path in this folder that never held it
    return os.path.realpath(full) if os.path.isabs(text) or os.path.lexists(full) else path


def _same_when_moved(before: Any, now: dict[str, Any]) -> bool:
    """Whether `before` and `now` differ only in where their local corpus lies: each local file
    taken relative to the folder all of them share, the same files of the same versions (sizes
    and modification times, which `mv` and `cp -a` keep). A project folder moved or copied
    whole, its corpus and outputs in it, re-runs as the same; its records name files by their
    resolved paths, which the move changed."""
    return (_relocatable(before) and _relocatable(now)
            and _without_version(_relocated(before)) == _without_version(_relocated(now)))


def _relocatable(record: Any) -> bool:
    """A record whose local files are all named by absolute paths (an older bertgpu's relative
    ones are not compared relocated: they stay as they were read)."""
    if not isinstance(record, dict) or not isinstance(record.get("versions"), dict):
        return False
    local = [local_path(p) for p in record["versions"] if not is_url(local_path(p))]
    return bool(local) and all(os.path.isabs(p) for p in local)


def _compared(before: Any, now: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The two records to name the differences of: as recorded, or, for a project moved whole
    (the same files relative to their shared folder), relocated, so that a file changed since
    is named so and not as another corpus."""
    if not (_relocatable(before) and _relocatable(now)):
        return before, now
    moved_before, moved_now = _relocated(before), _relocated(now)
    if set(moved_before["versions"]) != set(moved_now["versions"]):
        return before, now
    real = dict(zip(moved_now["versions"], now["versions"], strict=True))  # (named as now)
    return {**before, "versions": {real[k]: v for k, v in moved_before["versions"].items()}}, now


def _relocated(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with each local path (its versions' keys, its units' pieces' ``src``) relative
    to the deepest folder every local corpus file is in; URLs as they are."""
    texts = [local_path(p) for p in record["versions"] if not is_url(local_path(p))]
    common = os.path.commonpath(texts) if len(texts) > 1 else os.path.dirname(texts[0])

    def moved(path: str) -> str:
        text = local_path(path)
        return path if is_url(text) or not os.path.isabs(text) else os.path.relpath(text, common)

    return _paths_mapped(record, moved)


def _paths_mapped(record: dict[str, Any], path_to: Callable[[str], str]) -> dict[str, Any]:
    """`record` with `path_to` applied to each corpus path it names: its versions' keys and its
    units' pieces' ``src``."""
    out = dict(record)
    versions = record.get("versions")
    if isinstance(versions, dict):
        out["versions"] = {path_to(path): v for path, v in versions.items()}
    units = record.get("units")
    if isinstance(units, list):
        out["units"] = [[{**piece, "src": path_to(piece["src"])}
                         if isinstance(piece, dict) and isinstance(piece.get("src"), str)
                         else piece for piece in unit] if isinstance(unit, list) else unit
                        for unit in units]
    return out


def _without_version(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan less the bertgpu version that made it (an upgrade alone remakes nothing), less the
    folder its relative paths were read from (`resolved_paths`: the set is the same from any)
    and, for mlm, less --short-seq-prob and --chunk-docs: they change no byte of an mlm set (an
    older bertgpu took them with mlm and recorded them; its sets re-run as the same)."""
    plan = {k: v for k, v in plan.items() if k not in ("created_by", "read_from")}
    settings = plan.get("settings")
    if isinstance(settings, dict) and settings.get("objective") == "mlm":
        plan["settings"] = {**settings, "short_seq_prob": None}
        job = plan.get("job")
        chunk = JOB_FLAGS.index("--chunk-docs")
        if isinstance(job, list) and len(job) > chunk:
            plan["job"] = [*job[:chunk], None, *job[chunk + 1:]]
    return plan


def _plan_differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    out = []
    if before.get("tokenizer_hash") != now["tokenizer_hash"]:
        out.append("with another tokenizer (--tokenizer)")
    if before.get("settings", {}).get("objective") == now["settings"].get("objective"):
        before, now = _without_version(before), _without_version(now)  # (both mlm: the same)
    old, new = before.get("settings", {}), now["settings"]
    out += [_flag(flag, old.get(key), new.get(key)) for key, flag in SETTING_FLAGS.items()
            if old.get(key) != new.get(key)]
    old_job = before.get("job", [None] * len(JOB_FLAGS))
    out += [_flag(flag, a, b) for flag, a, b in zip(JOB_FLAGS, old_job, now["job"], strict=False)
            if flag is not None and a != b]
    if before.get("unit_bytes") != now["unit_bytes"]:
        out.append(_flag("--unit-bytes", before.get("unit_bytes"), now["unit_bytes"]))
    out += _corpus_differences(before.get("versions", {}), now["versions"])
    return out or ["by another version of bertgpu's plan"]


def _corpus_differences(before: dict[str, str], now: dict[str, str]) -> list[str]:
    """How the corpus files (path -> version) differ: other files, or the same files changed."""
    if set(before) != set(now):
        gone, new = sorted(set(before) - set(now)), sorted(set(now) - set(before))
        if not new:
            return [f"from a larger corpus: also {_files(gone)}"]
        if not gone:
            return [f"from a smaller corpus: without {_files(new)}"]
        return [f"from another corpus: {_files(gone)}, where this one has {_files(new)}"]
    changed = sorted(path for path in now if before[path] != now[path])
    if changed:
        return [f"from an earlier version of the corpus: {len(changed)} file"
                f"{'s' if len(changed) != 1 else ''} changed since (size or modification time; "
                f"first: {changed[0]})"]
    return []


def _sizes_read_on(before: Any, now: dict[str, Any]) -> Any:
    """`before` (a record of an earlier run) with each file version that is a size alone taken
    as `now`'s when the sizes agree: a bertgpu before https's Last-Modified and hf://'s blob_id
    were read (`sources.VERSION_KEYS`) recorded those files by size, and an upgrade alone remakes
    nothing (every such corpus would have been "changed since")."""
    versions, new = (before.get("versions") if isinstance(before, dict) else None), now["versions"]
    if not isinstance(versions, dict):
        return before
    kept = {path: (new[path] if isinstance(old, str) and ":" not in old and path in new
                   and new[path].split(":", 1)[0] == old else old)
            for path, old in versions.items()}
    return {**before, "versions": kept}


def _files(paths: list[str]) -> str:
    return paths[0] + (f" and {len(paths) - 1} more" if len(paths) > 1 else "")


def _flag(flag: str, before: Any, now: Any) -> str:
    return f"with {flag} {_shown(before)} (asked {_shown(now)})"


def _shown(value: Any) -> str:
    if isinstance(value, bool):  # a switch: --skip-bad, --cased
        return "on" if value else "off"
    return "none" if value is None else str(value)


# --------------------------------------------------------------------------- tokenizer


def tokenizer_record(inputs: list, settings: dict[str, Any],
                     version: Callable[[Any], str]) -> dict[str, Any]:
    """trained-from.json of a tokenizer trained on the files ``inputs`` with ``settings``."""
    return resolved_paths({"settings": settings,
                           "versions": {str(src): version(src) for src in inputs}})


def same_as_trained(out: Path, record: dict[str, Any]) -> bool:
    """Whether the tokenizer folder ``out`` was trained as ``record`` says: True, nothing to do;
    False, no folder or an empty one. A tokenizer trained otherwise raises naming how; a folder
    without a record is left to the caller's check (an older bertgpu's, or the user's)."""
    path = out / TRAINED
    if not path.is_file() or not (out / "vocab.txt").is_file():
        return False
    try:
        before = _sizes_read_on(resolved_paths(json.loads(path.read_text(encoding="utf-8"))),
                                record)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if before == record or _same_when_moved(before, record):
        return True
    old, new = before.get("settings", {}), record["settings"]
    diffs = [_flag(flag, old.get(key), new.get(key)) for key, flag in TOKENIZER_FLAGS.items()
             if old.get(key) != new.get(key)]
    before, record = _compared(before, record)
    diffs += _corpus_differences(before.get("versions", {}), record["versions"])
    raise BertgpuError(f"{out}: holds a tokenizer trained {'; '.join(diffs or ['otherwise'])}; "
                       "expected a new output folder (or remove this one)")
