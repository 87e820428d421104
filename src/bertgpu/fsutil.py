"""Outputs that are never half-written and never silently damaged.

Atomic folders. A folder is built under a temporary name and swapped in by `replace_dir`: write
new, rename old aside (`NAME.old`), rename new in, remove old. At every moment either the old or
the new whole folder exists under one of those two names.

Only bertgpu's own folders are ever deleted. `NAME.tmp` and `NAME.old` beside a user's output
folder hold `SCRATCH_MARK` (`make_scratch`, `replace_dir`; removed last: `remove_marked`); one
without it is the user's and is refused in one line, never removed (an empty one excepted). A
folder that `replace_dir` replaces must be empty or pass the command's own test (`replaces`: an
earlier output of that command, e.g. a shard set's manifest.json), checked at start-up by
`check_output_folder(..., replaces=...)`.

Sealed folders. `seal(folder)` records the size and sha256 of every file in `checksums.json`,
then writes `COMPLETE`, and flushes all of it to disk. The one definition used everywhere
(training resume, `bertgpu export --step`, `load_pretrained` of a run folder):

- complete: the folder holds `COMPLETE` (`is_complete`); anything else was interrupted;
- good: complete, and every file has its recorded size and checksum (`verify_folder` is None).

A sealed folder deleted while it is verified (`remove_dir` takes COMPLETE first: a run's
checkpoint.keep_last pruning an older checkpoint) is not damage: `FolderRemoved`.

Checkpoint folders `ROOT/step_N/` built on these: `step_folders.py`.

`write_problem` words a failed write for its one-line error (space figures for a full disk only).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from bertgpu.errors import BertgpuError

COMPLETE = "COMPLETE"
CHECKSUMS = "checksums.json"
OLD, TMP = ".old", ".tmp"
RUN_LOCK = ".bertgpu-run.lock"  # in a run folder: "PID HOST" of the process training there
SCRATCH_MARK = ".bertgpu-scratch"  # in NAME.tmp / NAME.old beside an output: bertgpu's to delete
_CHUNK = 8 << 20
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # freeing space (or quota) is the cure
ACCESS_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})  # freeing space is not
_SAFETENSORS_OS_ERROR = re.compile(r"\(os error (\d+)\)")
Hook = Callable[[], None]
WriteHook = Callable[[Path], None]


def fsync_dir(path: Path) -> None:
    """Make renames inside `path` durable; best effort (not possible on every platform)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def check_output_folder(path: str | os.PathLike[str], what: str = "an output folder", *,
                        replaces: Callable[[Path], bool] | None = None) -> None:
    """`path` may become a folder: it is one already or does not exist, and its nearest existing
    parent is a folder. Else a one-line error naming the file in the way, before any work (a
    command that replaces its output folder would otherwise replace a file of the user's).

    `replaces`: the command builds its output as PATH.tmp and swaps it in with `replace_dir`.
    Then an existing non-empty PATH must pass `replaces` (an earlier output of the same command),
    and PATH.tmp and PATH.old, which the command removes, must be bertgpu's scratch folders."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                where = "" if p == path else f" (on the way to {path})"
                raise BertgpuError(f"{p}: exists and is not a folder{where}; expected {what}")
            break
    if replaces is None:
        return
    check_not_cwd(path)
    check_replaceable(path, replaces, what)
    check_siblings(path)


def check_not_cwd(path: str | os.PathLike[str], flag: str = "--out") -> None:
    """A folder that a command builds beside it and swaps in is neither the current folder nor
    one that holds it: the shell would be left in a deleted folder (and ``.`` has no name to
    build ``..tmp`` beside: `--out .` was a ValueError traceback)."""
    here, target = Path.cwd().resolve(), Path(path).resolve()
    if target == here or target in here.parents:
        what = "the current folder" if target == here else "a folder that holds the current one"
        raise BertgpuError(f"{flag} {os.fspath(path)}: is {what}, which would be replaced; "
                           "expected a new folder elsewhere (e.g. a name inside it)")


def check_siblings(path: Path) -> None:
    """PATH.tmp and PATH.old, which a command that swaps PATH in removes, are bertgpu's own."""
    path = Path(path)
    for suffix in (TMP, OLD):
        check_scratch(path.with_name(path.name + suffix), path)


def within(path: Path, folder: Path) -> bool:
    """`path` is `folder` or lies inside it (links resolved)."""
    try:
        Path(path).resolve().relative_to(Path(folder).resolve())
        return True
    except ValueError:
        return False


def check_apart(out: str | os.PathLike[str], inputs: list, flag: str = "--corpus") -> None:
    """The output folder `out` (and OUT.tmp, OUT.old) neither lies inside an input nor holds one:
    a folder that is read while it is written, or replaced while it holds the input, would lose
    data. `inputs`: the paths given (folders included) and the files they resolved to; URLs are
    skipped."""
    out = Path(out)
    family = [out, out.with_name(out.name + TMP), out.with_name(out.name + OLD)]
    for raw in inputs:
        text = os.fspath(raw)
        if "://" in text or not Path(text).exists():
            continue
        for folder in family:
            if within(text, folder) or within(folder, text):
                raise BertgpuError(f"{out}: overlaps the input {text} ({flag}); expected an output "
                                   "folder outside the inputs, holding none of them")


def _empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def check_replaceable(path: Path, replaces: Callable[[Path], bool], what: str) -> None:
    """A non-empty folder at `path` is replaced only when `replaces(path)` says it is an earlier
    output of the same kind; anything else is the user's, refused in one line."""
    path = Path(path)
    if is_scratch(path):  # an output whose swap a kill cut short (replace_dir): whole, unmark it
        (path / SCRATCH_MARK).unlink(missing_ok=True)
    if path.is_dir() and not path.is_symlink() and not _empty_dir(path) and not replaces(path):
        raise BertgpuError(f"{path}: a folder that is not {what}; it would be replaced, so "
                           "expected a new or empty folder, or an earlier output of this command")
    if path.is_symlink():
        raise BertgpuError(f"{path}: is a symbolic link; expected {what} (a real folder, which "
                           "is replaced)")


def check_scratch(scratch: Path, output: Path) -> None:
    """`scratch` (OUTPUT.tmp or OUTPUT.old) is absent, bertgpu's own or an empty folder (one a
    kill left between its mkdir and its mark, or after `remove_marked` took the mark): it will
    be removed."""
    scratch = Path(scratch)
    if (not (scratch.exists() or scratch.is_symlink()) or is_scratch(scratch)
            or (not scratch.is_symlink() and _empty_dir(scratch))):
        return
    raise BertgpuError(f"{scratch}: exists and was not made by bertgpu, which writes {output.name} "
                       f"through it (and would remove it); move it away or choose another output")


def is_scratch(path: Path) -> bool:
    """`path` is a scratch folder bertgpu made (and may remove)."""
    return path.is_dir() and not path.is_symlink() and (path / SCRATCH_MARK).is_file()


def make_scratch(scratch: Path, output: Path) -> Path:
    """A fresh, empty scratch folder `scratch` for `output` (an old one of bertgpu's is removed; a
    folder of the user's there is refused). Marked so a later run knows it may remove it."""
    scratch = Path(scratch)
    check_scratch(scratch, output)
    remove_marked(scratch)
    scratch.mkdir(parents=True)
    (scratch / SCRATCH_MARK).touch()
    return scratch


def remove_scratch(scratch: Path, output: Path) -> None:
    """Remove `scratch` if it is bertgpu's (a folder of the user's there is refused)."""
    check_scratch(scratch, output)
    remove_marked(scratch)


def remove_marked(folder: Path) -> None:
    """Remove a scratch folder of bertgpu's, its mark last: a kill midway leaves it marked (or
    empty), which the next run removes. `shutil.rmtree` deletes in listing order: a kill after
    the mark went left a partial folder that every later run refused as the user's."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name == SCRATCH_MARK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    (folder / SCRATCH_MARK).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def _mark(folder: Path) -> None:
    try:
        (folder / SCRATCH_MARK).touch()
    except OSError:
        pass


def replace_dir(tmp: Path, final: Path, between: Hook | None = None,
                replaces: Callable[[Path], bool] | None = None, what: str = "an output folder"
                ) -> Path:
    """Move the finished folder `tmp` to `final`, replacing an existing `final`.

    The old folder is marked as bertgpu's scratch, renamed aside (`final.old`) and removed only
    after the new one is in place, so a crash leaves a whole folder under `final` or `final.old`
    (`between` runs between the two renames; tests use it to crash there). `tmp` keeps its mark
    until it is `final` (unmarked first, a kill before the rename left a whole, unmarked
    `final.tmp` that the same command then refused as "not made by bertgpu"); a `final` left
    marked by a kill around the renames is a whole output, unmarked by the next command
    (`check_replaceable`). A `final.old` of the user's is refused, and so is a non-empty `final`
    that fails `replaces` when it is given (checked again here, after the work, in case the
    folder appeared meanwhile)."""
    tmp, final = Path(tmp), Path(final)
    old = final.with_name(final.name + OLD)
    if replaces is not None:
        check_replaceable(final, replaces, what)
    if final.exists():
        check_scratch(old, final)
        remove_marked(old)  # left by an earlier crash; `final` is the whole one
        _mark(final)  # before the rename: `old` is marked from its first moment
        os.replace(final, old)
        if between is not None:
            between()
        os.replace(tmp, final)
        (final / SCRATCH_MARK).unlink(missing_ok=True)
        fsync_dir(final.parent)
        remove_marked(old)
    else:
        os.replace(tmp, final)
        (final / SCRATCH_MARK).unlink(missing_ok=True)
        if is_scratch(old):  # a kill between an earlier run's renames left the old folder
            remove_marked(old)
    fsync_dir(final.parent)
    return final


def remove_dir(folder: Path) -> None:
    """Delete a sealed folder so that a crash midway leaves an incomplete folder (ignored), never a
    'complete' one with files missing."""
    (folder / COMPLETE).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Sealing and verifying


def file_sha256(path: str | os.PathLike[str], sync: bool = False) -> str:
    """The sha256 of a file's bytes, read in chunks (`sync`: and flushed to disk, for sealing)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
        if sync:
            os.fsync(f.fileno())
    return h.hexdigest()


def _digest_and_sync(path: Path) -> str:
    return file_sha256(path, sync=True)


def _write_synced(path: Path, text: str, after_write: WriteHook | None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    if after_write is not None:
        after_write(path)


def seal(folder: Path, note: str = "", after_write: WriteHook | None = None) -> None:
    """Record size and sha256 of every file in `folder` (flat), then write COMPLETE; everything is
    on disk when this returns. `after_write(path)` runs after each of the two files is written."""
    folder = Path(folder)
    files = {}
    for path in sorted(folder.iterdir()):
        if path.name in (COMPLETE, CHECKSUMS) or not path.is_file():
            continue
        files[path.name] = {"bytes": path.stat().st_size, "sha256": _digest_and_sync(path)}
    record = {"format": 1, "algorithm": "sha256", "files": files}
    _write_synced(folder / CHECKSUMS, json.dumps(record, indent=1, sort_keys=True) + "\n",
                  after_write)
    _write_synced(folder / COMPLETE, note + "\n", after_write)
    fsync_dir(folder)


def is_complete(folder: Path) -> bool:
    """The folder's save finished (COMPLETE is written last, after every file and checksum)."""
    return not Path(folder).name.endswith(TMP) and (Path(folder) / COMPLETE).is_file()


def _recorded(folder: Path) -> dict[str, dict] | str | None:
    """checksums.json's file table, a problem string, or None when there is none."""
    path = folder / CHECKSUMS
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"{CHECKSUMS} is unreadable ({e})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not all(
        isinstance(m, dict) and isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str)
        for m in files.values()
    ):
        return f"{CHECKSUMS} has no valid 'files' table"
    return files


def _size_problem(folder: Path, files: dict[str, dict]) -> str | None:
    """A file of `files` (checksums.json's table) missing or not of its recorded size."""
    for name, meta in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != meta["bytes"]:
            what = "truncated" if size < meta["bytes"] else "longer than recorded"
            return f"{name} is {what} ({size:,} bytes, {meta['bytes']:,} recorded)"
    return None


class FolderRemoved(BertgpuError):
    """A sealed folder deleted while it was read: a run removes its older checkpoints as it saves
    newer ones (checkpoint.keep_last). Not damage: a caller that picks the newest good checkpoint
    picks again; others say so in one line (it read as a FileNotFoundError traceback, or as
    "incomplete (no COMPLETE marker ...)" of a checkpoint that was complete)."""

    def __init__(self, folder: Path) -> None:
        super().__init__(f"{folder}: removed while being read (a running pretraining deletes its "
                         "older checkpoints as it saves newer ones: checkpoint.keep_last)")
        self.folder = Path(folder)


def verify_folder(folder: Path) -> str | None:
    """None when the folder is good; otherwise what is wrong, in a few words (incomplete, a file
    missing or truncated, a checksum mismatch). Sizes are checked before any file is read.
    `FolderRemoved` when the folder was deleted meanwhile (`remove_dir` takes COMPLETE first)."""
    folder = Path(folder)
    if folder.name.endswith(TMP):
        return "half-written (its save was interrupted)"
    if not (folder / COMPLETE).is_file():
        return f"incomplete (no {COMPLETE} marker: its save did not finish)"
    files = _recorded(folder)
    problem = files if isinstance(files, str) else None  # None: sealed before checksums existed
    if isinstance(files, dict):
        try:
            problem = _checksum_problem(folder, files)
        except FileNotFoundError as e:
            problem = f"{Path(e.filename or '?').name} is missing"
    if not (folder / COMPLETE).is_file():
        raise FolderRemoved(folder)
    return problem


def _checksum_problem(folder: Path, files: dict[str, dict]) -> str | None:
    problem = _size_problem(folder, files)
    if problem is not None:
        return problem
    for name, meta in files.items():
        if file_sha256(folder / name) != meta["sha256"]:
            return f"{name} fails its sha256 checksum (the file changed after it was written)"
    return None


# What `newest_good` found wrong in this process: {folder: (its seal's identity, problem)}. The
# identity is COMPLETE's inode and mtime, so a folder saved again under the same name (a new
# COMPLETE) is not taken for the damaged one it replaced.
_FOUND_DAMAGED: dict[str, tuple[tuple[int, int, int], str]] = {}


def _seal_identity(folder: Path) -> tuple[int, int, int] | None:
    try:
        st = (Path(folder) / COMPLETE).stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def known_problem(folder: Path) -> str | None:
    """What is wrong with a sealed folder, found without reading its data: the problem
    `newest_good` found in this process (a checksum included), else a file missing or not of its
    recorded size, else None. Cheap (a few stats and checksums.json), so retention may ask it of
    every checkpoint at every save; hashing them all there would read gigabytes each time."""
    folder = Path(folder)
    seal_id = _seal_identity(folder)
    if seal_id is None:
        return f"incomplete (no {COMPLETE} marker: its save did not finish)"
    found = _FOUND_DAMAGED.get(os.path.abspath(folder))
    if found is not None and found[0] == seal_id:
        return found[1]
    files = _recorded(folder)
    return _size_problem(folder, files) if isinstance(files, dict) else files


def remember_damage(folder: Path, problem: str) -> None:
    seal_id = _seal_identity(folder)
    if seal_id is not None:
        _FOUND_DAMAGED[os.path.abspath(folder)] = (seal_id, problem)


# ---------------------------------------------------------------------------------------------
# Space


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the filesystem that holds `path` (or would, once created)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def write_problem(folder: Path, exc: OSError, needed: int) -> tuple[str, str]:
    """(why, what to do) for a write into `folder` that failed with `exc`, as in "FOLDER: cannot
    write X: {why}; {what to do} and re-run ...". The bytes needed and free, and "free space",
    only for a full disk or quota (ENOSPC, EDQUOT): for a permission error (EACCES, EPERM, EROFS)
    the folder is not writable and freeing space would not help; other errors keep the figures."""
    reason = exc.strerror or str(exc)
    if exc.errno in ACCESS_ERRNOS:
        fix = ("remount the folder's file system read-write" if exc.errno == errno.EROFS
               else "fix the folder's permissions")
        return f"{reason} (the folder is not writable)", fix
    figures = f"needs about {human_bytes(needed)}, {human_bytes(free_bytes(folder))} free"
    return f"{reason} ({figures})", ("free space" if exc.errno in SPACE_ERRNOS else "fix that")


def save_safetensors(tensors: dict, path: Path) -> None:
    """safetensors' save_file, its failed write raised as the OSError it is (safetensors reports
    one as its own error type: "I/O error: No space left on device (os error 28)")."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        m = _SAFETENSORS_OS_ERROR.search(str(e))
        if m is None:
            raise
        code = int(m.group(1))
        raise OSError(code, os.strerror(code), str(path)) from None


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


def human_bytes(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as df -H and disk vendors count)."""
    value, unit = float(n), "bytes"
    for bigger in ("kB", "MB", "GB", "TB"):
        if abs(value) < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"


def not_utf8(path: str | os.PathLike[str]) -> BertgpuError:
    """The one-line error for a text file that does not decode as UTF-8: the line of its first
    bad byte (a decoder reading in chunks knows only an offset in its chunk), the byte and its
    offset in the file, and the way out."""
    offset = 0
    try:
        with open(path, "rb") as f:
            for n, line in enumerate(f, 1):  # "\n" is never inside a UTF-8 character
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    return BertgpuError(
                        f"{path}:{n}: not UTF-8 text (byte 0x{line[e.start]:02x} at offset "
                        f"{offset + e.start} of the file); expected UTF-8 (convert it first, "
                        "e.g. iconv -f ITS_ENCODING -t UTF-8)")
                offset += len(line)
    except OSError:
        pass
    return BertgpuError(f"{path}: not UTF-8 text; expected UTF-8")

