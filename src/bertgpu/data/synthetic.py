"""Synthetic shard sets in the exact `bertgpu prepare` layout, for tests and throughput benchmarks.

    from bertgpu.data.synthetic import write_synthetic_shards
    data = write_synthetic_shards("bench_out/data", n_train=2048, n_val=64, seq_len=128,
                                  vocab_size=4096)

Rows are random "sentences" of words: a whole word "wN" followed by 0-2 "##cN" continuation
pieces, so whole-word masking has words to find; "mlm+nsp" rows are ``[CLS] A [SEP] B [SEP]``
with random labels. The tokenizer/ folder (vocab.txt with [PAD] [UNK] [CLS] [SEP] [MASK], then
~2/3 words and 1/3 pieces; tokenizer.json, tokenizer_config.json, special_tokens_map.json)
loads like a real one. Everything is seeded, and written by prepare's writer
(`writer.ShardSetWriter`: DIR.tmp, then renamed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from bertgpu.data.manifest import OBJECTIVES, Manifest, total_counts
from bertgpu.data.writer import ShardSetWriter
from bertgpu.errors import BertgpuError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)
# No documents are split here, so prepare's record of how the split was made is left out.
NOT_RECORDED = frozenset({"validation_docs", "split_unit", "cut_documents", "validation_share",
                          "whole_word_segmenter"})


def synthetic_vocab(vocab_size: int) -> list[str]:
    """[PAD] [UNK] [CLS] [SEP] [MASK], then ~2/3 whole words "wN", then "##cN" pieces."""
    if vocab_size < 8:
        raise BertgpuError(f"synthetic data: vocab_size {vocab_size}: expected 8 or more")
    rest = vocab_size - len(SPECIALS)
    n_words = max(1, (2 * rest) // 3)
    return SPECIALS + [f"w{i}" for i in range(n_words)] + [f"##c{i}" for i in range(rest - n_words)]


def _write_tokenizer(folder: Path, vocab: list[str], seq_len: int) -> str:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    from bertgpu.data.tokenizer_folder import tokenizer_hash

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("".join(tok + "\n" for tok in vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizerFast", "do_lower_case": True,
        "tokenize_chinese_chars": True, "strip_accents": None, "model_max_length": seq_len,
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }, indent=2))
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
    )
    tok.decoder = decoders.WordPiece()
    tok.save(str(folder / "tokenizer.json"))
    return tokenizer_hash(folder)


def _random_words(rng: np.random.Generator, n_tokens: int, word_ids: np.ndarray,
                  cont_ids: np.ndarray) -> np.ndarray:
    """`n_tokens` ids made of words: a "wN" start followed by 0-2 "##cN" pieces."""
    out: list[int] = []
    while len(out) < n_tokens:
        out.append(int(rng.choice(word_ids)))
        if cont_ids.size:
            out.extend(int(t) for t in rng.choice(cont_ids, size=int(rng.integers(0, 3))))
    return np.array(out[:n_tokens], dtype=np.int64)


def _split(rng, n, seq_len, objective, variable_lengths, word_ids, cont_ids, dtype):
    ids = np.zeros((n, seq_len), dtype=dtype)  # right-padded with [PAD] = 0
    lengths = np.zeros(n, dtype=np.int32)
    types = np.zeros((n, seq_len), dtype=np.uint8)
    nsp = rng.integers(0, 2, size=n).astype(np.uint8)
    for r in range(n):
        L = int(rng.integers(max(5, seq_len // 4), seq_len + 1)) if variable_lengths else seq_len
        if objective == "mlm":
            row = np.concatenate([[CLS], _random_words(rng, L - 2, word_ids, cont_ids), [SEP]])
        else:
            a = int(rng.integers(1, L - 3))  # [CLS] A [SEP] B [SEP], both segments non-empty
            b = L - 3 - a
            row = np.concatenate([[CLS], _random_words(rng, a, word_ids, cont_ids), [SEP],
                                  _random_words(rng, b, word_ids, cont_ids), [SEP]])
            types[r, a + 2 : L] = 1
        ids[r, :L] = row
        lengths[r] = L
    return ids, lengths, types, nsp


def _write_splits(data: ShardSetWriter, rng: np.random.Generator, sizes: dict[str, int],
                  seq_len: int, objective: str, variable_lengths: bool, vocab: list[str]) -> None:
    word_ids = np.array([i for i, t in enumerate(vocab) if t.startswith("w")])
    cont_ids = np.array([i for i, t in enumerate(vocab) if t.startswith("##")], dtype=np.int64)
    for split, n in sizes.items():
        dtype = data.writers[split].dtype
        ids, lengths, types, nsp = _split(rng, n, seq_len, objective, variable_lengths, word_ids,
                                          cont_ids, dtype)
        arrays = {"input_ids": ids, "lengths": lengths}
        if objective == "mlm+nsp":
            arrays.update(token_type_ids=types, nsp_labels=nsp)
        data.writers[split].add(arrays)


def _dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65535 else np.uint32)


def write_synthetic_shards(
    dir: str | os.PathLike,
    n_train: int = 64,
    n_val: int = 8,
    seq_len: int = 32,
    vocab_size: int = 100,
    objective: str = "mlm",
    seed: int = 0,
    variable_lengths: bool = False,
    *,
    sequences_per_shard: int = 24,
    created_by: str = "bertgpu.data.synthetic",
) -> Path:
    """Write a shard set to ``dir`` (replaced if it exists) and return its path.

    Train is cut into shards of ``sequences_per_shard`` (the default 24 gives 64 -> 24, 24, 16,
    so that shard boundaries get exercised); ``variable_lengths`` draws each row's length in
    [max(5, seq_len // 4), seq_len] instead of full rows.
    """
    if objective not in OBJECTIVES:
        raise BertgpuError(f"synthetic data: objective {objective!r}: expected one of "
                           f"{', '.join(OBJECTIVES)}")
    if seq_len < 8 or n_train < 1 or n_val < 0 or sequences_per_shard < 1:
        raise BertgpuError(f"synthetic data: seq_len {seq_len}, n_train {n_train}, n_val {n_val}, "
                           f"sequences_per_shard {sequences_per_shard}: expected seq_len >= 8 and "
                           "positive counts")
    vocab = synthetic_vocab(vocab_size)
    sizes = {"train": n_train, "validation": n_val}
    with ShardSetWriter(dir, seq_len, _dtype(vocab_size), sequences_per_shard,
                        nsp=objective == "mlm+nsp") as data:
        tok_hash = _write_tokenizer(data.folder / "tokenizer", vocab, seq_len)
        _write_splits(data, np.random.default_rng(seed), sizes, seq_len, objective,
                      variable_lengths, vocab)
        splits = data.close()
        manifest = Manifest(
            objective=objective, seq_len=seq_len, dtype=_dtype(vocab_size).name,
            vocab_size=vocab_size, tokenizer_hash=tok_hash, do_lower_case=True,
            special_tokens={"pad": PAD, "unk": UNK, "cls": CLS, "sep": SEP, "mask": MASK},
            seed=seed, validation_fraction=n_val / (n_train + n_val),
            counts=total_counts(splits, n_train + n_val),  # each row stands for a document
            splits=splits, created_by=created_by, absent=NOT_RECORDED,
        )
        return data.commit(manifest)
