"""ModernBERT (Warner et al. 2024) with transformers' names: `config.py` (ModernBertConfig, both
transformers versions' config.json), `model.py` (pre-norm encoder, GeGLU, local/global attention
and its heads), `rope.py` (rotary positions, the sliding window), `cost.py` (FLOPs per token and
memory per step).

`SPEC` is what the rest of bertgpu knows of the architecture (models/spec.py).
"""

from bertgpu.models.modernbert import cost
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.spec import Architecture


def _fix_legacy_keys(sd: dict, base: bool) -> dict:
    # A ModernBERT file may keep the tied decoder weight instead of the token embedding.
    if "decoder.weight" in sd and "model.embeddings.tok_embeddings.weight" not in sd and not base:
        sd["model.embeddings.tok_embeddings.weight"] = sd["decoder.weight"]
    return sd


SPEC = Architecture(
    title="ModernBERT",
    name="modernbert",
    config_class=ModernBertConfig,
    model_module="bertgpu.models.modernbert.model",
    encoder_prefix="model.",
    encoder_names=("embeddings.", "layers.", "final_norm."),
    layers_path="layers",
    flops_per_token=cost.flops_per_token_of,
    train_bytes=cost.estimate_train_bytes,
    has_nsp=False,
    # transformers' ModernBERT default [PAD] is its own vocabulary's 50283; a bertgpu tokenizer's is
    # 0.
    pretraining_defaults={"pad_token_id": 0},
    equivalents={"hidden_act": ("hidden_activation",), "layer_norm_eps": ("norm_eps",),
                 "hidden_dropout_prob": ("mlp_dropout", "embedding_dropout"),
                 "attention_probs_dropout_prob": ("attention_dropout",)},
    # The context extension of ModernBERT (1024 -> 8192 tokens) raises the global RoPE theta.
    continuation_fields=("max_position_embeddings", "global_rope_theta", "local_rope_theta",
                         "embedding_dropout", "attention_dropout", "mlp_dropout"),
    fix_legacy_keys=_fix_legacy_keys,
    # Wqkv is one Linear in transformers too: only the vocabulary is laid out differently.
    vocab_tables=("embeddings.tok_embeddings.weight", "decoder.weight", "decoder.bias"),
)
