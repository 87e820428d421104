"""Tests for FLOPs per token (models/bert/cost.py, telemetry/flops.py) against a hand count and
torch's FLOP counter, peak lookup, MFU."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.models.bert.cost import flops_per_token
from bertgpu.telemetry.flops import (
    PEAK_TFLOPS,
    flops_per_real_token,
    flops_per_token_from_config,
    gpu_model,
    mfu,
    peak_and_source,
    peak_tflops,
)

# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


def test_flops_hand_count_tiny():
    # d=4, L=2, ff=8, V=10, T=5, half the tokens predicted, with NSP. By hand:
    #   layer = (4*16 + 4*4) + (2*4*8 + 8 + 4) + 4*4 = 80 + 76 + 16 = 172;  N = 344
    #   6N = 2064;  12*L*d*T = 12*2*4*5 = 480
    #   head = (16 + 4) + 2*4 + (4*10 + 10) = 78;  0.5 * 6 * 78 = 234
    #   pooler + NSP = (16 + 4) + (2*4 + 2) = 30;  6 * 30 / 5 = 36
    assert flops_per_token(4, 2, 8, 10, 5, mlm_fraction=0.5, with_nsp=True) == pytest.approx(2814)
    assert flops_per_token(4, 2, 8, 10, 5, mlm_fraction=0.5, with_nsp=False) == pytest.approx(2778)
    assert flops_per_token(4, 2, 8, 10, 5, mlm_fraction=0.0, with_nsp=False) == pytest.approx(2544)


def test_flops_parameter_count_matches_torch_modules():
    # N and the head size must equal the parameter counts of the equivalent torch modules.
    torch = pytest.importorskip("torch")
    nn = torch.nn
    d, L, ff, V, T = 16, 3, 40, 50, 8
    layer = nn.ModuleList(
        [nn.Linear(d, d) for _ in range(4)]
        + [nn.Linear(d, ff), nn.Linear(ff, d), nn.LayerNorm(d), nn.LayerNorm(d)]
    )
    head = nn.ModuleList([nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, V)])
    pooler = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, 2)])

    def count(m):
        return sum(p.numel() for p in m.parameters())

    frac = 0.25
    expected = (
        6 * L * count(layer) + 12 * L * d * T + frac * 6 * count(head) + 6 * count(pooler) / T
    )
    assert flops_per_token(d, L, ff, V, T, mlm_fraction=frac) == pytest.approx(expected)


def test_flops_matmuls_match_torch_flop_counter():
    # Independent check of the 6n / 12LdT accounting: run forward + backward of a hand-built
    # BERT encoder + sparse MLM head + pooler/NSP under torch's FlopCounterMode (counts matmul
    # FLOPs only), and compare with our formula minus the bias/LayerNorm terms.
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    nn, F = torch.nn, torch.nn.functional
    torch.manual_seed(0)
    B, T, d, heads, ff, V, L = 2, 8, 16, 2, 32, 24, 2
    n_masked = 4  # of B*T = 16 tokens
    layers = [
        nn.ModuleDict(
            {
                "q": nn.Linear(d, d),
                "k": nn.Linear(d, d),
                "v": nn.Linear(d, d),
                "o": nn.Linear(d, d),
                "ln1": nn.LayerNorm(d),
                "fc1": nn.Linear(d, ff),
                "fc2": nn.Linear(ff, d),
                "ln2": nn.LayerNorm(d),
            }
        )
        for _ in range(L)
    ]
    transform, ln, decoder = nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, V)
    pooler, nsp = nn.Linear(d, d), nn.Linear(d, 2)
    x = torch.randn(B, T, d, requires_grad=True)  # embeddings output: its grad is computed too

    def split(t):  # (B, T, d) -> (B, heads, T, d/heads)
        return t.view(B, T, heads, d // heads).transpose(1, 2)

    with FlopCounterMode(display=False) as counter:
        h = x
        for m in layers:
            q, k, v = split(m["q"](h)), split(m["k"](h)), split(m["v"](h))
            scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads)  # (B, heads, T, T)
            a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
            h = m["ln1"](h + m["o"](a))
            h = m["ln2"](h + m["fc2"](F.gelu(m["fc1"](h))))
        picked = h.reshape(B * T, d)[:n_masked]  # (n_masked, d): the sparse head
        logits = decoder(ln(F.gelu(transform(picked))))
        nsp_logits = nsp(torch.tanh(pooler(h[:, 0])))
        (logits.sum() + nsp_logits.sum()).backward()
    counted = counter.get_total_flops() / (B * T)

    frac = n_masked / (B * T)
    ours = flops_per_token(d, L, ff, V, T, mlm_fraction=frac, with_nsp=True)
    # What FlopCounterMode does not count: biases and LayerNorms, times 6.
    non_matmul = 6 * L * (4 * d + ff + d + 4 * d)
    non_matmul += frac * 6 * (d + 2 * d + V)
    non_matmul += 6 * (d + 2) / T
    assert ours - non_matmul == pytest.approx(counted, rel=1e-9)


def test_flops_bert_base_and_large_match_anchors():
    base = flops_per_token(768, 12, 3072, 30522, 128, mlm_fraction=0.15)
    large = flops_per_token(1024, 24, 4096, 30522, 128, mlm_fraction=0.15)
    assert base == pytest.approx(0.55e9, rel=0.05)
    assert large == pytest.approx(1.9e9, rel=0.05)
    # Exact values of our accounting, by hand, to catch silent formula changes. BERT-base:
    # layer 7,087,872 params (N = 85,054,464), head 24,063,546, pooler+NSP 592,130:
    # 6N + 12*12*768*128 + 0.15*6*head + 6*592,130/128.
    assert base == pytest.approx(
        6 * 85_054_464 + 12 * 12 * 768 * 128 + 0.9 * 24_063_546 + 6 * 592_130 / 128, rel=1e-12
    )
    # BERT-large: N = 24 * 12,596,224, head 32,336,698, pooler+NSP 1,051,650.
    assert large == pytest.approx(
        6 * 24 * 12_596_224 + 12 * 24 * 1024 * 128 + 0.9 * 32_336_698 + 6 * 1_051_650 / 128,
        rel=1e-12,
    )
    assert round(base / 1e6) == 546 and round(large / 1e6) == 1881


def test_flops_from_config_and_validation():
    cfg = SimpleNamespace(
        hidden_size=768, num_hidden_layers=12, intermediate_size=3072, vocab_size=30522
    )
    assert flops_per_token_from_config(cfg, 128, 0.15) == flops_per_token(
        768, 12, 3072, 30522, 128, 0.15
    )
    assert flops_per_token_from_config(cfg, 128, 0.15, with_nsp=False) < flops_per_token(
        768, 12, 3072, 30522, 128, 0.15
    )
    with pytest.raises(ValueError):
        flops_per_token(768, 12, 3072, 30522, 128, mlm_fraction=1.5)
    with pytest.raises(ValueError):
        flops_per_token(0, 12, 3072, 30522, 128)


def test_flops_per_real_token_counts_each_sequence_at_its_own_length():
    # BERT d=4, L=2, ff=8, V=10 (test_flops_hand_count_tiny): 6N = 2064, head 78, pooler+NSP 30.
    # Sequences of 2, 5, 5 real tokens (12 tokens): attention 12 L d sum(n^2)/sum(n)
    # = 96 * 54 / 12 = 432; the MLM head 0.5 * 6 * 78 = 234 per token; the pooler and NSP once
    # per sequence: 6 * 30 * 3 / 12 = 45. A padded width of 5 would charge 480 of attention.
    cfg = SimpleNamespace(hidden_size=4, num_hidden_layers=2, intermediate_size=8, vocab_size=10)
    assert flops_per_real_token(cfg, [2, 5, 5], mlm_fraction=0.5) == pytest.approx(
        2064 + 432 + 234 + 45)
    assert flops_per_real_token(cfg, (n for n in [5, 2, 5]), 0.0, with_nsp=False) == (
        pytest.approx(2064 + 432))
    # Packed rows, all full: the count at that length. Empty rows weigh nothing.
    assert flops_per_real_token(cfg, [5] * 7 + [0], 0.5) == pytest.approx(
        flops_per_token_from_config(cfg, 5, 0.5))
    with pytest.raises(ValueError, match="no real tokens"):
        flops_per_real_token(cfg, [0, 0], 0.5)
    with pytest.raises(ValueError, match="negative"):
        flops_per_real_token(cfg, [3, -1], 0.5)


def test_flops_per_real_token_modernbert_windows_by_sequence():
    # ModernBERT d=8, f=12, 3 layers (global, local, local; window 4: 2 keys each side), V=20.
    # Per token: 6 * 3 * (4 * 64 + 3 * 96) = 9792 for the weights. A sequence of n tokens: each
    # global layer 12 d n, each local one 12 d k(n), k the keys per query the band allows,
    # averaged over the n queries. Sequences of 3 and 9 tokens:
    #   n=3: every query sees all 3: 96 * (3 + 3 + 3) = 864 per token
    #   n=9: keys per query 3, 4, 5, 5, 5, 5, 5, 4, 3 = 39 / 9: 96 * (9 + 2 * 39 / 9) = 1696
    #   weighted by tokens: (3 * 864 + 9 * 1696) / 12 = 1488.
    from bertgpu.models.build import model_config

    cfg = model_config({"architecture": "modernbert", "vocab_size": 20, "hidden_size": 8,
                        "num_hidden_layers": 3, "num_attention_heads": 2,
                        "intermediate_size": 12, "local_attention": 4,
                        "global_attn_every_n_layers": 3, "max_position_embeddings": 64,
                        "pad_token_id": 0})
    assert flops_per_real_token(cfg, [3, 9], mlm_fraction=0.0) == pytest.approx(9792 + 1488)
    # the max-length count (64) charges every token far more attention than it sees; its local
    # layers' queries see 5 keys but the two at each end 3 and 4: (64 * 5 - 2 * 3) / 64
    local = (64 * 5 - 2 * (2 + 1)) / 64
    assert flops_per_token_from_config(cfg, 64, 0.0) == pytest.approx(
        9792 + 96 * (64 + 2 * local))


@pytest.mark.parametrize("local_attention", [2, 4, 7, 128])
def test_modernbert_window_keys_are_what_the_mask_lets_through(local_attention):
    """A sliding-window layer's attention FLOPs count the keys its mask lets each query see,
    averaged over the sequence (edges see fewer); `local_attention + 1` keys for every token
    overcounted the edges, and odd windows by one key everywhere."""
    from bertgpu.models.modernbert.cost import window_keys
    from bertgpu.models.modernbert.rope import sliding_window_mask

    for seq_len in (1, 2, 3, local_attention // 2 + 1, local_attention + 1, 100, 1024):
        allowed = sliding_window_mask(seq_len, local_attention).sum().item() / seq_len
        assert window_keys(seq_len, local_attention) == pytest.approx(allowed, rel=1e-12), seq_len


# --------------------------------------------------------------------------------------------
# Peak TFLOP/s and MFU
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_peak_env(monkeypatch):
    monkeypatch.delenv("BERTGPU_PEAK_TFLOPS", raising=False)


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.0),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.0),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "bf16", 989.0),
        ("NVIDIA H200 NVL", "bf16", 835.0),
        ("NVIDIA H200 NVL", "tf32", 418.0),
        ("NVIDIA H200 NVL", "fp32", 60.0),
        ("NVIDIA H100 NVL", "bf16", 835.0),
        ("NVIDIA GH200 480GB", "bf16", 989.0),
        ("NVIDIA GH200 480GB", "fp32", 67.0),
        ("NVIDIA GH200 144G HBM3e", "bf16", 989.0),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100-PCIE-40GB", "fp32", 19.5),
        ("NVIDIA A100 80GB PCIe", "tf32", 156.0),
        ("NVIDIA A10", "bf16", 125.0),
        ("NVIDIA L4", "fp16", 121.0),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA GeForce RTX 4090", "bf16", 165.0),
        ("NVIDIA GeForce RTX 3090", "fp16", 71.0),
        ("NVIDIA GeForce RTX 3060 Ti", "bf16", 32.4),
        ("NVIDIA RTX A6000", "bf16", 155.0),
        ("Tesla V100-SXM2-16GB", "fp16", 125.0),
        ("Tesla T4", "fp16", 65.0),
        # no TF32 tensor cores: an fp32 run's matrix products run at the fp32 rate
        ("Tesla V100-SXM2-16GB", "tf32", 15.7),
        ("Tesla T4", "tf32", 8.1),
    ],
)
def test_peak_lookup_by_device_name(name, dtype, expected):
    assert peak_tflops(name, dtype) == expected


def test_peak_lookup_unknown_and_unsupported():
    assert peak_tflops("NVIDIA A10G", "bf16") is None  # not A10, not A100
    assert peak_tflops("Some Future Accelerator", "bf16") is None
    assert peak_tflops(None, "bf16") is None
    assert peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no bf16 tensor cores
    with pytest.raises(ValueError):
        peak_tflops("NVIDIA H100 80GB HBM3", "int8")


def test_peak_lookup_accepts_torch_dtypes():
    torch = pytest.importorskip("torch")
    assert peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", torch.float32) == 67.0


def test_peak_override_and_env(monkeypatch):
    assert peak_tflops("unknown", "bf16", override=100.0) == 100.0
    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", "250")
    assert peak_tflops("unknown", "bf16") == 250.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 250.0
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16", override=800.0) == 800.0  # argument wins
    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", "fast")
    with pytest.raises(BertgpuError, match="BERTGPU_PEAK_TFLOPS"):
        peak_tflops("NVIDIA H100 80GB HBM3", "bf16")


def test_peak_table_is_consistent():
    for model, by_dtype in PEAK_TFLOPS.items():
        assert set(by_dtype) <= {"bf16", "fp16", "tf32", "fp32"}, model
        assert all(v > 0 for v in by_dtype.values()), model


def test_mfu_arithmetic():
    # 100k tokens/s at 1 GFLOP/token = 100 TFLOP/s achieved; one 200-TFLOP/s device: 50 %.
    assert mfu(100_000, 1e9, 200.0) == pytest.approx(0.5)
    assert mfu(100_000, 1e9, 200.0, n_devices=4) == pytest.approx(0.125)
    assert mfu(100_000, 1e9, None) is None
    # The ANCHORS.md NVIDIA BERT-large row: ~74k tok/s on an A100 in fp16 -> ~45 %.
    large = flops_per_token(1024, 24, 4096, 30522, 128, mlm_fraction=0.15)
    assert mfu(74_000, large, peak_tflops("NVIDIA A100-SXM4-80GB", "fp16")) == pytest.approx(
        0.45, abs=0.02
    )




def test_peak_lookup_leaves_out_the_4090_d_and_3090_ti():
    """The RTX 4090 D (China's cut-down part) and the 3090 Ti are other devices with other
    peaks: no MFU rather than the 4090's or the 3090's peak."""
    assert gpu_model("NVIDIA GeForce RTX 4090 D") is None
    assert peak_tflops("NVIDIA GeForce RTX 4090 D", "bf16") is None
    assert gpu_model("NVIDIA GeForce RTX 3090 Ti") is None
    assert gpu_model("NVIDIA GeForce RTX 4090") == "RTX 4090"


def test_peak_lookup_leaves_out_laptop_parts():
    """"NVIDIA GeForce RTX 4090 Laptop GPU" (an AD103, about 80 TFLOP/s bf16) took the desktop
    card's 165: its MFU read half the true value. No MFU rather than a wrong one
    (BERTGPU_PEAK_TFLOPS gives it)."""
    assert gpu_model("NVIDIA GeForce RTX 4090 Laptop GPU") is None
    assert peak_tflops("NVIDIA GeForce RTX 4090 Laptop GPU", "bf16") is None
    assert gpu_model("NVIDIA RTX A6000") == "RTX A6000"


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-5"])
def test_peak_env_that_is_not_a_positive_finite_number_is_refused(monkeypatch, value):
    """An infinite peak would show every MFU as 0 %: refused, naming the variable and value."""
    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", value)
    with pytest.raises(BertgpuError) as err:
        peak_and_source("NVIDIA H100 80GB HBM3", "bf16")
    assert str(err.value) == (f"environment variable BERTGPU_PEAK_TFLOPS: found {value!r}, "
                              "expected a number > 0 (TFLOP/s of one device)")


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 0.0, -5.0])
def test_peak_override_that_is_not_a_positive_finite_number_is_refused(value):
    """`bench model --peak-tflops inf` ran with every MFU shown as 0 and recorded an infinite peak
    (only the environment variable refused it)."""
    with pytest.raises(BertgpuError, match=r"^peak TFLOP/s override: found .*, expected a finite "
                                           r"number > 0$"):
        peak_and_source("NVIDIA H100 80GB HBM3", "bf16", override=value)


def test_the_peak_environment_variable_gives_mfu_on_any_device(monkeypatch):
    # pretrain and finetune ignored BERTGPU_PEAK_TFLOPS off CUDA, which bench model honours
    from types import SimpleNamespace

    import torch

    from bertgpu.train.loop_state import device_mfu

    engine = SimpleNamespace(device=torch.device("cpu"), precision="fp32")
    monkeypatch.delenv("BERTGPU_PEAK_TFLOPS", raising=False)
    assert device_mfu(engine, 1e6, 1, 2e6) is None  # no peak known for a CPU: no made-up MFU
    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", "4")
    assert device_mfu(engine, 1e6, 2, 2e6) == pytest.approx(2e12 / (2 * 4e12))
    assert device_mfu(engine, None, 2, 2e6) is None


def test_a_bad_peak_environment_variable_is_refused_before_the_first_step(monkeypatch):
    from bertgpu.errors import BertgpuError
    from bertgpu.train.loop_state import LogWindow

    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", "abc")
    with pytest.raises(BertgpuError, match="BERTGPU_PEAK_TFLOPS: found 'abc'"):
        LogWindow(1, 0, 10)
