"""The one writer of shard sets (`bertgpu prepare` and `synthetic`): shard files streamed row by
row, manifest.json last, the whole folder moved into place at the end; and the MLM row packer.

    with ShardSetWriter(out, seq_len=128, dtype=np.uint16, shard_size=65536, nsp=False) as data:
        packer = Packer(data.writers["train"], seq_len=128, cls=2, sep=3)
        packer.add(tokens, None, joins)      # one unit's tokens, from `split.mlm_units`
        packer.finish()
        ...                                  # tokenizer/ into data.folder
        splits = data.close()                # {"train": {"sequences": ..., "shards": [...]}, ...}
        data.commit(Manifest(..., splits=splits))

Nothing of a shard stays in memory: rows go to ``NAME.KEY.npy.part`` as they come and are copied
behind the .npy header when the shard is complete (the same bytes as ``np.save``), into
``NAME.KEY.npy.tmp`` renamed to ``NAME.KEY.npy``, so a reader never sees a partial shard file.
`bertgpu prepare` writes one `ShardWriter` per split and work unit (``prefix``
"train-00003": shards "train-00003-00000", ...) and may upload each finished file
(``on_file``, `output`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from bertgpu.data.manifest import Manifest
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import is_scratch, make_scratch, remove_marked, replace_dir

SPLITS = ("train", "validation")


class ShardSetWriter:
    """A shard set being written to DIR.tmp, which replaces DIR once `commit` has written the
    manifest; leaving the `with` block any other way (an error, Ctrl-C) removes DIR.tmp, so a
    reader never finds a half-written set.

    ``writers`` holds a `ShardWriter` per split, ``folder`` is DIR.tmp (for tokenizer/).
    """

    def __init__(self, out: str | Path, seq_len: int, dtype: np.dtype, shard_size: int, nsp: bool,
                 word_starts: bool = False) -> None:
        self.out = Path(out)
        self.folder = self.out.with_name(self.out.name + ".tmp")
        self.writers = {s: ShardWriter(self.folder, s, seq_len, dtype, shard_size, nsp, word_starts)
                        for s in SPLITS}
        self._committed = False

    def __enter__(self) -> ShardSetWriter:
        make_scratch(self.folder, self.out)  # one left over from a killed run is removed
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self._committed and is_scratch(self.folder):
            remove_marked(self.folder)

    def close(self, documents: dict[str, int] | None = None) -> dict[str, dict[str, Any]]:
        """Write each split's last shard and return the manifest's ``splits``.

        ``documents``: per split, when the caller knows them (prepare; not synthetic sets).
        """
        for writer in self.writers.values():
            writer.flush()
        return {s: w.summary(None if documents is None else documents[s])
                for s, w in self.writers.items()}

    def commit(self, manifest: Manifest) -> Path:
        """Write manifest.json, then move the finished folder to DIR (replacing one there)."""
        (self.folder / "manifest.json").write_text(manifest.dumps(), encoding="utf-8")
        replace_dir(self.folder, self.out, replaces=lambda p: (p / "manifest.json").is_file(),
                    what="a shard set (with manifest.json)")
        self._committed = True
        return self.out


class ShardWriter:
    """Streams rows into the current shard's files; a shard holds shard_size rows.

    Keys: ``input_ids`` (N, T) and ``lengths`` (N,); with ``nsp`` also ``token_type_ids`` (N, T)
    and ``nsp_labels`` (N,); with ``word_starts`` also ``word_starts`` (N, T).
    """

    def __init__(self, folder: Path, split: str, seq_len: int, dtype: np.dtype, shard_size: int,
                 nsp: bool, word_starts: bool = False, prefix: str | None = None,
                 on_file: Callable[[Path], None] | None = None) -> None:
        self.folder, self.split = folder, split
        self.prefix = prefix or split
        self.on_file = on_file  # called with each finished .npy file
        self.seq_len, self.dtype, self.shard_size = seq_len, np.dtype(dtype), shard_size
        self.dtypes = {"input_ids": self.dtype, "lengths": np.dtype(np.int32)}
        self.id_limit = int(np.iinfo(self.dtype).max)  # a larger id would wrap: 70000 -> 4464
        if nsp:
            self.dtypes.update(token_type_ids=np.dtype(np.uint8), nsp_labels=np.dtype(np.uint8))
        if word_starts:
            self.dtypes["word_starts"] = np.dtype(np.uint8)
        self.files: dict = {}
        self.n = 0
        self.tokens = 0
        self.shards: list[dict] = []

    def _name(self) -> str:
        return f"{self.prefix}-{len(self.shards):05d}"

    def check_ids(self, ids: np.ndarray) -> None:
        """Refuse token ids this writer's dtype cannot hold, which a cast would wrap silently
        (prepare picks uint32 for a vocabulary over 65535, so this is a bug's sign)."""
        if ids.size and not np.can_cast(ids.dtype, self.dtype) and ids.max() > self.id_limit:
            raise BertgpuError(f"token id {int(ids.max())} does not fit the shards' {self.dtype} "
                               f"(ids up to {self.id_limit}); expected ids below the vocabulary "
                               "size the dtype was chosen for")

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """Append rows: ``arrays`` holds every key of this writer,
        all with the same number of rows."""
        self.check_ids(arrays["input_ids"])
        lengths = arrays["lengths"]
        done = 0
        while done < len(lengths):
            take = min(self.shard_size - self.n, len(lengths) - done)
            if not self.files:
                name = self._name()
                self.files = {key: open(self.folder / f"{name}.{key}.npy.part", "wb")
                              for key in self.dtypes}
            for key, dtype in self.dtypes.items():
                part = np.ascontiguousarray(arrays[key][done : done + take], dtype=dtype)
                self.files[key].write(part.data)
            self.tokens += int(lengths[done : done + take].sum())
            self.n += take
            done += take
            if self.n == self.shard_size:
                self.flush()

    def flush(self) -> None:
        """Close the current shard (if it has rows) and write its .npy files."""
        if self.n == 0:
            return
        name = self._name()
        for key, f in self.files.items():
            f.close()
            shape = ((self.n, self.seq_len) if key in ("input_ids", "token_type_ids", "word_starts")
                     else (self.n,))
            header = {"descr": np.lib.format.dtype_to_descr(self.dtypes[key]),
                      "fortran_order": False, "shape": shape}
            part = self.folder / f"{name}.{key}.npy.part"
            final = self.folder / f"{name}.{key}.npy"
            tmp = final.with_name(final.name + ".tmp")
            with open(tmp, "wb") as out, open(part, "rb") as src:
                np.lib.format.write_array_header_1_0(out, header)
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, final)
            part.unlink()
            if self.on_file is not None:
                self.on_file(final)
        self.files = {}
        self.shards.append({"name": name, "sequences": self.n, "tokens": self.tokens})
        self.n = 0
        self.tokens = 0

    def summary(self, documents: int | None = None) -> dict[str, Any]:
        """This split in the manifest's ``splits``; ``documents`` only when known."""
        summary: dict[str, Any] = {
            "sequences": sum(s["sequences"] for s in self.shards),
            "tokens": sum(s["tokens"] for s in self.shards),
        }
        if documents is not None:
            summary["documents"] = documents
        summary["shards"] = self.shards
        return summary


class Packer:
    """Packs a split's units of tokens into full ``[CLS] ... [SEP]`` rows, carrying the remainder
    over.

    A unit that does not continue the previous one (``joins`` False: a new document, or one
    resuming after a chunk went to the other split) is preceded by [SEP]. Every row is full
    except the last. With word starts, a flag array travels alongside ([CLS] and [SEP] start words).
    """

    def __init__(self, writer: ShardWriter, seq_len: int, cls: int, sep: int) -> None:
        self.writer, self.seq_len, self.cls, self.sep = writer, seq_len, cls, sep
        self.with_flags = "word_starts" in writer.dtypes
        self.carry = np.empty(0, np.int32)
        self.carry_flags = np.empty(0, np.uint8)
        self.started = False  # a token was packed

    def add(self, tokens: np.ndarray, word_starts: np.ndarray | None, joins: bool) -> None:
        """One unit's tokens (int32) and, with flags, its word starts (uint8)."""
        if tokens.size == 0:
            return
        self.writer.check_ids(tokens)  # (the rows below are made in the writer's dtype)
        sep = self.started and not joins
        buf = np.concatenate([self.carry, np.array([self.sep], np.int32), tokens] if sep
                             else [self.carry, tokens])
        if self.with_flags:
            parts = ([self.carry_flags, np.ones(1, np.uint8), word_starts] if sep
                     else [self.carry_flags, word_starts])
            self.carry_flags = np.concatenate(parts)
        self.started = True
        content = self.seq_len - 2
        n = len(buf) // content
        if n:
            rows = np.empty((n, self.seq_len), self.writer.dtype)
            rows[:, 0] = self.cls
            rows[:, 1:-1] = buf[: n * content].reshape(n, content)
            rows[:, -1] = self.sep
            arrays = {"input_ids": rows, "lengths": np.full(n, self.seq_len, np.int32)}
            if self.with_flags:
                arrays["word_starts"] = self._flag_rows(
                    self.carry_flags[: n * content].reshape(n, content))
            self.writer.add(arrays)
        self.carry = buf[n * content :]
        self.carry_flags = self.carry_flags[n * content :]

    def _flag_rows(self, content: np.ndarray) -> np.ndarray:
        rows = np.ones((len(content), self.seq_len), np.uint8)  # [CLS] and [SEP] start words
        rows[:, 1 : content.shape[1] + 1] = content
        return rows

    def finish(self) -> None:
        """Write the last, short row (right-padded with [PAD] = 0)."""
        k = self.carry.size
        if k == 0:
            return
        row = np.zeros((1, self.seq_len), self.writer.dtype)
        row[0, 0] = self.cls
        row[0, 1 : k + 1] = self.carry
        row[0, k + 1] = self.sep
        arrays = {"input_ids": row, "lengths": np.array([k + 2], np.int32)}
        if self.with_flags:
            flags = self._flag_rows(self.carry_flags[None, :])
            flags[0, k + 2 :] = 0
            arrays["word_starts"] = flags
        self.writer.add(arrays)
        self.carry = np.empty(0, np.int32)
        self.carry_flags = np.empty(0, np.uint8)
