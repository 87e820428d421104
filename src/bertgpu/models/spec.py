"""What bertgpu needs to know about an encoder architecture, declared once per architecture.

Each architecture is a folder, `models/<name>/`, whose `__init__.py` declares `SPEC`, an
`Architecture`; `models/build.py` lists the folders (one line each). Everything else reads the
spec: the `[model]` section of a recipe is `config_class` (so a recipe can only name fields the
architecture has), `build_model` takes the head classes from `heads()`, `hf_io` the Hugging Face
names, MFU the FLOPs per token, the automatic micro batch the memory estimate::

    spec = build.spec("modernbert")
    cfg = spec.config_class(hidden_size=256, num_attention_heads=4, **spec.pretraining_defaults)
    model = spec.heads()["masked_lm"](cfg)
    spec.flops_per_token(cfg, seq_len=128, mlm_fraction=0.3, with_nsp=False)

Nothing here imports torch: the config schema and the data tools read specs before any model is
built; `heads()` imports the architecture's model module on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Architecture:
    """One encoder architecture: its config, heads, Hugging Face names and costs."""

    name: str
    """`model.architecture` in a recipe and `model_type` in a Hugging Face config.json."""
    title: str
    """How people write it ("BERT", "ModernBERT"), for messages."""
    config_class: type
    """The hyper-parameter dataclass (transformers' field names): the `[model]` section of a
    recipe and the fields read from and written to config.json. Has `from_dict`, `to_dict`,
    `validate(prefix)`."""
    model_module: str
    """Module whose `HEADS` maps a head name ("pretraining", "masked_lm", "classification", "qa",
    "token_classification", "base") to a class (or factory) taking the config."""
    encoder_prefix: str
    """Attribute holding the encoder in the task models, with its dot ("bert.", "model.")."""
    encoder_names: tuple[str, ...]
    """Top-level names of the bare encoder's parameters (a bare encoder folder stores them
    without `encoder_prefix`)."""
    layers_path: str
    """Dotted path, inside the bare encoder, of the `nn.ModuleList` of its transformer layers
    ("encoder.layer", "layers"): what sharded training (FSDP) wraps one by one (`layers`)."""
    flops_per_token: Callable[[Any, int, float, bool], float]
    """(config, seq_len, mlm_fraction, with_nsp) -> training FLOPs per token, for MFU."""
    train_bytes: Callable[..., int]
    """(config, micro_batch, seq_len, dtype_bytes, grad_ckpt, flash_attention, optimizer) ->
    rough bytes of one pretraining step: the automatic micro batch's estimate off CUDA."""
    has_nsp: bool = False
    """Pretraining can train a next-sentence head (objective mlm+nsp)."""
    has_pooler: bool = False
    """The bare encoder ("base") takes `add_pooling_layer` (BERT's pooler over [CLS])."""
    pretraining_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Fields of a recipe's `[model]` whose default differs from transformers' for a model
    pretrained from scratch on a bertgpu tokenizer (e.g. the id of [PAD])."""
    equivalents: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Fields of other architectures -> this one's names for the same knob (a recipe that names
    the wrong one is told which to use; fine-tuning's --hidden_dropout_prob sets them all)."""
    position_tables: tuple[str, ...] = ()
    """Learned position tables (names inside the encoder, e.g. "embeddings.position_embeddings.
    weight"), one row per position up to max_position_embeddings: what grows when a continued
    run raises max_position_embeddings (RoPE has none)."""
    continuation_fields: tuple[str, ...] = ()
    """`[model]` fields a run continued from a checkpoint (`--init`) may set differently from the
    checkpoint's config.json: none that changes what a weight means, except
    max_position_embeddings, which may grow (new rows of `position_tables` are initialised)."""
    fused_linears: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Linear layers the model holds as one that Hugging Face stores as several, as module paths
    inside a layer: {"attention.self.qkv": ("attention.self.query", "attention.self.key",
    "attention.self.value")}. The model's weight and bias are HF's stacked along the output
    dimension, in this order; `layout.py` splits them on export and stacks them on load."""
    vocab_tables: tuple[str, ...] = ()
    """Parameters with one row per token (name suffixes, tied copies included, e.g.
    "embeddings.word_embeddings.weight"): `shared.padded_vocab_size(vocab_size)` rows inside the
    model, `vocab_size` rows in Hugging Face files (`layout.py` converts)."""
    fix_legacy_keys: Callable[[dict[str, Any], bool], dict[str, Any]] | None = None
    """(state dict in our names, loading a bare encoder) -> the same with keys that older files
    store differently filled in (e.g. a decoder bias stored only under its old name)."""

    def heads(self) -> dict[str, Any]:
        """Head name -> model class (imports the model module, hence torch)."""
        return importlib.import_module(self.model_module).HEADS

    def layers(self, model: Any) -> list[Any]:
        """The transformer layers of `model` (any head, or the bare encoder), in order; the model
        itself knows nothing of the parallelism that shards them."""
        prefix = self.encoder_prefix.rstrip(".")
        encoder = getattr(model, prefix, None) if prefix else None
        return list((encoder if encoder is not None else model).get_submodule(self.layers_path))

    def pretraining_config(self) -> Any:
        """The `[model]` section of a recipe that names this architecture, before the recipe's
        values: transformers' defaults with `pretraining_defaults` applied."""
        return self.config_class(**self.pretraining_defaults)


__all__ = ["Architecture"]
