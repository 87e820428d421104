"""The parameter layout inside our models, Hugging Face's layout in files, and the conversion.

Two kinds of tensor are laid out for speed inside a model rather than as transformers stores them
(each architecture's SPEC declares which, models/spec.py):

- fused Linears (`Architecture.fused_linears`): BERT's query, key and value are one
  `attention.self.qkv` Linear whose weight is [W_q; W_k; W_v] (3H, H) and bias [b_q; b_k; b_v]:
  one matmul, and no torch.cat of three weights in every forward and backward (ModernBERT's Wqkv
  is one Linear in transformers too);
- vocabulary tables (`Architecture.vocab_tables`): `shared.padded_vocab_size(V)` rows, those past
  V zero (`shared.VOCAB_MULTIPLE`; the model's logits are cut back to V).

`model.state_dict()`, `named_parameters()`, the optimizer state and DCP checkpoint shards are in
the model's own layout. Whole-file checkpoints hold Hugging Face's (`file_state`, and
`model_state` back when resuming), so that transformers' `from_pretrained` reads a checkpoint
folder. Weights in the Hugging Face layout are converted where they cross into or out of a
model: `hf_io` (`load_pretrained`, `load_init_weights` behind
`--init`, `save_pretrained` behind `bertgpu export`, a run's hf/ folder and fine-tuned models),
and `hf_state_dict` / `load_hf_state_dict` below for code that hands weights to or from a
transformers model in memory (bench model, the parity tests).

Why not state_dict hooks that would make `state_dict()` itself show Hugging Face's names and
shapes: the keys of `state_dict()` must be the names of parameters. torch.distributed.checkpoint
(`get_state_dict` / `set_state_dict`, FSDP2 checkpoints) maps every key back to a parameter by
walking the module tree and keys the optimizer state by parameter name; a hook's
`...attention.self.query.weight` names no parameter, and cutting a third or the padding off a
DTensor sharded along that very dimension would put collectives inside a state-dict call. A
whole-file checkpoint is converted on the host instead, where every tensor is whole.

Both directions take either layout (a bertgpu checkpoint is in ours, a Hugging Face folder in
theirs) and leave what is already converted alone, for any name -> tensor mapping (weights,
gradients)::

    hf = to_hf(model.state_dict(), "bert", config.vocab_size)   # HF names and shapes (views)
    model.load_state_dict(from_hf(hf, "bert", config.vocab_size))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from bertgpu.models.build import spec
from bertgpu.models.shared import padded_vocab_size


def _prefix(module: str, path: str) -> str | None:
    """What precedes `path` when `module` is `path` inside some parent ("bert.encoder.layer.3."
    for "bert.encoder.layer.3.attention.self.qkv" and "attention.self.qkv"), else None."""
    if module == path:
        return ""
    if module.endswith("." + path):
        return module[: -len(path)]
    return None


def _is_vocab_table(key: str, tables: tuple[str, ...]) -> bool:
    return any(key == t or key.endswith("." + t) for t in tables)


def to_hf(tensors: Mapping[str, torch.Tensor], architecture: str,
          vocab_size: int) -> dict[str, torch.Tensor]:
    """Our layout -> Hugging Face's: each fused Linear split into its parts (views), each
    vocabulary table cut to `vocab_size` rows (a view). Keys already in HF's layout pass as
    they are."""
    arch = spec(architecture)
    padded = padded_vocab_size(vocab_size)
    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        module, _, leaf = key.rpartition(".")
        for fused, parts in arch.fused_linears.items():
            prefix = _prefix(module, fused)
            if prefix is not None:  # (k * n, ...) -> k pieces of (n, ...) along the output dim
                for part, piece in zip(parts, t.chunk(len(parts)), strict=True):
                    out[f"{prefix}{part}.{leaf}"] = piece
                break
        else:
            if (padded != vocab_size and t.dim() > 0 and t.shape[0] == padded
                    and _is_vocab_table(key, arch.vocab_tables)):
                t = t[:vocab_size]
            out[key] = t
    return out


@torch.no_grad()
def from_hf(tensors: Mapping[str, torch.Tensor], architecture: str,
            vocab_size: int) -> dict[str, torch.Tensor]:
    """Hugging Face's layout -> ours: the parts of each fused Linear stacked (in the declared
    order) when all of them are present, each vocabulary table of `vocab_size` rows padded with
    zero rows. Keys already in our layout pass as they are; parts of a fused Linear whose
    siblings are missing too (the caller's key checks name them)."""
    arch = spec(architecture)
    padded = padded_vocab_size(vocab_size)
    groups: dict[str, dict[str, str]] = {}  # fused key -> {its part: the HF key present}
    order: dict[str, tuple[str, ...]] = {}  # fused key -> its parts, in the declared order
    member: dict[str, str] = {}  # HF key -> its fused key
    for key in tensors:
        module, _, leaf = key.rpartition(".")
        for fused, parts in arch.fused_linears.items():
            for part in parts:
                prefix = _prefix(module, part)
                if prefix is not None:
                    target = f"{prefix}{fused}.{leaf}"
                    groups.setdefault(target, {})[part] = key
                    order[target], member[key] = parts, target
    out: dict[str, torch.Tensor] = {}
    for key, t in tensors.items():
        target = member.get(key)
        if target is not None and len(groups[target]) == len(order[target]):
            if target not in out:  # at the first part present: stack them all
                out[target] = torch.cat([tensors[groups[target][p]] for p in order[target]])
            continue
        if (padded != vocab_size and t.dim() > 0 and t.shape[0] == vocab_size
                and _is_vocab_table(key, arch.vocab_tables)):
            t = torch.cat([t, t.new_zeros((padded - vocab_size, *t.shape[1:]))])
        out[key] = t
    return out


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model.state_dict()` in Hugging Face's names and shapes (views of the model's tensors,
    tied copies included, as transformers' own `state_dict()`)."""
    config = model.config
    return to_hf(model.state_dict(), config.architecture, config.vocab_size)


def load_hf_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor],
                       strict: bool = True) -> Any:
    """`model.load_state_dict` of a state dict in Hugging Face's layout (a transformers model's
    `state_dict()`); the tied weights shared again. Returns torch's missing / unexpected keys."""
    config = model.config
    result = model.load_state_dict(from_hf(state, config.architecture, config.vocab_size),
                                   strict=strict)
    model.tie_weights()
    return result


def file_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights as a whole-file checkpoint stores them: `hf_state_dict` for a bertgpu model
    (its config names an architecture), so that transformers' `from_pretrained` reads a
    checkpoint folder as it reads an export; any other module's `state_dict()` as it is."""
    if getattr(getattr(model, "config", None), "architecture", None) is None:
        return model.state_dict()
    return hf_state_dict(model)


def model_state(model: nn.Module, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's weights in `model`'s own layout, from either layout (checkpoints written
    before `file_state` hold ours); the inverse of `file_state`, bitwise (the padding rows
    `to_hf` cut off are zero in a model, and zero again here)."""
    config = getattr(model, "config", None)
    if getattr(config, "architecture", None) is None:
        return dict(tensors)
    return from_hf(tensors, config.architecture, config.vocab_size)


__all__ = ["file_state", "from_hf", "hf_state_dict", "load_hf_state_dict", "model_state",
           "to_hf"]
