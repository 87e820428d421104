"""Atomic checkpoints: round trip, crash mid-write, pruning, pickle refusal, RNG states.
(Disk faults, damage and recovery: tests/test_faults_*.py.)"""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch
from torch import nn

from bertgpu.errors import BertgpuError
from bertgpu.train import checkpoint as ckpt


def tied_model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Module()
    m.emb = nn.Embedding(7, 4)
    m.dec = nn.Linear(4, 7)
    m.dec.weight = m.emb.weight  # tied, like BERT's word embeddings and MLM decoder
    m.norm = nn.LayerNorm(4)
    return m


def train_state(step: int) -> dict:
    model = tied_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.dec(model.emb(torch.tensor([1, 2]))).sum().backward()
    opt.step()
    return {"step": step, "optimizer": opt.state_dict(), "loader": {"position": 12 * step},
            "rng": ckpt.rng_state(), "clock": {"elapsed_s": 1.5}}


def test_round_trip_bitwise(tmp_path):
    model = tied_model()
    state = train_state(3)
    path = ckpt.save_checkpoint(tmp_path, 3, model.state_dict(), state,
                                extra_files={"config.toml": "seed = 1\n", "config.json": b"{}"})
    assert path == tmp_path / "checkpoints" / "step_3"
    assert sorted(p.name for p in path.iterdir()) == [
        "COMPLETE", "checksums.json", "config.json", "config.toml", "model.safetensors",
        "train_state.pt"]
    assert ckpt.latest_checkpoint(tmp_path) == path
    weights, loaded = ckpt.load_checkpoint(path)
    for k, v in model.state_dict().items():
        assert torch.equal(weights[k], v) and weights[k].dtype == v.dtype, k
    assert loaded["step"] == 3 and loaded["loader"] == {"position": 36}
    opt_a, opt_b = state["optimizer"]["state"][0], loaded["optimizer"]["state"][0]
    assert torch.equal(opt_a["exp_avg"], opt_b["exp_avg"])
    new = tied_model()
    new.load_state_dict(weights)  # tied tensors load back into the tied module


def test_crash_mid_write_keeps_previous(tmp_path, monkeypatch):
    model = tied_model()
    ckpt.save_checkpoint(tmp_path, 1, model.state_dict(), train_state(1))

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(BertgpuError, match=r"checkpoints: cannot write step_2: disk full \(needs "
                                           r"about .* free\); step_1 is intact"):
        ckpt.save_checkpoint(tmp_path, 2, model.state_dict(), train_state(2))
    monkeypatch.undo()
    assert not (tmp_path / "checkpoints" / "step_2.tmp").exists()  # the partial folder is removed
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step_1"
    assert ckpt.load_checkpoint(latest)[1]["step"] == 1

    # A folder without COMPLETE (e.g. copied by hand, interrupted) is ignored too.
    incomplete = tmp_path / "checkpoints" / "step_9"
    incomplete.mkdir()
    (incomplete / "train_state.pt").write_bytes(b"")
    assert ckpt.latest_checkpoint(tmp_path).name == "step_1"

    # A .tmp left by a crash (SIGKILL mid-write) is replaced by the next save of that step.
    (tmp_path / "checkpoints" / "step_2.tmp").mkdir()
    (tmp_path / "checkpoints" / "step_2.tmp" / "model.safetensors").write_bytes(b"partial")
    ckpt.save_checkpoint(tmp_path, 2, model.state_dict(), train_state(2))
    assert ckpt.latest_checkpoint(tmp_path).name == "step_2"
    assert not (tmp_path / "checkpoints" / "step_2.tmp").exists()


def test_keep_last_prunes_oldest(tmp_path):
    model = tied_model()
    for step in (10, 20, 30, 40, 50):
        ckpt.save_checkpoint(tmp_path, step, model.state_dict(), {"step": step}, keep_last=3)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_30", "step_40", "step_50"]
    # Saving the same step again (e.g. a final save after resume) replaces it in place.
    ckpt.save_checkpoint(tmp_path, 50, model.state_dict(), {"step": 50, "again": True}, keep_last=3)
    assert ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))[1]["again"] is True
    assert ckpt.latest_checkpoint(tmp_path / "nowhere") is None


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_malicious_pickle_refused(tmp_path):
    path = ckpt.save_checkpoint(tmp_path, 1, tied_model().state_dict(), {"step": 1})
    with open(path / "train_state.pt", "wb") as f:
        pickle.dump({"step": 1, "payload": Evil()}, f, protocol=2)
    with pytest.raises(BertgpuError,
                       match=r"refusing to load .*train_state.pt: not a plain tensor checkpoint"):
        ckpt.load_checkpoint(path)


def test_missing_files_are_a_clear_error(tmp_path):
    with pytest.raises(BertgpuError, match="not a complete checkpoint"):
        ckpt.load_checkpoint(tmp_path)


def test_rng_round_trip_survives_weights_only_load(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    state = ckpt.rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3))

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.rand(3).tolist(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
