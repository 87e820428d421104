"""Where `bertgpu prepare` writes while it runs, and how the finished shard set is sealed.

    work = WorkFolder("data/")             # or "s3://bucket/data/", "file:///shared/data"
    done = work.begin(plan, overwrite)     # driver: start, or keep the units a killed run finished
    work.scratch(3); work.publish(path)    # a worker: shard files of unit 3, each put in whole
    work.write_record(3, record)           # ... and last, the record that says unit 3 is done
    work.seal(manifest_text, tok_files)    # driver: tokenizer/, then manifest.json, then in place

A local output (a path, or a file:// URL: a shared filesystem a cluster mounts) is built in
DATADIR.tmp and renamed to DATADIR when sealed (`fsutil.replace_dir`: an old DATADIR stays whole
until the new one replaces it). A URL output is built in place, since
an object store cannot rename a folder: every file is uploaded whole under its final name (a PUT
is atomic: a reader never sees half a shard), and manifest.json, uploaded after every other file
of the set, seals it; readers need the manifest, so there is no moment with a set that looks
complete and is not. Either way the bookkeeping is removed only once the set is sealed (renamed
into place, or its manifest uploaded): a run stopped while sealing leaves either a set a re-run
seals from its records or a sealed set, whose leftover bookkeeping the re-run removes (`sealed`).

The bookkeeping of a run in progress is ``prepare-plan.json`` (the work units and the files'
versions, `units.plan_record`) and ``units/NNNNN.json`` (one record per finished unit, written
after its shards). A re-run of the same command on the same corpus finds both, keeps the units
whose records and shard files are there, and redoes the others; any other plan starts afresh.
The sealed set keeps the plan as ``prepared-from.json``: a re-run after the end finds it the same
and does nothing (`rerun`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bertgpu.data.rerun import PREPARED
from bertgpu.data.sources import filesystem, is_url, local_path
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import SCRATCH_MARK, is_scratch, make_scratch, remove_marked, replace_dir

PLAN = "prepare-plan.json"
UNITS = "units"
MANIFEST = "manifest.json"


class WorkFolder:
    """The files of one `bertgpu prepare` output while it is written (see the module docstring).
    Picklable: a Ray worker gets one and writes its unit's files through it."""

    def __init__(self, out: str | os.PathLike, base: str | None = None) -> None:
        text = local_path(out)  # file://: a local (or shared, mounted) folder: renames work
        self.remote = is_url(text)
        if self.remote:
            self.out = text.rstrip("/")
            self.folder = self.out
        else:
            final = Path(text)
            final = final if final.is_absolute() or base is None else Path(base) / final
            self.out = str(final)
            self.folder = str(final.with_name(final.name + ".tmp"))

    # ------------------------------------------------------------------ paths

    def _fs(self):
        return filesystem(self.folder)

    def _path(self, name: str) -> str:
        """Path of ``name`` in the folder (inside the filesystem, for a URL)."""
        if not self.remote:
            return str(Path(self.folder) / name)
        fs, root = self._fs()
        return f"{root.rstrip('/')}/{name}"

    def _write_text(self, name: str, text: str) -> None:
        if self.remote:
            fs, _ = self._fs()
            fs.pipe_file(self._path(name), text.encode("utf-8"))
            return
        path = Path(self._path(name))
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    def _read_text(self, name: str) -> str | None:
        try:
            if self.remote:
                fs, _ = self._fs()
                return fs.cat_file(self._path(name)).decode("utf-8")
            return Path(self._path(name)).read_text(encoding="utf-8")
        except (FileNotFoundError, UnicodeDecodeError):
            return None

    def _exists(self, name: str) -> bool:
        if self.remote:
            fs, _ = self._fs()
            return fs.exists(self._path(name))
        return Path(self._path(name)).exists()

    # ------------------------------------------------------------------ the workers' side

    def scratch(self, unit: int) -> Path:
        """A local folder for the shard files of ``unit`` (the folder itself when local)."""
        if not self.remote:
            return Path(self.folder)
        return Path(tempfile.mkdtemp(prefix=f"bertgpu-unit{unit:05d}-"))

    def publish(self, path: Path) -> None:
        """A finished file of the scratch folder into the output (uploaded whole)."""
        if self.remote:
            with self.store_errors("cannot write", midway=True):
                fs, _ = self._fs()
                fs.put_file(str(path), self._path(path.name))
            path.unlink()

    def drop_scratch(self, scratch: Path) -> None:
        if self.remote:
            shutil.rmtree(scratch, ignore_errors=True)

    def write_record(self, unit: int, record: dict) -> None:
        """The last thing a unit writes: after it, the unit counts as done."""
        with self.store_errors("cannot write", midway=True):
            self._write_text(f"{UNITS}/{unit:05d}.json", json.dumps(record, indent=1) + "\n")

    def remove(self, names: list[str]) -> None:
        """Remove files of the folder (shards of a unit prepared again, or left out)."""
        if not self.remote:
            for name in names:
                Path(self._path(name)).unlink(missing_ok=True)
            return
        with self.store_errors("cannot remove", midway=True):
            fs, _ = self._fs()
            for path in map(self._path, names):
                if fs.exists(path):
                    fs.rm_file(path)

    def forget(self, unit: int) -> None:
        """What an earlier run of ``unit`` wrote, removed: it runs again (`unit_job.run_unit`).
        Its shards go first (a stop midway leaves a record without them, a unit not done), and
        they are every file named for the unit, not those of its record: a run cut off before
        its record had left shards (and a .part) that no record named, beside the new ones."""
        mine = re.compile(rf"[a-z]+-{unit:05d}-\d+\.")
        with self.store_errors("cannot read", midway=True):
            if self.remote:
                fs, root = self._fs()
                names = [p.rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
            else:
                names = os.listdir(self.folder)
        self.remove([*sorted(n for n in names if mine.match(n)), f"{UNITS}/{unit:05d}.json"])

    def _record(self, name: str) -> dict | None:
        text = self._read_text(name)
        try:
            return json.loads(text) if text else None
        except json.JSONDecodeError:
            return None

    # ------------------------------------------------------------------ the driver's side

    def begin(self, plan: dict, overwrite: bool) -> dict[int, dict]:
        """Start writing; returns the records of the units a run of the same plan finished."""
        with self.store_errors("cannot write"):
            return self._begin(plan, overwrite)

    @contextlib.contextmanager
    def store_errors(self, what: str, midway: bool = False) -> Iterator[None]:
        """Any failure of a URL output's store (a host that does not answer, a write refused)
        as one line naming the output URL: at the start, a BertgpuError (the URL is the user's to
        fix); ``midway`` (the store took the run's writes so far), a `StoreFailed`. Nothing for a
        local output: its OSErrors are the file system's (`cli.place_error`)."""
        if not self.remote:
            yield
            return
        try:
            yield
        except (BertgpuError, StoreFailed):
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the store raises
            why = " ".join(f"{type(exc).__name__}: {exc}".split())
            if midway:
                raise StoreFailed(f"{self.out}: {what} ({why})") from None
            raise BertgpuError(f"{self.out}: {what} ({why}); expected an output URL this "
                               "machine can write to") from None

    def _begin(self, plan: dict, overwrite: bool) -> dict[int, dict]:
        text = json.dumps(plan, sort_keys=True)
        # (a URL's plan beside a manifest: a set sealed just before its bookkeeping went; here
        # only to be replaced, with --overwrite)
        if self._read_text(PLAN) == text and not (self.remote and self._exists(MANIFEST)):
            if not self.remote:
                (Path(self.folder) / SCRATCH_MARK).touch()  # (bertgpu 0.1 did not mark it)
            return self._finished()
        if self.remote:
            self._clear_remote(overwrite)
            self._write_text(PLAN, text)  # first: a folder holding it is known as ours
            fs, _ = self._fs()
            fs.makedirs(self._path(UNITS), exist_ok=True)
        else:  # another plan's, or none; a folder of the user's there is refused
            make_scratch(Path(self.folder), Path(self.out))
            Path(self.folder, UNITS).mkdir()
            self._write_text(PLAN, text)
        return {}

    def _clear_remote(self, overwrite: bool) -> None:
        fs, root = self._fs()
        units = self._path(UNITS)
        try:  # (an empty units/ alone counts as nothing: made before the plan by an earlier
            # bertgpu whose upload of the plan failed, on a store with folders, memory://)
            there = [p.rstrip("/") for p in fs.ls(root, detail=False)] if fs.exists(root) else []
            found = bool(there) and (there != [units] or bool(fs.find(units)))
        except Exception as exc:  # noqa: BLE001 - one line naming the URL, whatever the store
            raise BertgpuError(f"{self.out}: cannot reach ({' '.join(str(exc).split())})") from None
        if found:
            sealed = self._exists(MANIFEST)
            ours = self._exists(PLAN) or self._exists(PREPARED)  # (PREPARED: a seal stopped)
            if not sealed and not ours:  # the user's files: never removed
                raise BertgpuError(f"{self.out}: holds files that are not {SHARD_SET}; it would "
                                   "be replaced, so expected a new or empty folder, or an earlier "
                                   "output of this command")
            if sealed and not overwrite:
                raise BertgpuError(f"{self.out}: already exists and is not empty; expected a new "
                                   "folder (or --overwrite)")
            if sealed:  # (a store cannot swap folders: the old set goes before the new is made)
                fs.rm_file(self._path(MANIFEST))  # unseal first: never a manifest over a mix
            marks = {self._path(PLAN), self._path(PREPARED)}  # last: a stop midway leaves a
            rest = [p for p in fs.find(root) if p not in marks]  # folder still known as ours
            if rest:
                fs.rm(rest)
            fs.rm(root, recursive=True)

    def _finished(self) -> dict[int, dict]:
        """Records of finished units whose shard files are all there."""
        if self.remote:
            fs, _ = self._fs()
            names = [p.rsplit("/", 1)[-1] for p in fs.find(self._path(UNITS))]
        else:
            names = [p.name for p in Path(self._path(UNITS)).glob("*.json")]
        out = {}
        for name in names:
            record = self._record(f"{UNITS}/{name}")
            if record is not None and all(self._exists(f) for f in shard_files(record)):
                out[int(record["unit"])] = record
        return out

    def check_arrived(self, records: dict[int, dict], engine: str) -> None:
        """Every shard file the units recorded is in the folder before it is sealed (one listing):
        a Ray worker on another node writes a local --out on its own disk, and one in another
        process writes memory:// in its own memory."""
        if self.remote:
            with self.store_errors("cannot read", midway=True):
                fs, root = self._fs()
                there = {p.rsplit("/", 1)[-1] for p in fs.find(root)}
        else:
            there = set(os.listdir(self.folder))
        names = [name for r in records.values() for name in shard_files(r)]
        missing = [name for name in names if name not in there]
        if missing:
            why = ("with --engine ray, expected an output every node writes to: an object "
                   "store's URL or a folder every node mounts (memory:// is each process's own)"
                   if engine == "ray" else "expected the output to keep what the units write")
            raise BertgpuError(f"{self.out}: {len(missing)} of {len(names)} shard files the work "
                               f"units wrote are not there (first: {missing[0]}); {why}")

    def seal(self, manifest_text: str, tokenizer_files: dict[str, bytes]) -> str:
        """tokenizer/ (``tokenizer_files``: name -> bytes), prepared-from.json, manifest.json
        last; the set in place, then the bookkeeping removed. Removed before the rename, a
        local set stopped in between left a folder whose units every re-run prepared again."""
        if self.remote:
            with self.store_errors("cannot write", midway=True):
                return self._seal_remote(manifest_text, tokenizer_files)
        folder = Path(self.folder)
        (folder / "tokenizer").mkdir(exist_ok=True)
        for name, data in sorted(tokenizer_files.items()):
            (folder / "tokenizer" / name).write_bytes(data)
        self._write_text(PREPARED, self._read_text(PLAN))  # what the set is made from (`rerun`)
        self._write_text(MANIFEST, manifest_text)
        replace_dir(folder, Path(self.out), replaces=is_shard_set, what=SHARD_SET)
        self._drop_bookkeeping()
        return self.out

    def _seal_remote(self, manifest_text: str, tokenizer_files: dict[str, bytes]) -> str:
        """The bookkeeping goes after manifest.json, not before: a stop at any point leaves the
        plan and the records (a re-run seals the set from them) or a sealed set. Removed first,
        a stop before the manifest left a folder no re-run could resume, or even replace."""
        fs, _ = self._fs()
        for name, data in sorted(tokenizer_files.items()):
            fs.pipe_file(self._path(f"tokenizer/{name}"), data)
        fs.pipe_file(self._path(PREPARED), fs.cat_file(self._path(PLAN)))
        self._write_text(MANIFEST, manifest_text)
        self._drop_bookkeeping()
        return self.out

    def _drop_bookkeeping(self) -> None:
        """prepare-plan.json and units/ of the sealed set at the output, where they are: nothing
        reads them once manifest.json is there."""
        if not self.remote:  # (what cannot be removed, a later run's `sealed` tries again)
            with contextlib.suppress(OSError):
                Path(self.out, PLAN).unlink(missing_ok=True)
            shutil.rmtree(Path(self.out, UNITS), ignore_errors=True)
            return
        fs, _ = self._fs()
        if fs.exists(self._path(PLAN)):
            fs.rm_file(self._path(PLAN))
        if fs.exists(self._path(UNITS)):
            fs.rm(self._path(UNITS), recursive=True)

    def sealed(self) -> tuple[str | None, str | None]:
        """The texts of manifest.json and prepared-from.json of a shard set sealed at the output
        (None for a file that is not there): what a re-run finds (`rerun.same_as_prepared`).
        The bookkeeping a run stopped just after sealing left beside them is removed here: the
        set was tidy only if that run had gone on."""
        if self.remote:
            with self.store_errors("cannot read"):
                texts = self._read_text(MANIFEST), self._read_text(PREPARED)
        else:
            texts = tuple(map(self._read_sealed, (MANIFEST, PREPARED)))
        if None not in texts:
            with self.store_errors("cannot write"):
                self._drop_bookkeeping()
        return texts

    def _read_sealed(self, name: str) -> str | None:
        try:
            return Path(self.out, name).read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
            return None

    def discard(self) -> None:
        """Remove everything this run wrote (bad input: nothing is kept, nothing sealed)."""
        if not self.remote:
            if is_scratch(Path(self.folder)):
                remove_marked(Path(self.folder))
            return
        fs, root = self._fs()
        try:
            if fs.exists(root):
                fs.rm(root, recursive=True)
        except Exception:  # noqa: BLE001 - the error being reported matters more
            pass


class StoreFailed(ConnectionError):
    """A store (the output's, or the corpus's) or the network to it failed while the run went
    on: a reset connection, a timeout, an upload refused. No bad input: the run stops with this
    one line and keeps its finished units for a re-run of the same command (`engines.RunStopped`),
    as for a killed worker. Not a BertgpuError: a Ray task raising it is a failed task, not bad
    input (`ray_engine`)."""


SHARD_SET = "a shard set (bertgpu prepare's output, with manifest.json)"


def is_shard_set(folder: Path) -> bool:
    """An earlier shard set, which --overwrite may replace: anything else at --out is refused.
    A shard set that holds more than prepare wrote there (a run folder put beside the shards,
    say) is an error naming it: replacing the set deleted it without a word."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return False
    own = {MANIFEST, "tokenizer", PLAN, PREPARED, UNITS, SCRATCH_MARK}
    other = sorted(e.name + ("/" if e.is_dir() else "") for e in folder.iterdir()
                   if e.name not in own and not (e.suffix == ".npy" and e.is_file()))
    if other:
        shown = ", ".join(other[:3]) + (f" and {len(other) - 3} more" if len(other) > 3 else "")
        raise BertgpuError(f"{folder}: a shard set that also holds {shown}, which prepare did not "
                           "write; replacing the set would delete it: move it out, or choose "
                           "another --out")
    return True


def shard_files(record: dict) -> list[str]:
    """Every .npy file of a unit record's shards."""
    keys = record["keys"]
    return [f"{s['name']}.{k}.npy" for split in record["splits"].values()
            for s in split["shards"] for k in keys]
