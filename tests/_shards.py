"""Synthetic shard sets in the exact format of docs/ARCHITECTURE.md, for tests.

`write_synthetic_shards(tmp_path / "data")` writes manifest.json, train/validation shards of
random "sentences" and a small tokenizer/ folder (vocab.txt with [PAD] [UNK] [CLS] [SEP] [MASK],
whole words "wN" and "##cN" continuation pieces, plus tokenizer.json/tokenizer_config.json/
special_tokens_map.json), all with numpy and `tokenizers`, in well under a second.

Import from a test file with `from _shards import write_synthetic_shards` (pytest puts tests/
on sys.path).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP, MASK = range(5)


def synthetic_vocab(vocab_size: int) -> list[str]:
    """[PAD] [UNK] [CLS] [SEP] [MASK], then ~2/3 whole words "wN", then "##cN" pieces."""
    if vocab_size < 8:
        raise ValueError("vocab_size must be at least 8")
    rest = vocab_size - len(SPECIALS)
    n_words = max(1, (2 * rest) // 3)
    return SPECIALS + [f"w{i}" for i in range(n_words)] + [f"##c{i}" for i in range(rest - n_words)]


def _write_tokenizer(folder: Path, vocab: list[str], seq_len: int) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("".join(tok + "\n" for tok in vocab), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizerFast", "do_lower_case": True, "tokenize_chinese_chars": True,
        "strip_accents": None, "model_max_length": seq_len,
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }, indent=2))
    try:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)],
        )
        tok.decoder = decoders.WordPiece()
        tok.save(str(folder / "tokenizer.json"))
    except ImportError:
        pass
    # The project's own hash when tokenizer.py exists, else a stand-in over vocab.txt.
    try:
        from bertgpu.data.tokenizer import tokenizer_hash

        return tokenizer_hash(folder)
    except Exception:
        return hashlib.sha256((folder / "vocab.txt").read_bytes()).hexdigest()


def _random_words(rng: np.random.Generator, n_tokens: int, word_ids: np.ndarray, cont_ids: np.ndarray) -> np.ndarray:
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


def write_synthetic_shards(
    dir: str | Path,
    n_train: int = 64,
    n_val: int = 8,
    seq_len: int = 32,
    vocab_size: int = 100,
    objective: str = "mlm",
    seed: int = 0,
    variable_lengths: bool = False,
    *,
    sequences_per_shard: int = 24,
) -> Path:
    """Write a shard set to `dir` (created) and return it. Train is cut into shards of
    `sequences_per_shard` (the default 24 gives 64 -> 24, 24, 16, so shard boundaries get tested)."""
    if objective not in ("mlm", "mlm+nsp"):
        raise ValueError(f"objective must be 'mlm' or 'mlm+nsp', got {objective!r}")
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = synthetic_vocab(vocab_size)
    word_ids = np.array([i for i, t in enumerate(vocab) if t.startswith("w")])
    cont_ids = np.array([i for i, t in enumerate(vocab) if t.startswith("##")], dtype=np.int64)
    tok_hash = _write_tokenizer(out / "tokenizer", vocab, seq_len)
    dtype = np.uint16 if vocab_size <= 65535 else np.uint32
    rng = np.random.default_rng(seed)
    splits = {}
    for split, n in (("train", n_train), ("validation", n_val)):
        ids, lengths, types, nsp = _split(rng, n, seq_len, objective, variable_lengths, word_ids, cont_ids, dtype)
        shards = []
        for k, lo in enumerate(range(0, n, sequences_per_shard)):
            hi = min(lo + sequences_per_shard, n)
            name = f"{split}-{k:05d}"
            np.save(out / f"{name}.input_ids.npy", ids[lo:hi])
            np.save(out / f"{name}.lengths.npy", lengths[lo:hi])
            if objective == "mlm+nsp":
                np.save(out / f"{name}.token_type_ids.npy", types[lo:hi])
                np.save(out / f"{name}.nsp_labels.npy", nsp[lo:hi])
            shards.append({"name": name, "sequences": hi - lo, "tokens": int(lengths[lo:hi].sum())})
        splits[split] = {"sequences": n, "tokens": int(lengths.sum()), "shards": shards}
    manifest = {
        "format_version": 1,
        "objective": objective,
        "seq_len": seq_len,
        "dtype": np.dtype(dtype).name,
        "vocab_size": vocab_size,
        "tokenizer_hash": tok_hash,
        "do_lower_case": True,
        "special_tokens": {"pad": PAD, "unk": UNK, "cls": CLS, "sep": SEP, "mask": MASK},
        "seed": seed,
        "validation_fraction": n_val / max(1, n_train + n_val),
        "counts": {
            "documents": n_train + n_val,
            "sequences": n_train + n_val,
            "tokens": splits["train"]["tokens"] + splits["validation"]["tokens"],
        },
        "splits": splits,
        "inputs": [],
        "skipped_inputs": [],
        "created_by": "tests/_shards.py",
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return out
