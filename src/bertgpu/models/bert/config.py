"""BERT's hyper-parameters: Hugging Face's `BertConfig` field names, defaults (BERT-base) and
checks. No torch here, so a training config can be checked before anything is built.

    config = BertConfig.from_dict(json.load(open("config.json")))   # unknown keys are ignored
    config.validate()                                               # BertgpuError naming the field
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from bertgpu.errors import BertgpuError

# hidden_act values we implement (bert.activation); the HF names map to the same functions.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

# transformers' BertConfig switches (4.x and 5.x) that make other math of the same weights: a
# causal mask (BertLMHeadModel, BertGeneration-style decoders; transformers keeps it causal even
# in BertForMaskedLM / ForSequenceClassification), or cross-attention layers over an encoder's
# output. bertgpu's BERT is the bidirectional encoder alone: reading past them would give other
# logits than transformers' without a word. transformers writes both, false, into every BertConfig.
DECODER_SWITCHES = {"is_decoder": "a causal decoder",
                    "add_cross_attention": "a decoder with cross-attention to an encoder"}


@dataclass
class BertConfig:
    """BERT hyper-parameters with Hugging Face's field names and defaults (BERT-base)."""

    architecture: str = "bert"
    """The architecture these fields describe (config.json's model_type)."""
    vocab_size: int = 30522
    """Number of token ids; the word embedding and the MLM decoder have this many rows."""
    hidden_size: int = 768
    """Width H of every token representation."""
    num_hidden_layers: int = 12
    """Number of encoder layers."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward block inside each layer (4 H in BERT)."""
    hidden_act: str = "gelu"
    """Activation of the feed-forward block and the MLM transform: gelu (erf), gelu_new or
    gelu_pytorch_tanh (tanh approximation), relu."""
    hidden_dropout_prob: float = 0.1
    """Dropout after embeddings, attention output and feed-forward output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities (training only)."""
    max_position_embeddings: int = 512
    """Longest sequence the learned position table covers."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids; 2 for sentence A / B."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of Linear and Embedding weights."""
    layer_norm_eps: float = 1e-12
    """Epsilon of every LayerNorm."""
    pad_token_id: int | None = 0
    """Id of [PAD]; its word embedding row is initialised to zero and gets no gradient (None, as
    some published config.json files say: no such row)."""
    classifier_dropout: float | None = None
    """Dropout before the sequence-classification layer; None means hidden_dropout_prob."""
    position_embedding_type: str = "absolute"
    """Only "absolute" (learned positions) is supported; kept so HF configs round-trip."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        """Build from a dict such as HF's config.json, ignoring keys we do not use
        (architectures, model_type, torch_dtype, id2label, ...); BertgpuError for a decoder's
        (`DECODER_SWITCHES` true), whose logits ours would not reproduce. Callers that read a
        file put its path before the message."""
        for key, what in DECODER_SWITCHES.items():
            if d.get(key) not in (None, False):
                raise BertgpuError(f"{key} {json.dumps(d[key])} ({what}); bertgpu loads "
                                   f"bidirectional encoders only (expected {key} false; set it "
                                   "false to use these weights as one anyway)")
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def export_problem(self) -> str | None:
        """Why an export's config.json would build another model in some transformers version
        (ModernBertConfig has such a case); None: every BertConfig exports as it is."""
        return None

    def validate(self, prefix: str = "config field ") -> BertConfig:
        """Raise BertgpuError naming the field (after `prefix`) if the
        combination cannot be built."""

        def check(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise BertgpuError(f"{prefix}{name} = {getattr(self, name)!r}: expected {expected}")

        check(self.architecture == "bert", "architecture", "'bert'")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            check(isinstance(value, int) and not isinstance(value, bool) and value > 0, name,
                  "a positive integer")
        check(self.hidden_size % self.num_attention_heads == 0, "hidden_size",
              f"a multiple of num_attention_heads ({self.num_attention_heads})")
        check(self.hidden_act in ACTIVATIONS, "hidden_act", f"one of {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            check(0.0 <= getattr(self, name) < 1.0, name, "a number in [0, 1)")
        check(self.classifier_dropout is None or 0.0 <= self.classifier_dropout < 1.0,
              "classifier_dropout", "a number in [0, 1) or none")
        check(self.initializer_range > 0, "initializer_range", "a positive number")
        check(self.layer_norm_eps > 0, "layer_norm_eps", "a positive number")
        check(self.pad_token_id is None or 0 <= self.pad_token_id < self.vocab_size,
              "pad_token_id", "an id below vocab_size, or none")
        check(self.position_embedding_type == "absolute", "position_embedding_type",
              "'absolute' (relative position embeddings are not supported)")
        return self


__all__ = ["ACTIVATIONS", "DECODER_SWITCHES", "BertConfig"]
