"""The batch contract between data/ and models/: what the loader computes on the host and the
model consumes, so neither package imports the other.

`IGNORE_INDEX` marks label positions that are not predicted; `BatchMeta` describes a padded
(B, T) batch's layout (is anything padding, which tokens are real, where each sequence starts,
which positions carry an MLM label), computed once on the CPU by `batch_meta` from the tensors
the loader already holds and moved to the device with the batch. Given it, a model's forward and
backward make no `.item()`, `nonzero()` or `bool(tensor)` call (models/attention.py explains the
kernels that read it)::

    meta = batch_meta(batch["attention_mask"], batch["labels"])   # CPU, in the loader / collator
    out = model(**batch, batch_meta=meta)                         # moved with the batch
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch comes with the first batch: the config schema reads IGNORE_INDEX too
    import torch

IGNORE_INDEX = -100
"""Label of positions that are not predicted (the Hugging Face / PyTorch cross-entropy default);
the masking collator writes it, the losses skip it."""




@dataclass
class BatchMeta:
    """The layout of one right- or left-padded (B, T) batch, computed by `batch_meta`.

    Python fields are decided on the host (a compiled model guards on them: at most a few graph
    variants); tensor fields are int64 index lists, built on the host and moved with the batch.
    """

    padded: bool
    """Some position is padding: attention needs a mask (False keeps `attn_mask=None`, which lets
    SDPA use the flash kernel). A compiled run's loader sets it on every batch when its split has
    short rows (`PretrainLoader(compiled=True)`): one graph, full rows masking nothing."""
    packed_ok: bool = True
    """Column 0 of every row is a real token, so attention over each gathered sequence equals the
    masked padded attention and the varlen / nested kernels are exact (left padding or an empty
    row fall back to the padded kernel)."""
    max_len: int = 0
    """Longest kept sequence (the varlen kernel's tile loop bound)."""
    index: torch.Tensor | None = None
    """(N_tok,) flat positions b * T + t of the kept tokens, ascending (every position when nothing
    is padded: an unpadded model then runs the same graph on full and padded batches); None only
    for metadata made without a mask."""
    cu_seqlens: torch.Tensor | None = None
    """(B + 1,) offsets of each sequence's kept rows; row 0 of sequence b is its column 0 (the
    [CLS] token a pooler reads, kept even when padding). None when `index` is."""
    masked: torch.Tensor | None = None
    """(M,) flat positions b * T + t with an MLM label (the sparse MLM head's rows);
    None without labels."""
    masked_rows: torch.Tensor | None = None
    """(M',) rows of the unpadded (N_tok, H) activations with an MLM label (labels on padding,
    which no collator writes, are dropped there); None when `index` is or without labels."""
    masked_count: torch.Tensor | None = None
    """0-dim: how many entries of `masked` / `masked_rows` are real, when both are padded to a
    fixed capacity (`batch_meta(masked_capacity=...)`, for CUDA graphs, which replay one shape):
    the entries after it repeat position 0 and the model gives them no label. None when they
    hold exactly the labelled positions."""

    VARYING = ("index", "masked", "masked_rows")
    """Fields whose length changes from batch to batch (kept tokens, masked tokens): marked dynamic
    for torch.compile (`to`), so a new length reuses the graph instead of compiling another;
    `masked` and `masked_rows` only when not padded to a capacity (then their length is fixed)."""

    def to(self, device: torch.device | str, non_blocking: bool = True) -> BatchMeta:
        """The same metadata with its tensors on `device` (itself when they are there already).
        `non_blocking` copies from pinned memory without blocking the host."""
        import torch

        device = torch.device(device)
        moved = {f.name: v.to(device, non_blocking=non_blocking)
                 for f in fields(self)
                 if isinstance(v := getattr(self, f.name), torch.Tensor) and v.device != device}
        out = replace(self, **moved) if moved else self
        out.mark_dynamic()
        return out

    def mark_dynamic(self) -> None:
        """Mark the `VARYING` lengths dynamic for torch.compile, once torch.compile is in use (its
        module imported; nothing is imported here): the first compile then makes a graph for any
        length, where dynamo would otherwise specialise on the first batch's and compile again on
        the first batch that differs. Harmless without compile (an attribute on the tensor)."""
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None:
            return
        # MLM positions padded to a capacity (masked_count) have one length for the whole run
        for name in ("index",) if self.masked_count is not None else self.VARYING:
            t = getattr(self, name)
            if t is not None and t.dim() == 1 and t.numel() > 1:
                dynamo.maybe_mark_dynamic(t, 0)

    def pin_memory(self) -> BatchMeta:
        """Page-locked copies of the tensors (what a DataLoader with pin_memory=True calls)."""
        import torch

        return replace(self, **{f.name: v.pin_memory() for f in fields(self)
                                if isinstance(v := getattr(self, f.name), torch.Tensor)})


def mark_rows_dynamic(batch: dict[str, Any]) -> None:
    """Mark the number of rows (dimension 0) of a device batch's tensors dynamic for
    torch.compile, once it is in use (as `BatchMeta.mark_dynamic`), with `cu_seqlens` (B + 1).
    For a run whose micro batches change size mid-run (load balancing re-shares the global
    batch): one graph for every size from 2 up, where each new size compiled again. A micro
    batch of one row still makes a graph of its own (dynamo specialises sizes 0 and 1), and so
    does each size in the CUDA-graph modes (their MLM capacity follows the rows)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return
    meta = batch.get("batch_meta")
    cu = getattr(meta, "cu_seqlens", None)
    for t in [*batch.values(), cu]:
        if getattr(t, "dim", lambda: 0)() >= 1 and t.shape[0] > 1:
            dynamo.maybe_mark_dynamic(t, 0)


def batch_meta(attention_mask: torch.Tensor | None, mlm_labels: torch.Tensor | None = None,
               shape: tuple[int, int] | None = None,
               masked_capacity: int | None = None) -> BatchMeta:
    """Metadata of a batch from its (B, T) attention mask (1 = token, 0 = padding; None = all
    tokens, then `shape` gives (B, T)) and optional (B, T) MLM labels (IGNORE_INDEX = no label).

    `masked_capacity` pads the MLM positions to that many (or to M, when a batch has more: one
    more shape, never a lost label) and records M in `masked_count`, so that every batch of a run
    gives the MLM head the same shape (CUDA graphs replay one shape).

    Meant for CPU tensors (loader, collator): its `bool()` and `nonzero()` are host work there.
    On device tensors it is correct but waits on the device (the Hugging Face-style call)."""
    import torch
    import torch.nn.functional as F

    masked = None
    if mlm_labels is not None:
        masked = _positions(mlm_labels.reshape(-1) != IGNORE_INDEX)  # (M,)
    if attention_mask is None:
        if shape is None:
            raise ValueError("batch_meta needs an attention mask or the batch shape")
        meta = BatchMeta(padded=False, max_len=int(shape[1]), masked=masked)
        return _to_capacity(meta, masked_capacity)
    real = attention_mask.bool()
    B, T = real.shape
    if bool(real.all()):  # every position kept: the unpadded layout is the identity
        lengths = torch.full((B,), T, dtype=torch.int64)
        meta = BatchMeta(padded=False, max_len=T, index=torch.arange(B * T),
                         cu_seqlens=F.pad(lengths.cumsum(0), (1, 0)), masked=masked,
                         masked_rows=masked)
        return _to_capacity(meta, masked_capacity)
    keep = real.clone()
    packed_ok = bool(keep[:, 0].all())
    keep[:, 0] = True  # the pooler reads column 0 of every row
    # A row of padding only attends everywhere in the padded path (`sdpa_mask`): keep all of it,
    # so even its (meaningless but finite) outputs match the padded model exactly.
    keep |= ~real.any(dim=1, keepdim=True)
    lengths = keep.sum(1)  # (B,)
    flat = keep.reshape(-1)
    rows = None
    if masked is not None:
        row_of = flat.long().cumsum(0) - 1  # (B T,) row of each kept position
        labelled = masked[flat.index_select(0, masked)]
        rows = row_of.index_select(0, labelled)
    meta = BatchMeta(padded=True, packed_ok=packed_ok, max_len=int(lengths.max()),
                     index=_positions(flat), cu_seqlens=F.pad(lengths.cumsum(0), (1, 0)),
                     masked=masked, masked_rows=rows)
    return _to_capacity(meta, masked_capacity)


def _positions(flags: torch.Tensor) -> torch.Tensor:
    """(N,) bool -> the positions that are True, (K,) int64: a tensor of its own, never a view
    (nonzero's (K, 1) squeezed is one): compiled on the CPU, a graph guarded on the view's base,
    and the first batch without padding (an arange, no base) compiled again."""
    return flags.nonzero().squeeze(1).clone()


def _to_capacity(meta: BatchMeta, capacity: int | None) -> BatchMeta:
    """`meta` with `masked` and `masked_rows` padded with position 0 to `capacity` entries (to M
    when M is larger) and `masked_count` = M; `meta` itself without a capacity or labels."""
    import torch
    import torch.nn.functional as F

    if capacity is None or meta.masked is None:
        return meta
    count = meta.masked.numel()
    if meta.masked_rows is not None and meta.masked_rows.numel() != count:
        # one count serves both layouts; no collator labels padding
        raise ValueError("batch_meta: MLM labels on padding positions cannot be padded to a "
                         "capacity")
    size = max(int(capacity), count)

    def pad(t: torch.Tensor | None) -> torch.Tensor | None:
        # real rows first, then position 0 (a valid row of any layout): the model drops its label
        return None if t is None else F.pad(t, (0, size - t.numel()))

    return replace(meta, masked=pad(meta.masked), masked_rows=pad(meta.masked_rows),
                   masked_count=torch.tensor(count, dtype=torch.int64))


__all__ = ["IGNORE_INDEX", "BatchMeta", "batch_meta"]
