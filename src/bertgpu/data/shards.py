"""The shard set on disk: memmap reading, compatibility with a model.

A shard set (written by `writer.ShardSetWriter` for `bertgpu prepare`, format in
docs/ARCHITECTURE.md) is a folder of plain `.npy` files plus `manifest.json`, read and validated
as a `manifest.Manifest` (``ShardSet.manifest``). This module reads it without loading it into
memory::

    from bertgpu.data.shards import ShardSet, check_compatible

    train = ShardSet("data/")                       # validates manifest.json and every shard
    check_compatible(train, vocab_size=30522, max_position_embeddings=512)
    rows = train.get([0, 5, 9])                     # input_ids (3, T), lengths (3,), ...

The global sample order and the masks are in `masking.py`, each rank's batches in `loaders.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bertgpu.data.manifest import SPECIAL_KEYS, Manifest
from bertgpu.errors import BertgpuError

__all__ = ["ShardSet", "check_compatible"]


# --------------------------------------------------------------------------------------------
# Shard set


class ShardSet:
    """One split (`"train"` or `"validation"`) of a shard set, memory-mapped.

    Construction validates the manifest and the header (shape, dtype) of every shard file, so
    a broken data folder fails at start-up with a message naming the file, not hours later.
    Global index `i` runs over the shards in manifest order.
    """

    def __init__(self, data_dir: str | Path, split: str = "train") -> None:
        self.data_dir = Path(data_dir)
        self.split = split
        self.manifest_path = self.data_dir / "manifest.json"
        self.manifest = Manifest.read(self.manifest_path)
        m = self.manifest
        self.objective: str = m.objective
        self.seq_len: int = int(m.seq_len)
        self.vocab_size: int = int(m.vocab_size)
        self.dtype = np.dtype(m.dtype)
        self.special_tokens: dict[str, int] = {k: int(m.special_tokens[k]) for k in SPECIAL_KEYS}
        shards = m.split_shards(split, self.manifest_path)
        self.shard_names = [name for name, _ in shards]
        self._counts = np.asarray([n for _, n in shards], dtype=np.int64)
        # Shard s holds global indices [starts[s], ends[s]); np.searchsorted on ends finds s.
        self._ends = np.cumsum(self._counts)
        self._starts = self._ends - self._counts
        self._arrays: list[dict[str, np.ndarray]] | None = None
        self._open()
        self._check_lengths()

    @property
    def has_nsp(self) -> bool:
        return self.manifest.has_nsp

    @property
    def tokenizer_dir(self) -> Path:
        return self.data_dir / "tokenizer"

    @property
    def tokenizer_hash(self) -> str:
        return str(self.manifest.tokenizer_hash)

    @property
    def has_word_starts(self) -> bool:
        """Whether a whole-word segmenter stored word-start flags (`bertgpu.data.segment`)."""
        return self.manifest.has_word_starts

    def word_starts_source(self) -> str:
        """What says where whole words start, for a run's start-up table: the shards' segmenter
        ("jieba word starts"), or the tokenizer's marks (data/word_rule.py)."""
        if self.has_word_starts:
            return f"{self.manifest.whole_word_segmenter} word starts"
        from bertgpu.data.word_rule import word_rule

        return word_rule(self.tokenizer_dir).describe()

    def _fields(self) -> dict[str, tuple[np.dtype, bool]]:
        """Per-sequence arrays of this objective: name -> (dtype, has a seq_len axis)."""
        fields = {"input_ids": (self.dtype, True), "lengths": (np.dtype("int32"), False)}
        if self.has_nsp:
            fields["token_type_ids"] = (np.dtype("uint8"), True)
            fields["nsp_labels"] = (np.dtype("uint8"), False)
        if self.has_word_starts:
            fields["word_starts"] = (np.dtype("uint8"), True)
        return fields

    def _open(self) -> list[dict[str, np.ndarray]]:
        """Memory-map every shard file, checking shapes and dtypes against the manifest."""
        if self._arrays is not None:
            return self._arrays
        arrays = []
        for name, count in zip(self.shard_names, self._counts.tolist(), strict=True):
            shard: dict[str, np.ndarray] = {}
            for field, (dtype, has_t) in self._fields().items():
                path = self.data_dir / f"{name}.{field}.npy"
                if not path.is_file():
                    raise BertgpuError(f"{path}: shard file missing (listed in "
                                       f"{self.manifest_path})")
                try:
                    arr = np.load(path, mmap_mode="r", allow_pickle=False)
                except (ValueError, OSError, EOFError) as e:  # EOFError: an empty file
                    raise BertgpuError(f"{path}: not a readable .npy file ({e})") from None
                shape = (count, self.seq_len) if has_t else (count,)
                if arr.shape != shape or arr.dtype != dtype:
                    raise BertgpuError(
                        f"{path}: found shape {arr.shape} dtype {arr.dtype}, expected shape "
                        f"{shape} dtype {dtype} (from {self.manifest_path})"
                    )
                shard[field] = arr
            arrays.append(shard)
        self._arrays = arrays
        return arrays

    def _check_lengths(self) -> None:
        """Every row's length within 2 ([CLS] [SEP]) .. seq_len, and each shard's lengths summing
        to the manifest's count of its tokens. Damaged lengths (zeros) trained silently: no real
        token, loss 0, and a checkpoint and an export of nothing learned. Reads the lengths
        only (4 bytes a sequence), once: not in the worker processes that re-open the files."""
        listed = self.manifest.splits[self.split]["shards"]
        tokens = {s["name"]: s.get("tokens") for s in listed}  # checked by split_shards
        damaged = ("a damaged shard; expected the shard set as bertgpu prepare wrote it (prepare "
                   "it again)")
        chunk = 1 << 22  # rows at a time: a shard set of 10^8 sequences needs no 2 x 400 MB
        for name, shard in zip(self.shard_names, self._open(), strict=True):
            path, lengths, total = self.data_dir / f"{name}.lengths.npy", shard["lengths"], 0
            for start in range(0, len(lengths), chunk):
                part = np.asarray(lengths[start:start + chunk])
                bad = np.flatnonzero((part < 2) | (part > self.seq_len))
                if bad.size:
                    raise BertgpuError(
                        f"{path}: row {start + int(bad[0])} has length {int(part[bad[0]])}, "
                        f"expected 2 ([CLS] and [SEP]) to seq_len {self.seq_len} "
                        f"({self.manifest_path}): {damaged}")
                total += int(part.sum(dtype=np.int64))
            if isinstance(tokens[name], int) and total != tokens[name]:
                raise BertgpuError(
                    f"{path}: the lengths sum to {total} tokens, expected the {tokens[name]} that "
                    f"{self.manifest_path} lists for {name}: {damaged}")

    # Worker processes re-open the memmaps instead of pickling their contents.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def has_short_rows(self) -> bool:
        """Whether some sequence is shorter than seq_len (padding in its batch): a packed MLM
        split's last sequences, most NSP pairs. Reads the lengths (4 bytes a sequence)."""
        return any(bool((shard["lengths"] < self.seq_len).any()) for shard in self._open())

    def __repr__(self) -> str:
        return (
            f"ShardSet({str(self.data_dir)!r}, split={self.split!r}: {len(self)} sequences of "
            f"{self.seq_len} in {len(self.shard_names)} shards, objective {self.objective!r})"
        )

    def get(self, indices: np.ndarray | Iterable[int]) -> dict[str, np.ndarray]:
        """Rows at global `indices` (any order, repeats allowed), as int64 arrays.

        Returns `input_ids` (B, T), `lengths` (B,), `token_type_ids` (B, T) (zeros for "mlm") and,
        for "mlm+nsp", `nsp_labels` (B,); with a whole-word segmenter also `word_starts` (B, T)
        bool.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n, T, B = len(self), self.seq_len, idx.size
        if B and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"sample index out of range [0, {n}) in {self!r}")
        out = {
            "input_ids": np.empty((B, T), dtype=np.int64),
            "lengths": np.empty(B, dtype=np.int64),
        }
        if self.has_nsp:
            out["token_type_ids"] = np.empty((B, T), dtype=np.int64)
            out["nsp_labels"] = np.empty(B, dtype=np.int64)
        else:
            out["token_type_ids"] = np.zeros((B, T), dtype=np.int64)
        if self.has_word_starts:
            out["word_starts"] = np.empty((B, T), dtype=bool)
        if B == 0:
            return out
        arrays = self._open()
        # Sort once so each shard is read with ascending offsets (page-cache friendly), then
        # process the contiguous run of each shard.
        order = np.argsort(idx, kind="stable")
        sorted_idx = idx[order]
        shard_of = np.searchsorted(self._ends, sorted_idx, side="right")
        cuts = np.flatnonzero(np.diff(shard_of)) + 1
        for rows, local, s in zip(
            np.split(order, cuts), np.split(sorted_idx, cuts), shard_of[np.r_[0, cuts]].tolist(),
            strict=True
        ):
            local = local - self._starts[s]
            for field, arr in arrays[s].items():
                out[field][rows] = arr[local]
        return out


def check_compatible(
    shards: ShardSet,
    vocab_size: int,
    max_position_embeddings: int,
    tokenizer_hash: str | None = None,
    *,
    type_vocab_size: int | None = None,
    special_ids: dict[str, int] | None = None,
    special_mismatch: Callable[[str, int, int], str] | None = None,
) -> None:
    """Refuse a shard set whose tokenizer or sequence length does not fit the model.

    A model vocabulary larger than the tokenizer's is fine (embeddings padded to a multiple of
    64 are common); a smaller one, a longer sequence than the position table, another
    tokenizer (hash from `tokenizer_folder.tokenizer_hash`), or a special token whose id
    differs from the model's (`special_ids`: "pad" -> the config's pad_token_id, ...) is an
    error naming the manifest. `special_mismatch(key, shards' id, model's id)`: the text of
    that last error after the manifest's path, for a caller that knows where the model's ids
    come from (an --init folder, with or without its tokenizer); by default it suggests the
    setting model.KEY_token_id, which only a model configured by the run may change.
    """
    path = shards.manifest_path
    if shards.vocab_size > vocab_size:
        raise BertgpuError(
            f"{path}: vocab_size {shards.vocab_size} does not fit the model: expected at most the "
            f"model's vocab_size {vocab_size}, found {shards.vocab_size}"
        )
    if shards.seq_len > max_position_embeddings:
        raise BertgpuError(
            f"{path}: seq_len {shards.seq_len} is longer than the model's max_position_embeddings "
            f"{max_position_embeddings}; expected seq_len <= {max_position_embeddings} (or a "
            "larger model.max_position_embeddings)"
        )
    for key, model_id in (special_ids or {}).items():
        shard_id = shards.special_tokens[key]
        if shard_id != model_id:
            if special_mismatch is not None:
                raise BertgpuError(f"{path}: {special_mismatch(key, shard_id, model_id)}")
            raise BertgpuError(
                f"{path}: special token {key} has id {shard_id} in the shards "
                f"but {model_id} in the model ({key}_token_id); expected the same id (set "
                f"model.{key}_token_id {shard_id}, or prepare with the model's tokenizer)"
            )
    if tokenizer_hash is not None and shards.tokenizer_hash != tokenizer_hash:
        raise BertgpuError(
            f"{path}: tokenizer_hash does not match the model's tokenizer: expected "
            f"{tokenizer_hash}, found {shards.tokenizer_hash} (the shards were prepared with "
            "another tokenizer)"
        )
    if type_vocab_size is not None and shards.has_nsp and type_vocab_size < 2:
        raise BertgpuError(
            f"{path}: objective 'mlm+nsp' needs token types 0 and 1: expected type_vocab_size >= "
            f"2, found {type_vocab_size}"
        )


