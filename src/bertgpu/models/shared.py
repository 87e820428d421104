"""Pieces every encoder here shares: outputs, per-instance speed options and the summed losses
the engine normalises.

Nothing in this file knows BERT's parameter names; `bert/model.py` and `modernbert/model.py`
build on it. The vocabulary tables (`VocabEmbedding`, `VocabDecoder`) are padded to
`VOCAB_MULTIPLE` rows here; `layout.py` converts to and from Hugging Face's unpadded files.

    opts = ModelOptions(unpad=True, attention_backend="auto")
    model = BertForPreTraining(config, options=opts)     # or later: model.configure(unpad=True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertgpu.batch import IGNORE_INDEX
from bertgpu.errors import BertgpuError

ATTENTION_BACKENDS = ("auto", "varlen", "nested", "padded")
"""Kernels of unpadded attention (see `attention.choose_backend`)."""


class ModelOutput(dict):
    """A dict with attribute access; only the fields that were computed are present."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


@dataclass(frozen=True)
class ModelOptions:
    """How one model instance runs. None of these changes the math (same loss and gradients to
    float tolerance); each model holds its own, so two models in one process never share them."""

    unpad: bool = False
    """Run padded batches on their real tokens only: embeddings, projections, FFN and norms on
    (N_tok, H) rows, attention per sequence (see `attention.Unpadded`)."""
    attention_backend: str = "auto"
    """Kernel of unpadded attention: "auto" or "varlen" (flash attention over the packed
    sequences, models/flash.py, where it exists: CUDA, fp16/bf16), "nested" (nested tensors
    through SDPA, CUDA fp16/bf16), or "padded" (masked SDPA on re-padded q, k, v: exact
    everywhere). Where the asked kernel has no fused implementation the padded one runs, with one
    warning ("auto" without: on a CPU or in fp32 that is expected)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward instead of storing them: ~1/3 more compute
    for a much smaller activation footprint (8 GB cards, long sequences)."""

    def validate(self) -> ModelOptions:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise BertgpuError(f"unpad backend: found {self.attention_backend!r}, expected one of "
                               f"{', '.join(ATTENTION_BACKENDS)}")
        return self


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters, same math) whose output, under fp16/bf16 autocast, is in
    the autocast dtype.

    Autocast runs layer_norm in fp32 and returns fp32, so without this the residual stream, the
    dropout masks applied to it and every activation saved for backward between layers are fp32:
    twice the bytes of the memory-bound part of a step. On an H100 (BERT-base, 128 x 128,
    compiled) the step's GPU time fell from 28.6 to 26.9 ms (probe of issue 24). The normalisation
    itself still computes in fp32; outside autocast nothing changes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        kind = y.device.type
        if y.dtype == torch.float32 and torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
            if dtype in (torch.float16, torch.bfloat16):
                y = y.to(dtype)
        return y


class Configurable(nn.Module):
    """A model whose `ModelOptions` can change after construction, for this instance only.

    Every submodule that reads options holds an `options` attribute; `configure` hands the new
    (frozen) options to all of them, so a model never mixes old and new settings."""

    options: ModelOptions

    def configure(self, options: ModelOptions | None = None, **changes: Any) -> ModelOptions:
        """Replace this model's options (`options`, then any field given by name); returns them."""
        new = dataclasses.replace(options or self.options, **changes).validate()
        for m in self.modules():
            if hasattr(m, "options"):
                m.options = new
        return new

    def gradient_checkpointing_enable(self, enabled: bool = True) -> None:
        """Hugging Face's name for `configure(gradient_checkpointing=enabled)`."""
        self.configure(gradient_checkpointing=enabled)

    def unpad_enable(self, enabled: bool = True, backend: str = "auto") -> None:
        """`configure(unpad=enabled, attention_backend=backend)`."""
        self.configure(unpad=enabled, attention_backend=backend)


VOCAB_MULTIPLE = 64
"""Rows of the vocabulary tables (token embedding, tied MLM decoder and its bias) are padded to a
multiple of this inside the model: BERT's 30,522 becomes 30,528, so the decoder matmul (and its
weight gradient) has a vocabulary dimension that tensor-core tiles cover evenly (bf16/fp16 GEMMs
want multiples of 8 and fill whole tiles at multiples of 64: nanoGPT pads GPT-2's 50,257 to
50,304 for the same reason, Megatron-LM to 128 per rank).
A constant, not an option: the shapes inside a checkpoint follow from `vocab_size` alone. The
padding never shows outside the model: logits and losses are over the real vocabulary, and
`layout.py` cuts the rows off on export (Hugging Face files have `vocab_size` rows)."""


def padded_vocab_size(vocab_size: int) -> int:
    """`vocab_size` rounded up to a multiple of `VOCAB_MULTIPLE` (30522 -> 30528, 99 -> 128)."""
    return -(-int(vocab_size) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


class VocabEmbedding(nn.Embedding):
    """A token embedding with `padded_vocab_size(vocab_size)` rows, of which the first
    `vocab_size` are tokens. The padding rows are zero and stay zero: no id reaches them, and the
    tied decoder (`VocabDecoder`) cuts their logits off, so they never get a gradient (Adam and
    LAMB then leave them at zero, and decoupled weight decay of zero is zero).

    Initialisers draw random numbers for the token rows only (`tokens`), so a model built under a
    seed gets the initial weights the unpadded table would have had, every later tensor too."""

    def __init__(self, vocab_size: int, embedding_dim: int, padding_idx: int | None = None):
        self.vocab_size = int(vocab_size)  # before nn.Embedding's reset_parameters reads it
        super().__init__(padded_vocab_size(vocab_size), embedding_dim, padding_idx=padding_idx)

    @property
    def tokens(self) -> torch.Tensor:
        """The (V, H) rows of real tokens (a view of the weight)."""
        return self.weight[: self.vocab_size]

    def reset_parameters(self) -> None:
        """nn.Embedding's N(0, 1), on the token rows only; padding rows and padding_idx zero."""
        nn.init.normal_(self.tokens)
        self.zero_padding_rows()
        self._fill_padding_idx_with_zero()

    def zero_padding_rows(self) -> None:
        """Zero the rows past the real vocabulary."""
        with torch.no_grad():
            self.weight[self.vocab_size:].zero_()


class VocabDecoder(nn.Linear):
    """The MLM decoder over the padded vocabulary: one (H x V_pad) matmul, whose logits are cut to
    the real V. Everything downstream (the returned logits, the cross-entropy, argmax accuracy)
    sees exactly the unpadded model's V columns, and the cut columns get zero gradient: the
    padded rows of the tied embedding and of the bias get none.

    The cut logits are copied out of the padded ones rather than returned as a strided view: FSDP2
    warns about (and an in-place op would break the backward hook of) a view in the output of the
    model it wraps, and the cross-entropy makes a contiguous copy anyway. The copy is O(M V) next
    to the matmul's O(M V H)."""

    def __init__(self, in_features: int, vocab_size: int, bias: bool = True):
        self.vocab_size = int(vocab_size)  # before nn.Linear's reset_parameters reads it
        super().__init__(in_features, padded_vocab_size(vocab_size), bias=bias)

    @property
    def tokens(self) -> torch.Tensor:
        """The (V, H) weight rows of real tokens (a view)."""
        return self.weight[: self.vocab_size]

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation of the token rows only (the same random numbers as an
        unpadded decoder: see VocabEmbedding); the padding rows zero."""
        v = self.vocab_size
        nn.init.kaiming_uniform_(self.tokens, a=math.sqrt(5))  # as nn.Linear
        with torch.no_grad():
            self.weight[v:].zero_()
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            nn.init.uniform_(self.bias[:v], -bound, bound)
            with torch.no_grad():
                self.bias[v:].zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)  # (..., V_pad)
        if self.out_features == self.vocab_size:
            return logits
        return logits[..., : self.vocab_size].contiguous()  # (..., V)


def masked_lm_terms(logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Summed MLM cross-entropy of the (M, V) logits of the labelled rows, their count and the
    number predicted right; no host sync (the count is a device reduction, not `len`)."""
    return {
        # fp32 cross-entropy: under bf16 autocast the logits are bf16, their log-sum-exp is not
        "mlm_loss_sum": F.cross_entropy(logits.float(), targets, reduction="sum"),
        "mlm_count": (targets != IGNORE_INDEX).sum(),
        "mlm_correct": (logits.argmax(-1) == targets).sum(),
    }


def sequence_loss_terms(logits: torch.Tensor, labels: torch.Tensor,
                        num_labels: int) -> dict[str, torch.Tensor]:
    """Sequence classification: summed cross-entropy (MSE when num_labels == 1), the number of
    sequences (a device count, no tensor built from a Python int) and the mean loss."""
    if num_labels == 1:
        loss_sum = F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1),
                              reduction="sum")
    else:
        loss_sum = F.cross_entropy(logits.float(), labels.reshape(-1), reduction="sum")
    count = torch.ones_like(labels.reshape(-1), dtype=torch.int64).sum()  # (), B
    return {"loss_sum": loss_sum, "count": count, "loss": loss_sum / labels.numel()}


def token_loss_terms(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token classification: logits (B, T, C), labels (B, T) with IGNORE_INDEX where not
    labelled -> summed cross-entropy over labelled positions, their count, and the mean."""
    flat = labels.reshape(-1)
    loss_sum = F.cross_entropy(logits.float().reshape(flat.numel(), -1), flat,
                               ignore_index=IGNORE_INDEX, reduction="sum")
    count = (flat != IGNORE_INDEX).sum()
    return {"loss_sum": loss_sum, "count": count, "loss": loss_sum / count.clamp(min=1)}


def span_loss_terms(start_logits: torch.Tensor, end_logits: torch.Tensor,
                    start_positions: torch.Tensor, end_positions: torch.Tensor,
                    attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Extractive QA, as transformers computes it: start/end logits (B, T); positions outside the
    window are clamped to T and ignored. `loss` is HF's (CE_start + CE_end) / 2; `loss_sum` /
    `count` equals it whenever start and end are ignored together (always, for SQuAD features).

    The softmax leaves out the padding (`attention_mask` 0): over it, a feature's loss depended on
    how wide its micro batch was padded, so the same step trained otherwise on another number
    of devices or micro batch (transformers pads to max_seq_len, one width, and keeps it in)."""
    if attention_mask is not None:
        pad = attention_mask.reshape(start_logits.shape) == 0
        start_logits = start_logits.float().masked_fill(pad, -1e4)
        end_logits = end_logits.float().masked_fill(pad, -1e4)
    T = start_logits.size(1)
    s = start_positions.reshape(-1).clamp(0, T)
    e = end_positions.reshape(-1).clamp(0, T)
    s_sum = F.cross_entropy(start_logits.float(), s, ignore_index=T, reduction="sum")
    e_sum = F.cross_entropy(end_logits.float(), e, ignore_index=T, reduction="sum")
    n_s, n_e = (s != T).sum(), (e != T).sum()
    return {"loss": (s_sum / n_s + e_sum / n_e) / 2, "loss_sum": (s_sum + e_sum) / 2, "count": n_s}


def labelled_output(logits: torch.Tensor, labels: torch.Tensor | None,
                    loss_terms: Callable[[torch.Tensor, torch.Tensor],
                                         dict[str, torch.Tensor]]) -> ModelOutput:
    """A classifier's output: its logits, and with labels the loss terms of `loss_terms`."""
    out = ModelOutput(logits=logits)
    if labels is not None:
        out.update(loss_terms(logits, labels))
    return out


def num_parameters(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once), without the padding rows of
    the vocabulary tables (always zero, never trained: the count is the Hugging Face model's);
    optionally without the embedding tables (the usual "non-embedding parameters" used for FLOP
    estimates)."""
    seen: set[int] = set()
    skip: set[int] = set()
    if exclude_embeddings:
        skip = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    padding: dict[int, int] = {}  # parameter -> elements in its padding rows
    for m in model.modules():
        if isinstance(m, (VocabEmbedding, VocabDecoder)):
            for p in m.parameters(recurse=False):
                padding[id(p)] = (p.shape[0] - m.vocab_size) * (p.numel() // p.shape[0])
    total = 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel() - padding.get(id(p), 0)
    return total


__all__ = ["ATTENTION_BACKENDS", "VOCAB_MULTIPLE", "ModelOutput", "ModelOptions", "Configurable",
           "LayerNorm", "VocabDecoder", "VocabEmbedding", "padded_vocab_size", "masked_lm_terms",
           "sequence_loss_terms", "token_loss_terms", "span_loss_terms", "num_parameters"]
