"""ModernBERT (Warner et al. 2024, arXiv:2412.13663), named and computed like Hugging Face's
`modeling_modernbert.py`, with our BERT classes' output contract.

What differs from BERT: no position or token-type tables (token embeddings + LayerNorm only),
rotary position embeddings with one theta for global and another for local layers, pre-norm
blocks with bias-free LayerNorms and Linears, a fused Wqkv projection, a GeGLU feed-forward
(`Wi` -> input, gate; `act(input) * gate` -> `Wo`), sliding-window attention (`local_attention`
tokens wide) on all but every `global_attn_every_n_layers`-th layer (layer 0 is global), a final
norm, and an MLM head (dense -> activation -> norm) with a decoder tied to the token embeddings.

Parameter names are transformers': `model.layers.N.attn.Wqkv.weight`,
`model.layers.N.mlp.Wi.weight`, `head.dense.weight`, `decoder.bias`, ... (its query, key and value
are one Linear already). Only the vocabulary tables differ inside the model: they have
`padded_vocab_size(V)` rows (shared.VocabEmbedding, shared.VocabDecoder: logits cut back to V),
which `layout.py` cuts off on export and adds when reading a ModernBERT folder.
The rest is shared with bert.py: the MLM head runs only at labelled positions, outputs carry
summed losses and counts for the engine (`mlm_loss_sum`, `mlm_count`, `loss_sum`, ...), a
`BatchMeta` from the loader keeps the forward free of host syncs,
and `ModelOptions` (unpadding and its attention kernel, gradient checkpointing) belong to the
instance (layers.py, attention.py). ModernBERT has no NSP head and no segment embeddings:
`token_type_ids` is accepted (the batches of either architecture have it) and ignored, as by
transformers' ModernBERT tokenizer, which emits none.

Shapes in comments: B batch, T sequence length, H hidden size, N heads, D head size, I
intermediate size, V vocabulary, M masked tokens, N_tok kept (real) tokens.

    model = ModernBertForMaskedLM(ModernBertConfig(vocab_size=8192, hidden_size=256, ...))
    out = model(input_ids, attention_mask, labels=labels)    # out.loss == transformers' loss
    out.loss.backward()
    model.configure(unpad=True)   # then padded batches run on their real tokens only (same loss)
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertgpu.batch import BatchMeta
from bertgpu.errors import BertgpuError
from bertgpu.models.attention import (
    Layout,
    Segments,
    Unpadded,
    attention,
    choose_backend,
    flash_expected,
    labelled_rows,
    pad_rows,
    padded_layout,
    resolve_meta,
    sdpa_mask,
    unpadded_padded_attention,
    varlen_attention,
)
from bertgpu.models.dropout import Dropout
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.rope import apply_rope, cos_sin, sliding_window_mask
from bertgpu.models.shared import (
    Configurable,
    LayerNorm,
    ModelOptions,
    ModelOutput,
    VocabDecoder,
    VocabEmbedding,
    labelled_output,
    masked_lm_terms,
    sequence_loss_terms,
    span_loss_terms,
    token_loss_terms,
)


def activation(name: str):
    """transformers' ACT2FN for the names we accept (validated by ModernBertConfig)."""
    if name == "gelu":
        return F.gelu  # exact erf form
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return F.relu if name == "relu" else F.silu


# ---------------------------------------------------------------------------------------------
# Attention: the sliding window on top of attention.py's kernels


def attention_masks(attention_mask: torch.Tensor | None, seq_len: int, local_attention: int,
                    device: torch.device) -> dict[str, torch.Tensor | None]:
    """SDPA masks (True = may attend) per layer type, built once per forward from the (B, T)
    padding mask (1 = token, 0 = padding, None = nothing padded):

    full_attention     (B, 1, 1, T) the keys that are tokens (attention.sdpa_mask); None without
                       padding
    sliding_attention  (B or 1, 1, T, T) the window |i - j| <= local_attention // 2, and tokens;
                       None when the window covers the whole sequence and nothing is padded

    Real tokens never see padding, so their outputs are exactly transformers'. No row is empty
    (an empty row is NaN in some SDPA kernels, and a NaN value poisons its masked key's column
    too): a row of padding only attends to all of it, as bert.py, and a padding query with no
    token within its window attends to itself. Only such queries' (meaningless) outputs differ
    from transformers', whose eager and SDPA paths disagree there as well. No host sync.
    """
    full = None if attention_mask is None else sdpa_mask(attention_mask)  # (B, 1, 1, T)
    # every pair within the window: the window's mask is the full one. Not under compile, where
    # branching on T made a graph of its own for widths on either side (`impl.bucket_window`).
    if not torch.compiler.is_compiling() and seq_len <= local_attention // 2 + 1:
        return {"full_attention": full, "sliding_attention": full}
    local = sliding_window_mask(seq_len, local_attention, device)[None, None]  # (1, 1, T, T)
    if full is not None:
        local = local & full  # (B, 1, T, T)
        empty = ~local.any(dim=-1, keepdim=True)  # (B, 1, T, 1) padding far from any token
        local = local | (empty & torch.eye(seq_len, dtype=torch.bool, device=device))
    return {"full_attention": full, "sliding_attention": local}


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: Layout,
                       window: int | None, dropout_p: float) -> torch.Tensor:
    """attention.attention with a sliding window of `window` tokens on each side (None: global).

    The flash paths (`Segments` of padded rows, the "varlen" kernel of unpadded ones) take the
    window as window_size=(window, window) and never build a (T, T) mask; padded SDPA rows and the
    padded fallback of unpadded ones carry the window in their mask (see `attention_masks`);
    nested tensors take no mask, so where `choose_backend` picks them a local layer runs the
    padded kernel."""
    if window is None or isinstance(layout, Segments):
        return attention(q, k, v, layout, dropout_p, window)
    if not isinstance(layout, Unpadded):
        return attention(q, k, v, layout, dropout_p)  # the window is in the mask
    if choose_backend(layout.backend, q, dropout_p, layout.packed_ok) == "varlen":
        return varlen_attention(q, k, v, layout, dropout_p, window)
    return unpadded_padded_attention(q, k, v, layout, dropout_p)


# ---------------------------------------------------------------------------------------------
# The encoder


def _layer_norm(config: ModernBertConfig) -> LayerNorm:
    return LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)


class ModernBertEmbeddings(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.tok_embeddings = VocabEmbedding(config.vocab_size, config.hidden_size,
                                             padding_idx=config.pad_token_id)  # (V_pad, H)
        self.norm = _layer_norm(config)
        self.drop = Dropout(config.embedding_dropout)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.tok_embeddings(input_ids)))  # (B, T, H) or (N_tok, H)


class ModernBertMLP(nn.Module):
    """GeGLU (Shazeer 2020): Wo(drop(act(input) * gate)) with [input, gate] = Wi(x)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.Wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.act = activation(config.hidden_activation)
        self.drop = Dropout(config.mlp_dropout)
        self.Wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp, gate = self.Wi(x).chunk(2, dim=-1)  # (..., I) each
        return self.Wo(self.drop(self.act(inp) * gate))


class ModernBertAttention(nn.Module):
    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * config.hidden_size,
                              bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_dropout
        # transformers applies the attention dropout a second time on the output projection
        self.out_drop = Dropout(config.attention_dropout)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], layout: Layout,
                window: int | None) -> torch.Tensor:
        # (..., H) -> q, k, v (..., N, D) each: (B, T, N, D), or (N_tok, N, D) unpadded
        q, k, v = self.Wqkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = windowed_attention(q, k, v, layout, window, self.dropout_p if self.training else 0.0)
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

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], layout: Layout,
                window: int | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, layout, window)
        return x + self.mlp(self.mlp_norm(x))


class ModernBertPreTrainedModel(Configurable):
    """transformers' initialisation (truncated normals; outputs of residual branches scaled by
    1 / sqrt(2 L)) and the per-instance options every model below shares."""

    config: ModernBertConfig

    def _init_weights(self, module: nn.Module) -> None:
        c = self.config
        stds = {"in": c.initializer_range,
                "out": c.initializer_range / math.sqrt(2.0 * c.num_hidden_layers),
                "final_out": c.hidden_size ** -0.5}

        def init(linear: nn.Module, std: float) -> None:
            cut = c.initializer_cutoff_factor * std
            # a padded vocabulary draws for its token rows only: the unpadded model's values
            weight = linear.tokens if isinstance(linear, VocabEmbedding) else linear.weight
            nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-cut, b=cut)
            if getattr(linear, "bias", None) is not None:
                nn.init.zeros_(linear.bias)

        if isinstance(module, ModernBertEmbeddings):
            init(module.tok_embeddings, stds["in"])  # its token rows; the padding stays zero
        elif isinstance(module, (ModernBertMLP, ModernBertAttention)):
            init(module.Wi if isinstance(module, ModernBertMLP) else module.Wqkv, stds["in"])
            init(module.Wo, stds["out"])
        elif isinstance(module, ModernBertPredictionHead):
            init(module.dense, stds["out"])
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, ModernBertForMaskedLM) and module.decoder.bias is not None:
            nn.init.zeros_(module.decoder.bias)  # its weight is the token embedding, set above
        elif isinstance(module, _WithClassifier):
            init(module.classifier, stds["final_out"])

    def post_init(self, options: ModelOptions | None = None) -> None:
        self.tie_weights()
        self.apply(self._init_weights)
        self.options = ModelOptions()
        self.configure(options)

    def tie_weights(self) -> None:
        """Share tied parameters again (after loading a state dict or moving to meta)."""


class ModernBertModel(ModernBertPreTrainedModel):
    def __init__(self, config: ModernBertConfig, options: ModelOptions | None = None):
        super().__init__()
        self.config = config.validate()
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertEncoderLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.final_norm = _layer_norm(config)
        self.post_init(options)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               meta: BatchMeta | None = None,
               unpad: bool | None = None) -> tuple[torch.Tensor, Unpadded | None]:
        """Embeddings + layers + final norm: (B, T, H) and None, or, unpadded, (N_tok, H) and its
        Unpadded (only when asked, `unpad` default `self.options.unpad`, and something is
        padded)."""
        c = self.config
        T = input_ids.size(1)
        meta = resolve_meta(input_ids, attention_mask, meta)
        unpad = self.options.unpad if unpad is None else unpad
        backend = self.options.attention_backend
        un = None
        # positions (1, T): the column, as transformers
        positions = torch.arange(T, device=input_ids.device)[None]
        if unpad and attention_mask is not None and meta.index is not None:
            # also when nothing is padded: full and padded batches share one compiled graph
            un = Unpadded.from_meta(meta, attention_mask, backend)
            flash = (backend in ("auto", "varlen") and meta.packed_ok and flash_expected(
                input_ids.device, self.embeddings.tok_embeddings.weight.dtype, c.head_dim))
            layouts = self._unpadded_layouts(un, attention_mask, T, flash)
            # both (N_tok,)
            input_ids, positions = input_ids.reshape(-1).index_select(0, un.index), un.index % T
        else:
            layout = padded_layout(attention_mask, meta, backend, input_ids.device,
                                   self.embeddings.tok_embeddings.weight.dtype,
                                   tuple(input_ids.shape), c.head_dim)
            layouts = ({"full_attention": layout, "sliding_attention": layout}
                       if isinstance(layout, Segments) else
                       attention_masks(attention_mask if meta.padded else None, T,
                                       c.local_attention, input_ids.device))
        # (cos, sin) per layer type, (..., 1, D) each
        ropes = {"full_attention": cos_sin(positions, c.head_dim, c.global_rope_theta),
                 "sliding_attention": cos_sin(positions, c.head_dim, c.local_theta)}
        half = c.local_attention // 2
        covered = not torch.compiler.is_compiling() and T <= half + 1  # as attention_masks
        windows = {"full_attention": None, "sliding_attention": None if covered else half}
        x = self.embeddings(input_ids)  # (B, T, H) or (N_tok, H)
        for layer in self.layers:
            kind = layer.attention_type
            args = (x, ropes[kind], layouts[kind], windows[kind])
            if self.options.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, *args, use_reentrant=False)
            else:
                x = layer(*args)
        return self.final_norm(x), un

    def _unpadded_layouts(self, un: Unpadded, attention_mask: torch.Tensor, seq_len: int,
                          flash: bool) -> dict[str, Unpadded]:
        """The `Unpadded` of each layer type: where the flash kernel runs, one for both (the
        window is the kernel's argument); elsewhere each with its SDPA mask for the padded
        fallback (the sliding one with its (B, 1, T, T) window)."""
        if flash:
            return {"full_attention": un, "sliding_attention": un}
        masks = attention_masks(attention_mask, seq_len, self.config.local_attention,
                                attention_mask.device)
        return {kind: dataclasses.replace(un, mask=mask) for kind, mask in masks.items()}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, batch_meta: BatchMeta | None = None,
                unpad: bool | None = None) -> ModelOutput:
        """(B, T) ids -> last_hidden_state (B, T, H) (zeros at padding when unpadded)."""
        x, un = self.encode(input_ids, attention_mask, batch_meta, unpad)
        return ModelOutput(last_hidden_state=x if un is None else pad_rows(x, un))


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

    def __init__(self, config: ModernBertConfig, options: ModelOptions | None = None):
        super().__init__()
        self.config = config.validate()
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        # (H -> V_pad), logits cut to V; weight tied to the token embeddings
        self.decoder = VocabDecoder(config.hidden_size, config.vocab_size, bias=config.decoder_bias)
        self.post_init(options)

    def tie_weights(self) -> None:
        self.decoder.weight = self.model.embeddings.tok_embeddings.weight

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None, unpad: bool | None = None) -> ModelOutput:
        """BertForPreTraining's signature, so one training loop drives either architecture;
        `next_sentence_label` must be None (build_model and the config refuse NSP earlier)."""
        if next_sentence_label is not None:
            raise BertgpuError("ModernBERT has no next-sentence head: expected no "
                               "next_sentence_label (train.with_nsp false, data objective mlm)")
        meta = resolve_meta(input_ids, attention_mask, batch_meta, labels)
        # Full (B, T, V) logits need every position: unpadding only pays with labels.
        x, un = self.model.encode(input_ids, attention_mask, meta,
                                  unpad=False if labels is None else unpad)
        if labels is None:
            return ModelOutput(prediction_logits=self.decoder(self.head(x)))  # (B, T, V)
        # Sparse head: same logits and gradients as the dense one at the labelled rows.
        rows, targets = labelled_rows(x, labels, meta, un)
        out = ModelOutput(prediction_logits=self.decoder(self.head(rows)))  # (M, V)
        out.update(masked_lm_terms(out.prediction_logits, targets))
        out.loss = out.mlm_loss_sum / out.mlm_count.clamp(min=1)
        return out


class _WithClassifier(ModernBertPreTrainedModel):
    """model -> head -> drop -> classifier(out_features), the layout of the three task models."""

    def __init__(self, config: ModernBertConfig, num_labels: int = 2,
                 id2label: dict[int, str] | None = None, options: ModelOptions | None = None):
        super().__init__()
        out_features = num_labels  # the classifier's outputs: labels, or start and end for QA
        self.config = config.validate()
        self.model = ModernBertModel(config)
        self.head = ModernBertPredictionHead(config)
        self.drop = Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, out_features)
        self.num_labels = out_features
        self.id2label = (dict(id2label) if id2label
                         else {i: f"LABEL_{i}" for i in range(out_features)})
        self.post_init(options)

    def _classify(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.drop(self.head(x)))


class ModernBertForSequenceClassification(_WithClassifier):
    """Pooled (first token, or mean over real tokens) -> head -> classifier; num_labels == 1 is
    regression (MSE). Loss outputs as BertForSequenceClassification: loss, loss_sum, count."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None) -> ModelOutput:
        x, un = self.model.encode(input_ids, attention_mask, batch_meta)  # (B, T, H) or (N_tok, H)
        logits = self._classify(self._pool(x, un, attention_mask))  # (B, num_labels)
        return labelled_output(logits, labels,
                               lambda lg, y: sequence_loss_terms(lg, y, self.num_labels))

    def _pool(self, x: torch.Tensor, un: Unpadded | None,
              attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(B, H): column 0 (each sequence's first row when unpadded), or the mean over tokens."""
        if self.config.classifier_pooling == "cls":
            return x[:, 0] if un is None else x.index_select(0, un.first_rows())
        if attention_mask is None:
            return x.mean(dim=1)
        # In fp32, cast back: a bf16 count is off past 256 tokens (301 -> 302), and CUDA's
        # index_add rounds a bf16 sum at every row (a mean of 512 rows was 20% off).
        weights = attention_mask.float()  # (B, T): 1 = token
        if un is None:
            sums = (x.float() * weights.unsqueeze(-1)).sum(dim=1)
        else:  # rows -> their sequence (flat position // T), weighted (a kept column 0 may pad)
            w = weights.reshape(-1).index_select(0, un.index).unsqueeze(-1)  # (N_tok, 1)
            sums = x.new_zeros(un.batch, x.size(-1), dtype=torch.float32).index_add(
                0, un.index // un.seq_len, x.float() * w)
        return (sums / weights.sum(dim=1, keepdim=True)).to(x.dtype)


class ModernBertForQuestionAnswering(_WithClassifier):
    """A start and an end logit per token; loss outputs as BertForQuestionAnswering."""

    def __init__(self, config: ModernBertConfig, options: ModelOptions | None = None):
        super().__init__(config, 2, None, options)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None) -> ModelOutput:
        # Unpadded when the model unpads (BERT's QA head says why that is safe)
        x = self.model(input_ids, attention_mask, batch_meta=batch_meta).last_hidden_state
        start_logits, end_logits = self._classify(x).float().unbind(-1)  # (B, T) each
        out = ModelOutput(start_logits=start_logits, end_logits=end_logits)
        if start_positions is not None and end_positions is not None:
            out.update(span_loss_terms(start_logits, end_logits, start_positions, end_positions,
                                       attention_mask))
        return out


class ModernBertForTokenClassification(_WithClassifier):
    """A label per token (NER); positions labelled IGNORE_INDEX (padding, sub-words) carry no loss.
    loss_sum / count is transformers' mean over the labelled tokens."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None) -> ModelOutput:
        x = self.model(input_ids, attention_mask, batch_meta=batch_meta).last_hidden_state
        # logits (B, T, num_labels)
        return labelled_output(self._classify(x), labels, token_loss_terms)


# Head name -> class taking the config: what models/build.py builds (see models/spec.py).
# ModernBERT has no next-sentence head: "pretraining" is its masked LM.
HEADS = {"base": ModernBertModel, "pretraining": ModernBertForMaskedLM,
         "masked_lm": ModernBertForMaskedLM, "classification": ModernBertForSequenceClassification,
         "qa": ModernBertForQuestionAnswering,
         "token_classification": ModernBertForTokenClassification}

__all__ = [
    "HEADS", "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
    "ModernBertForQuestionAnswering", "ModernBertForTokenClassification", "attention_masks",
    "windowed_attention",
]
