"""The registry of architectures, and the one place that maps an architecture and a head to a model.

An architecture is a folder `models/<name>/` whose `__init__.py` declares `SPEC`
(models/spec.py); `ARCHITECTURES` below lists them, one line each.

`fields` are Hugging Face config.json names (`hidden_size`, `num_hidden_layers`, ...) plus either
`architecture` (our config's `model.architecture`) or `model_type` (config.json's), so the same
call builds a model from a `[model]` section, from a checkpoint's config.json, or from any
Hugging Face folder's::

    model = build_model({"architecture": "modernbert", "hidden_size": 256, ...}, "masked_lm")
    model = build_model(read_config(folder), "classification", num_labels=3)

Heads: "pretraining" (BERT: MLM + NSP when `with_nsp`; ModernBERT: MLM, it has no NSP),
"masked_lm", "classification", "qa", "token_classification", "base" (the bare encoder).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError

if TYPE_CHECKING:  # torch is imported by the model modules when a model is built, not here:
    from torch import nn  # the config schema imports this module's vocabularies

    from bertgpu.models.spec import Architecture

ARCHITECTURES: dict[str, str] = {
    "bert": "bertgpu.models.bert",
    "modernbert": "bertgpu.models.modernbert",
}
"""`model.architecture` (= transformers' `model_type`) -> the package that declares its `SPEC`."""
HEADS = ("pretraining", "masked_lm", "classification", "qa", "token_classification", "base")


def architecture_of(fields: dict[str, Any]) -> str:
    """`architecture` or `model_type` of `fields` (they must agree when both are given); "bert"
    when neither is (old BERT config.json files may lack model_type)."""
    arch, model_type = fields.get("architecture"), fields.get("model_type")
    if arch is not None and model_type is not None and arch != model_type:
        raise BertgpuError(f"config field architecture {arch!r} disagrees with model_type "
                           f"{model_type!r}")
    name = arch if arch is not None else model_type if model_type is not None else "bert"
    if name not in ARCHITECTURES:
        raise BertgpuError(f"config field {'architecture' if arch is not None else 'model_type'}: "
                           f"found {name!r}, expected one of {', '.join(ARCHITECTURES)}")
    return name


def spec(architecture: str) -> Architecture:
    """The `SPEC` of a registered architecture (no torch import)."""
    if architecture not in ARCHITECTURES:
        raise BertgpuError(f"architecture {architecture!r}: expected one of "
                           f"{', '.join(ARCHITECTURES)}")
    return importlib.import_module(ARCHITECTURES[architecture]).SPEC


def spec_of_config(config: Any) -> Architecture:
    """The spec of a config object: ours (its `architecture` field), or any object with
    transformers' field names (its `model_type`, else BERT)."""
    return spec(getattr(config, "architecture", None)
                or getattr(config, "model_type", None) or "bert")


def config_class(architecture: str) -> type:
    """The config dataclass of an architecture (BertConfig or ModernBertConfig); no torch import."""
    return spec(architecture).config_class


def model_config(fields: dict[str, Any]) -> Any:
    """The validated BertConfig / ModernBertConfig of `fields` (unknown names are ignored);
    BertgpuError naming the field when it cannot be built."""
    try:
        return config_class(architecture_of(fields)).from_dict(fields).validate()
    except TypeError as e:  # a field of the wrong kind that the dataclass cannot take
        raise BertgpuError(f"config: {e}") from None


def labels_of(fields: dict[str, Any], num_labels: int | None) -> tuple[int, dict[int, str] | None]:
    """(num_labels, id2label) of a classification model: the argument, else config.json's
    id2label / num_labels, else 2; config.json's label names when their count agrees."""
    raw = fields.get("id2label")
    id2label = None
    if isinstance(raw, dict) and raw:
        try:
            id2label = {int(k): str(v) for k, v in raw.items()}
        except ValueError:
            id2label = None
    if num_labels is None:
        num_labels = len(id2label) if id2label else int(fields.get("num_labels", 2))
    if id2label is not None and len(id2label) != num_labels:
        id2label = None
    return num_labels, id2label


def build_model(fields: dict[str, Any], head: str, num_labels: int | None = None,
                with_nsp: bool | None = None, *, add_pooling_layer: bool = True) -> nn.Module:
    """A freshly initialised model of `fields`' architecture with `head`, in train mode, fp32, CPU.

    num_labels: classification / token classification (default: from `fields`, else 2).
    with_nsp: the NSP head of an architecture that has one (None = yes, as BertForPreTraining);
    true for one without is an error. add_pooling_layer: the BERT pooler of head "base".
    Field errors are BertgpuError naming the field.
    """
    if head not in HEADS:
        raise BertgpuError(f"head {head!r}: expected one of {', '.join(HEADS)}")
    arch = spec(architecture_of(fields))
    config = model_config(fields)
    if with_nsp and not arch.has_nsp:
        raise BertgpuError(f"with_nsp: {arch.title} has no next-sentence head; expected "
                           "--train.with_nsp false for architecture "
                           f"{arch.name} (MLM alone: NSP shards' sentence pairs train it too)")
    cls = arch.heads()[head]
    if head in ("classification", "token_classification"):
        n, id2label = labels_of(fields, num_labels)
        return cls(config, num_labels=n, id2label=id2label)
    if head == "base" and arch.has_pooler:
        return cls(config, add_pooling_layer=add_pooling_layer)
    if head == "pretraining" and arch.has_nsp:
        return cls(config, with_nsp=True if with_nsp is None else with_nsp)
    return cls(config)


__all__ = ["ARCHITECTURES", "HEADS", "architecture_of", "build_model", "config_class", "labels_of",
           "model_config", "spec", "spec_of_config"]
