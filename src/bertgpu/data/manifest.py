"""A shard set's `manifest.json` as one dataclass, written by `writer.ShardSetWriter` and read by
`shards.ShardSet` (the layout is in docs/ARCHITECTURE.md, "Shard set")::

    from bertgpu.data.manifest import Manifest

    m = Manifest.read(Path("data/manifest.json"))  # validated: a one-line BertgpuError naming
                                                   # the file
    m.seq_len, m.objective, m.splits["train"]["sequences"]
    m.split_shards("train", path)                  # [("train-00000-00000", 65536), ...]
    m.to_json()                                    # the dict manifest.json holds, keys in file
                                                   # order

The fields are the keys, in file order. `read` checks the keys a reader depends on (the version,
then REQUIRED_KEYS and their types); the other keys are kept as found, and a manifest may lack
them: one written before the key existed, or by `synthetic`, which does not split documents.
`absent` remembers which are missing, so that `to_json` gives back the keys it was given.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

FORMAT_VERSION = 1
OBJECTIVES = ("mlm", "mlm+nsp")
SPECIAL_KEYS = ("pad", "unk", "cls", "sep", "mask")
REQUIRED_KEYS = ("objective", "seq_len", "dtype", "vocab_size", "tokenizer_hash",
                 "special_tokens", "splits")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a shard set holds and how it was made; one field per manifest.json key."""

    format_version: int = FORMAT_VERSION
    """Layout version; readers refuse any other than FORMAT_VERSION."""
    objective: str
    """The rows: "mlm" (packed full rows) or "mlm+nsp" (sentence pairs, next-sentence labels)."""
    seq_len: int
    """Tokens per row, [CLS] and [SEP] included."""
    dtype: str
    """dtype of input_ids: "uint16", or "uint32" for a vocabulary over 65535."""
    vocab_size: int
    """The tokenizer's vocabulary size, added tokens included."""
    tokenizer_hash: str
    """`tokenizer_folder.tokenizer_hash` of the tokenizer used (its copy is in tokenizer/)."""
    do_lower_case: bool | None = None
    """Whether the tokenizer lowercases its input."""
    special_tokens: dict[str, int]
    """Ids of the special tokens, keys SPECIAL_KEYS."""
    seed: int | None = None
    """Seed of the split and the NSP choices (of the random rows, for a synthetic set)."""
    validation_fraction: float | None = None
    """Share of the text asked for validation; null when validation_docs was asked instead."""
    validation_docs: int | None = None
    """The first N documents held out for validation, when asked instead of a fraction."""
    split_unit: str | None = None
    """How the split was cut: "document", "chunk" (some document on both sides) or "none"."""
    cut_documents: int | None = None
    """Documents with chunks on both sides of the split."""
    validation_share: float | None = None
    """Validation's share of the tokens, rounded to 6 places."""
    whole_word_segmenter: str | None = None
    """Segmenter whose word starts are stored in *.word_starts.npy ("jieba"), or null for none."""
    counts: dict[str, int] = field(default_factory=dict)
    """documents, sequences and tokens of the whole set; null_rows, when any: rows (Parquet,
    Arrow) or JSON lines whose text was null, skipped as no document."""
    splits: dict[str, dict[str, Any]]
    """Per split: sequences, tokens, documents (prepare only) and shards
    [{name, sequences, tokens}]."""
    inputs: list[dict[str, Any]] = field(default_factory=list)
    """The corpus files read: path, bytes, sha256."""
    skipped_inputs: list[dict[str, str]] = field(default_factory=list)
    """Inputs skipped with --skip-bad: path, reason."""
    created_by: str | None = None
    """The writer: "bertgpu VERSION", or the name a synthetic set was given."""
    absent: frozenset[str] = frozenset()
    """Optional keys this manifest lacks, left out by `to_json` (not a key itself)."""

    def __post_init__(self) -> None:
        if not self.absent <= OPTIONAL_KEYS:
            raise ValueError(f"Manifest.absent: {sorted(self.absent - OPTIONAL_KEYS)} are not "
                             "optional keys")

    @property
    def has_nsp(self) -> bool:
        return self.objective == "mlm+nsp"

    @property
    def has_word_starts(self) -> bool:
        """Whether a whole-word segmenter stored word-start flags (`bertgpu.data.segment`)."""
        return bool(self.whole_word_segmenter)

    def to_json(self) -> dict[str, Any]:
        """The manifest.json object: every key but the absent ones, in file order (a copy: the
        manifest is frozen, and its nested objects stay as read)."""
        return copy.deepcopy({k: getattr(self, k) for k in KEYS if k not in self.absent})

    def dumps(self) -> str:
        """The text of manifest.json."""
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """Load and validate `path`; every problem is a BertgpuError naming the file."""
        if not path.parent.exists():
            raise BertgpuError(f"{path.parent}: does not exist (expected a shard set written by "
                               "`bertgpu prepare`)")
        if path.parent.is_file():  # --data DIR/manifest.json: "DIR/manifest.json/manifest.json"
            hint = f" (its folder: {path.parent.parent})" if path.parent.name == path.name else ""
            raise BertgpuError(f"{path.parent}: a file, not a folder; expected the folder of a "
                               f"shard set written by `bertgpu prepare`{hint}")
        if not path.is_file():
            if any((path.parent / n).exists() for n in ("metrics.jsonl", "checkpoints")):
                raise BertgpuError(f"{path}: no manifest.json found: {path.parent} is a run "
                                   "folder of `bertgpu pretrain` or `finetune`, not a shard set; "
                                   "expected the --out of `bertgpu prepare`")
            raise BertgpuError(f"{path}: no manifest.json found (expected a shard set written by "
                               "`bertgpu prepare`)")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise BertgpuError(f"{path}: cannot read the manifest ({e})") from None
        return cls.parse(text, path)

    @classmethod
    def parse(cls, text: str, path: Path) -> Manifest:
        """The Manifest of manifest.json's ``text``; `path` names it in errors."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise BertgpuError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
        return cls.from_json(data, path)

    @classmethod
    def from_json(cls, data: Any, path: Path) -> Manifest:
        """Validate a parsed manifest.json (`path` names it in errors) and build the Manifest.

        Keys this version does not know are ignored, as they always were.
        """
        if not isinstance(data, dict):
            raise BertgpuError(f"{path}: expected a JSON object, found {type(data).__name__}")
        _check_version(data, path)
        _check_required(data, path)
        return cls(**{k: data[k] for k in KEYS if k in data},
                   absent=frozenset(k for k in KEYS if k not in data))

    def split_shards(self, split: str, path: Path) -> list[tuple[str, int]]:
        """(file stem, sequences) of each shard of `split`, checked;
        `path` names the manifest in errors."""
        info = self.splits.get(split)
        if not isinstance(info, dict) or not isinstance(info.get("shards"), list):
            raise BertgpuError(
                f"{path}: splits.{split}: missing or without a 'shards' list (found splits "
                f"{sorted(self.splits)})"
            )
        shards: list[tuple[str, int]] = []
        for k, shard in enumerate(info["shards"]):
            ok = (isinstance(shard, dict) and isinstance(shard.get("name"), str)
                  and isinstance(shard.get("sequences"), int))
            # A name is a file stem in the data folder, never a path out of it.
            if not ok or shard["sequences"] < 0 or "/" in shard["name"] or "\\" in shard["name"]:
                raise BertgpuError(
                    f"{path}: splits.{split}.shards[{k}]: found {shard!r}, "
                    "expected {\"name\": \"<file stem>\", \"sequences\": <int>}"
                )
            shards.append((shard["name"], shard["sequences"]))
        declared, total = info.get("sequences"), sum(n for _, n in shards)
        if isinstance(declared, int) and declared != total:
            raise BertgpuError(f"{path}: splits.{split}.sequences is {declared} but its "
                               f"shards hold {total}")
        return shards


# The manifest.json keys: every field but `absent`, in file order; the optional ones may be missing.
KEYS = tuple(f.name for f in dataclasses.fields(Manifest) if f.name != "absent")
OPTIONAL_KEYS = frozenset(KEYS) - {"format_version", *REQUIRED_KEYS}


def total_counts(splits: dict[str, dict[str, Any]], documents: int) -> dict[str, int]:
    """The manifest's `counts`: `documents` and the splits' sequences and tokens summed."""
    return {
        "documents": documents,
        "sequences": sum(s["sequences"] for s in splits.values()),
        "tokens": sum(s["tokens"] for s in splits.values()),
    }


def _check_version(data: dict[str, Any], path: Path) -> None:
    # The version first: a manifest from a newer bertgpu may have other keys.
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise BertgpuError(
            f"{path}: format_version: found {version!r}, expected {FORMAT_VERSION} "
            "(re-run `bertgpu prepare` with this version of bertgpu)"
        )


def _check_required(data: dict[str, Any], path: Path) -> None:
    """The keys readers depend on: present and of the right type."""
    for key in REQUIRED_KEYS:
        if key not in data:
            raise BertgpuError(f"{path}: missing key {key!r}")
    if data["objective"] not in OBJECTIVES:
        raise BertgpuError(f"{path}: objective: found {data['objective']!r}, expected one of "
                           f"{list(OBJECTIVES)}")
    for key in ("seq_len", "vocab_size"):
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise BertgpuError(f"{path}: {key}: found {value!r}, expected a positive integer")
    if data["dtype"] not in ("uint16", "uint32"):
        raise BertgpuError(f"{path}: dtype: found {data['dtype']!r}, expected 'uint16' or 'uint32'")
    special = data["special_tokens"]
    if not isinstance(special, dict) or any(
        not isinstance(special.get(k), int) or not 0 <= special[k] < data["vocab_size"]
        for k in SPECIAL_KEYS
    ):
        raise BertgpuError(
            f"{path}: special_tokens: found {special!r}, expected integer ids below vocab_size for "
            f"{list(SPECIAL_KEYS)}"
        )
    if not isinstance(data["splits"], dict):
        raise BertgpuError(f"{path}: splits: expected an object with 'train' and 'validation'")
