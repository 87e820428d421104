"""ModernBERT (Warner et al. 2024, arXiv:2412.13663), named and computed like Hugging Face's
`modeling_modernbert.py`, with our BERT classes' output contract.

What differs from BERT: no position or token-type tables (token embeddings + LayerNorm only),
rotary position embeddings with one theta for global and another for local layers, pre-norm
blocks with bias-free LayerNorms and Linears, a fused Wqkv projection, a GeGLU feed-forward
(`Wi` -> input, gate; `act(input) * gate` -> `Wo`), sliding-window attention (`local_attention`
tokens wide) on all but every `global_attn_every_n_layers`-th layer (layer 0 is global), a final
norm, and an MLM head (dense -> activation -> norm) with a decoder tied to the token embeddings.

Parameter names are transformers': `model.layers.N.attn.Wqkv.weight`, `model.layers.N.mlp.Wi.weight`,
`head.dense.weight`, `decoder.bias`, ... so `hf_io.py` reads and writes ModernBERT folders as they
are. As in `bert.py`, the MLM head runs only at labelled positions when labels are given, and the
outputs carry summed losses and counts for the engine (`mlm_loss_sum`, `mlm_count`, `loss_sum`...).
ModernBERT has no NSP head and no segment embeddings: `token_type_ids` is accepted (the batches of
either architecture have it) and ignored, as by transformers' ModernBERT tokenizer, which emits none.

Shapes in comments: B batch, T sequence length, H hidden size, N heads, D head size, I
intermediate size, V vocabulary, M masked tokens.

    model = ModernBertForMaskedLM(ModernBertConfig(vocab_size=8192, hidden_size=256, ...))
    out = model(input_ids, attention_mask, labels=labels)    # out.loss == transformers' loss
    out.loss.backward()
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertgpu.models import IGNORE_INDEX
from bertgpu.models.bert import ModelOutput
from bertgpu.models.modernbert_config import ACTIVATIONS, LAYER_TYPES, POOLINGS, ModernBertConfig
from bertgpu.models.rope import apply_rope, cos_sin, sliding_window_mask


def activation(name: str):
    """transformers' ACT2FN for the names we accept (validated by ModernBertConfig)."""
    if name == "gelu":
        return F.gelu  # exact erf form
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu if name == "relu" else F.silu


# ---------------------------------------------------------------------------------------------
# Attention masks and the attention kernel


def attention_masks(attention_mask: torch.Tensor | None, seq_len: int, local_attention: int,
                    device: torch.device) -> dict[str, torch.Tensor | None]:
    """SDPA masks (True = may attend) per layer type, built once per forward from the (B, T)
    padding mask (1 = token, 0 = padding, None = nothing padded):

    full_attention     (B, 1, 1, T) the keys that are tokens; None without padding
    sliding_attention  (B or 1, 1, T, T) the window |i - j| <= local_attention // 2, and tokens;
                       None when the window covers the whole sequence and nothing is padded

    Real tokens never see padding, so their outputs are exactly transformers'. No row is empty
    (an empty row is NaN in some SDPA kernels, and a NaN value poisons its masked key's column
    too): a row of padding only attends to all of it, as bert.py, and a padding query with no
    token within its window attends to itself. Only such queries' (meaningless) outputs differ
    from transformers', whose eager and SDPA paths disagree there as well. No host sync:
    nothing here reads tensor values on the host.
    """
    keys = None
    if attention_mask is not None:
        keys = attention_mask.bool()
        keys = keys | ~keys.any(dim=-1, keepdim=True)  # (B, T)
    masks: dict[str, torch.Tensor | None] = {"full_attention": None if keys is None else keys[:, None, None, :]}
    if seq_len <= local_attention // 2 + 1:  # every pair is within the window
        masks["sliding_attention"] = masks["full_attention"]
        return masks
    local = sliding_window_mask(seq_len, local_attention, device)[None, None]  # (1, 1, T, T)
    if keys is not None:
        local = local & keys[:, None, None, :]  # (B, 1, T, T)
        empty = ~local.any(dim=-1, keepdim=True)  # (B, 1, T, 1) padding far from any token
        local = local | (empty & torch.eye(seq_len, dtype=torch.bool, device=device))
    masks["sliding_attention"] = local
    return masks


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
         dropout_p: float) -> torch.Tensor:
    """q, k, v (B, T, N, D) -> (B, T, N D): softmax(q k^T / sqrt(D)) v over the allowed keys."""
    B, T = q.shape[:2]
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask, dropout_p=dropout_p)  # (B, N, T, D)
    return y.transpose(1, 2).reshape(B, T, -1)


# ---------------------------------------------------------------------------------------------
# The encoder


def _layer_norm(config: ModernBertConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.norm = _layer_norm(config)
        self.drop = nn.Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))  # (B, T, H)


class ModernBertMLP(nn.Module):
    """GeGLU (Shazeer 2020): Wo(drop(act(input) * gate)) with [input, gate] = Wi(x)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_activation)
        self.drop = nn.Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp, gate = self.Wi(x).chunk(2, dim=-1)  # (..., I) each
        return self.Wo(self.drop(self.act(inp) * gate))


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        # transformers applies the attention dropout a second time on the output projection
        self.out_drop = nn.Dropout(config.attention_dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        q, k, v = self.Wqkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)  # (B, T, N, D) each
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = sdpa(q, k, v, mask, self.dropout_p if self.training else 0.0)  # (B, T, H)
        return self.out_drop(self.Wo(y))


class ModernBertEncoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)). Layer 0 has no attention norm
    (the embeddings were just normalised), as in transformers."""

    def __init__(self, config: ModernBertConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.Identity() if layer_idx == 0 else _layer_norm(config)
        self.attn = ModernBertAttention(config)
        self.mlp_norm = _layer_norm(config)
        self.mlp = ModernBertMLP(config)
        self.attention_type = config.resolved_layer_types()[layer_idx]

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, mask)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertPreTrainedModel(nn.Module):
    """transformers' initialisation (truncated normals; outputs of residual branches scaled by
    1 / sqrt(2 L)) and the per-instance switches every model below shares."""

    config: ModernBertConfig

    def _init_weights(self, module: nn.Module) -> None:
        c = self.config
        stds = {"in": c.initializer_range, "out": c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers),
                "final_out": c.hidden_size ** -0.5}

        def init(linear: nn.Module, std: float) -> None:
            cut = c.initializer_cutoff_factor * std
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=std, a=-cut, b=cut)
            if getattr(linear, "bias", None) is not None:
                nn.init.zeros_(linear.bias)

        if isinstance(module, ModernBertEmbeddings):
            init(module.tok_embeddings, stds["in"])
        elif isinstance(module, ModernBertMLP):
            init(module.Wi, stds["in"])
            init(module.Wo, stds["out"])
        elif isinstance(module, ModernBertAttention):
            init(module.Wqkv, stds["in"])
            init(module.Wo, stds["out"])
        elif isinstance(module, ModernBertPredictionHead):
            init(module.dense, stds["out"])
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ModernBertForMaskedLM) and module.decoder.bias is not None:
            nn.init.zeros_(module.decoder.bias)  # its weight is the token embedding, set above
        elif isinstance(module, (ModernBertForSequenceClassification, ModernBertForQuestionAnswering,
                                 ModernBertForTokenClassification)):
            init(module.classifier, stds["final_out"])

    def post_init(self) -> None:
        self.tie_weights()
        self.apply(self._init_weights)

    def tie_weights(self) -> None:
        """Share tied parameters again (after loading a state dict or moving to meta)."""

    def gradient_checkpointing_enable(self, enabled: bool = True) -> None:
        for m in self.modules():
            if isinstance(m, ModernBertModel):
                m.gradient_checkpointing = enabled


class ModernBertModel(ModernBertPreTrainedModel):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config.validate()
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = _layer_norm(config)
        # Recompute each layer in backward instead of storing its activations (see bert.py).
        self.gradient_checkpointing = False
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> ModelOutput:
        """(B, T) ids -> last_hidden_state (B, T, H). `token_type_ids` is ignored (see above)."""
        c = self.config
        T = input_ids.size(1)
        x = self.embeddings(input_ids)  # (B, T, H)
        positions = torch.arange(T, device=input_ids.device)[None]  # (1, T): the column, as transformers
        ropes = {"full_attention": cos_sin(positions, c.head_dim, c.global_rope_theta),
                 "sliding_attention": cos_sin(positions, c.head_dim, c.local_theta)}  # (1, T, 1, D) each
        masks = attention_masks(attention_mask, T, c.local_attention, input_ids.device)
        for layer in self.layers:
            args = (x, ropes[layer.attention_type], masks[layer.attention_type])
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, *args, use_reentrant=False)
            else:
                x = layer(*args)
        return ModelOutput(last_hidden_state=self.final_norm(x))


# ---------------------------------------------------------------------------------------------
# Heads


class ModernBertPredictionHead(nn.Module):
    """dense -> activation -> norm; the MLM head and, under the same name, the first part of the
    classification heads (so fine-tuning starts from the pretrained MLM head, as transformers)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.classifier_bias)
        self.act = activation(config.classifier_activation)
        self.norm = _layer_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class ModernBertForMaskedLM(ModernBertPreTrainedModel):
    """MLM pretraining. With labels the head runs at labelled positions only and the output has
    `mlm_loss_sum`, `mlm_count`, `mlm_correct` for the engine; without, full (B, T, V) logits."""

    with_nsp = False  # the training loop asks every pretraining model; ModernBERT has no NSP

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config.validate()
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.post_init()

    def tie_weights(self) -> None:
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        x = self.model(input_ids, attention_mask).last_hidden_state  # (B, T, H)
        out = ModelOutput()
        if labels is None:
            out.prediction_logits = self.decoder(self.head(x))  # (B, T, V)
            return out
        # Sparse head, as bert.py: same logits and gradients as the dense one at the labelled rows.
        labels = labels.reshape(-1)  # (B T,)
        keep = (labels != IGNORE_INDEX).nonzero().squeeze(1)  # (M,)
        targets = labels.index_select(0, keep)
        logits = self.decoder(self.head(x.reshape(-1, x.size(-1)).index_select(0, keep)))  # (M, V)
        out.prediction_logits = logits
        out.mlm_loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")  # fp32 log-sum-exp
        out.mlm_count = torch.tensor(keep.numel(), device=x.device)
        out.mlm_correct = (logits.argmax(-1) == targets).sum()
        out.loss = out.mlm_loss_sum / out.mlm_count.clamp(min=1)
        return out


class _WithClassifier(ModernBertPreTrainedModel):
    """model -> head -> drop -> classifier(out_features), the layout of the three task models."""

    def __init__(self, config: ModernBertConfig, out_features: int):
        super().__init__()
        self.config = config.validate()
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, out_features)

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(x)))


class ModernBertForSequenceClassification(_WithClassifier):
    """Pooled (first token, or mean over real tokens) -> head -> classifier; num_labels == 1 is
    regression (MSE). Loss outputs as BertForSequenceClassification: loss, loss_sum, count."""

    def __init__(self, config: ModernBertConfig, num_labels: int = 2, id2label: dict[int, str] | None = None):
        super().__init__(config, num_labels)
        self.num_labels = num_labels
        self.id2label = dict(id2label) if id2label else {i: f"LABEL_{i}" for i in range(num_labels)}
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        x = self.model(input_ids, attention_mask).last_hidden_state  # (B, T, H)
        if self.config.classifier_pooling == "cls":
            pooled = x[:, 0]
        elif attention_mask is None:
            pooled = x.mean(dim=1)
        else:
            m = attention_mask.to(x.dtype).unsqueeze(-1)  # (B, T, 1)
            pooled = (x * m).sum(dim=1) / m.sum(dim=1)  # (B, H)
        logits = self._classify(pooled)  # (B, num_labels)
        out = ModelOutput(logits=logits)
        if labels is not None:
            if self.num_labels == 1:
                out.loss_sum = F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1), reduction="sum")
            else:
                out.loss_sum = F.cross_entropy(logits.float(), labels.reshape(-1), reduction="sum")
            out.count = torch.tensor(labels.numel(), device=logits.device)
            out.loss = out.loss_sum / labels.numel()
        return out


class ModernBertForQuestionAnswering(_WithClassifier):
    """A start and an end logit per token; loss outputs as BertForQuestionAnswering."""

    def __init__(self, config: ModernBertConfig):
        super().__init__(config, 2)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> ModelOutput:
        x = self.model(input_ids, attention_mask).last_hidden_state
        start_logits, end_logits = self._classify(x).float().unbind(-1)  # (B, T) each
        out = ModelOutput(start_logits=start_logits, end_logits=end_logits)
        if start_positions is not None and end_positions is not None:
            # transformers: positions outside the window are clamped to T and ignored
            T = start_logits.size(1)
            s = start_positions.reshape(-1).clamp(0, T)
            e = end_positions.reshape(-1).clamp(0, T)
            s_sum = F.cross_entropy(start_logits, s, ignore_index=T, reduction="sum")
            e_sum = F.cross_entropy(end_logits, e, ignore_index=T, reduction="sum")
            n_s, n_e = (s != T).sum(), (e != T).sum()
            out.loss = (s_sum / n_s + e_sum / n_e) / 2
            out.loss_sum = (s_sum + e_sum) / 2  # / count == loss when start and end are ignored together
            out.count = n_s
        return out


class ModernBertForTokenClassification(_WithClassifier):
    """A label per token (NER); positions labelled IGNORE_INDEX (padding, sub-words) carry no loss.
    loss_sum / count is transformers' mean over the labelled tokens."""

    def __init__(self, config: ModernBertConfig, num_labels: int = 2, id2label: dict[int, str] | None = None):
        super().__init__(config, num_labels)
        self.num_labels = num_labels
        self.id2label = dict(id2label) if id2label else {i: f"LABEL_{i}" for i in range(num_labels)}
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ModelOutput:
        x = self.model(input_ids, attention_mask).last_hidden_state
        logits = self._classify(x)  # (B, T, num_labels)
        out = ModelOutput(logits=logits)
        if labels is not None:
            flat = labels.reshape(-1)
            out.loss_sum = F.cross_entropy(logits.float().reshape(-1, self.num_labels), flat,
                                           ignore_index=IGNORE_INDEX, reduction="sum")
            out.count = (flat != IGNORE_INDEX).sum()
            out.loss = out.loss_sum / out.count.clamp(min=1)
        return out


__all__ = [
    "ModernBertConfig", "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
    "ModernBertForQuestionAnswering", "ModernBertForTokenClassification", "attention_masks", "ACTIVATIONS",
    "LAYER_TYPES", "POOLINGS",
]
