"""JSON-lines files of a run (``metrics.jsonl``, ``gpu.jsonl``): appending, reading, following;
how a run's records say it started and ended (``run_start``, ``run_task``, ``run_end``,
``describe_end``, ``restart_launcher``, ``named_launcher``), and whether the process they name is
gone (``process_gone``).

Writers append one JSON object per line and flush it, so a reader may see a file that grows while
it reads, and a run killed mid-write leaves a last line without its newline. Readers here skip
such a cut last line and refuse a broken line anywhere else (that is corruption, not a crash).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from bertgpu.errors import BertgpuError


def open_for_append(path: Path) -> IO[str]:
    """Open ``path`` for appending, on a fresh line. A last line that a crash (or a full disk)
    left cut is removed first: kept, it would sit mid-file once the resumed run appends, where
    every later read refuses it as corruption; a whole record without its newline (an editor's
    save) is kept."""
    if path.is_file() and path.stat().st_size > 0:
        with open(path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            start, tail = _last_line(f, size)
            if tail and _record(tail) is None:
                f.truncate(start)
            elif tail:
                f.write(b"\n")
    return open(path, "a", encoding="utf-8")  # the caller closes it


def _last_line(f: IO[bytes], end: int) -> tuple[int, bytes]:
    """(offset, bytes) of the line that ends at `end` (its newline left out), read backwards
    in blocks: the start of a file of any size costs nothing."""
    tail = b""
    while end > len(tail) and b"\n" not in tail:
        f.seek(max(0, end - len(tail) - 4096))
        tail = f.read(end - f.tell() - len(tail)) + tail
    line = tail[tail.rfind(b"\n") + 1:]
    return end - len(line), line


def cut_after(path: Path, step: int) -> int:
    """Remove the records of steps after `step` from the end of the JSON-lines file `path`, in
    place (a link to the file stays one), and return how many went. A run resumed from the
    checkpoint of `step` goes through those steps again: their records were of a timeline that
    no longer is, and read as duplicates (an eval record logged twice, pandas counting steps
    twice). The file is read backwards to the newest record at or before `step`: a long run's
    file costs no more than its last records. Lines that are not records are kept."""
    if not path.is_file():  # none yet, or not a file to rewrite (a device reads for ever)
        return 0
    with open(path, "r+b") as f:
        end = f.seek(0, os.SEEK_END)
        kept: list[bytes] = []
        cut = 0
        while end > 0:
            start, line = _last_line(f, end)
            record = _record(line)
            at = _step(record) if record is not None else -1  # -1: no step (not a record)
            if at > step and _written_by(record, step):
                kept.append(line + b"\n")  # the checkpoint resumed from, or one before it
            elif at > step:
                cut += 1
            elif at >= 0:
                break
            elif line.strip():
                kept.append(line + b"\n")
            end = max(start - 1, 0)  # before this line's predecessor's newline
        if cut:
            f.seek(end + 1 if end else 0)
            f.truncate()
            f.write(b"".join(reversed(kept)))
    return cut


def _written_by(record: dict[str, Any] | None, step: int) -> bool:
    """Whether `record` says a checkpoint of `step` or before was written: a background write
    ends steps after its checkpoint (logged at step 81 for step 80), and the resume from that
    checkpoint keeps it (report counted one checkpoint too few)."""
    if record is None or record.get("event") != "checkpoint_written":
        return False
    saved = record.get("saved_step")
    return isinstance(saved, int) and not isinstance(saved, bool) and saved <= step


def _record(line: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        return None
    return record if isinstance(record, dict) else None


def _parse(line: str, path: Path, lineno: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
        if not isinstance(record, dict):
            raise ValueError("not an object")
    except ValueError:
        raise BertgpuError(
            f"{path}:{lineno}: found {line[:60]!r}, expected one JSON object per line"
        ) from None
    return {k: float("nan") if v is None else v for k, v in record.items()}


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file, ``null`` read as NaN; a cut last line is skipped."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise BertgpuError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise BertgpuError(f"{path}:{line}: not UTF-8 (byte 0x{e.object[e.start]:02x}); "
                           "expected the JSON lines bertgpu writes") from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(_parse(line, path, i + 1))
        except BertgpuError:
            if i == last:
                break
            raise
    return records


def read_metrics(path: Path | str, drop_superseded: bool = False) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (or a run folder holding one), ``null`` read as NaN.

    A last line cut short by a crash is skipped; a broken line elsewhere raises BertgpuError.
    With ``drop_superseded``, the train/eval records of steps that a resumed run went through
    again (those between the last checkpoint and the crash) keep only their latest version. A
    resume is recognised by a train step that does not increase.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records = read_jsonl(path)
    return drop_superseded_records(records) if drop_superseded else records


def drop_superseded_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep only the latest version of train/eval records that a resumed run logged again."""
    # Within one run, train steps strictly increase (at most one train record per optimizer
    # step). A train record at or below the last train step marks a resume from a checkpoint:
    # the earlier train and eval records from that step on are superseded.
    keep: list[dict[str, Any]] = []
    last_train: int | None = None
    for rec in records:
        kind, step = rec.get("kind"), rec.get("step")
        if kind == "train" and isinstance(step, int):
            if last_train is not None and step <= last_train:
                keep = [
                    r
                    for r in keep
                    if r.get("kind") not in ("train", "eval") or r.get("step", -1) < step
                ]
            last_train = step
        keep.append(rec)
    return keep


def _event(record: dict[str, Any]) -> Any:
    return record.get("event") if record.get("kind") == "info" else None


def process_started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (Linux's /proc/PID/stat); None where
    that cannot be read (another system, no such process). With the pid it names one process: a
    pid alone may be handed to another process once the first is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after "PID (COMMAND)"
        return int(fields[19])  # field 22 of the line: starttime
    except (OSError, IndexError, ValueError):
        return None


def process_gone(pid: int, started: Any = None) -> bool:
    """True when process ``pid`` is no longer on this host (one of another user's still counts):
    no such pid, or (with ``started``, its start time when the run wrote it) a pid that another
    process has taken since."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # PermissionError: it exists; anything else: cannot tell
        pass
    if isinstance(started, int) and not isinstance(started, bool):
        now = process_started(pid)
        return now is not None and now != started
    return False


def run_start(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest ``start`` record (the loop writes one per process: host, pid, world_size,
    max_steps, and a fine-tuning run's ``task``); None for runs of older versions, which wrote
    none."""
    return next((r for r in reversed(records) if _event(r) == "start"), None)


def run_task(records: list[dict[str, Any]]) -> str | None:
    """The task a fine-tuning run's start record names (results.json's ``task``, as the user
    gave it: "SST-2", "squad2", "ner", ...); None for a pretraining run and for runs of versions
    that did not write it (their checkpoints' finetune.json names it)."""
    start = run_start(records)
    task = start.get("task") if start is not None else None
    return task if isinstance(task, str) and task else None


def run_end(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``end`` record that closed the run as it stands: the newest one, unless a ``start``
    (a resumed run) or a train record of a later step (a resume by an older version) came after
    it. None while the run goes on, or when it was killed before it could write one."""
    end = None
    for r in records:
        event = _event(r)
        if event == "end":
            end = r
        elif event == "start" or (end is not None and r.get("kind") == "train"
                                  and _step(r) > _step(end)):
            end = None
    return end


def _step(record: dict[str, Any]) -> int:
    return _whole(record.get("step"))


def _whole(value: Any) -> int:
    """`value` when it is a whole number of 0 or more, else -1."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def describe_end(end: dict[str, Any], max_steps: float | None = None) -> str:
    """How an ``end`` record says the run ended, e.g. ``finished (max_steps)``, ``stopped
    (diverged at step 6)``, ``stopped (preempted at step 9 of 30; re-run the same command to
    resume)``."""
    reason, step = end.get("reason"), _step(end)
    at = f"at step {step}" if step >= 0 else "at an unknown step"
    if reason == "preempted":
        of = f" of {max_steps:.0f}" if max_steps else ""
        return f"stopped (preempted {at}{of}; re-run the same command to resume)"
    if reason == "diverged":
        return f"stopped (diverged {at})"
    if reason == "error":
        return f"stopped ({error_at(end)})"
    return f"finished ({reason})" if isinstance(reason, str) else "finished"


def error_at(end: dict[str, Any]) -> str:
    """``error at step 24: RuntimeError: ...`` of an ``end`` record with reason "error"."""
    step, error = _step(end), end.get("error")
    at = f"at step {step}" if step >= 0 else "at an unknown step"
    return f"error {at}" + (f": {_clipped(error)}" if isinstance(error, str) and error else "")


def restart_launcher(end: dict[str, Any]) -> tuple[int, int | None] | None:
    """(pid, start time) of the process that may start a failed job again (``--max-restarts``),
    as the job's error ``end`` record names it: written while restarts remain, by a worker whose
    error is no stop and no bad input (train/run_end.py); None when no restart may follow."""
    return named_launcher(end) if end.get("reason") == "error" else None


def named_launcher(record: dict[str, Any]) -> tuple[int, int | None] | None:
    """(pid, start time) of the launcher that a record names (``launcher_pid``,
    ``launcher_pid_started``): the process that may start the job again; None when it names
    none. A ``start`` record names it for an attempt that another may follow (``launcher_fields``),
    so that a rank 0 killed without an end record is waited for as an error is."""
    pid, started = record.get("launcher_pid"), record.get("launcher_pid_started")
    if _whole(pid) <= 0:
        return None
    return pid, (started if _whole(started) >= 0 else None)


RESTART_BY_ENV = "BERTGPU_RESTART_BY"
"""Set for the workers of an attempt that `--max-restarts` may follow with another: "PID STARTED",
the process that restarts the job (train/launcher.py) and its start time (``process_started``;
"-" where unknown). Unset on the last attempt: no record may promise a restart that cannot come."""


def launcher_fields() -> dict[str, Any]:
    """``launcher_pid`` and ``launcher_pid_started`` for the ``start`` record of an attempt that
    another may follow, naming the process that would start it: bertgpu's launcher
    (RESTART_BY_ENV, ``--nproc N --max-restarts M``), or, under torchrun with restarts left
    (its TORCHELASTIC_RESTART_COUNT below TORCHELASTIC_MAX_RESTARTS), torch's agent, the
    worker's parent; {} otherwise. A rank 0 that is killed writes no end record: `bertgpu
    watch` took the job for over while the launcher restarted it."""
    said = os.environ.get(RESTART_BY_ENV, "").split()
    if len(said) == 2 and said[0].isdigit():
        return {"launcher_pid": int(said[0]),
                "launcher_pid_started": int(said[1]) if said[1].isdigit() else None}
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    most = os.environ.get("TORCHELASTIC_MAX_RESTARTS", "")
    if count.isdigit() and most.isdigit() and int(count) < int(most):
        agent = os.getppid()
        return {"launcher_pid": agent, "launcher_pid_started": process_started(agent)}
    return {}


def _clipped(text: str, limit: int = 200) -> str:
    """`text` cut to about `limit` characters at a word, with "…"; a code span the cut opened
    loses its backtick, which would have run on through the report's markdown."""
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    if cut.count("`") % 2:
        i = cut.rfind("`")
        cut = cut[:i] + cut[i + 1:]
    return cut + " …"


_CHECKED_BYTES = 256
"""How many of the bytes it read last a follower finds again before it reads on: the ends of its
last records, whose numbers a record written there after a cut does not repeat."""


class JsonlFollower:
    """Reads the records appended to a JSON-lines file since the last call (``bertgpu watch``).

    Only complete lines are consumed: a line still being written is read on a later call. A
    file that shrank (replaced, or a new run in the same folder), or whose bytes before where
    this follower got to are no longer the ones it read (a resumed run cuts the records after its
    checkpoint, ``cut_after``, and its own soon grow the file past that point again), is read
    again from the start, and ``reset`` tells the caller to forget what it had. Read on from
    that point, the records of the restarted job were missed, its ``start`` record among them,
    and watch took the old one for the run's. A file whose folder was renamed (a fine-tuning
    run's OUT.tmp, once finished, is OUT) is followed there with `move_to`.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._lineno = 0
        self._file: tuple[int, int] | None = None  # (device, inode) of the file last seen
        self._last = b""  # the last bytes read (up to _CHECKED_BYTES), which end at _offset
        self.reset = False

    def move_to(self, path: Path) -> bool:
        """Follow the file to `path`, reading on from where this follower was: True when `path`
        is the very file it read (its device and inode), or any file when it has seen none yet
        (read from its start, as a new follower would). Another file at `path` (the previous
        run's, between the two renames of fsutil.replace_dir) is not the rest of these records:
        False, and nothing changes."""
        try:
            st = path.stat()
        except OSError:
            return False
        if self._file is not None and (st.st_dev, st.st_ino) != self._file:
            return False
        self.path = path
        return True

    def poll(self) -> list[dict[str, Any]]:
        self.reset = False
        try:
            st = self.path.stat()
        except OSError:
            return []
        size, self._file = st.st_size, (st.st_dev, st.st_ino)
        try:
            with open(self.path, "rb") as f:
                if self._offset and not self._unchanged(f, size):
                    self._offset, self._lineno, self.reset = 0, 0, True
                if size == self._offset:
                    return []
                f.seek(self._offset)
                chunk = f.read(size - self._offset)
        except FileNotFoundError:  # gone since the stat (a folder renamed): the next poll sees
            return []
        end = chunk.rfind(b"\n") + 1  # up to the last complete line
        if end:
            self._last = chunk[max(end - _CHECKED_BYTES, 0):end]
        records = []
        for raw in chunk[:end].splitlines():
            self._lineno += 1
            line = raw.decode("utf-8", errors="replace")
            if line.strip():
                try:
                    records.append(_parse(line, self.path, self._lineno))
                except BertgpuError:
                    if self._lineno == 1:  # a run's first line is its start record: not a log
                        raise
                    continue  # a line cut by a crash, then continued after a resume: skip it
        self._offset += end
        return records

    def _unchanged(self, f: IO[bytes], size: int) -> bool:
        """Whether the file (`size` bytes) still holds the bytes this follower read last, where
        it read them."""
        if size < self._offset:
            return False
        f.seek(self._offset - len(self._last))
        return f.read(len(self._last)) == self._last
