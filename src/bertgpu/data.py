"""Memmap shard reader, deterministic rank-aware sample order, resumable cursor, masking collator.

A shard set (written by `bertgpu prepare`, format in docs/ARCHITECTURE.md) is a folder of plain
`.npy` files plus `manifest.json`. This module reads it without loading it into memory and turns
it into the micro batches one rank needs for one optimizer step::

    from bertgpu.data import MaskingConfig, PretrainLoader, ShardSet, check_compatible

    train = ShardSet("data/")                       # validates manifest.json and every shard
    check_compatible(train, vocab_size=30522, max_position_embeddings=512)
    loader = PretrainLoader(train, MaskingConfig(mask_rate=0.15), global_batch_size=256,
                            micro_batch_size=32, rank=rank, world_size=world, seed=1234)
    micro_batches = loader.next_step()              # accumulation_steps dicts of torch.long tensors
    state = loader.state_dict()                     # {"position": ..., "seed": ...}

Determinism (Megatron's idea, see DESIGN.md §3): the sample at global position `p` is
`sample_order(n, seed, p // n)[p % n]`, and the mask of sample `i` in epoch `e` comes from a
numpy Philox generator keyed on `(seed, e, i)` alone. Nothing depends on the world size, the
micro batch size, the number of workers or restarts, so resuming at another world size continues
with exactly the next samples and the same masks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
OBJECTIVES = ("mlm", "mlm+nsp")
IGNORE_INDEX = -100  # label of positions that are not predicted (PyTorch's cross-entropy default)
SPECIAL_KEYS = ("pad", "unk", "cls", "sep", "mask")

_U64 = (1 << 64) - 1
# Philox keys are (seed, domain): the order and the masks use separate streams even for one seed.
_ORDER_DOMAIN = 0x6F72646572  # "order"
_MASK_DOMAIN = 0x6D61736B  # "mask"


# --------------------------------------------------------------------------------------------
# Shard set


def _read_manifest(path: Path) -> dict[str, Any]:
    """Load and validate `manifest.json`; every problem is a BertgpuError naming the file."""
    if not path.is_file():
        raise BertgpuError(f"{path}: no manifest.json found (expected a shard set written by `bertgpu prepare`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BertgpuError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BertgpuError(f"{path}: cannot read the manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise BertgpuError(f"{path}: expected a JSON object, found {type(manifest).__name__}")
    # The version first: a manifest from a newer bertgpu may have other keys.
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise BertgpuError(
            f"{path}: format_version: found {version!r}, expected {FORMAT_VERSION} "
            "(re-run `bertgpu prepare` with this version of bertgpu)"
        )
    for key in ("objective", "seq_len", "dtype", "vocab_size", "tokenizer_hash", "special_tokens", "splits"):
        if key not in manifest:
            raise BertgpuError(f"{path}: missing key {key!r}")
    if manifest["objective"] not in OBJECTIVES:
        raise BertgpuError(f"{path}: objective: found {manifest['objective']!r}, expected one of {list(OBJECTIVES)}")
    for key in ("seq_len", "vocab_size"):
        value = manifest[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise BertgpuError(f"{path}: {key}: found {value!r}, expected a positive integer")
    if manifest["dtype"] not in ("uint16", "uint32"):
        raise BertgpuError(f"{path}: dtype: found {manifest['dtype']!r}, expected 'uint16' or 'uint32'")
    special = manifest["special_tokens"]
    if not isinstance(special, dict) or any(
        not isinstance(special.get(k), int) or not 0 <= special[k] < manifest["vocab_size"] for k in SPECIAL_KEYS
    ):
        raise BertgpuError(
            f"{path}: special_tokens: found {special!r}, expected integer ids below vocab_size for {list(SPECIAL_KEYS)}"
        )
    if not isinstance(manifest["splits"], dict):
        raise BertgpuError(f"{path}: splits: expected an object with 'train' and 'validation'")
    return manifest


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
        self.manifest: dict[str, Any] = _read_manifest(self.manifest_path)
        m = self.manifest
        self.objective: str = m["objective"]
        self.seq_len: int = int(m["seq_len"])
        self.vocab_size: int = int(m["vocab_size"])
        self.dtype = np.dtype(m["dtype"])
        self.special_tokens: dict[str, int] = {k: int(m["special_tokens"][k]) for k in SPECIAL_KEYS}
        split_info = m["splits"].get(split)
        if not isinstance(split_info, dict) or not isinstance(split_info.get("shards"), list):
            raise BertgpuError(
                f"{self.manifest_path}: splits.{split}: missing or without a 'shards' list "
                f"(found splits {sorted(m['splits'])})"
            )
        names: list[str] = []
        counts: list[int] = []
        for k, shard in enumerate(split_info["shards"]):
            ok = isinstance(shard, dict) and isinstance(shard.get("name"), str) and isinstance(shard.get("sequences"), int)
            if not ok or shard["sequences"] < 0 or "/" in shard["name"] or "\\" in shard["name"]:
                raise BertgpuError(
                    f"{self.manifest_path}: splits.{split}.shards[{k}]: found {shard!r}, "
                    "expected {\"name\": \"<file stem>\", \"sequences\": <int>}"
                )
            names.append(shard["name"])
            counts.append(shard["sequences"])
        self.shard_names = names
        self._counts = np.asarray(counts, dtype=np.int64)
        # Shard s holds global indices [starts[s], ends[s]); np.searchsorted on ends finds s.
        self._ends = np.cumsum(self._counts)
        self._starts = self._ends - self._counts
        declared = split_info.get("sequences")
        if isinstance(declared, int) and declared != int(self._counts.sum()):
            raise BertgpuError(
                f"{self.manifest_path}: splits.{split}.sequences is {declared} but its shards hold {int(self._counts.sum())}"
            )
        self._arrays: list[dict[str, np.ndarray]] | None = None
        self._open()

    @property
    def has_nsp(self) -> bool:
        return self.objective == "mlm+nsp"

    @property
    def tokenizer_dir(self) -> Path:
        return self.data_dir / "tokenizer"

    @property
    def tokenizer_hash(self) -> str:
        return str(self.manifest["tokenizer_hash"])

    def _fields(self) -> dict[str, tuple[np.dtype, bool]]:
        """Per-sequence arrays of this objective: name -> (dtype, has a seq_len axis)."""
        fields = {"input_ids": (self.dtype, True), "lengths": (np.dtype("int32"), False)}
        if self.has_nsp:
            fields["token_type_ids"] = (np.dtype("uint8"), True)
            fields["nsp_labels"] = (np.dtype("uint8"), False)
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
                    raise BertgpuError(f"{path}: shard file missing (listed in {self.manifest_path})")
                try:
                    arr = np.load(path, mmap_mode="r", allow_pickle=False)
                except (ValueError, OSError) as e:
                    raise BertgpuError(f"{path}: not a readable .npy file ({e})") from None
                shape = (count, self.seq_len) if has_t else (count,)
                if arr.shape != shape or arr.dtype != dtype:
                    raise BertgpuError(
                        f"{path}: found shape {arr.shape} dtype {arr.dtype}, expected shape {shape} dtype {dtype} "
                        f"(from {self.manifest_path})"
                    )
                shard[field] = arr
            arrays.append(shard)
        self._arrays = arrays
        return arrays

    # Worker processes re-open the memmaps instead of pickling their contents.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __repr__(self) -> str:
        return (
            f"ShardSet({str(self.data_dir)!r}, split={self.split!r}: {len(self)} sequences of {self.seq_len} "
            f"in {len(self.shard_names)} shards, objective {self.objective!r})"
        )

    def get(self, indices: np.ndarray | Iterable[int]) -> dict[str, np.ndarray]:
        """Rows at global `indices` (any order, repeats allowed), as int64 arrays.

        Returns `input_ids` (B, T), `lengths` (B,), `token_type_ids` (B, T) (zeros for "mlm") and,
        for "mlm+nsp", `nsp_labels` (B,).
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
            np.split(order, cuts), np.split(sorted_idx, cuts), shard_of[np.r_[0, cuts]].tolist(), strict=True
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
) -> None:
    """Refuse a shard set whose tokenizer or sequence length does not fit the model.

    A model vocabulary larger than the tokenizer's is fine (embeddings padded to a multiple of
    64 are common); a smaller one, a longer sequence than the position table, or another
    tokenizer (hash from `bertgpu.tokenizer.tokenizer_hash`) is an error naming the manifest.
    """
    path = shards.manifest_path
    if shards.vocab_size > vocab_size:
        raise BertgpuError(
            f"{path}: vocab_size {shards.vocab_size} does not fit the model: expected at most the model's "
            f"vocab_size {vocab_size}, found {shards.vocab_size}"
        )
    if shards.seq_len > max_position_embeddings:
        raise BertgpuError(
            f"{path}: seq_len {shards.seq_len} is longer than the model's max_position_embeddings "
            f"{max_position_embeddings}; expected seq_len <= {max_position_embeddings}"
        )
    if tokenizer_hash is not None and shards.tokenizer_hash != tokenizer_hash:
        raise BertgpuError(
            f"{path}: tokenizer_hash does not match the model's tokenizer: expected {tokenizer_hash}, "
            f"found {shards.tokenizer_hash} (the shards were prepared with another tokenizer)"
        )
    if type_vocab_size is not None and shards.has_nsp and type_vocab_size < 2:
        raise BertgpuError(
            f"{path}: objective 'mlm+nsp' needs token types 0 and 1: expected type_vocab_size >= 2, "
            f"found {type_vocab_size}"
        )


# --------------------------------------------------------------------------------------------
# Global sample order


def _check_seed(seed: int) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= int(seed) <= _U64:
        raise BertgpuError(f"seed: found {seed!r}, expected an integer in [0, 2**64)")
    return int(seed)


def _philox(seed: int, domain: int, epoch: int, index: int) -> np.random.Generator:
    """A generator that depends on (seed, domain, epoch, index) alone.

    The key holds (seed, domain); (index, epoch) sit in the two high words of Philox's 256-bit
    counter, which draws advance from the low word, so streams never overlap (2**128 blocks each).
    """
    key = np.array([seed, domain], dtype=np.uint64)
    counter = np.array([0, 0, index, epoch], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


def sample_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """The permutation of `range(n)` (int64) used in `epoch`; a function of (n, seed, epoch) alone."""
    return _philox(_check_seed(seed), _ORDER_DOMAIN, int(epoch), 0).permutation(int(n))


@functools.lru_cache(maxsize=4)
def _cached_order(n: int, seed: int, epoch: int) -> np.ndarray:
    # uint32 halves the memory of a large epoch permutation; read-only because it is shared.
    order = sample_order(n, seed, epoch)
    if n <= np.iinfo(np.uint32).max:
        order = order.astype(np.uint32)
    order.flags.writeable = False
    return order


def positions_to_indices(positions: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Global positions (any shape) -> (epochs, sample indices), both int64 of the same shape."""
    if n <= 0:
        raise ValueError("positions_to_indices needs a non-empty data set")
    pos = np.asarray(positions, dtype=np.int64)
    epochs, offsets = np.divmod(pos, n)
    indices = np.empty_like(pos)
    # A batch spans at most a few epochs; each permutation is computed once and cached.
    for e in np.unique(epochs).tolist():
        sel = epochs == e
        indices[sel] = _cached_order(int(n), int(seed), int(e))[offsets[sel]]
    return epochs, indices


def position_to_index(p: int, n: int, seed: int) -> tuple[int, int]:
    """Global position `p` -> (epoch, sample index): `(p // n, sample_order(n, seed, p // n)[p % n])`."""
    epoch, offset = divmod(int(p), int(n))
    return epoch, int(_cached_order(int(n), int(seed), epoch)[offset])


# --------------------------------------------------------------------------------------------
# Masking


@dataclass
class MaskingConfig:
    """How tokens are chosen for the masked-language-model objective (BERT, §3.1)."""

    mask_rate: float = 0.15
    """Fraction of the maskable tokens (not special, inside the sequence) chosen for prediction:
    exactly round(mask_rate * maskable), at least one. 0.15 in BERT, 0.3 in MosaicBERT."""
    replace_mask: float = 0.8
    """Of the chosen tokens, the fraction replaced by [MASK]."""
    replace_random: float = 0.1
    """Of the chosen tokens, the fraction replaced by a random non-special token; the remaining
    1 - replace_mask - replace_random stay unchanged (but are still predicted)."""
    whole_word: bool = False
    """Choose whole words: all WordPiece pieces of a word (a vocab entry starting with "##"
    continues the previous word) are chosen together, up to the same token budget."""

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_rate < 1.0:
            raise BertgpuError(f"masking.mask_rate: found {self.mask_rate}, expected a value in (0, 1)")
        for name in ("replace_mask", "replace_random"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise BertgpuError(f"masking.{name}: found {getattr(self, name)}, expected a value in [0, 1]")
        if self.replace_mask + self.replace_random > 1.0 + 1e-9:
            raise BertgpuError(
                f"masking: replace_mask + replace_random = {self.replace_mask + self.replace_random}, expected <= 1"
            )


def continuation_table_from_vocab(vocab_txt_path: str | Path) -> np.ndarray:
    """(V,) bool: True for vocab entries that continue a word (WordPiece "##" pieces)."""
    path = Path(vocab_txt_path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise BertgpuError(f"{path}: cannot read the vocabulary ({e})") from None
    if lines and lines[-1] == "":
        lines.pop()  # the trailing newline, not an entry
    return np.array([tok.rstrip("\r").startswith("##") for tok in lines], dtype=bool)


class Masker:
    """Dynamic, deterministic masking: the mask of a sample depends on (seed, epoch, index) only.

    Each row gets its own Philox generator; all other work is vectorised over the batch.
    """

    def __init__(
        self,
        cfg: MaskingConfig,
        vocab_size: int,
        special_ids: Iterable[int] | np.ndarray,
        mask_id: int,
        continuation: np.ndarray | None = None,
    ) -> None:
        self.cfg = cfg
        self.vocab_size = int(vocab_size)
        self.mask_id = int(mask_id)
        special = np.zeros(self.vocab_size, dtype=bool)
        special[np.asarray(list(special_ids), dtype=np.int64)] = True
        self._special = special  # (V,) lookup: True for tokens never masked
        # Random replacements are drawn from these ids only, so they are never special.
        self._replacement = np.flatnonzero(~special).astype(np.int64)
        if self._replacement.size == 0:
            raise BertgpuError("masking: every vocabulary entry is special; nothing to mask")
        self._continuation: np.ndarray | None = None
        if cfg.whole_word:
            if continuation is None:
                raise BertgpuError("masking.whole_word needs the tokenizer's vocab.txt (continuation table)")
            table = np.zeros(max(self.vocab_size, len(continuation)), dtype=bool)
            table[: len(continuation)] = np.asarray(continuation, dtype=bool)
            self._continuation = table

    @classmethod
    def from_shards(cls, cfg: MaskingConfig, shards: ShardSet) -> Masker:
        """A masker for a shard set: its vocab size, special tokens and (whole-word) vocab.txt."""
        continuation = None
        if cfg.whole_word:
            vocab_txt = shards.tokenizer_dir / "vocab.txt"
            continuation = continuation_table_from_vocab(vocab_txt)
            if len(continuation) != shards.vocab_size:
                raise BertgpuError(
                    f"{vocab_txt}: {len(continuation)} entries, expected vocab_size {shards.vocab_size} "
                    f"from {shards.manifest_path}"
                )
        return cls(cfg, shards.vocab_size, shards.special_tokens.values(), shards.special_tokens["mask"], continuation)

    def mask(
        self, input_ids_row: np.ndarray, length: int, seed: int, epoch: int, index: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mask one row (T,): returns (masked ids (T,), labels (T,) with -100 where not predicted)."""
        masked, labels = self.mask_batch(
            np.asarray(input_ids_row)[None, :], np.array([length]), seed, np.array([epoch]), np.array([index])
        )
        return masked[0], labels[0]

    def mask_batch(
        self,
        input_ids: np.ndarray,
        lengths: np.ndarray,
        seed: int,
        epochs: np.ndarray,
        indices: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mask a batch: input_ids (B, T), lengths/epochs/indices (B,) -> (masked ids, labels), (B, T) int64.

        Row b is exactly `mask(input_ids[b], lengths[b], seed, epochs[b], indices[b])`: nothing
        depends on the other rows or on T beyond the row's length.
        """
        ids = np.asarray(input_ids, dtype=np.int64)
        B, T = ids.shape
        seed = _check_seed(seed)
        lens = np.minimum(np.asarray(lengths, dtype=np.int64).reshape(B), T)
        epochs = np.asarray(epochs, dtype=np.int64).reshape(B)
        indices = np.asarray(indices, dtype=np.int64).reshape(B)
        pos = np.arange(T)
        cand = (pos[None, :] < lens[:, None]) & ~self._special[ids]  # (B, T) maskable
        # Three uniforms per real token: selection key, 80/10/10 action, replacement token.
        # Only `length` of each are drawn, so padding width never changes a row's mask.
        u = np.ones((3, B, T))
        # One bit generator re-keyed per row: the same stream as `_philox(seed, _MASK_DOMAIN, e, i)`
        # (checked in the tests) at a third of the cost of constructing a new one.
        bit_gen = np.random.Philox(key=np.array([seed, _MASK_DOMAIN], dtype=np.uint64))
        gen = np.random.Generator(bit_gen)
        state = bit_gen.state
        for b, (L, e, i) in enumerate(zip(lens.tolist(), epochs.tolist(), indices.tolist(), strict=True)):
            state["state"]["counter"] = np.array([0, 0, i, e], dtype=np.uint64)
            state["buffer_pos"], state["has_uint32"], state["uinteger"] = 4, 0, 0  # drop buffered draws
            bit_gen.state = state
            u[:, b, :L] = gen.random((3, L))
        n_cand = cand.sum(axis=1)  # (B,)
        budget = np.floor(self.cfg.mask_rate * n_cand + 0.5).astype(np.int64)  # round half up
        budget = np.where((n_cand > 0) & (budget == 0), 1, budget)
        if self._continuation is None:
            chosen = self._choose_tokens(u[0], cand, budget)
        else:
            chosen = self._choose_words(ids, u[0], cand, budget)
        action = u[1]
        to_mask = chosen & (action < self.cfg.replace_mask)
        to_random = chosen & ~to_mask & (action < self.cfg.replace_mask + self.cfg.replace_random)
        n_repl = self._replacement.size
        random_ids = self._replacement[np.minimum((u[2] * n_repl).astype(np.int64), n_repl - 1)]  # (B, T)
        masked = ids.copy()
        masked[to_mask] = self.mask_id
        masked[to_random] = random_ids[to_random]
        labels = np.where(chosen, ids, IGNORE_INDEX)
        return masked, labels

    @staticmethod
    def _choose_tokens(keys: np.ndarray, cand: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """The `budget[b]` candidates with the smallest keys in each row: a uniform random subset."""
        B, T = cand.shape
        order = np.argsort(np.where(cand, keys, np.inf), axis=1)
        chosen = np.zeros((B, T), dtype=bool)
        np.put_along_axis(chosen, order, np.arange(T)[None, :] < budget[:, None], axis=1)
        return chosen

    def _choose_words(self, ids: np.ndarray, keys: np.ndarray, cand: np.ndarray, budget: np.ndarray) -> np.ndarray:
        """Whole words in random order, skipping a word that would overshoot the token budget
        (Google's create_pretraining_data.py); at least one word when a row has any."""
        assert self._continuation is not None
        B, T = cand.shape
        prev_cand = np.zeros_like(cand)
        prev_cand[:, 1:] = cand[:, :-1]
        # A word starts at a candidate unless it is a "##" piece right after another candidate.
        start = cand & ~(self._continuation[ids] & prev_cand)
        chosen = np.zeros((B, T), dtype=bool)
        for b in range(B):
            starts = np.flatnonzero(start[b])
            if starts.size == 0:
                continue
            word_of = np.cumsum(start[b]) - 1  # (T,) word number of each candidate position
            sizes = np.bincount(word_of[cand[b]], minlength=starts.size)
            take = np.zeros(starts.size, dtype=bool)
            covered, k = 0, int(budget[b])
            for w in np.argsort(keys[b, starts], kind="stable").tolist():  # word key: its first piece's
                if covered + sizes[w] > k:
                    continue
                take[w] = True
                covered += int(sizes[w])
                if covered == k:
                    break
            if covered == 0:
                take[int(np.argmin(keys[b, starts]))] = True
            chosen[b] = cand[b] & take[np.maximum(word_of, 0)]
        return chosen


# --------------------------------------------------------------------------------------------
# Batches and loaders


def _make_batch(shards: ShardSet, masker: Masker, seed: int, epochs: np.ndarray, indices: np.ndarray) -> dict[str, torch.Tensor]:
    """Samples (epoch, index) -> one model batch of torch.long tensors (B, T) / (B,)."""
    import torch

    raw = shards.get(indices)
    masked, labels = masker.mask_batch(raw["input_ids"], raw["lengths"], seed, epochs, indices)
    T = masked.shape[1]
    attention_mask = (np.arange(T)[None, :] < raw["lengths"][:, None]).astype(np.int64)  # (B, T)
    batch = {
        "input_ids": torch.from_numpy(masked),
        "attention_mask": torch.from_numpy(attention_mask),
        "token_type_ids": torch.from_numpy(raw["token_type_ids"]),
        "labels": torch.from_numpy(labels),
    }
    if "nsp_labels" in raw:
        batch["next_sentence_label"] = torch.from_numpy(raw["nsp_labels"])
    return batch


class _MicroBatches:
    """Map-style dataset for torch's DataLoader: item j is this rank's j-th micro batch after
    global position `start` (step j // A, micro batch j % A). Picklable for worker processes."""

    def __init__(self, shards: ShardSet, masker: Masker, seed: int, start: int, global_batch_size: int,
                 micro_batch_size: int, rank: int, world_size: int) -> None:
        self.shards, self.masker, self.seed, self.start = shards, masker, seed, start
        self.G, self.m = global_batch_size, micro_batch_size
        self.per_rank = global_batch_size // world_size
        self.A = self.per_rank // micro_batch_size
        self.rank = rank

    def positions(self, j: int) -> np.ndarray:
        step, micro = divmod(j, self.A)
        first = self.start + step * self.G + self.rank * self.per_rank + micro * self.m
        return np.arange(first, first + self.m, dtype=np.int64)

    def __getitem__(self, j: int) -> dict[str, torch.Tensor]:
        epochs, indices = positions_to_indices(self.positions(j), len(self.shards), self.seed)
        return _make_batch(self.shards, self.masker, self.seed, epochs, indices)

    def __len__(self) -> int:
        return 1 << 62  # endless: the loader stops asking, not the dataset


def _as_masker(masking: Masker | MaskingConfig, shards: ShardSet) -> Masker:
    if isinstance(masking, Masker):
        return masking
    if isinstance(masking, MaskingConfig):
        return Masker.from_shards(masking, shards)
    raise TypeError(f"expected a Masker or MaskingConfig, got {type(masking).__name__}")


class PretrainLoader:
    """The micro batches of one rank, one optimizer step at a time, resumable by global position.

    Step s covers global positions [pos, pos + G); rank r takes [pos + r*G/W, pos + (r+1)*G/W),
    cut into `accumulation_steps` micro batches of `micro_batch_size`. The state is the global
    position alone, so a resumed run (any world size or micro batch size) sees the same samples.
    With `num_workers > 0` a torch DataLoader prepares the next micro batches in worker
    processes while the model computes; the batches are identical to `num_workers=0`.

    `bucket_window=k` (k >= 1; 0 = off) sorts the samples of each window of k micro batches by
    length and cuts every micro batch to its own longest sequence (`bucket_by_length`): the same
    samples with the same masks in the same step, less padding, and, since the engine normalises
    by the step's token count, the same step loss.
    """

    def __init__(
        self,
        shards: ShardSet,
        masking: Masker | MaskingConfig,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        bucket_window: int = 0,
    ) -> None:
        for name, value in (("global_batch_size", global_batch_size), ("micro_batch_size", micro_batch_size),
                            ("world_size", world_size)):
            if not isinstance(value, int) or value <= 0:
                raise BertgpuError(f"{name}: found {value!r}, expected a positive integer")
        if not 0 <= rank < world_size:
            raise BertgpuError(f"rank {rank} is outside [0, {world_size})")
        if global_batch_size % (micro_batch_size * world_size):
            raise BertgpuError(
                f"global_batch_size {global_batch_size} is not divisible by micro_batch_size "
                f"{micro_batch_size} x {world_size} device{'s' if world_size > 1 else ''}; "
                f"expected a multiple of {micro_batch_size * world_size}"
            )
        if len(shards) == 0:
            raise BertgpuError(f"{shards.manifest_path}: split {shards.split!r} has no sequences")
        if num_workers < 0:
            raise BertgpuError(f"num_workers: found {num_workers}, expected >= 0")
        if not isinstance(bucket_window, int) or bucket_window < 0:
            raise BertgpuError(f"bucket_window: found {bucket_window!r}, expected an integer >= 0 (0 = off)")
        self.bucket_window = bucket_window
        self.shards = shards
        self.masker = _as_masker(masking, shards)
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed = _check_seed(seed)
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.position = 0  # global position of the next step's first sample
        self._iter: Iterator[dict[str, torch.Tensor]] | None = None

    @property
    def accumulation_steps(self) -> int:
        """Micro batches per optimizer step on each rank: G / (micro x world)."""
        return self.global_batch_size // (self.micro_batch_size * self.world_size)

    @property
    def epoch(self) -> int:
        """Epoch of the next step's first sample (position // number of sequences)."""
        return self.position // len(self.shards)

    def _dataset(self) -> _MicroBatches:
        return _MicroBatches(self.shards, self.masker, self.seed, self.position, self.global_batch_size,
                             self.micro_batch_size, self.rank, self.world_size)

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's micro batches for the next optimizer step; advances the position by G."""
        A = self.accumulation_steps
        pin = False
        if self.num_workers == 0:
            ds = self._dataset()
            out = [ds[j] for j in range(A)]
            pin = self.pin_memory
        else:
            if self._iter is None:
                import torch.utils.data

                # The dataset starts at the current position; the sampler walks it in order and
                # the DataLoader keeps prefetch_factor x num_workers micro batches in flight.
                loader = torch.utils.data.DataLoader(
                    self._dataset(), batch_size=None, sampler=range(1 << 62), num_workers=self.num_workers,
                    pin_memory=self.pin_memory, prefetch_factor=self.prefetch_factor,
                )
                self._iter = iter(loader)
            out = [next(self._iter) for _ in range(A)]
        if self.bucket_window:
            out = bucket_by_length(out, self.bucket_window)
            pin = self.pin_memory  # new tensors: pin them again
        if pin:
            import torch

            if torch.cuda.is_available():  # page-locked memory makes .to(device, non_blocking=True) async
                out = [{k: v.pin_memory() for k, v in mb.items()} for mb in out]
        self.position += self.global_batch_size
        return out

    def __iter__(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        while True:
            yield self.next_step()

    def close(self) -> None:
        """Stop the worker processes (they restart on the next `next_step`)."""
        self._iter = None

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        position = state.get("position")
        if not isinstance(position, (int, np.integer)) or position < 0:
            raise BertgpuError(f"data loader state: position: found {position!r}, expected an integer >= 0")
        if "seed" in state and int(state["seed"]) != self.seed:
            raise BertgpuError(
                f"data loader state: seed: the checkpoint was trained with data seed {state['seed']}, "
                f"expected the configured seed {self.seed} (resuming with another seed changes the sample order)"
            )
        self.position = int(position)
        self._iter = None  # prefetched batches belong to the old position


def iter_eval_batches(
    shards: ShardSet,
    masking: Masker | MaskingConfig,
    batch_size: int,
    seed: int = 0,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[dict[str, torch.Tensor]]:
    """Iterate a split once, in order, with fixed masks (epoch 0), for evaluation.

    Batch k holds samples [k*batch_size, (k+1)*batch_size) (the last may be short); rank r gets
    batches r, r + world_size, ... of the first `max_batches` (all when None).
    """
    if batch_size <= 0:
        raise BertgpuError(f"batch_size: found {batch_size}, expected a positive integer")
    masker = _as_masker(masking, shards)
    seed = _check_seed(seed)
    n = len(shards)
    n_batches = -(-n // batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for k in range(rank, n_batches, world_size):
        indices = np.arange(k * batch_size, min((k + 1) * batch_size, n), dtype=np.int64)
        yield _make_batch(shards, masker, seed, np.zeros_like(indices), indices)


class ValidationLoader:
    """Re-iterable `iter_eval_batches`: `for batch in ValidationLoader(...)` once per evaluation."""

    def __init__(self, shards: ShardSet, masking: Masker | MaskingConfig, batch_size: int, seed: int = 0,
                 max_batches: int | None = None, rank: int = 0, world_size: int = 1) -> None:
        self.shards, self.masker = shards, _as_masker(masking, shards)
        self.batch_size, self.seed, self.max_batches = batch_size, seed, max_batches
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter_eval_batches(self.shards, self.masker, self.batch_size, self.seed, self.max_batches,
                                 self.rank, self.world_size)

    def __len__(self) -> int:
        """Batches this rank yields."""
        n_batches = -(-len(self.shards) // self.batch_size)
        if self.max_batches is not None:
            n_batches = min(n_batches, self.max_batches)
        return len(range(self.rank, n_batches, self.world_size))


def trim_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
    """Cut the T axis to the longest real sequence in the batch (same math, less padding).

    Works on model batches (torch, with `attention_mask`) and on `ShardSet.get` output (numpy,
    with `lengths`). Every (B, T) entry is cut to (B, L); padded positions carry no labels and
    are masked out of attention, so the loss is unchanged.
    """
    if "attention_mask" in batch:
        am = batch["attention_mask"]
        T = am.shape[1]
        L = int(am.sum(1).max()) if am.shape[0] else 0
    elif "lengths" in batch:
        T = batch["input_ids"].shape[1]
        L = int(np.max(np.asarray(batch["lengths"]))) if len(batch["lengths"]) else 0
    else:
        raise KeyError("trim_batch needs 'attention_mask' or 'lengths'")
    L = max(L, 1)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if getattr(value, "ndim", 0) == 2 and value.shape[1] == T and L < T:
            value = value[:, :L]
            value = value.contiguous() if hasattr(value, "contiguous") else np.ascontiguousarray(value)
        out[key] = value
    return out


def bucket_by_length(micro_batches: list[dict[str, torch.Tensor]], window: int) -> list[dict[str, torch.Tensor]]:
    """Less padding with the same samples: sort each window of `window` micro batches by length.

    The samples of micro batches [w*k, (w+1)*k) are pooled, stably sorted by their real length
    (attention_mask row sums, longest first) and dealt back into micro batches of the original
    sizes, each then cut to its own longest sequence by `trim_batch`. Rows move whole (input ids,
    mask, labels, NSP label together), so every sample keeps its mask, and the step holds exactly
    the same samples. Windows never cross a step, so the global order of steps is unchanged.
    """
    import torch

    if window < 1:
        raise BertgpuError(f"bucket_window: found {window}, expected >= 1")
    out: list[dict[str, torch.Tensor]] = []
    for start in range(0, len(micro_batches), window):
        group = micro_batches[start:start + window]
        sizes = [int(mb["input_ids"].shape[0]) for mb in group]
        pooled = {k: torch.cat([mb[k] for mb in group]) for k in group[0]}  # (sum sizes, T) / (sum,)
        lengths = pooled["attention_mask"].sum(1)  # (n,)
        order = torch.sort(lengths, descending=True, stable=True).indices
        for part in torch.split(order, sizes):
            out.append(trim_batch({k: v.index_select(0, part) for k, v in pooled.items()}))
    return out
