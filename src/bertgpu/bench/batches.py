"""The synthetic batches the model benchmarks time: model sizes, real lengths, and right-padded
MLM batches with the host-side metadata the loader would attach (`bench model`, `bench model
--strategy fsdp`).

Lengths (`--real-lengths`): ``full`` (no padding), ``uniform`` (uniform in [T/8, T]), a prepared
data folder (its train split's sequence lengths) or ``squad:FILE`` (the feature lengths SQuAD
fine-tuning gives: the questions and context windows of a SQuAD JSON, tokenized with
`--tokenizer` and cut into [CLS] question [SEP] window [SEP] rows as `tasks/squad.py` does).

The masks are drawn as training draws them (`data.masking.Masker`): exactly round(rate x the
maskable tokens) per sequence, 80/10/10. A batch's B lengths are one sample, and every timed
batch is a permutation of it: the batches differ in content and layout but hold the same tokens,
the same masked count and the same longest sequence, so a compiled model compiles once per shape
instead of once per batch, and padded and unpadded rows time the same work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=512),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
                  intermediate_size=2048),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096),
}
"""BERT sizes (transformers' BertConfig names; vocabulary 30,522)."""

MODERN_SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=8192, hidden_size=128, num_hidden_layers=3, num_attention_heads=2,
                 intermediate_size=256, max_position_embeddings=1024, local_attention=64,
                 global_rope_theta=10000.0, pad_token_id=0),
    "base": dict(vocab_size=50368, hidden_size=768, num_hidden_layers=22, num_attention_heads=12,
                 intermediate_size=1152, max_position_embeddings=8192, local_attention=128,
                 global_rope_theta=160000.0),
}
"""ModernBERT sizes (configs/modern-tiny.toml, configs/modern-base.toml)."""

BERT_VOCAB = 30522
# The special ids of bertgpu's tokenizers ([PAD] [UNK] [CLS] [SEP] [MASK]); random tokens start
# after them.
_CLS, _MASK, _FIRST_TOKEN = 2, 4, 5


def _squad_lengths(file: str, tokenizer: str | None, seq_len: int) -> Any:
    """Feature lengths of a SQuAD JSON at max_seq_len `seq_len` (tasks/squad.featurize)."""
    import numpy as np

    from bertgpu.data.tokenizer_folder import find_tokenizer_folder, load_tokenizer
    from bertgpu.tasks.squad import featurize, read_squad

    if not tokenizer:
        raise BertgpuError(f"--real-lengths squad:{file}: expected --tokenizer DIR (a WordPiece "
                           "folder, or a prepared data folder holding one) to tokenize it with")
    folder = find_tokenizer_folder(tokenizer)
    if folder is None:
        raise BertgpuError(f"--tokenizer {tokenizer}: no tokenizer folder (vocab.txt) found")
    query = min(64, seq_len // 4)
    stride = min(128, max(1, (seq_len - query - 3) // 2))
    features = featurize(read_squad(file), load_tokenizer(folder), max_seq_len=seq_len,
                         doc_stride=stride, max_query_len=query)
    return features.attention_mask.sum(axis=1).astype(np.int64)


def sample_lengths(spec: str, n: int, seq_len: int, seed: int,
                   tokenizer: str | None = None) -> Any:
    """(n,) int64 real lengths in [2, seq_len]: full, uniform, drawn from a shard set's train
    lengths, or from the feature lengths of ``squad:FILE`` (tokenized with `tokenizer`)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if spec == "full":
        return np.full(n, seq_len, dtype=np.int64)
    if spec == "uniform":
        return rng.integers(max(2, seq_len // 8), seq_len + 1, size=n).astype(np.int64)
    if spec.startswith("squad:"):
        pool = _squad_lengths(spec[len("squad:"):], tokenizer, seq_len)
        where = spec
    else:
        from bertgpu.data.shards import ShardSet

        if not Path(spec).is_dir():
            raise BertgpuError(f"--real-lengths {spec}: expected full, uniform, squad:FILE or a "
                               "prepared data folder")
        shards = ShardSet(spec, "train")  # BertgpuError naming the folder if not a shard set
        pool = (np.concatenate([a["lengths"] for a in shards._open()]) if len(shards)
                else np.zeros(0))
        where = f"{spec}: the train split"
    if pool.size == 0:
        raise BertgpuError(f"{where} has no sequences to draw lengths from")
    return np.clip(rng.choice(pool, size=n), 2, seq_len).astype(np.int64)


def make_batches(n: int, batch: int, seq_len: int, vocab: int, lengths_spec: str, seed: int,
                 device: Any, *, mask_rate: float = 0.15, nsp: bool = True,
                 tokenizer: str | None = None) -> list[dict[str, Any]]:
    """n right-padded (batch, seq_len) MLM batches on `device`: [CLS] first, random tokens,
    masks drawn by `Masker` at `mask_rate` (a fixed count per sequence), and the `batch_meta`
    the loader would attach (computed on the host; transformers' batches leave it out). With
    `nsp` (BERT) also token_type_ids (segment B in the second half) and random NSP labels.
    Every batch holds a permutation of the same lengths (see the module docstring)."""
    import numpy as np
    import torch

    from bertgpu.batch import batch_meta
    from bertgpu.data.masking import Masker, MaskingConfig

    lengths = sample_lengths(lengths_spec, batch, seq_len, seed, tokenizer)
    masker = Masker(MaskingConfig(mask_rate=mask_rate), vocab, range(_FIRST_TOKEN), _MASK)
    rng = np.random.default_rng(seed + 1)
    out = []
    for i in range(n):
        lens = torch.from_numpy(rng.permutation(lengths))  # (B,)
        mask = (torch.arange(seq_len)[None, :] < lens[:, None]).long()  # (B, T)
        ids = torch.from_numpy(rng.integers(_FIRST_TOKEN, vocab, (batch, seq_len))) * mask
        ids[:, 0] = _CLS
        masked, labels = masker.mask_batch(ids.numpy(), lens.numpy(), seed, np.zeros(batch),
                                           np.arange(i * batch, (i + 1) * batch))
        b: dict[str, Any] = dict(input_ids=torch.from_numpy(masked), attention_mask=mask,
                                 labels=torch.from_numpy(labels))
        if nsp:
            b["token_type_ids"] = ((torch.arange(seq_len)[None, :] >= (lens[:, None] // 2))
                                   & mask.bool()).long()
            b["next_sentence_label"] = torch.from_numpy(rng.integers(0, 2, batch))
        b["batch_meta"] = batch_meta(mask, b["labels"])
        out.append({k: v.to(device) for k, v in b.items()})
    return out


__all__ = ["BERT_VOCAB", "MODERN_SIZES", "SIZES", "make_batches", "sample_lengths"]
