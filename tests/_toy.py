"""One toy "pretraining" model, loss and batches for the engine and distributed tests.

`ToyPretrain` stands in for BertForPreTraining: a token head (MLM-like, predicted positions only)
and a sequence head (NSP-like); `loss_fn` / `count_fn` follow the engine's contract (summed
losses, matching counts). A batch with a "poison" entry (a 0-d tensor such as inf or nan)
multiplies the MLM loss by it, to make a step non-finite on purpose.
"""

from __future__ import annotations

import torch
from torch import nn

V, D, T = 11, 8, 6  # vocabulary, width, sequence length


class ToyPretrain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.body = nn.Sequential(nn.Linear(D, D), nn.Tanh())
        self.LayerNorm = nn.LayerNorm(D)
        self.mlm = nn.Linear(D, V)
        self.nsp = nn.Linear(D, 2)

    def forward(self, input_ids, labels, nsp_labels):
        h = self.LayerNorm(self.body(self.emb(input_ids)))  # (B, T, D)
        mask = labels != -100
        mlm_sum = nn.functional.cross_entropy(self.mlm(h[mask]).float(), labels[mask],
                                              reduction="sum")
        nsp_sum = nn.functional.cross_entropy(self.nsp(h[:, 0]).float(), nsp_labels,
                                              reduction="sum")
        return {"mlm": mlm_sum, "nsp": nsp_sum}


def loss_fn(model, batch):
    out = model(batch["input_ids"], batch["labels"], batch["nsp_labels"])
    if "poison" in batch:
        out = {**out, "mlm": out["mlm"] * batch["poison"]}
    return out


def count_fn(batch):
    return {"mlm": int((batch["labels"] != -100).sum()), "nsp": batch["input_ids"].shape[0]}


def make_batch(n: int, seed: int) -> dict[str, torch.Tensor]:
    """n sequences with a varying number of predicted tokens per sequence (as MLM masking gives):
    rows predict 1..T tokens, so ranks and micro batches weigh differently."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (n, T), generator=g)
    labels = torch.randint(0, V, (n, T), generator=g)
    keep = torch.rand(n, T, generator=g) < torch.linspace(0.1, 0.9, n).unsqueeze(1)
    keep[:, 0] = True  # at least one prediction per sequence
    labels[~keep] = -100
    return {"input_ids": ids, "labels": labels,
            "nsp_labels": torch.randint(0, 2, (n,), generator=g)}


def rows(batch, lo: int, hi: int) -> dict[str, torch.Tensor]:
    return {k: v[lo:hi] for k, v in batch.items()}


def split(batch, k: int) -> list[dict[str, torch.Tensor]]:
    """k equal micro batches of `batch`, in order."""
    n = batch["input_ids"].shape[0] // k
    return [rows(batch, i * n, (i + 1) * n) for i in range(k)]


def cpu_fp16_available() -> bool:
    """Whether this torch has fp16 autocast and a GradScaler on the CPU (fp16 tests run there)."""
    try:
        torch.amp.GradScaler("cpu")
        with torch.autocast("cpu", dtype=torch.float16):
            torch.ones(2, 2) @ torch.ones(2, 2)
        return True
    except Exception:
        return False
