"""BERT, named and computed exactly like Hugging Face's `modeling_bert.py`, and nothing else.

Parameter names are our compatibility contract: every file we read or write has the keys, shapes
and meaning of `transformers.BertForPreTraining`'s. Inside the model two tensors are laid out for
speed instead, and `layout.py` converts at the Hugging Face boundary (hf_io, export, `--init`):
query, key and value are one `attention.self.qkv` Linear (3H x H: one matmul, no concatenation
per forward), and the vocabulary tables have `padded_vocab_size(V)` rows (shared.VocabEmbedding,
shared.VocabDecoder; the logits are cut back to V). The math is the same (post-LayerNorm
encoder, erf GELU, learned absolute positions); the speed comes from things that do not change
it, each a per-instance `ModelOptions` (shared.py), a parameter layout or a property of the batch:

- attention through `F.scaled_dot_product_attention` (attention.py), with `attn_mask=None` when
  nothing is padded so the flash kernel is allowed;
- the MLM head evaluated only at the masked positions (~15% of tokens): the (H x V) decoder is the
  largest matmul of BERT-base's training step when it runs on every token;
- `BatchMeta` (attention.py), computed by the loader on the host: given it, forward and backward
  never wait on the host (no `.item()`, `nonzero()`, `bool(tensor)`) and compile to one graph;
- options: unpadding (the encoder runs on real tokens only), gradient checkpointing;
- on the CPU, dropout masks drawn more cheaply (dropout.py) and attention with dropout written
  out instead of SDPA's math fallback (attention.cpu_dropout_attention).

Shapes in comments: B batch, T sequence length, H hidden size, N heads, D head size (H / N),
V vocabulary, M masked tokens, N_tok kept (real) tokens.

    model = BertForPreTraining(BertConfig(num_hidden_layers=2, hidden_size=128, ...))
    out = model(input_ids, attention_mask, token_type_ids, labels=labels, next_sentence_label=nsp)
    out.loss.backward()        # == transformers' BertForPreTraining loss on the same batch
    model.configure(unpad=True)   # then padded batches run on their real tokens only (same loss)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertgpu.batch import IGNORE_INDEX, BatchMeta
from bertgpu.errors import BertgpuError
from bertgpu.models.attention import (
    Layout,
    Unpadded,
    attention,
    labelled_rows,
    pad_rows,
    padded_layout,
    resolve_meta,
)
from bertgpu.models.bert.config import ACTIVATIONS, BertConfig
from bertgpu.models.dropout import Dropout
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
    """The function behind a Hugging Face `hidden_act` name."""
    if name == "gelu":
        return F.gelu  # exact erf form, as HF's "gelu" and the original BERT
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")  # GPT-2's tanh approximation
    if name == "relu":
        return F.relu
    raise BertgpuError(f"config field hidden_act: found {name!r}, expected one of "
                       f"{', '.join(ACTIVATIONS)}")


# ---------------------------------------------------------------------------------------------
# The encoder


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = VocabEmbedding(config.vocab_size, config.hidden_size,
                                              padding_idx=config.pad_token_id)  # (V_pad, H)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)
        # Not persistent: HF (>= 4.31) leaves it out of state dicts too, so the keys match.
        self.register_buffer("position_ids",
                             torch.arange(config.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                unpadded: Unpadded | None = None) -> torch.Tensor:
        T = input_ids.size(1)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if unpadded is not None:
            # Only the kept tokens: (N_tok,) ids; a token's position is its column, as in HF
            idx = unpadded.index
            x = self.word_embeddings(input_ids.reshape(-1).index_select(0, idx))  # (N_tok, H)
            x = x + self.token_type_embeddings(token_type_ids.reshape(-1).index_select(0, idx))
            x = x + self.position_embeddings(idx % T)  # (N_tok,) column of each kept token
            return self.dropout(self.LayerNorm(x))
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(self.position_ids[:, :T])  # (1, T, H) broadcast over B
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        # HF's query, key and value stacked: weight (3H, H) = [W_q; W_k; W_v], bias (3H,), so the
        # projection is one matmul (layout.py splits it into HF's three on export).
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., H) -> q, k, v, each (..., N, D): views of one (..., 3H) matmul, no copies."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)
        return q, k, v

    def forward(self, x: torch.Tensor, attn: Layout) -> torch.Tensor:
        q, k, v = self._qkv(x)  # (B, T, N, D) each, or (N_tok, N, D) unpadded
        return attention(q, k, v, attn, self.dropout_p if self.training else 0.0)


class BertSelfOutput(nn.Module):
    """dense -> dropout -> + residual -> LayerNorm (post-norm, as the original BERT); the attention
    output (in_features = H) and, as BertOutput, the feed-forward output (in_features = 4H)."""

    def __init__(self, config: BertConfig, in_features: int | None = None):
        super().__init__()
        self.dense = nn.Linear(in_features or config.hidden_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, attn: Layout) -> torch.Tensor:
        return self.output(self.self(x, attn), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # (B, T, intermediate_size)


class BertOutput(BertSelfOutput):
    def __init__(self, config: BertConfig):
        super().__init__(config, in_features=config.intermediate_size)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, attn: Layout) -> torch.Tensor:
        # x (B, T, H) with attn the SDPA mask, or (N_tok, H) with attn an Unpadded
        a = self.attention(x, attn)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.options = ModelOptions()  # set by the model's `configure`

    @property
    def gradient_checkpointing(self) -> bool:
        return self.options.gradient_checkpointing

    def forward(self, x: torch.Tensor, attn: Layout) -> torch.Tensor:
        for layer in self.layer:
            if self.options.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, attn, use_reentrant=False)
            else:
                x = layer(x, attn)
        return x


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(x[:, 0]))  # (B, H) from the [CLS] token


class BertPreTrainedModel(Configurable):
    """Shared initialisation (HF's `_init_weights`), options and helpers of all models below."""

    config: BertConfig

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            # the decoder before tie_weights: its token rows only, as VocabEmbedding below
            rows = module.tokens if isinstance(module, VocabDecoder) else module.weight
            nn.init.normal_(rows, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            # a padded vocabulary draws for its token rows only: the unpadded model's values
            # (shared.VocabEmbedding)
            rows = module.tokens if isinstance(module, VocabEmbedding) else module.weight
            nn.init.normal_(rows, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    def post_init(self, options: ModelOptions | None = None) -> None:
        self.apply(self._init_weights)
        self.tie_weights()
        self.options = ModelOptions()
        self.configure(options)

    def tie_weights(self) -> None:
        """Share tied parameters again (after loading a state dict or moving to meta)."""


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True,
                 options: ModelOptions | None = None):
        super().__init__()
        self.config = config.validate()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.post_init(options)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None, batch_meta: BatchMeta | None = None,
               unpad: bool | None = None) -> tuple[torch.Tensor, Unpadded | None]:
        """Embeddings + encoder: (B, T, H) and None, or, unpadded, (N_tok, H) and its Unpadded.

        Unpadding happens only when asked (`unpad`, default `self.options.unpad`) and something
        is padded. `batch_meta` (see attention.py) must describe this batch; without it the
        metadata is computed here, which waits on the device (and, compiled, masks always)."""
        meta = resolve_meta(input_ids, attention_mask, batch_meta)
        unpad = self.options.unpad if unpad is None else unpad
        backend = self.options.attention_backend
        if unpad and attention_mask is not None and meta.index is not None:
            # also when nothing is padded: full and padded batches then share one compiled graph
            un = Unpadded.from_meta(meta, attention_mask, backend)
            x = self.embeddings(input_ids, token_type_ids, un)  # (N_tok, H)
            return self.encoder(x, un), un
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        layout = padded_layout(attention_mask, meta, backend, input_ids.device,
                               self.embeddings.word_embeddings.weight.dtype,
                               tuple(input_ids.shape),
                               self.config.hidden_size // self.config.num_attention_heads)
        return self.encoder(x, layout), None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, batch_meta: BatchMeta | None = None,
                unpad: bool | None = None) -> ModelOutput:
        x, un = self.encode(input_ids, attention_mask, token_type_ids, batch_meta, unpad)
        if un is not None:
            x = pad_rows(x, un)  # (B, T, H), zeros at padding (HF has finite garbage there)
        out = ModelOutput(last_hidden_state=x)
        if self.pooler is not None:
            out.pooler_output = self.pooler(x)  # (B, H)
        return out

    def pooled(self, x: torch.Tensor, un: Unpadded | None) -> torch.Tensor:
        """The pooler on the [CLS] rows of `encode`'s output: column 0, or each sequence's first
        row when unpadded (no re-padding needed). (B, H)."""
        assert self.pooler is not None, "a model built without a pooler"
        cls_rows = x[:, 0] if un is None else x.index_select(0, un.first_rows())  # (B, H)
        return self.pooler.activation(self.pooler.dense(cls_rows))


# ---------------------------------------------------------------------------------------------
# Heads


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # decoder.weight is tied to the word embeddings and decoder.bias *is* self.bias, exactly
        # as in HF, so the state dict has HF's keys (both cls.predictions.bias and .decoder.bias);
        # both have V_pad rows, and the decoder cuts its logits to V.
        self.decoder = VocabDecoder(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(self.decoder.out_features))  # (V_pad,)
        self.decoder.bias = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(x))  # (..., H) -> (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, with_nsp: bool = True):
        super().__init__()
        self.predictions = BertLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2) if with_nsp else None


class BertForPreTraining(BertPreTrainedModel):
    """MLM (+ NSP when `with_nsp`). with_nsp=False is HF's BertForMaskedLM: no pooler, no
    seq_relationship, and it is exported under that architecture name."""

    @property
    def hf_class_name(self) -> str:
        """The transformers class of the export: BertForPreTraining,
        or BertForMaskedLM without NSP."""
        return "BertForPreTraining" if self.with_nsp else "BertForMaskedLM"

    def __init__(self, config: BertConfig, with_nsp: bool = True,
                 options: ModelOptions | None = None):
        super().__init__()
        self.config = config.validate()
        self.with_nsp = with_nsp
        self.bert = BertModel(config, add_pooling_layer=with_nsp)
        self.cls = BertPreTrainingHeads(config, with_nsp=with_nsp)
        self.post_init(options)

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.cls.predictions.decoder.bias = self.cls.predictions.bias

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None, unpad: bool | None = None) -> ModelOutput:
        meta = resolve_meta(input_ids, attention_mask, batch_meta, labels)
        # Full (B, T, V) logits need every position: unpadding only pays with labels.
        x, un = self.bert.encode(input_ids, attention_mask, token_type_ids, meta,
                                 unpad=False if labels is None else unpad)
        # x: (B, T, H), or (N_tok, H) unpadded
        out = ModelOutput()
        losses = []
        if labels is None:
            out.prediction_logits = self.cls.predictions(x)  # (B, T, V)
        else:
            # Sparse head: transform + decoder only where a label exists (M ~ 0.15 B T rows);
            # same logits and gradients as the dense head.
            rows, targets = labelled_rows(x, labels, meta, un)
            out.prediction_logits = self.cls.predictions(rows)  # (M, V)
            out.update(masked_lm_terms(out.prediction_logits, targets))
            losses.append(out.mlm_loss_sum / out.mlm_count.clamp(min=1))
        if self.cls.seq_relationship is not None:
            nsp_logits = self.cls.seq_relationship(self.bert.pooled(x, un))  # (B, 2)
            out.seq_relationship_logits = nsp_logits
            if next_sentence_label is not None:
                target = next_sentence_label.reshape(-1)
                out.nsp_loss_sum = F.cross_entropy(nsp_logits.float(), target, reduction="sum")
                out.nsp_count = (target != IGNORE_INDEX).sum()
                out.nsp_correct = (nsp_logits.argmax(-1) == target).sum()
                losses.append(out.nsp_loss_sum / out.nsp_count.clamp(min=1))
        if losses:
            out.loss = sum(losses)  # HF: mean MLM loss + mean NSP loss
        return out


class _BertWithClassifier(BertPreTrainedModel):
    """Encoder -> dropout -> Linear(num_labels) named `classifier`, with label names for export
    (HF's LABEL_i by default); `POOLER` (a constant of each subclass) says whether the encoder
    keeps its [CLS] pooler, as in Hugging Face's layout of that head."""

    POOLER: bool = True

    def __init__(self, config: BertConfig, num_labels: int = 2,
                 id2label: dict[int, str] | None = None, options: ModelOptions | None = None):
        super().__init__()
        self.config = config.validate()
        self.num_labels = num_labels
        self.id2label = dict(id2label) if id2label else {i: f"LABEL_{i}" for i in range(num_labels)}
        self.bert = BertModel(config, add_pooling_layer=self.POOLER)
        p = (config.classifier_dropout if config.classifier_dropout is not None
             else config.hidden_dropout_prob)
        self.dropout = Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.post_init(options)


class BertForSequenceClassification(_BertWithClassifier):
    """[CLS] pooler -> dropout -> Linear(num_labels); num_labels == 1 is regression (MSE)."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None) -> ModelOutput:
        x, un = self.bert.encode(input_ids, attention_mask, token_type_ids, batch_meta)
        logits = self.classifier(self.dropout(self.bert.pooled(x, un)))  # (B, num_labels)
        return labelled_output(logits, labels,
                               lambda lg, y: sequence_loss_terms(lg, y, self.num_labels))


class BertForTokenClassification(_BertWithClassifier):
    """A label per token (NER, POS): encoder (no pooler) -> dropout -> Linear(num_labels), as
    HF's BertForTokenClassification; labels (B, T) with IGNORE_INDEX where not labelled."""

    POOLER = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None) -> ModelOutput:
        # x: (B, T, H); logits: (B, T, num_labels)
        x = self.bert(input_ids, attention_mask, token_type_ids, batch_meta).last_hidden_state
        return labelled_output(self.classifier(self.dropout(x)), labels, token_loss_terms)


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction: a start and an end logit per token."""

    def __init__(self, config: BertConfig, options: ModelOptions | None = None):
        super().__init__()
        self.config = config.validate()
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init(options)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None,
                batch_meta: BatchMeta | None = None) -> ModelOutput:
        # Unpadded when the model unpads: the encoder's rows come back re-padded with zeros,
        # the loss leaves the padding out (span_loss_terms) and SQuAD's decoding reads context
        # tokens only, so padding positions' logits (the head's bias here) matter nowhere.
        x = self.bert(input_ids, attention_mask, token_type_ids, batch_meta).last_hidden_state
        start_logits, end_logits = self.qa_outputs(x).float().unbind(-1)  # (B, T) each
        out = ModelOutput(start_logits=start_logits, end_logits=end_logits)
        if start_positions is not None and end_positions is not None:
            out.update(span_loss_terms(start_logits, end_logits, start_positions, end_positions,
                                       attention_mask))
        return out


def _masked_lm(config: BertConfig) -> BertForPreTraining:
    return BertForPreTraining(config, with_nsp=False)  # exported as transformers' BertForMaskedLM


# Head name -> class (or factory) taking the config: what models/build.py builds (see
# models/spec.py).
HEADS = {"base": BertModel, "pretraining": BertForPreTraining, "masked_lm": _masked_lm,
         "classification": BertForSequenceClassification, "qa": BertForQuestionAnswering,
         "token_classification": BertForTokenClassification}

__all__ = [
    "HEADS", "BertModel", "BertForPreTraining", "BertForSequenceClassification",
    "BertForTokenClassification", "BertForQuestionAnswering", "activation",
]
