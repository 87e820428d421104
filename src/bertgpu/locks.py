"""One command at a time writes an output: `output_lock` holds an exclusive lock on
``OUT.bertgpu-lock`` beside the output while a command writes it (through ``OUT.tmp``), and
refuses a second one in one line naming the first (pid and host).

Two `finetune` (or `glue`) runs into one --out trained together: the second deleted the
first's working folder, or resumed from its live checkpoint, and both said they were done over
an output that had lost its metrics.jsonl; two `prepare` runs both died on each other's files.
`bertgpu pretrain` locks inside its run folder (train/run_folder.py), which is never renamed; the
commands here write a scratch folder that is renamed into place at the end, so their lock lies
beside it. The lock file is removed when the command ends; one left by a process killed with
SIGKILL holds no lock and is taken over. Where the file system cannot lock (some network file
systems), the command goes on unlocked, as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

from bertgpu.errors import BertgpuError

LOCK = ".bertgpu-lock"
"""The lock file's suffix: `OUT.bertgpu-lock`. Not `.lock`, which other tools' files use (uv.lock,
poetry.lock): one beside an --out named uv was adopted, emptied and deleted."""
_OURS = re.compile(rb"\d+ \S+ bertgpu [a-z]+\n?")
_HELD: dict[Path, list[Path]] = {}  # lock file -> the folders made for it, while held


def release_held() -> None:
    """Remove the lock files this process holds (and the folders made for them), before an
    `os._exit` that skips every `finally` (a stop during distributed set-up, a grace run out): a
    lock file left beside the output said another command was writing it."""
    for path, made in list(_HELD.items()):
        _remove(path, made)


def _holder(content: bytes, command: str) -> str:
    """"bertgpu glue (pid N on HOST)" from the lock file its holder wrote ("PID HOST COMMAND"),
    or `command` when it says no more."""
    words = content.decode("utf-8", "replace").split()
    return f"{' '.join(words[2:])} (pid {words[0]} on {words[1]})" if len(words) > 2 else command


def _lock_path(out: Path) -> Path:
    """The lock of `out`, the folder a link at `out` names (two spellings of one output take
    one lock)."""
    out = Path(os.path.realpath(out))
    return out.with_name(out.name + LOCK)


def check_free(out: str | os.PathLike[str], command: str) -> None:
    """Refuse now, in one line, an output another process is writing (its lock held): a
    launcher calls this before it starts workers, which took seconds to refuse it each. Not in
    a worker of a job (WORLD_SIZE set): its rank 0 holds the lock, which the others would find."""
    text = os.fspath(out)
    if "WORLD_SIZE" in os.environ or "://" in text or not _lock_path(Path(text)).is_file():
        return
    with output_lock(out, command):  # taken and given back at once: free
        pass


@contextlib.contextmanager
def output_lock(out: str | os.PathLike[str], command: str, hold: bool = True) -> Iterator[None]:
    """Hold ``OUT.bertgpu-lock`` while `command` ("bertgpu finetune") writes `out`, or raise a
    one-line BertgpuError when another process holds it. `hold` False (the other ranks of a job)
    and URL outputs (a store has no locks) do nothing. Folders made on the way to the lock are
    removed again when the command leaves nothing in them."""
    text = os.fspath(out)
    if "://" in text or not can_lock(hold):
        yield
        return
    out = Path(os.path.abspath(text))
    path = _lock_path(out)
    made = [p for p in path.parents if not p.exists()]
    while True:
        fd = _open(path, out)
        if fd is None:  # a place nothing can be written to: a re-run with nothing to do still
            yield  # ends so ("already holds this shard set"); a command that writes says why not
            return
        content = os.pread(fd, 300, 0)  # empty: just made, here or by another bertgpu
        if content and not _OURS.fullmatch(content):
            os.close(fd)
            raise BertgpuError(f"{path}: a file bertgpu did not write, where it keeps the lock of "
                               f"{out}; expected it gone (move it) or another --out")
        taken = try_flock(fd)
        if not taken:
            who = _holder(content, command)
            os.close(fd)
            if taken is None:  # no locks on this file system
                yield
                return
            raise BertgpuError(f"{out}: another {who} is writing this output; wait for it to end "
                               "or stop it, or give another --out") from None
        try:  # the holder before us removed the file after we opened it: lock the new one
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    _HELD[path] = made
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {command}\n".encode(), 0)
        yield
    finally:
        _remove(path, made)  # while locked: a process waiting on it finds it gone and retries
        release(fd)


def can_lock(hold: bool = True) -> bool:
    """Whether this process takes a lock at all: not the other ranks of a job (`hold` False),
    and not where the system has no POSIX locks."""
    if not hold:
        return False
    try:
        import fcntl  # noqa: F401
    except ImportError:
        return False
    return True


def try_flock(fd: int) -> bool | None:
    """An exclusive lock on `fd` without waiting: True when taken, False when another process
    holds it, None where the file system cannot lock (ENOLCK, EOPNOTSUPP: some network file
    systems), where a command goes on unlocked."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return False if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    _LOCK_FDS.add(fd)
    return True


def release(fd: int) -> None:
    """Close a lock's descriptor, which releases the lock (`try_flock`)."""
    _LOCK_FDS.discard(fd)
    os.close(fd)


_LOCK_FDS: set[int] = set()
"""The descriptors of the locks this process holds. A forked child (a DataLoader worker) shares
them, and a flock lasts until the last of them closes: a run killed by SIGKILL stayed locked for
the seconds its orphaned workers took to notice, and the same command run again at once was
refused, naming the dead process. Each child closes its copies (`_close_in_child`)."""


def _close_in_child() -> None:
    for fd in _LOCK_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _LOCK_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


def _open(path: Path, out: Path) -> int | None:
    """The lock file's descriptor (made with its folders), or None where this user may not write
    (a read-only mount, another user's folder). A link there is refused, never followed: bertgpu
    makes none, and one that dangled read as "the file system refuses to create this folder"."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as e:
        if os.path.islink(path):
            raise BertgpuError(f"{path}: a link bertgpu did not make, where it keeps the lock of "
                               f"{out}; expected it gone (move it) or another --out") from None
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        return None


def _remove(path: Path, made: list[Path]) -> None:
    _HELD.pop(path, None)
    with contextlib.suppress(OSError):
        path.unlink()
    for folder in made:  # the deepest first
        with contextlib.suppress(OSError):
            folder.rmdir()
