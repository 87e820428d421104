"""Edge cases of the model code: ModernBERT's sliding-window mask at the window's edge, BertConfig's
boundary checks, ModernBERT's MLM head initialisation, BERT's default label names and a fused
Linear whose parts a Hugging Face state dict only partly has."""

from __future__ import annotations

import math

import pytest
import torch
from _tiny import TINY
from _tiny_modern import TINY_MODERN

from bertgpu.errors import BertgpuError
from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForSequenceClassification
from bertgpu.models.layout import from_hf
from bertgpu.models.modernbert.config import ModernBertConfig
from bertgpu.models.modernbert.model import ModernBertForMaskedLM, attention_masks
from bertgpu.models.modernbert.rope import sliding_window_mask

CPU = torch.device("cpu")


def test_sliding_mask_kept_one_token_past_the_window():
    """At T = local_attention // 2 + 2 the first and last tokens are farther apart than the half
    window, so local layers must get the sliding mask, not the unrestricted (global) one."""
    masks = attention_masks(None, seq_len=6, local_attention=8, device=CPU)
    local = masks["sliding_attention"]
    assert masks["full_attention"] is None
    assert local is not None
    assert local.shape == (1, 1, 6, 6)
    assert torch.equal(local, sliding_window_mask(6, 8)[None, None])
    assert not local[0, 0, 0, 5] and not local[0, 0, 5, 0]
    assert local[0, 0, 0, 4] and local[0, 0, 1, 5]


def test_sliding_mask_dropped_when_the_window_covers_every_pair():
    """At T = local_attention // 2 + 1 every pair of tokens is within the window: no mask needed
    (None) without padding, and the padding mask alone with it."""
    masks = attention_masks(None, seq_len=5, local_attention=8, device=CPU)
    assert masks == {"full_attention": None, "sliding_attention": None}
    padded = attention_masks(torch.tensor([[1, 1, 1, 0, 0]]), seq_len=5, local_attention=8,
                             device=CPU)
    assert padded["sliding_attention"] is padded["full_attention"]


def test_pad_token_id_equal_to_vocab_size_is_refused():
    """A [PAD] id one past the last row of the vocabulary is refused (the export would not load in
    transformers)."""
    BertConfig(vocab_size=100, pad_token_id=99).validate()
    with pytest.raises(BertgpuError, match="pad_token_id = 100: expected an id below vocab_size"):
        BertConfig(vocab_size=100, pad_token_id=100).validate()


@pytest.mark.parametrize("name", ["classifier_dropout", "hidden_dropout_prob",
                                  "attention_probs_dropout_prob"])
def test_dropout_of_one_is_refused(name):
    """A dropout probability of 1.0 zeros every activation it applies to (nothing would be
    learnt), so it is refused; just below 1 is accepted."""
    BertConfig(**{name: 0.999}).validate()
    with pytest.raises(BertgpuError, match=f"{name} = 1.0: expected a number in \\[0, 1\\)"):
        BertConfig(**{name: 1.0}).validate()


@pytest.mark.parametrize("kind", ["relative_key_query", "relative_key", "absolut"])
def test_position_embedding_types_other_than_absolute_are_refused(kind):
    """Only learned absolute positions are built: any other position_embedding_type (a relative
    one, or a typo) is refused instead of silently building absolute positions."""
    BertConfig(position_embedding_type="absolute").validate()
    with pytest.raises(BertgpuError, match=f"position_embedding_type = '{kind}': expected"):
        BertConfig(position_embedding_type=kind).validate()


def test_modernbert_mlm_head_dense_starts_with_the_scaled_down_std():
    """The MLM head's dense layer is initialised as transformers does, with the residual-output
    std initializer_range / sqrt(2 L), not the larger input std initializer_range."""
    config = ModernBertConfig(**TINY_MODERN)
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(config)
    std_in = config.initializer_range
    std_out = std_in / math.sqrt(2.0 * config.num_hidden_layers)
    assert std_in > 2.5 * std_out
    weight = model.head.dense.weight.detach()
    cut = config.initializer_cutoff_factor * std_out
    assert weight.abs().max() <= cut
    # a normal truncated at +-2 std has std ~0.88 of the untruncated one
    assert 0.7 * std_out < weight.std().item() < 1.1 * std_out


def test_bert_classifier_default_label_names_count_from_zero():
    """A BERT classifier built without label names exports transformers' default names
    LABEL_0 .. LABEL_{n-1}."""
    model = BertForSequenceClassification(BertConfig(**TINY), num_labels=2)
    assert model.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    three = BertForSequenceClassification(BertConfig(**TINY), num_labels=3)
    assert three.id2label == {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}


def test_from_hf_leaves_a_lone_query_as_it_is():
    """A Hugging Face state dict holding the query of a layer but not its key and value is not
    fused into a (wrong-size) qkv: the query passes unchanged, for the key checks to name what is
    missing."""
    query = torch.arange(16.0).reshape(4, 4)
    key = "encoder.layer.0.attention.self.query.weight"
    out = from_hf({key: query}, "bert", 99)
    assert list(out) == [key]
    assert torch.equal(out[key], query)
    # with all three parts present they are fused, query first
    parts = {f"encoder.layer.0.attention.self.{p}.weight": query + i
             for i, p in enumerate(("query", "key", "value"))}
    fused = from_hf(parts, "bert", 99)
    assert list(fused) == ["encoder.layer.0.attention.self.qkv.weight"]
    assert torch.equal(fused["encoder.layer.0.attention.self.qkv.weight"],
                       torch.cat([query, query + 1, query + 2]))
