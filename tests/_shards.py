"""Synthetic shard sets for tests: the package's one writer, `bertgpu.data.synthetic`.

`write_synthetic_shards(tmp_path / "data")` writes manifest.json, train/validation shards of
random "sentences" and a small tokenizer/ folder in well under a second. Import from a test file
with `from _shards import write_synthetic_shards` (pytest puts tests/ on sys.path).
"""

from bertgpu.data.synthetic import (
    CLS,
    MASK,
    PAD,
    SEP,
    SPECIALS,
    UNK,
    synthetic_vocab,
    write_synthetic_shards,
)

__all__ = ["CLS", "MASK", "PAD", "SEP", "SPECIALS", "UNK", "synthetic_vocab",
           "write_synthetic_shards"]
