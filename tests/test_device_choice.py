"""Which device a process trains on (train/distributed.py), with the GPU count monkeypatched:
rank r takes GPU r % count, one visible GPU works for any LOCAL_RANK, and an explicit cuda:N is
refused when several processes would all land on it."""

from __future__ import annotations

import pytest
import torch

from bertgpu.errors import BertgpuError
from bertgpu.train import distributed


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this process sees `n` GPUs; records the devices set."""
    chosen: list[torch.device] = []

    def set_count(n: int) -> list[torch.device]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: chosen.append(torch.device(d)))
        return chosen

    return set_count


@pytest.mark.parametrize("count, local_rank, expected", [
    (8, 0, "cuda:0"), (8, 5, "cuda:5"),
    (4, 5, "cuda:1"),   # more ranks than GPUs: round-robin
    (1, 3, "cuda:0"),   # one visible GPU per process (CUDA_VISIBLE_DEVICES per rank, Slurm)
])
def test_cuda_is_local_rank_modulo_the_device_count(gpus, count, local_rank, expected):
    gpus(count)
    assert distributed._pick_device("cuda", local_rank, world_size=8) == expected
    assert distributed._pick_device("auto", local_rank, world_size=8) == expected


def test_explicit_gpu_only_for_a_single_process(gpus):
    gpus(2)
    assert distributed._pick_device("cuda:1", 0, world_size=1) == "cuda:1"
    with pytest.raises(BertgpuError, match=r"impl.device cuda:1: 2 processes would all use GPU 1; "
                                           r"expected impl.device cuda"):
        distributed._pick_device("cuda:1", 0, world_size=2)
    with pytest.raises(BertgpuError, match=r"cuda:N with N in \[0, 2\)"):
        distributed._pick_device("cuda:7", 0)
    with pytest.raises(BertgpuError, match="cuda:N"):
        distributed._pick_device("cuda:x", 0)


def test_no_gpu(gpus):
    gpus(0)
    assert distributed._pick_device("auto", 3) == "cpu"
    with pytest.raises(BertgpuError, match="no CUDA device is visible"):
        distributed._pick_device("cuda", 0)
    with pytest.raises(BertgpuError, match="expected auto, cpu, cuda, cuda:N or mps"):
        distributed._pick_device("tpu", 0)


def test_single_process_with_a_high_local_rank_uses_its_one_gpu(gpus, monkeypatch):
    chosen = gpus(1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    info = distributed.init_distributed("cuda")
    assert info.device == "cuda:0" and info.backend is None
    assert chosen == [torch.device("cuda:0")]  # NCCL and every .cuda() follow it
