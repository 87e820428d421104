"""BERT, named and computed exactly like Hugging Face's `modeling_bert.py`, and nothing else.

Parameter names are our compatibility contract: a state dict of `BertForPreTraining` here has the
same keys, shapes and meaning as `transformers.BertForPreTraining`'s, so `hf_io.py` only reads and
writes files. The math is the same too (post-LayerNorm encoder, erf GELU, learned absolute
positions); the speed comes from things that do not change it:

- attention through `F.scaled_dot_product_attention` (flash / memory-efficient kernels on GPU),
  with `attn_mask=None` when nothing is padded so the flash kernel is allowed;
- the MLM head evaluated only at the masked positions (~15% of tokens): the (H x V) decoder is the
  largest matmul of BERT-base's training step when it runs on every token;
- optionally (`BertSelfAttention.fused_qkv`) query, key and value as one (H x 3H) matmul over
  the concatenated weights (the parameters stay three HF-named Linear layers);
- optional unpadding (`unpad=True`, off by default): the real tokens of a padded batch are gathered
  into one (N, H) matrix, so embeddings, projections, FFN and LayerNorms run on real tokens only,
  and attention runs per sequence (varlen flash attention or nested tensors on CUDA, a padded
  SDPA fallback everywhere). Same loss and gradients as the padded path.

This file is pure: no data, no distributed code, no logging. Shapes in comments: B batch, T
sequence length, H hidden size, N heads, D head size (H / N), V vocabulary, M masked tokens.

    model = BertForPreTraining(BertConfig(num_hidden_layers=2, hidden_size=128, ...))
    out = model(input_ids, attention_mask, token_type_ids, labels=labels, next_sentence_label=nsp)
    out.loss.backward()        # == transformers' BertForPreTraining loss on the same batch
    model.unpad_enable()       # then padded batches run on their real tokens only (same loss)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bertgpu.errors import BertgpuError
from bertgpu.models import IGNORE_INDEX

# hidden_act values we implement; the HF names map to the same functions as theirs.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass
class BertConfig:
    """BERT hyper-parameters with Hugging Face's field names and defaults (BERT-base)."""

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
    pad_token_id: int = 0
    """Id of [PAD]; its word embedding row is initialised to zero."""
    classifier_dropout: float | None = None
    """Dropout before the sequence-classification layer; None means hidden_dropout_prob."""
    position_embedding_type: str = "absolute"
    """Only "absolute" (learned positions) is supported; kept so HF configs round-trip."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BertConfig:
        """Build from a dict such as HF's config.json, ignoring keys we do not use
        (architectures, model_type, torch_dtype, id2label, ...)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> BertConfig:
        """Raise BertgpuError naming the field if the combination cannot be built."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise BertgpuError(f"config field {name}: found {value!r}, expected a positive integer")
        if self.hidden_size % self.num_attention_heads != 0:
            raise BertgpuError(
                f"config field hidden_size: {self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise BertgpuError(
                f"config field hidden_act: found {self.hidden_act!r}, expected one of {', '.join(ACTIVATIONS)}")
        if self.position_embedding_type != "absolute":
            raise BertgpuError(
                f"config field position_embedding_type: found {self.position_embedding_type!r}, "
                "expected 'absolute' (relative position embeddings are not supported)")
        return self


def activation(name: str):
    if name == "gelu":
        return F.gelu  # exact erf form, as HF's "gelu" and the original BERT
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")  # GPT-2's tanh approximation
    if name == "relu":
        return F.relu
    raise BertgpuError(f"config field hidden_act: found {name!r}, expected one of {', '.join(ACTIVATIONS)}")


class ModelOutput(dict):
    """A dict with attribute access; only the fields that were computed are present."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


# ---------------------------------------------------------------------------------------------
# The encoder


@dataclass
class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit once gathered into (N, H) rows.

    Built once per forward by `unpad_index` and passed to every layer in place of the SDPA mask.
    Row n of the unpadded activations is flat position `index[n]` of the (B*T) grid; the rows of
    sequence b are `cu_seqlens[b]:cu_seqlens[b+1]`, in column order, and the first one is column 0
    (the [CLS] token the pooler reads), kept even when it is padding (a row of padding only is
    kept whole).
    """

    index: torch.Tensor
    """(N,) int64 flat positions b * T + t of the kept tokens, ascending."""
    batch: int
    seq_len: int
    cu_seqlens: torch.Tensor
    """(B + 1,) int64 offsets of each sequence's rows (row 0 of sequence b is its [CLS])."""
    max_len: int
    """Longest kept sequence (what the varlen kernel's tile loop runs to)."""
    mask: torch.Tensor
    """(B, 1, 1, T) bool SDPA mask of the padded fallback, as `attention_mask_for_sdpa` builds it."""
    packed_ok: bool
    """True when every kept token is a real token (column 0 of every row is real), so attention
    over each packed sequence equals the masked padded attention: the varlen / nested kernels are
    exact. False (left padding, empty rows) routes attention through the padded fallback."""
    backend: str = "auto"
    """Attention kernel: "auto", "varlen", "nested" or "padded" (see `unpad_enable`)."""


ATTENTION_BACKENDS = ("auto", "varlen", "nested", "padded")


def unpad_index(attention_mask: torch.Tensor, backend: str = "auto") -> Unpadded:
    """(B, T) 1 = token, 0 = padding -> the `Unpadded` description of its real tokens.

    Costs one host sync (N and the longest length are shapes), like the sparse MLM gather.
    """
    B, T = attention_mask.shape
    keep = attention_mask.bool().clone()
    packed_ok = bool(keep[:, 0].all())
    keep[:, 0] = True  # the pooler reads column 0 of every row
    # A row of padding only attends everywhere in the padded path (attention_mask_for_sdpa):
    # keep all of it, so even its (meaningless but finite) outputs match exactly.
    keep |= ~attention_mask.bool().any(dim=1, keepdim=True)
    lengths = keep.sum(1)  # (B,)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))  # (B + 1,)
    index = keep.reshape(-1).nonzero().squeeze(1)  # (N,)
    return Unpadded(index=index, batch=B, seq_len=T, cu_seqlens=cu_seqlens, max_len=int(lengths.max()),
                    mask=attention_mask_for_sdpa(attention_mask, force=True), packed_ok=packed_ok,
                    backend=backend)


def pad_rows(x: torch.Tensor, un: Unpadded) -> torch.Tensor:
    """(N, C) rows of the kept tokens -> (B, T, C) with zeros at the dropped positions."""
    out = x.new_zeros(un.batch * un.seq_len, x.size(-1))
    return out.index_copy(0, un.index, x).view(un.batch, un.seq_len, x.size(-1))


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size,
                                            padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # Not persistent: HF (>= 4.31) leaves it out of state dicts too, so the keys match.
        self.register_buffer("position_ids", torch.arange(config.max_position_embeddings).unsqueeze(0),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                unpadded: Unpadded | None = None) -> torch.Tensor:
        T = input_ids.size(1)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if unpadded is not None:
            # Only the kept tokens: (N,) ids; a token's position is its column, as in HF
            idx = unpadded.index
            x = self.word_embeddings(input_ids.reshape(-1)[idx])  # (N, H)
            x = x + self.token_type_embeddings(token_type_ids.reshape(-1)[idx])
            x = x + self.position_embeddings(idx % T)  # (N,) column of each kept token
            return self.dropout(self.LayerNorm(x))
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x = x + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(self.position_ids[:, :T])  # (1, T, H) broadcast over B
        return self.dropout(self.LayerNorm(x))


def _varlen_attn():
    """torch.nn.attention.varlen.varlen_attn (flash attention over packed sequences, CUDA,
    torch >= 2.10) or None."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


class BertSelfAttention(nn.Module):
    # Switch: one (H x 3H) matmul over the concatenated weights instead of three (H x H) ones
    # (the gradient flows back through torch.cat to the three HF-named parameters). Off by
    # default: on CPU it measured slower (BERT-base, seq 128, fp32: ~0.9x vs 1.15x transformers
    # unfused), and on GPU it is unmeasured; `bertgpu bench model --fused-qkv` compares.
    fused_qkv: bool = False

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(..., H) -> q, k, v, each (..., N, D) (views, no copies)."""
        if self.fused_qkv:
            w = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # (3H, H)
            b = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # (3H,)
            q, k, v = F.linear(x, w, b).unflatten(-1, (3, self.num_heads, -1)).unbind(-3)
            return q, k, v
        return (self.query(x).unflatten(-1, (self.num_heads, -1)),
                self.key(x).unflatten(-1, (self.num_heads, -1)),
                self.value(x).unflatten(-1, (self.num_heads, -1)))

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              attn_mask: torch.Tensor | None) -> torch.Tensor:
        """q, k, v (B, T, N, D) -> (B, T, H): softmax(q k^T / sqrt(D)) v, attn_mask (B, 1, 1, T)
        bool, True = may attend."""
        B, T = q.shape[:2]
        # (B, N, T, D) views: the layout SDPA wants
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=attn_mask, is_causal=False,
                                           dropout_p=self.dropout_p if self.training else 0.0)
        return y.transpose(1, 2).reshape(B, T, -1)

    def forward(self, x: torch.Tensor, attn: torch.Tensor | Unpadded | None) -> torch.Tensor:
        q, k, v = self._qkv(x)  # (B, T, N, D) each, or (N_tok, N, D) unpadded
        if not isinstance(attn, Unpadded):
            return self._sdpa(q, k, v, attn)
        un = attn
        dropout = self.dropout_p if self.training else 0.0
        backend = un.backend
        if backend == "auto":
            # Nested tensors on CUDA (flash / memory-efficient kernels, attention dropout works);
            # "varlen" is opt-in: its API is young (torch >= 2.10) and it has no dropout.
            backend = "nested" if x.is_cuda and un.packed_ok else "padded"
        if backend != "padded" and not un.packed_ok:
            backend = "padded"  # a padding [CLS] column would be a key: only the mask is exact
        if backend == "varlen":
            if not x.is_cuda or _varlen_attn() is None:
                raise BertgpuError("attention backend 'varlen' needs CUDA and torch >= 2.10 "
                                   "(torch.nn.attention.varlen); expected 'auto', 'nested' or 'padded' here")
            if dropout:
                raise BertgpuError("attention backend 'varlen' has no attention dropout; "
                                   "set attention_probs_dropout_prob=0 or use 'nested'/'padded'")
            cu = un.cu_seqlens.to(torch.int32)
            y = _varlen_attn()(q, k, v, cu, cu, un.max_len, un.max_len)  # (N_tok, N, D)
            return y.flatten(1)
        if backend == "nested":
            # Jagged nested tensors: (B, j, N, D) -> (B, N, j, D); SDPA runs each sequence
            # without padding (flash / memory-efficient kernels on CUDA, math elsewhere). The
            # kernels want each of q, k, v contiguous in its (N_tok, N, D) values.
            q, k, v = (torch.nested.nested_tensor_from_jagged(
                t.contiguous(), un.cu_seqlens, min_seqlen=1, max_seqlen=un.max_len).transpose(1, 2)
                for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
            return y.transpose(1, 2).values().flatten(1)  # (N_tok, H)
        # Padded fallback, correct everywhere: scatter q, k, v back to (B, T), masked SDPA, gather.
        # The projections and everything after attention still run on the N_tok real rows.
        y = self._sdpa(*(pad_rows(t.flatten(1), un).unflatten(-1, t.shape[1:]) for t in (q, k, v)), un.mask)
        return y.reshape(un.batch * un.seq_len, -1).index_select(0, un.index)  # (N_tok, H)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        # post-LayerNorm residual, as in the original BERT
        return self.LayerNorm(self.dropout(self.dense(y)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, attn: torch.Tensor | Unpadded | None) -> torch.Tensor:
        return self.output(self.self(x, attn), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # (B, T, intermediate_size)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, attn: torch.Tensor | Unpadded | None) -> torch.Tensor:
        # x (B, T, H) with attn the SDPA mask, or (N_tok, H) with attn an Unpadded
        a = self.attention(x, attn)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # Recompute each layer's activations in backward instead of storing them: ~1/3 more
        # compute for a much smaller activation footprint (8 GB cards, long sequences).
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor, attn: torch.Tensor | Unpadded | None) -> torch.Tensor:
        for layer in self.layer:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
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


def attention_mask_for_sdpa(attention_mask: torch.Tensor | None, force: bool = False) -> torch.Tensor | None:
    """(B, T) 1 = token, 0 = padding  ->  (B, 1, 1, T) bool for SDPA, or None if nothing is padded.

    None lets SDPA pick the flash kernel. The all-ones check costs one host sync, which is skipped
    under torch.compile (data-dependent branches would break the graph). A sequence that is all
    padding attends everywhere instead of nowhere, so it yields finite garbage rather than NaN.
    """
    if attention_mask is None:
        return None
    mask = attention_mask.bool()
    if not torch.compiler.is_compiling() and bool(mask.all()):
        return None
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    return mask[:, None, None, :]


class BertPreTrainedModel(nn.Module):
    """Shared initialisation (HF's `_init_weights`) and helpers of all models below."""

    config: BertConfig

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, BertLMPredictionHead):
            nn.init.zeros_(module.bias)

    def post_init(self) -> None:
        self.apply(self._init_weights)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share tied parameters again (after loading a state dict or moving to meta)."""

    def gradient_checkpointing_enable(self, enabled: bool = True) -> None:
        for m in self.modules():
            if isinstance(m, BertEncoder):
                m.gradient_checkpointing = enabled

    def unpad_enable(self, enabled: bool = True, backend: str = "auto") -> None:
        """Run padded batches on their real tokens only (see `Unpadded`); same loss and
        gradients as the padded path. `backend` picks the attention kernel: "auto" (varlen flash
        "auto" (nested tensors + SDPA on CUDA, "padded" elsewhere), "varlen" (flash attention
        over packed sequences, CUDA, fp16/bf16, torch >= 2.10, no attention dropout), "nested" or
        "padded" (masked SDPA on the re-padded q, k, v: correct everywhere)."""
        if backend not in ATTENTION_BACKENDS:
            raise BertgpuError(f"unpad backend: found {backend!r}, expected one of {', '.join(ATTENTION_BACKENDS)}")
        for m in self.modules():
            if isinstance(m, BertModel):
                m.unpad, m.unpad_backend = enabled, backend


class BertModel(BertPreTrainedModel):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config.validate()
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.unpad = False  # see BertPreTrainedModel.unpad_enable
        self.unpad_backend = "auto"
        self.post_init()

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               token_type_ids: torch.Tensor | None = None,
               unpad: bool | None = None) -> tuple[torch.Tensor, Unpadded | None]:
        """Embeddings + encoder: (B, T, H) and None, or, unpadded, (N_tok, H) and its Unpadded.

        Unpadding happens only when asked (`unpad`, default `self.unpad`) and something is padded.
        """
        unpad = self.unpad if unpad is None else unpad
        if unpad and attention_mask is not None and not bool(attention_mask.bool().all()):
            un = unpad_index(attention_mask, self.unpad_backend)
            x = self.embeddings(input_ids, token_type_ids, un)  # (N_tok, H)
            return self.encoder(x, un), un
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        return self.encoder(x, attention_mask_for_sdpa(attention_mask)), None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, unpad: bool | None = None) -> ModelOutput:
        x, un = self.encode(input_ids, attention_mask, token_type_ids, unpad)
        if un is not None:
            x = pad_rows(x, un)  # (B, T, H), zeros at padding (HF has finite garbage there)
        out = ModelOutput(last_hidden_state=x)
        if self.pooler is not None:
            out.pooler_output = self.pooler(x)  # (B, H)
        return out


# ---------------------------------------------------------------------------------------------
# Heads


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        # decoder.weight is tied to the word embeddings and decoder.bias *is* self.bias, exactly
        # as in HF, so the state dict has HF's keys (both cls.predictions.bias and .decoder.bias).
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
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

    def __init__(self, config: BertConfig, with_nsp: bool = True, unpad: bool = False):
        super().__init__()
        self.config = config.validate()
        self.with_nsp = with_nsp
        self.bert = BertModel(config, add_pooling_layer=with_nsp)
        self.cls = BertPreTrainingHeads(config, with_nsp=with_nsp)
        self.post_init()
        self.unpad_enable(unpad)

    def tie_weights(self) -> None:
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.cls.predictions.decoder.bias = self.cls.predictions.bias

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, unpad: bool | None = None) -> ModelOutput:
        # Full (B, T, V) logits need every position: unpadding only pays with labels.
        x, un = self.bert.encode(input_ids, attention_mask, token_type_ids,
                                 unpad=False if labels is None else unpad)
        # x: (B, T, H), or (N_tok, H) unpadded
        out = ModelOutput()
        losses = []
        if labels is None:
            out.prediction_logits = self.cls.predictions(x)  # (B, T, V)
        else:
            # Sparse head: transform + decoder only where a label exists (M ~ 0.15 B T rows).
            # Same logits and gradients as the dense head; the boolean gather costs a host sync.
            labels = labels.reshape(-1)  # (B T,)
            if un is not None:
                labels = labels[un.index]  # (N_tok,): padding never carries a label
            rows = x.reshape(-1, x.size(-1))  # (B T, H) or (N_tok, H)
            keep = (labels != IGNORE_INDEX).nonzero().squeeze(1)  # (M,)
            targets = labels.index_select(0, keep)  # (M,)
            logits = self.cls.predictions(rows.index_select(0, keep))  # (M, V)
            out.prediction_logits = logits
            # fp32 cross-entropy: under bf16 autocast the logits are bf16, their log-sum-exp is not
            out.mlm_loss_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
            out.mlm_count = torch.tensor(keep.numel(), device=x.device)
            out.mlm_correct = (logits.argmax(-1) == targets).sum()
            losses.append(out.mlm_loss_sum / out.mlm_count.clamp(min=1))
        if self.bert.pooler is not None:
            # [CLS] rows: column 0, or the first row of each sequence when unpadded
            cls_rows = x[:, 0] if un is None else x.index_select(0, un.cu_seqlens[:-1])  # (B, H)
            pooled = self.bert.pooler.activation(self.bert.pooler.dense(cls_rows))
        if self.cls.seq_relationship is not None:
            nsp_logits = self.cls.seq_relationship(pooled)  # (B, 2)
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


class BertForSequenceClassification(BertPreTrainedModel):
    """[CLS] pooler -> dropout -> Linear(num_labels); num_labels == 1 is regression (MSE)."""

    def __init__(self, config: BertConfig, num_labels: int = 2,
                 id2label: dict[int, str] | None = None):
        super().__init__()
        self.config = config.validate()
        self.num_labels = num_labels
        # Label names written to config.json on export (HF's LABEL_i by default).
        self.id2label = dict(id2label) if id2label else {i: f"LABEL_{i}" for i in range(num_labels)}
        self.bert = BertModel(config, add_pooling_layer=True)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> ModelOutput:
        pooled = self.bert(input_ids, attention_mask, token_type_ids).pooler_output  # (B, H)
        logits = self.classifier(self.dropout(pooled))  # (B, num_labels)
        out = ModelOutput(logits=logits)
        if labels is not None:
            if self.num_labels == 1:
                out.loss_sum = F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1),
                                          reduction="sum")
            else:
                out.loss_sum = F.cross_entropy(logits.float(), labels.reshape(-1), reduction="sum")
            out.count = torch.tensor(labels.numel(), device=logits.device)
            out.loss = out.loss_sum / labels.numel()
        return out


class BertForQuestionAnswering(BertPreTrainedModel):
    """Span extraction: a start and an end logit per token."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config.validate()
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> ModelOutput:
        x = self.bert(input_ids, attention_mask, token_type_ids).last_hidden_state  # (B, T, H)
        start_logits, end_logits = self.qa_outputs(x).float().unbind(-1)  # (B, T) each
        out = ModelOutput(start_logits=start_logits, end_logits=end_logits)
        if start_positions is not None and end_positions is not None:
            # HF: positions outside the window are clamped to T and ignored.
            T = start_logits.size(1)
            s = start_positions.reshape(-1).clamp(0, T)
            e = end_positions.reshape(-1).clamp(0, T)
            s_sum = F.cross_entropy(start_logits, s, ignore_index=T, reduction="sum")
            e_sum = F.cross_entropy(end_logits, e, ignore_index=T, reduction="sum")
            n_s, n_e = (s != T).sum(), (e != T).sum()
            # loss == HF's (CE_start + CE_end) / 2; loss_sum / count equals it whenever start and
            # end are ignored together (always, for SQuAD features).
            out.loss = (s_sum / n_s + e_sum / n_e) / 2
            out.loss_sum = (s_sum + e_sum) / 2
            out.count = n_s
        return out


def num_parameters(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Number of distinct parameters (tied weights counted once); optionally without the
    embedding tables (the usual "non-embedding parameters" used for FLOP estimates)."""
    seen: set[int] = set()
    skip: set[int] = set()
    if exclude_embeddings:
        skip = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    total = 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel()
    return total


__all__ = [
    "BertConfig", "ModelOutput", "BertModel", "BertForPreTraining", "BertForSequenceClassification",
    "BertForQuestionAnswering", "num_parameters", "attention_mask_for_sdpa", "IGNORE_INDEX",
    "Unpadded", "unpad_index", "pad_rows", "ATTENTION_BACKENDS",
]
