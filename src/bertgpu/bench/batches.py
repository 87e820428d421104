"""The synthetic batches the model benchmarks time: BERT sizes and right-padded pretraining
batches with the host-side metadata the loader would attach (`bench model`, `bench model
--strategy fsdp`)."""

from __future__ import annotations

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


def sample_lengths(spec: str, n: int, seq_len: int, seed: int) -> Any:
    """(n,) int64 real lengths in [2, seq_len]: full, uniform or drawn
    from a shard set's lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if spec == "full":
        return np.full(n, seq_len, dtype=np.int64)
    if spec == "uniform":
        return rng.integers(max(2, seq_len // 8), seq_len + 1, size=n).astype(np.int64)
    from bertgpu.data.shards import ShardSet

    shards = ShardSet(spec, "train")  # BertgpuError naming the folder when it is not a shard set
    pool = np.concatenate([a["lengths"] for a in shards._open()]) if len(shards) else np.zeros(0)
    if pool.size == 0:
        raise BertgpuError(f"{spec}: the train split has no sequences to draw lengths from")
    return np.clip(rng.choice(pool, size=n), 2, seq_len).astype(np.int64)


def make_batches(n: int, batch: int, seq_len: int, vocab: int, lengths_spec: str, seed: int,
                 device: Any) -> list[dict[str, Any]]:
    """n right-padded batches on `device`: [CLS] first, segment B in the second half, ~15% MLM
    labels on real tokens, random NSP labels, and the `batch_meta` the loader would attach
    (computed on the host; transformers' batches leave it out)."""
    import torch

    from bertgpu.batch import batch_meta

    lengths = torch.from_numpy(
        sample_lengths(lengths_spec, n * batch, seq_len, seed)).view(n, batch)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        mask = (torch.arange(seq_len)[None, :] < lengths[i][:, None]).long()  # (B, T)
        ids = torch.randint(5, vocab, (batch, seq_len), generator=g) * mask
        ids[:, 0] = 2  # [CLS]
        tt = ((torch.arange(seq_len)[None, :] >= (lengths[i][:, None] // 2)) & mask.bool()).long()
        pick = (torch.rand(batch, seq_len, generator=g) < 0.15) & mask.bool()
        pick[:, 0] = False
        labels = torch.where(pick, ids, torch.full_like(ids, -100))
        b: dict[str, Any] = dict(input_ids=ids, attention_mask=mask, token_type_ids=tt,
                                 labels=labels,
                                 next_sentence_label=torch.randint(0, 2, (batch,), generator=g))
        b["batch_meta"] = batch_meta(mask, labels)
        out.append({k: v.to(device) for k, v in b.items()})
    return out


__all__ = ["SIZES", "make_batches", "sample_lengths"]
