"""Attention backends, unpadding, and the batch metadata that keeps the GPU from waiting on the
host.

Nothing here knows BERT: q, k, v come in, attention comes out, and a batch's layout is described
by plain tensors.

**Batch metadata.** Everything data-dependent a model needs about a padded (B, T) batch (is any
position padding, which tokens are real, where each sequence starts, which positions carry an
MLM label) is computed once on the host by `batch_meta` from the CPU tensors the loader already
holds, and shipped to the device as small index tensors. Given it, the model's forward and
backward make no `.item()`, `nonzero()`, `bool(tensor)` or tensor-from-Python call: nothing
drains the GPU's queue and `torch.compile` sees one graph. Without it (the Hugging Face-style
call) the model computes the same metadata itself, at the price of those host syncs::

    meta = batch_meta(batch["attention_mask"], batch["labels"])   # CPU, in the loader / collator
    out = model(**batch, batch_meta=meta)                         # moved with the batch

**Unpadding.** With `ModelOptions.unpad`, the real tokens are gathered into (N_tok, H) rows
(`Unpadded`), so projections, FFN and norms skip padding; attention runs per sequence with one of
three kernels (`choose_backend`): "varlen" (torch's flash attention over packed sequences, called
directly: models/flash.py; attention dropout and sliding windows included), "nested" (jagged
nested tensors into SDPA), or "padded" (q, k, v scattered back to (B, T), masked SDPA, gathered
again; exact everywhere). "auto" is "varlen" where it runs (CUDA, fp16/bf16), else "padded".
Same loss and gradients as the padded model.

**Padded batches on the GPU.** Without unpadding, a padded (B, T) batch on CUDA in fp16/bf16
runs attention through the same flash kernel over its `Segments` (each row's tokens, then its
padding tail as a sequence of its own; models/flash.py): exact for real tokens, with no (T, T)
mask even for sliding windows, and one compiled graph whether or not a batch has padding.

**One graph.** Nothing a compiled forward reads depends on the batch beyond tensor sizes: the
loader's metadata always carries the unpad indices (also when nothing is padded), the flash
kernel is given the padded length T as its bound, and the row counts that vary (kept tokens,
masked tokens) are marked dynamic when the metadata moves to the device (`BatchMeta.to`), so
the first compile already covers every later batch.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bertgpu.batch import IGNORE_INDEX, BatchMeta, batch_meta
from bertgpu.models import flash
from bertgpu.models.dropout import dropout

# The flash kernel's op, looked up once here rather than inside a traced forward.
_HAS_FLASH = hasattr(torch.ops.aten, "_flash_attention_forward")

def traced_meta(attention_mask: torch.Tensor | None, shape: tuple[int, int]) -> BatchMeta:
    """What a model assumes inside `torch.compile` when no metadata was passed: padded whenever a
    mask is given (deciding would need a host sync), no unpadding, MLM rows left to the model."""
    return BatchMeta(padded=attention_mask is not None, packed_ok=False, max_len=int(shape[1]))


def resolve_meta(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 given: BatchMeta | None, labels: torch.Tensor | None = None) -> BatchMeta:
    """What a model's forward works from: `given` (the loader's) on the inputs' device, or, for the
    Hugging Face-style call, this batch's metadata computed here (`traced_meta` when compiling)."""
    if given is not None:
        # Compiled, the metadata is already where the batch is (the engine and the benches move
        # it): `to` would read every field, and the graph would guard on values such as
        # `padded` that change from batch to batch.
        return given if torch.compiler.is_compiling() else given.to(input_ids.device)
    if torch.compiler.is_compiling():
        return traced_meta(attention_mask, tuple(input_ids.shape))
    return batch_meta(attention_mask, labels, shape=tuple(input_ids.shape))


def sdpa_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 1 = token, 0 = padding -> (B, 1, 1, T) bool for SDPA, True = may attend. Device ops
    only. A sequence that is all padding attends everywhere instead of nowhere, so it yields
    finite garbage rather than NaN."""
    mask = attention_mask.bool()
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    return mask[:, None, None, :]


# ---------------------------------------------------------------------------------------------
# Unpadded rows


@dataclass
class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit once gathered into (N_tok, C) rows,
    handed to every layer in place of the SDPA mask (see `BatchMeta` for index / cu_seqlens)."""

    index: torch.Tensor
    """(N_tok,) int64 flat positions b * T + t of the kept rows."""
    batch: int
    seq_len: int
    cu_seqlens: torch.Tensor
    """(B + 1,) int64 offsets of each sequence's rows."""
    max_len: int
    """The padded length T: an upper bound of every sequence, static for a compiled graph (the
    batch's own longest sequence would be a value the graph guards on)."""
    mask: torch.Tensor
    """(B, 1, 1, T) bool SDPA mask of the padded fallback (`sdpa_mask`)."""
    packed_ok: bool
    backend: str = "auto"
    """The requested kernel; `choose_backend` settles it per call."""
    cu_seqlens_i32: torch.Tensor | None = None
    """`cu_seqlens` as int32, the flash kernel's type (cast once per forward, on the device)."""

    @classmethod
    def from_meta(cls, meta: BatchMeta, attention_mask: torch.Tensor,
                  backend: str = "auto") -> Unpadded:
        B, T = attention_mask.shape
        assert (meta.index is not None
                and meta.cu_seqlens is not None), "metadata of an unpadded batch"
        return cls(index=meta.index, batch=B, seq_len=T, cu_seqlens=meta.cu_seqlens,
                   max_len=T, mask=sdpa_mask(attention_mask), packed_ok=meta.packed_ok,
                   backend=backend, cu_seqlens_i32=meta.cu_seqlens.to(torch.int32))

    def first_rows(self) -> torch.Tensor:
        """(B,) row of each sequence's column 0 (its [CLS] token)."""
        return self.cu_seqlens[:-1]


def pad_rows(x: torch.Tensor, un: Unpadded) -> torch.Tensor:
    """(N_tok, C) rows of the kept tokens -> (B, T, C) with zeros at the dropped positions."""
    out = x.new_zeros(un.batch * un.seq_len, x.size(-1))
    return out.index_copy(0, un.index, x).view(un.batch, un.seq_len, x.size(-1))


def labelled_rows(x: torch.Tensor, labels: torch.Tensor, meta: BatchMeta,
                  un: Unpadded | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, H) rows of the encoder output `x` ((B, T, H), or (N_tok, H) with `un`) that carry an
    MLM label, and their (M,) targets: the sparse MLM head's input, the same logits and gradients
    at those rows as a dense head. When the metadata's positions are padded to a fixed capacity
    (`BatchMeta.masked_count`), the padding entries get the target IGNORE_INDEX: no loss, no
    gradient, no count."""
    flat = labels.reshape(-1)  # (B T,)
    if un is None:
        rows = x.reshape(-1, x.size(-1))  # (B T, H)
        pos = (meta.masked if meta.masked is not None
               else (flat != IGNORE_INDEX).nonzero().squeeze(1))
        picked, targets = rows.index_select(0, pos), flat.index_select(0, pos)
    else:
        keep = meta.masked_rows
        if keep is None:  # metadata made without the labels: found here (a host sync)
            keep = (flat.index_select(0, un.index) != IGNORE_INDEX).nonzero().squeeze(1)
        picked = x.index_select(0, keep)
        targets = flat.index_select(0, un.index.index_select(0, keep))
    if meta.masked_count is not None:
        filler = torch.arange(targets.numel(), device=targets.device) >= meta.masked_count
        targets = targets.masked_fill(filler, IGNORE_INDEX)
    return picked, targets


@dataclass
class Segments:
    """The layout of padded (B, T) rows for the flash kernel: `flash.segments` of the batch, each
    row's tokens then its padding tail (see models/flash.py)."""

    cu_seqlens: torch.Tensor
    """(2B + 1,) int32."""


def flash_expected(device: torch.device, param_dtype: torch.dtype, head_dim: int) -> bool:
    """Attention inputs will be CUDA fp16/bf16 (half parameters, or half autocast on CUDA) with a
    head size the flash kernel takes, so it can run (`flash.usable` of the q to come): decided
    before q, k, v exist, to choose the batch layout. Static under torch.compile (device, dtype
    and the autocast state are part of the graph)."""
    if device.type != "cuda" or not _HAS_FLASH or head_dim > flash.MAX_HEAD_DIM:
        return False
    return param_dtype in flash.HALF or (torch.is_autocast_enabled(device.type)
                                         and torch.get_autocast_dtype(device.type) in flash.HALF)


def padded_layout(attention_mask: torch.Tensor | None, meta: BatchMeta, backend: str,
                  device: torch.device, param_dtype: torch.dtype, shape: tuple[int, int],
                  head_dim: int) -> torch.Tensor | Segments | None:
    """What padded (B, T) rows attend with: `Segments` for the flash kernel on CUDA fp16/bf16
    (backend "auto" or "varlen", right padding), whatever the batch's padding; else the SDPA mask,
    or None when nothing is padded (SDPA may then pick its own flash kernel)."""
    if (backend in ("auto", "varlen") and meta.packed_ok
            and flash_expected(device, param_dtype, head_dim)):
        return Segments(flash.segments(attention_mask, shape[0], shape[1], device))
    return sdpa_mask(attention_mask) if meta.padded else None


# ---------------------------------------------------------------------------------------------
# Kernels


def choose_backend(requested: str, q: torch.Tensor, dropout_p: float, packed_ok: bool) -> str:
    """The kernel unpadded attention runs: the requested one where a fused kernel exists for these
    inputs, else "padded" (exact everywhere), with one warning per distinct reason.

    "auto" and "varlen" are the flash kernel (models/flash.py: CUDA, fp16/bf16, dropout and
    windows included); "nested" needs CUDA fp16/bf16 too (in fp32 nested tensors land on the
    math kernel). "auto" falls back without a warning: on the CPU or in fp32 that is expected.
    Left padding or an empty row (`packed_ok` False) makes only the masked padded kernel exact:
    no warning, it is a property of the batch, not of the setup. `dropout_p` is accepted for the
    callers' symmetry; every fused kernel here takes dropout."""
    if requested == "padded" or not packed_ok:
        return "padded"
    half_cuda = q.is_cuda and q.dtype in flash.HALF
    if requested in ("auto", "varlen"):
        if _HAS_FLASH and flash.usable(q):
            return "varlen"
        if requested == "varlen":
            _warn_once(f"unpadded attention: backend 'varlen' needs CUDA fp16/bf16 inputs with "
                       f"a head size <= 256, found {q.device.type} {q.dtype} "
                       f"(head size {q.shape[-1]}); using the padded kernel")
        return "padded"
    if not half_cuda:
        _warn_once(f"unpadded attention: backend {requested!r} needs CUDA fp16/bf16 inputs, found "
                   f"{q.device.type} {q.dtype}; using the padded kernel")
        return "padded"
    return requested


def _warn_once(message: str) -> None:
    # Python's default filter shows a given message once per call site; nothing to remember here.
    # Inside torch.compile a warning would break the graph: the eager model (or `bertgpu bench
    # model --check-graph`, which runs each configuration eagerly too) says it instead.
    if not torch.compiler.is_compiling():
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     attn_mask: torch.Tensor | None, dropout_p: float = 0.0) -> torch.Tensor:
    """q, k, v (B, T, N, D) -> (B, T, N D): softmax(q k^T / sqrt(D)) v. attn_mask (B, 1, 1, T)
    bool (True = may attend) or None (no padding: SDPA may pick the flash kernel)."""
    if dropout_p > 0.0 and q.device.type == "cpu" and not torch.compiler.is_compiling():
        return cpu_dropout_attention(q, k, v, attn_mask, dropout_p)
    B, T = q.shape[:2]
    # (B, N, T, D) views: the layout SDPA wants
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=attn_mask, dropout_p=dropout_p)
    return y.transpose(1, 2).reshape(B, T, -1)


def cpu_dropout_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          attn_mask: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """`padded_attention` for CPU training with attention dropout, written out.

    SDPA has no fused CPU kernel with dropout and falls back to its math kernel, which scales q
    and k apart, runs a safe softmax (three extra passes over the (B, N, T, T) scores) and draws
    the dropout mask with the single-threaded `bernoulli_`. Here: one batched matmul with the
    scale folded in, the masked softmax, `dropout.dropout`'s cheaper mask, one batched matmul. The
    same math. No mask here has an empty row (`sdpa_mask`; ModernBERT's `attention_masks`), so
    the plain softmax never sees a row of -inf.
    """
    B, T, N, D = q.shape
    qh = q.transpose(1, 2).reshape(B * N, T, D)  # (B N, T, D)
    kt = k.permute(0, 2, 3, 1).reshape(B * N, D, T)  # (B N, D, T)
    vh = v.transpose(1, 2).reshape(B * N, T, D)
    scores = torch.bmm(qh, kt).mul_(D**-0.5).view(B, N, T, T)
    if attn_mask is not None:
        scores = scores.masked_fill_(~attn_mask, float("-inf"))
    probs = dropout(torch.softmax(scores, dim=-1), dropout_p)  # (B, N, T, T)
    y = torch.bmm(probs.view(B * N, T, T), vh)  # (B N, T, D)
    return y.view(B, N, T, D).transpose(1, 2).reshape(B, T, N * D)


def nested_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, un: Unpadded,
                     dropout_p: float = 0.0) -> torch.Tensor:
    """q, k, v (N_tok, N, D) packed rows -> (N_tok, N D), each sequence attending to itself only.

    Jagged nested tensors (B, j, N, D) -> (B, N, j, D) into SDPA: flash / memory-efficient
    kernels on CUDA in fp16/bf16, the math kernel elsewhere (exact, slow). The kernels want each
    of q, k, v contiguous in its (N_tok, N, D) values."""
    q, k, v = (torch.nested.nested_tensor_from_jagged(
        t.contiguous(), un.cu_seqlens, min_seqlen=1, max_seqlen=un.max_len).transpose(1, 2)
        for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    return y.transpose(1, 2).values().flatten(1)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, un: Unpadded,
                     dropout_p: float = 0.0, window: int | None = None) -> torch.Tensor:
    """q, k, v (N_tok, N, D) packed rows -> (N_tok, N D) through the flash kernel over the
    sequences of `un` (models/flash.py), with attention dropout and an optional sliding window."""
    cu = un.cu_seqlens_i32 if un.cu_seqlens_i32 is not None else un.cu_seqlens.to(torch.int32)
    return flash.flash_varlen(q, k, v, cu, un.seq_len, dropout_p, window).flatten(1)


def unpadded_padded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, un: Unpadded,
                              dropout_p: float = 0.0) -> torch.Tensor:
    """The exact fallback: scatter q, k, v rows back to (B, T), masked SDPA, gather the rows."""
    q, k, v = (pad_rows(t.flatten(1), un).unflatten(-1, t.shape[1:]) for t in (q, k, v))
    y = padded_attention(q, k, v, un.mask, dropout_p)
    return y.reshape(un.batch * un.seq_len, -1).index_select(0, un.index)


Layout = torch.Tensor | Segments | Unpadded | None
"""What a layer's attention gets: an SDPA mask or None, or `Segments` (padded (B, T) rows), or an
`Unpadded` (packed rows)."""


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout,
              dropout_p: float = 0.0, window: int | None = None) -> torch.Tensor:
    """Multi-head attention without projections.

    layout an SDPA mask or None: q, k, v (B, T, N, D) -> (B, T, N D).
    layout `Segments`: the same through the flash kernel.
    layout an `Unpadded`: q, k, v (N_tok, N, D) -> (N_tok, N D), with the kernel from
    `choose_backend(layout.backend, ...)`.
    `window` (keys at most that far on either side) is honoured by the flash paths only: the
    callers with a window (ModernBERT's local layers) put it in the mask of the others."""
    if isinstance(layout, Segments):
        return flash.padded_flash(q, k, v, layout.cu_seqlens, dropout_p, window)
    if not isinstance(layout, Unpadded):
        return padded_attention(q, k, v, layout, dropout_p)
    backend = choose_backend(layout.backend, q, dropout_p, layout.packed_ok)
    if backend == "varlen":
        return varlen_attention(q, k, v, layout, dropout_p, window)
    if backend == "nested":
        return nested_attention(q, k, v, layout, dropout_p)
    return unpadded_padded_attention(q, k, v, layout, dropout_p)


__all__ = ["traced_meta", "resolve_meta", "sdpa_mask", "Unpadded", "pad_rows", "Segments",
           "flash_expected", "padded_layout", "Layout", "choose_backend",
           "padded_attention", "cpu_dropout_attention", "nested_attention", "varlen_attention",
           "unpadded_padded_attention", "attention"]
