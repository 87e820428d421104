"""BERT (Devlin et al. 2018) with Hugging Face's names and math: `config.py` (BertConfig),
`model.py` (the encoder and its heads), `cost.py` (FLOPs per token and memory per step).

`SPEC` is what the rest of bertgpu knows of the architecture (models/spec.py).
"""

from bertgpu.models.bert import cost
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.spec import Architecture


def _fix_legacy_keys(sd: dict, base: bool) -> dict:
    # Old files store the MLM bias only as cls.predictions.decoder.bias; it is the same tensor.
    if "cls.predictions.decoder.bias" in sd and "cls.predictions.bias" not in sd:
        sd["cls.predictions.bias"] = sd["cls.predictions.decoder.bias"]
    return sd


SPEC = Architecture(
    title="BERT",
    name="bert",
    config_class=BertConfig,
    model_module="bertgpu.models.bert.model",
    encoder_prefix="bert.",
    encoder_names=("embeddings.", "encoder.", "pooler."),
    layers_path="encoder.layer",
    flops_per_token=cost.flops_per_token_of,
    train_bytes=cost.estimate_train_bytes,
    has_nsp=True,
    has_pooler=True,
    equivalents={"hidden_activation": ("hidden_act",), "norm_eps": ("layer_norm_eps",),
                 "embedding_dropout": ("hidden_dropout_prob",),
                 "mlp_dropout": ("hidden_dropout_prob",),
                 "attention_dropout": ("attention_probs_dropout_prob",)},
    position_tables=("embeddings.position_embeddings.weight",),
    continuation_fields=("max_position_embeddings", "hidden_dropout_prob",
                         "attention_probs_dropout_prob"),
    fix_legacy_keys=_fix_legacy_keys,
    fused_linears={"attention.self.qkv": ("attention.self.query", "attention.self.key",
                                          "attention.self.value")},
    vocab_tables=("embeddings.word_embeddings.weight", "cls.predictions.bias",
                  "cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
)
