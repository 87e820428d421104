"""ModernBERT's hyper-parameters: transformers' `ModernBertConfig` names and defaults, read from
either transformers version's config.json and written in both. No torch here, so the training
config can check a `[model]` section with the same rules before anything is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from bertgpu.batch import IGNORE_INDEX
from bertgpu.errors import BertgpuError

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu")
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names for global / local
POOLINGS = ("cls", "mean")


@dataclass
class ModernBertConfig:
    """ModernBERT hyper-parameters with transformers' field names and defaults (ModernBERT-base)."""

    architecture: str = "modernbert"
    """The architecture these fields describe (config.json's model_type)."""
    vocab_size: int = 50368
    """Number of token ids (rows of the token embedding and of the tied decoder)."""
    hidden_size: int = 768
    """Width H of every token representation."""
    intermediate_size: int = 1152
    """Width I of the GeGLU block: Wi maps H -> 2 I (input and gate), Wo maps I -> H."""
    num_hidden_layers: int = 22
    """Number of encoder layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; H / N must be even (RoPE turns pairs of features)."""
    hidden_activation: str = "gelu"
    """Activation of the GeGLU input half: gelu (erf), gelu_new / gelu_pytorch_tanh, relu, silu."""
    max_position_embeddings: int = 8192
    """Longest sequence the model is meant for (RoPE itself has no table)."""
    initializer_range: float = 0.02
    """Std of the truncated-normal initialisation."""
    initializer_cutoff_factor: float = 2.0
    """Truncate the initialisation at this many standard deviations."""
    norm_eps: float = 1e-5
    """Epsilon of every LayerNorm."""
    norm_bias: bool = False
    """LayerNorms with a bias (ModernBERT: none)."""
    pad_token_id: int | None = 50283
    """Id of the padding token (its embedding row gets no gradient)."""
    # Tokenizer metadata that transformers keeps in config.json; the model does not read them.
    # None by default (transformers' defaults are ModernBERT's own vocabulary's ids, which would
    # point outside a vocabulary of ours); a loaded config.json keeps its values.
    bos_token_id: int | None = None
    """Tokenizer metadata kept in config.json: id of the beginning-of-sequence token."""
    eos_token_id: int | None = None
    """Tokenizer metadata kept in config.json: id of the end-of-sequence token."""
    cls_token_id: int | None = None
    """Tokenizer metadata kept in config.json: id of [CLS]."""
    sep_token_id: int | None = None
    """Tokenizer metadata kept in config.json: id of [SEP]."""
    global_rope_theta: float = 160_000.0
    """RoPE base of the global-attention layers."""
    local_rope_theta: float | None = 10_000.0
    """RoPE base of the sliding-window layers (None: the global theta, as transformers 4.x)."""
    attention_bias: bool = False
    """Biases in Wqkv and the attention output Wo."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities and on the attention output."""
    global_attn_every_n_layers: int = 3
    """Layer i is global when i % n == 0, local (sliding window) otherwise (unless layer_types
    says)."""
    layer_types: list[str] | None = None
    """Per layer "full_attention" or "sliding_attention" (transformers >= 5 writes this list);
    None derives it from global_attn_every_n_layers. A list that no such n derives (layer 0
    local, or global layers unevenly spaced) builds a model, but no export, pretraining or
    fine-tuning run takes it: transformers 4.x reads the period alone (`export_problem`)."""
    local_attention: int = 128
    """Width of the sliding window: a token sees local_attention // 2 tokens on each side."""
    embedding_dropout: float = 0.0
    """Dropout after the embedding LayerNorm."""
    mlp_bias: bool = False
    """Biases in Wi and Wo of the feed-forward block."""
    mlp_dropout: float = 0.0
    """Dropout between the GeGLU product and Wo."""
    decoder_bias: bool = True
    """Bias of the MLM decoder (its weight is tied to the token embeddings)."""
    classifier_pooling: str = "cls"
    """Sequence classification reads the first token ("cls") or the mean over real tokens
    ("mean")."""
    classifier_dropout: float = 0.0
    """Dropout before the classification / QA / token-classification layer."""
    classifier_bias: bool = False
    """Bias of the head's dense layer (the MLM and classification heads share its shape)."""
    classifier_activation: str = "gelu"
    """Activation of the head's dense layer."""
    sparse_prediction: bool = False
    """transformers' switch for MLM logits at labelled positions only; kept for round trips
    (ours always predicts only labelled positions when labels are given: the same loss)."""
    sparse_pred_ignore_index: int = IGNORE_INDEX
    """Label of unpredicted positions in transformers' sparse path; ours is IGNORE_INDEX."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModernBertConfig:
        """From a transformers config.json, 4.x (global_rope_theta, local_rope_theta,
        global_attn_every_n_layers) or 5.x (rope_parameters, layer_types), ignoring keys we do not
        use (architectures, id2label, dtype, ...). transformers' ModernBERT is bidirectional
        whatever its config says (is_decoder is read by neither version; the causal one is
        another model_type, "modernbert-decoder"), so no key here changes the mask."""
        d = dict(d)
        rope = d.pop("rope_parameters", None)
        if isinstance(rope, dict):
            for kind, key in (("full_attention", "global_rope_theta"),
                              ("sliding_attention", "local_rope_theta")):
                params = rope.get(kind) or {}
                if params.get("rope_type", "default") != "default":
                    raise BertgpuError(f"config field rope_parameters.{kind}.rope_type: found "
                                       f"{params['rope_type']!r}, expected 'default' (scaled RoPE "
                                       "is not supported)")
                if params.get("rope_theta") is not None:
                    d[key] = params["rope_theta"]
        if d.get("rope_scaling"):
            raise BertgpuError(f"config field rope_scaling: found {d['rope_scaling']!r}, expected "
                               "none (scaled RoPE is not supported)")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        """Both spellings transformers reads: 4.x's thetas and layer period, and 5.x's
        rope_parameters and layer_types. They agree, so either version builds the same model:
        the period written is the one that derives layer_types (`attention_period`), except for
        layer types no period derives, which only 5.x reads right (`export_problem`)."""
        out = dataclasses.asdict(self)
        out["layer_types"] = self.resolved_layer_types()
        period = self.attention_period()
        if period is not None:
            out["global_attn_every_n_layers"] = period
        out["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": self.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": self.local_theta},
        }
        return out

    @property
    def local_theta(self) -> float:
        return self.global_rope_theta if self.local_rope_theta is None else self.local_rope_theta

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def resolved_layer_types(self) -> list[str]:
        if self.layer_types is not None:
            return list(self.layer_types)
        return _periodic(self.global_attn_every_n_layers, self.num_hidden_layers)

    def attention_period(self) -> int | None:
        """The global_attn_every_n_layers that derives `resolved_layer_types()` (what transformers
        4.x, and readers such as candle or MLX ports, build the layers from): the config's own
        when it does, else the spacing of the global layers; None when no period does."""
        types = self.resolved_layer_types()
        if types == _periodic(self.global_attn_every_n_layers, len(types)):
            return self.global_attn_every_n_layers
        n = _first_period(types)
        return n if types == _periodic(n, len(types)) else None

    def export_problem(self) -> str | None:
        """Why an export's config.json would build another model in transformers 4.x, which reads
        global_attn_every_n_layers and not layer_types: the first layer whose type breaks the
        period of the layers before it; None when a period derives every layer's type."""
        types = self.resolved_layer_types()
        if not types or self.attention_period() is not None:
            return None
        n = _first_period(types)
        expected = _periodic(n, len(types))
        i = next(i for i, (t, e) in enumerate(zip(types, expected, strict=True)) if t != e)
        period = ("every period" if i == 0 else
                  f"the period of layers 0-{i - 1} (global_attn_every_n_layers {n})")
        return (f"layer_types: layer {i} is {types[i]} but {period} makes it {expected[i]}; "
                "transformers 4.x reads only global_attn_every_n_layers and would build another "
                "model from an export's config.json (expected full_attention on layers 0, n, "
                "2n, ... and sliding_attention on the others)")

    def validate(self, prefix: str = "config field ") -> ModernBertConfig:
        """Raise BertgpuError naming the field (after `prefix`) if the
        combination cannot be built."""
        if self.architecture != "modernbert":
            raise BertgpuError(f"{prefix}architecture: found {self.architecture!r}, "
                               "expected 'modernbert'")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings", "global_attn_every_n_layers",
                     "local_attention"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BertgpuError(f"{prefix}{name}: found {value!r}, expected a positive integer")
        if self.hidden_size % self.num_attention_heads or self.head_dim % 2:
            raise BertgpuError(
                f"{prefix}hidden_size: {self.hidden_size} / num_attention_heads "
                f"{self.num_attention_heads} must be an even integer (RoPE rotates pairs of "
                "head features)")
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in ACTIVATIONS:
                raise BertgpuError(f"{prefix}{name}: found {getattr(self, name)!r}, "
                                   f"expected one of {', '.join(ACTIVATIONS)}")
        if self.classifier_pooling not in POOLINGS:
            raise BertgpuError(f"{prefix}classifier_pooling: found {self.classifier_pooling!r}, "
                               f"expected one of {', '.join(POOLINGS)}")
        for name in ("attention_dropout", "embedding_dropout", "mlp_dropout", "classifier_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise BertgpuError(f"{prefix}{name}: found {getattr(self, name)!r}, expected a "
                                   "number in [0, 1)")
        for name in ("global_rope_theta", "local_theta", "norm_eps", "initializer_range"):
            if not getattr(self, name) > 0:
                raise BertgpuError(f"{prefix}{name}: found {getattr(self, name)!r}, expected a "
                                   "positive number")
        types = self.resolved_layer_types()
        if len(types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in types):
            raise BertgpuError(f"{prefix}layer_types: found {types!r}, expected "
                               f"{self.num_hidden_layers} entries, each one of "
                               f"{', '.join(LAYER_TYPES)}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            raise BertgpuError(f"{prefix}pad_token_id: found {self.pad_token_id!r}, expected an id "
                               f"below vocab_size ({self.vocab_size})")
        return self


def _periodic(n: int, num_layers: int) -> list[str]:
    """transformers 4.x's layers: global (full_attention) when i % n == 0."""
    return ["sliding_attention" if i % n else "full_attention" for i in range(num_layers)]


def _first_period(types: list[str]) -> int:
    """The period the first layers show: the index of the first global layer after layer 0 (the
    number of layers when there is none, so that layer 0 is the only global one)."""
    return next((i for i in range(1, len(types)) if types[i] == "full_attention"),
                max(len(types), 1))


__all__ = ["ModernBertConfig", "ACTIVATIONS", "LAYER_TYPES", "POOLINGS"]
