"""Where corpus files live: local paths as they are, URLs (``s3://``, ``gs://``, ``hf://``,
``https://``, ``memory://``, ``file://``) through fsspec.

    inputs = resolve_inputs(["books/", "s3://bucket/web/*.jsonl.zst"])  # Path or URL string each
    with open_raw(inputs[1]) as f: ...          # the stored bytes, seekable where the store is
    file_size(inputs[1]), file_version(inputs[1])

A URL needs fsspec (`pip install 'bertgpu[remote]'`) and the package of its protocol (s3fs,
gcsfs, huggingface_hub, aiohttp for https). Local paths never touch fsspec, so the common case
has no dependency and behaves exactly as before. Every problem is one `BertgpuError` line naming
the path or URL: a protocol without its package, a host that does not answer, nothing there.
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import glob
import io
import os
import re
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import OLD, TMP

Source = Path | str
"""A resolved corpus file: a local Path, or a URL string (never a local path as a string)."""

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Metadata files of a Hugging Face dataset saved to disk, skipped inside folders (never when
# named): the data are its .arrow files, or the .parquet files of its export.
DATASET_METADATA = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})
# ... and the empty marker Spark writes beside its part-NNNNN files (its .crc files are hidden).
NOT_CORPUS = DATASET_METADATA | {"_SUCCESS"}
# The files a dataset's repository keeps beside its data to describe it (README.md, the Hugging
# Face dataset card whose YAML front matter became the first training row; LICENSE-MIT,
# CITATION.cff), skipped inside folders by name (any case): the word, one tag of letters after
# "-" or "_" at most (README_zh-CN), extensions. Digits or more words after it make a corpus file
# (notice_of_appeal_0001.txt); those left out are named in one warning (`resolve_inputs`).
REPO_FILES = re.compile(r"(readme|licen[cs]e|copying|citation|notice|changelog)"
                        r"([-_][a-z]{1,10}(-[a-z]{2,4})?)?(\.[a-z][a-z0-9-]{0,9})*",
                        re.IGNORECASE)
SKIPPED_IN_FOLDERS = ("hidden files, README/LICENSE/CITATION/COPYING/NOTICE/CHANGELOG files and "
                      "dataset metadata (dataset_info.json, state.json, _SUCCESS) are not read")


def not_corpus(name: str) -> bool:
    """Whether a file of this name inside a corpus folder is left out (see REPO_FILES): hidden,
    a saved dataset's metadata, Spark's marker, or a repository's description of its data."""
    return name.startswith(".") or name in NOT_CORPUS or REPO_FILES.fullmatch(name) is not None


def is_url(path: str | os.PathLike) -> bool:
    return isinstance(path, str) and _URL.match(path) is not None


def _oneline(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def filesystem(url: str):
    """(fsspec filesystem, path inside it) of a URL; a missing package is a one-line error."""
    try:
        import fsspec
    except ImportError:
        raise BertgpuError(f"{url}: reading URLs needs fsspec; expected `pip install "
                           "'bertgpu[remote]'` (and s3fs, gcsfs, ... for the protocol)") from None
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise BertgpuError(f"{url}: no filesystem for this protocol ({exc}); expected its fsspec "
                           "package installed") from None
    except ValueError as exc:
        raise BertgpuError(f"{url}: {exc}; expected a path or a URL fsspec knows") from None
    except OSError as exc:  # a filesystem that connects when made (ftp, sftp): host unknown, ...
        raise BertgpuError(f"{url}: cannot reach ({_oneline(exc)}); expected a host that "
                           "answers") from None


def open_raw(src: Source) -> BinaryIO:
    """The file's stored bytes (not decompressed)."""
    if isinstance(src, Path):
        return open(src, "rb")
    fs, path = filesystem(src)
    try:
        f = fs.open(path, "rb")
        if isinstance(f, io.BufferedIOBase):  # memory://, local files
            return f
        # s3fs, gcsfs, https: fsspec's own buffered files, whose readline takes no size and
        # which have no peek; io's reader over them has both (fsspec still caches the blocks)
        return io.BufferedReader(_Remote(f), buffer_size=1 << 20)
    except FileNotFoundError:
        raise BertgpuError(f"{src}: no such file") from None
    except Exception as exc:  # noqa: BLE001 - any store's failure is one line naming the URL
        raise BertgpuError(f"{src}: cannot open ({_oneline(exc)})") from None


NO_RANGES = "The HTTP server doesn't appear to support range requests"
"""How fsspec's https files start the ValueError of a server that sends the whole file for a
read past its first block."""


class RangesRefused(OSError):
    """A read of an https file from a server without range requests: an error reading the
    file (`compressed.read_errors` takes OSErrors), not the ValueError of a bug."""

    def __str__(self) -> str:
        return ("the HTTP server does not answer range requests, which reading it past its start "
                "needs; expected a server that does (or the file downloaded first)")


class _Remote(io.RawIOBase):
    """An fsspec file as the raw file of a buffered reader; its one ValueError that is a read
    error, `NO_RANGES`, comes out as `RangesRefused`."""

    def __init__(self, f) -> None:
        super().__init__()
        self.f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self.f.seekable()

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()

    def readinto(self, buffer) -> int:
        try:
            return self.f.readinto(buffer)
        except ValueError as exc:
            if str(exc).startswith(NO_RANGES):
                raise RangesRefused(errno.EOPNOTSUPP, str(exc)) from exc
            raise

    def close(self) -> None:
        try:
            self.f.close()
        finally:
            super().close()


def _stat(src: Path) -> os.stat_result:
    try:
        return src.stat()
    except OSError as exc:  # gone since it was listed, a broken link, no permission
        raise BertgpuError(f"{src}: cannot read ({_oneline(exc)}); expected a file") from None


def file_size(src: Source) -> int:
    if isinstance(src, Path):
        return _stat(src).st_size
    fs, path = filesystem(src)
    return int(_info(src, fs, path)["size"])


# The keys of fsspec's info that change with a stored file, the first found is used: content
# hashes (s3's and gcs's ETag, gcs's md5Hash, an https server's ETag, Content-MD5 or Digest
# header, hf://'s git blob_id), then times (s3's LastModified, an https server's Last-Modified
# header, ...). With none, the size alone: a same-size edit goes unnoticed.
VERSION_KEYS = ("ETag", "etag", "md5Hash", "Content-MD5", "Digest", "blob_id", "LastModified",
                "Last-Modified", "mtime", "updated", "created")


def file_version(src: Source) -> str:
    """What changes when the file does (size and modification time, or the store's ETag,
    `VERSION_KEYS`): a re-run resumes only the work of an unchanged corpus."""
    if isinstance(src, Path):
        st = _stat(src)
        return f"{st.st_size}:{st.st_mtime_ns}"
    fs, path = filesystem(src)
    info = _info(src, fs, path)
    for key in VERSION_KEYS:
        if info.get(key) is not None:
            return f"{info['size']}:{info[key]}"
    return str(info["size"])


def _info(src: str, fs, path: str) -> dict:
    try:
        return fs.info(path)
    except FileNotFoundError:
        raise BertgpuError(f"{src}: no such file") from None
    except Exception as exc:  # noqa: BLE001
        raise BertgpuError(f"{src}: cannot reach ({_oneline(exc)})") from None


def name_of(src: Source) -> str:
    """The file name (last path component), for detecting its format."""
    return src.name if isinstance(src, Path) else src.rstrip("/").rsplit("/", 1)[-1]


# --------------------------------------------------------------------------- inputs


def resolve_inputs(paths: Iterable[str | os.PathLike],
                   skipped: list[tuple[str, str]] | None = None) -> list[Source]:
    """Expand files, folders (recursively) and glob patterns into a sorted, duplicate-free list.

    The order is deterministic (sorted within each argument, arguments in the order given) so
    that the same command always produces the same documents in the same order. Inside folders,
    hidden files (names starting with ``.``), a saved dataset's metadata files, Spark's
    ``_SUCCESS`` and a repository's README, LICENSE, ... (`not_corpus`) are ignored; a file named
    on the command line, or matched by a pattern, is always read. Symbolic links to folders are
    followed (each folder read once).
    A broken symbolic link found in a folder or by a pattern, and a folder that cannot be read
    (no permission: os.walk passed over it without a word), is an error, or with ``skipped``
    (--skip-bad) left out and recorded there as (path, reason).
    Local inputs come back as Paths, URLs as URL strings (``memory:///corpus/a.jsonl``).
    """
    out: list[Source] = []
    seen: set = set()
    bad: list[tuple[str, str]] = []
    left_out: list[str] = []  # repository files in folders (README.md, LICENSE, ...)
    for raw in paths:
        found = (_resolve_url(raw, bad, left_out) if is_url(raw)
                 else _resolve_local(os.fspath(raw), bad, left_out))
        for f in found:
            text = None if isinstance(f, Path) else local_path(f)  # file:///x is the file x
            key = f.resolve() if text is None else Path(text).resolve() if text != f else f
            if key not in seen:
                seen.add(key)
                out.append(f)
    for path, reason in bad:
        if skipped is None:
            raise BertgpuError(reason + " (or --skip-bad)")
        skipped.append((path, reason))
    if not out and bad:  # all of them skipped
        raise no_documents(skipped or [], "corpus files that can be read")
    if not out:
        raise BertgpuError("no corpus files given; expected --corpus PATH...")
    if left_out:  # one line: a corpus file named like one was dropped without a word
        names, n = sorted(set(left_out)), len(set(left_out))
        warnings.warn(f"left out {n} file{'s' if n != 1 else ''} of the corpus folders as a "
                      f"repository's README, LICENSE, ... by name: {', '.join(names[:3])}"
                      f"{f' and {n - 3} more' if n > 3 else ''}; name a file on the command line "
                      "(or by a pattern) to read it", stacklevel=2)
    return out


def no_documents(skipped: list[tuple[str, str]], expected: str) -> BertgpuError:
    """The error of a corpus that gave no document; with --skip-bad, how many files were skipped
    and why the first was (it read "no documents read from the corpus" alone)."""
    n = len(skipped)
    # a folder that cannot be read or a broken link is not a file
    kind = "file" if all(os.path.isfile(path) for path, _ in skipped) else "input"
    why = (f" ({n} {kind}{'s' if n != 1 else ''} skipped by --skip-bad; the first: "
           f"{skipped[0][1]})" if skipped else "")
    return BertgpuError(f"no documents read from the corpus{why}; expected {expected}")


def _broken(link: Path) -> tuple[str, str]:
    """(path, reason) of a broken symbolic link found in a folder or by a pattern."""
    return str(link), f"{link}: a broken symbolic link (to {os.readlink(link)}); expected a file"


def _special(path: Path) -> tuple[str, str]:
    """(path, reason) of a pipe, socket or device: a corpus is read more than once (its size,
    its format, its text), and opening a pipe in a folder waited for a writer forever."""
    return str(path), (f"{path}: not a regular file (a pipe, socket or device); expected a "
                       "corpus file or folder (write a stream to a file first, e.g. decompress "
                       "it)")


def _resolve_local(text: str, bad: list[tuple[str, str]], left_out: list[str]) -> list[Source]:
    p = Path(text)
    if p.is_dir():
        found = sorted(_walk_files(p, bad, left_out))
        if not found and not bad:
            raise BertgpuError(f"{text}: folder contains no corpus files ({SKIPPED_IN_FOLDERS}); "
                               "expected corpus files")
        return found
    if p.is_file():
        return [p]
    if p.exists():  # <(xzcat c.jsonl.xz) is /dev/fd/63, a link to "pipe:[...]" that stats
        raise BertgpuError(_special(p)[1])
    if p.is_symlink():
        raise BertgpuError(f"{text}: a broken symbolic link (to {os.readlink(p)}); expected a "
                           "file or folder")
    if glob.has_magic(text):
        matches = sorted(Path(m) for m in glob.glob(text, recursive=True))
        bad.extend(_broken(m) for m in matches if m.is_symlink() and not m.exists())
        # a folder it matches is read as a folder given by name is (the shell's expansion of
        # the same pattern gives it so): it was left out without a word
        found = [f for m in matches for f in ([m] if m.is_file() else sorted(
            _walk_files(m, bad, left_out)) if m.is_dir() else [])]
        if not found and not bad:
            raise BertgpuError(f"{text}: pattern matches no files")
        return found
    raise BertgpuError(f"{text}: no such file or folder")


def _walk_files(root: Path, bad: list[tuple[str, str]], left_out: list[str]) -> Iterator[Path]:
    """The files under ``root``, through links to folders (a folder reached twice, as by a link
    to one of its parents, is read once); broken links and folders that cannot be listed (``root``
    too) go to ``bad`` as (path, reason), a repository's README, LICENSE, ... to ``left_out``."""
    def unreadable(folder: str, exc: OSError) -> None:
        bad.append((folder, f"{folder}: cannot read the folder ({_oneline(exc)}); expected a "
                            "folder this user can list"))

    visited: set[tuple[int, int]] = set()
    walk = os.walk(root, onerror=lambda exc: unreadable(str(exc.filename or root), exc),
                   followlinks=True)
    for dirpath, dirnames, filenames in walk:
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in visited:
            dirnames[:] = []
            continue
        visited.add((st.st_dev, st.st_ino))
        # Real folders before links, each sorted: a folder reached both ways is read under its
        # own name, and which of two links to one folder is read does not depend on the listing.
        dirnames[:] = sorted((d for d in dirnames if not d.startswith(".")),
                             key=lambda d: (os.path.islink(os.path.join(dirpath, d)), d))
        files = [Path(dirpath) / name for name in filenames if not not_corpus(name)]
        left_out.extend(os.path.join(dirpath, n) for n in filenames if REPO_FILES.fullmatch(n))
        try:  # a folder readable but not searchable (mode 644) lists names it cannot stat
            broken = {path for path in files if path.is_symlink() and not path.exists()}
            special = {path for path in files if path not in broken and not path.is_file()}
        except OSError as exc:
            unreadable(dirpath, exc)
            dirnames[:] = []
            continue
        for path in files:
            if path in broken or path in special:
                bad.append(_broken(path) if path in broken else _special(path))
            else:
                yield path


def _find(fs, folder: str, left_out: list[str]) -> list[str]:
    """The corpus files under a store's ``folder``: hidden ones and `not_corpus` names left out,
    the URLs of a repository's README, LICENSE, ... added to ``left_out``."""
    root, found = folder.rstrip("/"), []
    for p in fs.find(folder):
        parts = p[len(root):].strip("/").split("/")
        if any(part.startswith(".") for part in parts) or parts[-1] in NOT_CORPUS:
            continue
        if REPO_FILES.fullmatch(parts[-1]):
            left_out.append(fs.unstrip_protocol(p))
        else:
            found.append(p)
    return found


def _resolve_url(url: str, bad: list[tuple[str, str]], left_out: list[str]) -> list[Source]:
    if url.startswith("file://"):
        # A local folder, file or pattern behind file:// is found as the same path given by
        # name is: fsspec's local find and glob list a link to a folder as a file ("Is a
        # directory" when read) or not at all.
        path = local_path(url)
        try:
            found = [str(p) for p in _resolve_local(path, bad, left_out)]
        except BertgpuError as exc:
            text = str(exc)
            raise BertgpuError(url + text[len(path):] if text.startswith(path + ":")
                               else text) from None
        return [url if p == path else f"file://{p}" for p in found]
    fs, path = filesystem(url)
    try:
        if glob.has_magic(path):
            found = [p for m, i in fs.glob(path, detail=True).items()
                     for p in ([m] if i.get("type") == "file" else _find(fs, m, left_out)
                               if i.get("type") == "directory" else [])]
            if not found:
                raise BertgpuError(f"{url}: pattern matches no files")
        elif fs.isdir(path):  # first: over http this is what fails on a host that is down
            found = _find(fs, path, left_out)
            if not found:
                raise BertgpuError(f"{url}: folder contains no corpus files "
                                   f"({SKIPPED_IN_FOLDERS}); expected corpus files")
        elif fs.isfile(path):
            found = [path]
        else:
            raise BertgpuError(f"{url}: no such file or folder")
    except BertgpuError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreachable host, refused credentials, ...
        raise BertgpuError(f"{url}: cannot reach ({_oneline(exc)})") from None
    found.sort(key=lambda p: p.split("/"))  # by part, as local paths: "a/x" before "a-b"
    return [url if p == path else fs.unstrip_protocol(p) for p in found]


def local_path(path: str | os.PathLike) -> str:
    """A ``file://`` URL as the local path it names (fsspec reads it as that path and
    `output.WorkFolder` writes there), so that every check of a local input or output applies
    to it; any other path or URL as given."""
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def check_url_apart(out: str, given: Iterable[str | os.PathLike],
                    flag: str = "--corpus") -> None:
    """An output URL neither lies inside a URL input (a file, a folder, the folder a pattern
    starts in) nor holds one, on the same filesystem, compared by fsspec's paths: a store has no
    rename, so its output is written in place and an overlap would read or remove the corpus."""
    fs_out, where = filesystem(out)
    where = where.rstrip("/")
    for raw in given:
        text = os.fspath(raw)
        if not is_url(text):
            continue
        fs_in, path = filesystem(text)
        if fs_in.protocol != fs_out.protocol:
            continue
        if glob.has_magic(path):  # the folder the pattern starts in
            path = path[: min(path.find(c) for c in "*?[" if c in path)].rpartition("/")[0]
        path = path.rstrip("/")
        if path == where or path.startswith(where + "/") or where.startswith(path + "/"):
            raise BertgpuError(f"{out}: overlaps the input {text} ({flag}); expected an output "
                               "folder outside the inputs, holding none of them")


def check_glob_apart(out: str | os.PathLike, patterns: Iterable[str | os.PathLike],
                     flag: str = "--corpus") -> None:
    """No local glob pattern in ``patterns`` can match the output folder ``out`` (or OUT.tmp,
    OUT.old) or anything inside it, whatever it comes to hold. `fsutil.check_apart` skips a
    pattern (it is no path that exists) and checks only what it matches now; a pattern that
    reaches into the output (``cc/**/*.txt`` with ``--out cc/sub/tok``) would read its files
    (vocab.txt, manifest.json, shards) as corpus on the next run."""
    folder = Path(local_path(out))
    family = [folder.with_name(folder.name + suffix) for suffix in ("", TMP, OLD)]
    for raw in patterns:
        text = local_path(raw)
        if is_url(text) or not glob.has_magic(text):
            continue
        if any(_glob_reaches(text, f) for f in family):
            raise BertgpuError(f"{folder}: overlaps the input {text} ({flag}); expected an "
                               "output folder outside the inputs, which the pattern cannot match")


def _glob_reaches(pattern: str, folder: Path) -> bool:
    """Whether ``glob.glob(pattern, recursive=True)`` (as `_resolve_local` calls it) can match
    ``folder`` or a path inside it. Exact for glob's rules, component by component: ``**``
    stands for any number of names, a wildcard neither matches nor crosses a hidden name unless
    it starts with ".", a literal matches itself; inside ``folder`` any name may come to exist.
    The parts before the first wildcard are the folder the pattern starts in; a ".." after a
    wildcard is taken lexically (``a/*/../b`` is ``a/b``)."""
    parts = Path(pattern).parts
    k = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    rest = Path(os.path.normpath(os.path.join(*parts[k:]))).parts
    ups = next((i for i, part in enumerate(rest) if part != os.pardir), len(rest))
    start, rest = Path(*parts[:k], *rest[:ups]), rest[ups:]
    # Both spellings: lexical, as glob walks the names (through links to folders), and
    # resolved, for an output named through another path to the same folder.
    for base, target in ((Path(os.path.abspath(start)), Path(os.path.abspath(folder))),
                         (start.resolve(), folder.resolve())):
        if base.is_relative_to(target):  # the pattern starts inside the folder
            return True
        if target.is_relative_to(base) and _parts_reach(rest, target.relative_to(base).parts):
            return True
    return False


def _parts_reach(pattern: tuple[str, ...], names: tuple[str, ...]) -> bool:
    """Whether the pattern's components can match ``names`` (a folder below the pattern's
    start) or the folder plus some components more."""
    @functools.cache
    def reach(i: int, j: int) -> bool:
        if j == len(names):  # the folder itself, or (pattern left) a path inside it
            return True
        if i == len(pattern):  # a folder above it: glob lists nothing under what it matches
            return False
        part, name = pattern[i], names[j]
        if part == "**":  # recursive: zero names, or one more (glob skips hidden folders)
            return reach(i + 1, j) or (not name.startswith(".") and reach(i, j + 1))
        if glob.has_magic(part):
            ok = (part.startswith(".") or not name.startswith(".")) and fnmatch.fnmatch(name, part)
        else:
            ok = part == name
        return ok and reach(i + 1, j + 1)

    return reach(0, 0)


def check_not_cwd(out: str | os.PathLike, flag: str = "--out") -> None:
    """A local output folder, which a command builds beside it and swaps in, is neither the
    current folder nor one that holds it: the shell would be left in a deleted folder (and
    ``.`` has no name to build ``..tmp`` beside)."""
    from bertgpu.fsutil import check_not_cwd as check_local

    text = local_path(out)
    if not is_url(text):
        check_local(text, flag)


def local_or_url(text: str | os.PathLike, base: str | None = None) -> Source:
    """A path or URL as the user gave it, as a Source (relative paths against ``base``)."""
    if is_url(text):
        return str(text)
    p = Path(text)
    return Path(base) / p if base is not None and not p.is_absolute() else p
