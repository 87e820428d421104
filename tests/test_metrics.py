"""Tests for bertgpu.train.metrics: FLOPs against a hand count and torch's FLOP counter, peak lookup,
MFU, throughput with a fake clock, and the metrics log (JSON lines, resume, ranks, console)."""

from __future__ import annotations

import io
import json
import math
from types import SimpleNamespace

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.train.metrics import (
    PEAK_TFLOPS,
    MetricsLogger,
    Throughput,
    device_memory,
    flops_per_token,
    flops_per_token_from_config,
    format_startup_table,
    gpu_utilisation,
    mfu,
    peak_tflops,
    read_metrics,
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


# --------------------------------------------------------------------------------------------
# Memory, GPU state, throughput, formatting
# --------------------------------------------------------------------------------------------


def test_device_memory_cpu_and_gpu_utilisation_degrade():
    mem = device_memory("cpu")
    assert mem["mem_peak_gib"] > 0
    assert mem["mem_peak_gib"] >= mem.get("mem_rss_gib", 0) * 0.99
    assert isinstance(gpu_utilisation(), dict)  # {} without nvidia-ml-py or a GPU


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_throughput_rates_with_fake_clock():
    clock = FakeClock()
    tp = Throughput(window=3, n_devices=2, clock=clock)
    assert tp.rates() == {}
    clock.t += 2.0
    tp.update(tokens=1024, sequences=8)  # 512 tok/s over 2 s
    r = tp.rates()
    assert r["tokens_per_s"] == pytest.approx(512)
    assert r["tokens_per_s_per_device"] == pytest.approx(256)
    assert r["sequences_per_s"] == pytest.approx(4)
    assert r["steps_per_s"] == pytest.approx(0.5)
    assert r["step_time_s"] == pytest.approx(2.0)
    # Then 4 fast steps of 1 s each: the window (3 updates) forgets the slow first step.
    for _ in range(4):
        clock.t += 1.0
        tp.update(tokens=1024, sequences=8)
    r = tp.rates()
    assert r["tokens_per_s"] == pytest.approx(1024)
    assert r["sequences_per_s_per_device"] == pytest.approx(4)
    assert r["steps_per_s"] == pytest.approx(1.0)
    assert (tp.tokens, tp.sequences, tp.steps) == (5 * 1024, 40, 5)
    # reset() drops the window (e.g. after an eval pause) but keeps the totals.
    clock.t += 100.0
    tp.reset()
    assert tp.rates() == {}
    clock.t += 0.5
    tp.update(tokens=1024, sequences=8)
    assert tp.rates()["tokens_per_s"] == pytest.approx(2048)
    assert tp.tokens == 6 * 1024


def test_format_startup_table():
    text = format_startup_table(
        [("per-device batch", "32"), ("devices", "8"), ("global batch", "256")], title="batch"
    )
    lines = text.splitlines()
    assert lines[0] == "batch"
    assert lines[1] == "  per-device batch  32"
    assert lines[2] == "  devices           8"
    assert len({line.index(v) for line, v in zip(lines[1:], ["32", "8", "256"], strict=True)}) == 1
    assert format_startup_table([]) == ""


# --------------------------------------------------------------------------------------------
# MetricsLogger and read_metrics
# --------------------------------------------------------------------------------------------


def _train_scalars(i: int) -> dict:
    return {
        "loss": 2.0 / i,
        "lr": 1e-4 * i,
        "grad_norm": 0.5,
        "tokens_per_s": 123456.789,
        "sequences_per_s": 964.5,
        "mfu": 0.4213,
        "mem_peak_gib": 12.34,
    }


def test_logger_writes_valid_json_lines(tmp_path):
    out = io.StringIO()
    with MetricsLogger(tmp_path, is_main=True, total_steps=4, log_every=2, stream=out) as log:
        for i in range(1, 5):
            log.log(i, "train", **_train_scalars(i))
        log.log(4, "eval", loss=float("nan"), accuracy=0.5, mfu=None)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5
    rows = [json.loads(line) for line in lines]  # strict JSON: NaN would not parse as standard
    train = [r for r in rows if r["kind"] == "train"]
    keys = {"step", "kind", "time", "elapsed_s", *_train_scalars(1)}
    assert all(set(r) == keys for r in train)
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert train[0]["lr"] == pytest.approx(1e-4)  # small values keep their precision
    assert train[0]["tokens_per_s"] == 123457  # rounded to 6 significant digits
    assert rows[-1]["loss"] is None  # NaN -> null
    assert "mfu" not in rows[-1]  # None scalars are dropped
    assert "NaN" not in "".join(lines)
    # Not a TTY: a plain line every log_every=2 train steps, plus the eval line; same fields.
    console = out.getvalue().splitlines()
    assert len(console) == 3
    assert console[0].startswith("train step 2/4 | loss 1.0000 | lr 2.00e-04 | gnorm 0.5")
    assert "tok/s 123.5k" in console[0] and "MFU 42.1%" in console[0]
    assert "mem 12.34GiB" in console[0] and "ETA" in console[0]
    assert console[2].startswith("eval step 4/4 | loss nan") and "accuracy 0.5" in console[2]


def test_logger_appends_on_reopen_and_read_metrics(tmp_path):
    out = io.StringIO()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=10, stream=out)
    for i in range(1, 4):
        log.log(i, "train", loss=1.0 / i)
    log.log(3, "eval", loss=0.9)
    log.close()
    log.close()  # idempotent
    # Simulate a crash mid-write, then a resume from the step-2 checkpoint.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "ki')
    log = MetricsLogger(
        tmp_path, is_main=True, total_steps=10, stream=out, initial_step=2, elapsed_offset_s=50.0
    )
    log.log(3, "train", loss=0.3)
    log.log(4, "train", loss=float("inf"))
    log.close()
    with pytest.raises(BertgpuError, match="metrics.jsonl:5"):
        read_metrics(tmp_path)  # the cut line is no longer the last one
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    del lines[4]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 5, "ki')
    rows = read_metrics(tmp_path / "metrics.jsonl")  # a cut last line is skipped
    assert [(r["kind"], r["step"]) for r in rows][3:] == [("eval", 3), ("train", 3), ("train", 4)]
    assert rows[0]["elapsed_s"] < 50.0 <= rows[4]["elapsed_s"]  # continues across the resume
    assert math.isnan(rows[5]["loss"])
    latest = read_metrics(tmp_path, drop_superseded=True)  # the first run's step 3 is gone
    assert [(r["kind"], r["step"]) for r in latest] == [("train", i) for i in (1, 2, 3, 4)]
    assert latest[2]["loss"] == pytest.approx(0.3)


def test_logger_non_main_rank_writes_nothing(tmp_path):
    out = io.StringIO()
    log = MetricsLogger(tmp_path / "run", is_main=False, total_steps=5, stream=out)
    assert log.log(1, "train", loss=1.0) is None
    log.print("hello")
    log.close()
    assert not (tmp_path / "run").exists()
    assert out.getvalue() == ""


def test_logger_without_run_dir_and_bad_input(tmp_path):
    out = io.StringIO()
    log = MetricsLogger(None, is_main=True, total_steps=None, log_every=1, stream=out)
    record = log.log(7, "train", loss=1.5, note="warmup")
    assert record is not None and record["note"] == "warmup"
    assert out.getvalue().startswith("train step 7 | loss 1.5000")
    log.print("a message")
    assert out.getvalue().splitlines()[-1] == "a message"
    with pytest.raises(ValueError):
        log.log(1, "debug", loss=1.0)
    with pytest.raises(TypeError):
        log.log(1, "train", loss=[1.0])
    log.close()


def test_logger_unwraps_tensors_and_tensorboard_optional(tmp_path):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    out = io.StringIO()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=2, tensorboard=True, stream=out)
    log.log(1, "train", loss=torch.tensor(2.5), grad_norm=np.float32(0.25), tokens=np.int64(3))
    log.close()
    (row,) = read_metrics(tmp_path)
    assert (row["loss"], row["grad_norm"], row["tokens"]) == (2.5, 0.25, 3)


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_logger_progress_bar_on_a_terminal(tmp_path):
    out = _TTY()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=10, stream=out, initial_step=2)
    for i in range(3, 6):
        log.log(i, "train", **_train_scalars(i))
    log.print("checkpoint saved")
    log.close()
    text = out.getvalue()
    assert "checkpoint saved" in text
    assert "5/10" in text and "loss" in text
    assert len(read_metrics(tmp_path)) == 3
