"""The MFU a training run logs, against hand-computed numbers: the peak it divides by (an fp32
run's matrix products run as TF32 on a card that has it, so TF32's peak, not the CUDA-core fp32
rate: 7.4x lower on an H100) and the FLOPs per token pretraining counts (the MLM decoder at the
masked fraction of tokens only). A mutation probe found neither checked by any test: only
`bench.model.peak_of` was."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from bertgpu import pretrain
from bertgpu.telemetry import metrics
from bertgpu.train.loop_state import device_mfu

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def gpu_named(monkeypatch):
    """A CUDA device of the given name, without one: what device_mfu and device_fields read."""
    monkeypatch.delenv("BERTGPU_PEAK_TFLOPS", raising=False)
    name = {"value": H100}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name["value"])

    def use(value: str) -> None:
        name["value"] = value

    return use


def _engine(precision: str) -> SimpleNamespace:
    return SimpleNamespace(precision=precision, device=torch.device("cuda", 0))


@pytest.mark.parametrize(("precision", "name", "peak"), [
    ("fp32", H100, 494.0),  # TF32 tensor cores, not the 67 TFLOP/s of the CUDA cores
    ("bf16", H100, 989.0),
    ("fp16", H100, 989.0),
    ("fp32", "NVIDIA A100-SXM4-80GB", 156.0),  # TF32, not 19.5
    ("fp32", "Tesla V100-SXM2-16GB", 15.7),  # no TF32 tensor cores: the fp32 rate
])
def test_the_loops_mfu_divides_by_the_runs_peak(gpu_named, precision, name, peak):
    gpu_named(name)
    # 2,000 tokens/s on each of 4 devices' worth, 1 GFLOP per token: 8e12 FLOP/s in all
    got = device_mfu(_engine(precision), 1e9, world=4, tokens_per_s=8000.0)
    assert got == pytest.approx(8e12 / (peak * 1e12 * 4), rel=1e-12)


def test_the_start_record_names_an_fp32_runs_tf32_peak(gpu_named):
    fields = metrics.device_fields(torch.device("cuda", 0), "fp32")
    assert fields["device_name"] == H100
    assert (fields["peak_tflops"], fields["peak_source"]) == (494.0, "table: H100 SXM tf32")
    fields = metrics.device_fields(torch.device("cuda", 0), "bf16")
    assert (fields["peak_tflops"], fields["peak_source"]) == (989.0, "table: H100 SXM bf16")


def _pretrain_fpt(mask_rate: float, with_nsp: bool = True) -> float:
    model = SimpleNamespace(architecture="bert", hidden_size=4, num_hidden_layers=2,
                            intermediate_size=8, vocab_size=10)
    cfg = SimpleNamespace(model=model, data=SimpleNamespace(mask_rate=mask_rate))
    data = SimpleNamespace(train=SimpleNamespace(seq_len=5), with_nsp=with_nsp)
    return pretrain._flops_per_token(cfg, data)


def test_pretraining_counts_the_mlm_decoder_at_the_masked_tokens_only():
    # d=4, L=2, ff=8, V=10, T=5. By hand (as tests/test_flops.py's hand count):
    #   layer = (4*16 + 4*4) + (2*4*8 + 8 + 4) + 4*4 = 172;  6N = 6 * 2 * 172 = 2064
    #   attention 12*L*d*T = 480
    #   MLM head (16 + 4) + 2*4 + (4*10 + 10) = 78 parameters at the masked fraction m: 6*78*m
    #   pooler + NSP (16 + 4) + (2*4 + 2) = 30 once per sequence: 6*30/5 = 36
    assert _pretrain_fpt(0.15) == pytest.approx(2064 + 480 + 0.15 * 468 + 36)  # 2650.2
    assert _pretrain_fpt(0.4) == pytest.approx(2064 + 480 + 0.4 * 468 + 36)  # 2767.2
    assert _pretrain_fpt(0.15, with_nsp=False) == pytest.approx(2064 + 480 + 0.15 * 468)
