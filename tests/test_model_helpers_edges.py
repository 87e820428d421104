"""Edge cases of the model helpers and the shard writer that other tests leave open: the token
loss with nothing labelled, ShardWriter's split of added rows at the shard size, the Packer's
word-start flags of its last short row, shared.LayerNorm's output dtype under bf16 autocast, the
ModernBERT FLOPs per token (head bias, the transformers-4.x global-layer period) and BERT's
step-bytes estimate against hand counts, from_hf with a fused Linear missing a part, and a config
whose architecture and model_type agree."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _tiny_modern import TINY_MODERN

from bertgpu.data.writer import Packer, ShardWriter
from bertgpu.models.bert.cost import estimate_train_bytes
from bertgpu.models.build import architecture_of, build_model
from bertgpu.models.layout import from_hf
from bertgpu.models.modernbert.cost import flops_per_token_of
from bertgpu.models.modernbert.model import ModernBertForMaskedLM
from bertgpu.models.shared import LayerNorm, token_loss_terms


def test_token_loss_with_nothing_labelled_is_zero_not_nan():
    torch.manual_seed(0)
    out = token_loss_terms(torch.randn(1, 3, 2), torch.full((1, 3), -100))
    assert int(out["count"]) == 0
    assert torch.isfinite(out["loss"])
    assert float(out["loss"]) == 0.0
    assert float(out["loss_sum"]) == 0.0


def _rows(start: int, n: int, T: int) -> dict[str, np.ndarray]:
    ids = np.arange(start * T, (start + n) * T, dtype=np.int64).reshape(n, T) % 60000
    return {"input_ids": ids, "lengths": np.full(n, T, np.int32)}


def test_shard_writer_splits_an_add_that_crosses_the_shard_size(tmp_path):
    T = 5
    w = ShardWriter(tmp_path, "train", seq_len=T, dtype=np.uint16, shard_size=4, nsp=False)
    w.add(_rows(0, 3, T))
    w.add(_rows(3, 3, T))
    w.flush()
    assert [s["sequences"] for s in w.shards] == [4, 2]
    assert [s["tokens"] for s in w.shards] == [4 * T, 2 * T]
    first = np.load(tmp_path / "train-00000.input_ids.npy")
    second = np.load(tmp_path / "train-00001.input_ids.npy")
    assert first.shape == (4, T) and second.shape == (2, T)
    expected = np.arange(6 * T).reshape(6, T)
    np.testing.assert_array_equal(first, expected[:4])
    np.testing.assert_array_equal(second, expected[4:])


def test_packer_last_short_row_flags_cls_and_sep_as_word_starts(tmp_path):
    w = ShardWriter(tmp_path, "train", seq_len=8, dtype=np.uint16, shard_size=16, nsp=False,
                    word_starts=True)
    p = Packer(w, seq_len=8, cls=2, sep=3)
    p.add(np.array([10, 11, 12], np.int32), np.array([1, 0, 1], np.uint8), joins=False)
    p.finish()
    w.flush()
    ids = np.load(tmp_path / "train-00000.input_ids.npy")
    flags = np.load(tmp_path / "train-00000.word_starts.npy")
    np.testing.assert_array_equal(ids, [[2, 10, 11, 12, 3, 0, 0, 0]])
    np.testing.assert_array_equal(flags, [[1, 1, 0, 1, 1, 0, 0, 0]])


def test_layernorm_returns_bf16_under_cpu_autocast():
    g = torch.Generator().manual_seed(0)
    ln = LayerNorm(8)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(8, generator=g))
        ln.bias.copy_(torch.randn(8, generator=g))
    x = torch.randn(2, 3, 8, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ln(x)
    assert y.dtype == torch.bfloat16
    ref = torch.nn.functional.layer_norm(x, (8,), ln.weight, ln.bias, ln.eps).to(torch.bfloat16)
    assert torch.equal(y, ref)
    assert ln(x).dtype == torch.float32  # outside autocast nothing changes


def test_modernbert_flops_hand_count_includes_head_dense_bias():
    # d=4, f=6, L=2, V=10, T=5, every layer global, half the tokens predicted. By hand:
    #   layer = Wqkv 3*16 + Wo 16 + Wi 4*12 + Wo 6*4 = 48 + 16 + 48 + 24 = 136; 6*2*136 = 1632
    #   attention = 2 layers * 12*d*T = 2 * 240 = 480
    #   head = dense 16 + bias 4 + decoder 40 + decoder bias 10 = 70; 0.5 * 6 * 70 = 210
    cfg = SimpleNamespace(hidden_size=4, intermediate_size=6, num_hidden_layers=2, vocab_size=10,
                          local_attention=4, layer_types=["full_attention"] * 2)
    assert flops_per_token_of(cfg, 5, mlm_fraction=0.5) == pytest.approx(1632 + 480 + 210)


def test_modernbert_flops_transformers4_period_makes_layers_0_and_3_global():
    # A 4.x config: no layer_types, global_attn_every_n_layers=3, 4 layers -> layers 0 and 3
    # global (T=5 keys), 1 and 2 sliding with local_attention=2 (|i-j| <= 1): keys per query over
    # 5 positions are 2,3,3,3,2 -> 13/5 = 2.6. No head (mlm_fraction 0).
    #   weights 6*4*136 = 3264; attention 12*4*(5 + 2.6 + 2.6 + 5) = 48 * 15.2 = 729.6
    cfg = SimpleNamespace(hidden_size=4, intermediate_size=6, num_hidden_layers=4, vocab_size=10,
                          local_attention=2, global_attn_every_n_layers=3)
    assert flops_per_token_of(cfg, 5, mlm_fraction=0.0) == pytest.approx(3264 + 729.6)


def test_bert_train_bytes_hand_count_counts_logits_and_their_gradient():
    # H=4, L=2, F=8, heads=2, V=10, 16 positions; micro batch 2 x 10 tokens = 20, fp32, AdamW.
    #   params = 2*(4*16 + 2*4*8) + (10 + 16 + 2)*4 + 16 = 256 + 112 + 16 = 384; 4 copies x 4 B
    #     = 6144
    #   activations = 2 layers * 20 tokens * (12*4 + 2*8) * 4 B = 2 * 5120 = 10240
    #   MLM logits: int(0.15 * 20) = 3 rows * V=10 * 4 B * 2 (logits + gradient) = 240
    cfg = SimpleNamespace(hidden_size=4, num_hidden_layers=2, intermediate_size=8,
                          num_attention_heads=2, vocab_size=10, max_position_embeddings=16)
    assert estimate_train_bytes(cfg, micro_batch=2, seq_len=10) == 6144 + 10240 + 240


def test_from_hf_leaves_a_fused_group_missing_a_part_unchanged():
    g = torch.Generator().manual_seed(0)
    prefix = "bert.encoder.layer.0.attention.self."
    tensors = {prefix + "query.weight": torch.randn(4, 4, generator=g),
               prefix + "key.weight": torch.randn(4, 4, generator=g)}
    out = from_hf(tensors, "bert", 99)
    assert set(out) == set(tensors)
    for k, t in tensors.items():
        assert torch.equal(out[k], t)


def test_config_whose_architecture_and_model_type_agree_builds_modernbert():
    fields = {**TINY_MODERN, "architecture": "modernbert", "model_type": "modernbert"}
    assert architecture_of(fields) == "modernbert"
    assert isinstance(build_model(fields, "masked_lm"), ModernBertForMaskedLM)
