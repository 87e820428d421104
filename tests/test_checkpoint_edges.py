"""Checkpoint edge cases: host copies of views and of tensors that change shape, the preemption
deadline and its margin, which checkpoint the messages name, the free-space estimate, and the
optimizer-state shape check of `--resume-optimizer`."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bertgpu import fsutil
from bertgpu.errors import BertgpuError
from bertgpu.train import checkpoint as ckpt
from bertgpu.train.continued import _check_fits
from bertgpu.train.distributed import DistInfo
from bertgpu.train.hostcopy import HostCopy
from bertgpu.train.preemption import Preemption, margin

pytestmark = pytest.mark.usefixtures("no_faults")


def weights() -> dict[str, torch.Tensor]:
    return {"w": torch.arange(12.0).view(3, 4)}


def test_host_copy_keeps_views_at_different_offsets_apart():
    """Two same-shaped views of one storage at different offsets (e.g. rows of one fused
    weight) must each get their own host copy, so a background checkpoint saves both."""
    base = torch.arange(8.0).view(2, 4)
    out = HostCopy().copy({"a": base[0], "b": base[1]})
    assert torch.equal(out["a"], base[0]) and torch.equal(out["b"], base[1])
    assert out["a"].data_ptr() != out["b"].data_ptr()


def test_host_copy_follows_a_tensor_that_changes_shape():
    """When a tensor under the same name changes shape between two saves, the reused host
    buffer must take the new shape and values, not keep the old ones."""
    hc = HostCopy()
    first = hc.copy({"a": torch.zeros(2)})
    assert torch.equal(first["a"], torch.zeros(2))
    second = hc.copy({"a": torch.ones(3)})
    assert second["a"].shape == (3,) and torch.equal(second["a"], torch.ones(3))


def test_preemption_deadline_only_moves_earlier():
    """A later end of the grace must not push an armed deadline outwards; an earlier one
    must bring it in."""
    p = Preemption(1000.0, DistInfo())
    try:
        now = time.monotonic()
        p._arm(now + 500)
        assert p.end == now + 500
        p._arm(now + 800)
        assert p.end == now + 500
        p._arm(now + 300)
        assert p.end == now + 300
        assert p.deadline is not None and p.deadline <= now + 300
    finally:
        p.restore()


def test_exit_margin_is_a_quarter_of_the_grace_up_to_two_seconds():
    """The time kept for the exit itself is a quarter of a short grace, and at most 2 s."""
    assert margin(1.0) == 0.25
    assert margin(4.0) == 1.0
    assert margin(8.0) == 2.0
    assert margin(100.0) == 2.0


def test_resume_hint_names_the_newest_checkpoint(tmp_path):
    """The last line of a failed job must say a re-run resumes from the newest checkpoint,
    not the oldest."""
    for step in (1, 2):
        ckpt.save_checkpoint(tmp_path, step, weights(), {"step": step}, keep_last=0)
    hint = ckpt.hint_for(tmp_path)
    assert "resumes from step 2 " in hint and "step_2" in hint and "step_1" not in hint


def test_failed_save_names_the_newest_intact_checkpoint(tmp_path, monkeypatch):
    """After a save fails, the error must name the newest checkpoint as the one a re-run
    resumes from, not the oldest."""
    for step in (10, 20):
        ckpt.save_checkpoint(tmp_path, step, weights(), {"step": step})

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(BertgpuError, match=r"cannot write step_30: .*; step_20 is intact"):
        ckpt.save_checkpoint(tmp_path, 30, weights(), {"step": 30})


def test_free_space_check_uses_the_newest_checkpoint_size(tmp_path, monkeypatch):
    """The free-space warning must compare with the size of the newest checkpoint (the model
    may have grown), not the oldest one's."""
    ckpt.save_checkpoint(tmp_path, 1, weights(), {"step": 1}, keep_last=0)
    ckpt.save_checkpoint(tmp_path, 2, {"w": torch.zeros(256, 256)}, {"step": 2}, keep_last=0)
    small = fsutil.folder_bytes(ckpt.checkpoint_dir(tmp_path, 1))
    large = fsutil.folder_bytes(ckpt.checkpoint_dir(tmp_path, 2))
    assert small < large
    monkeypatch.setattr(fsutil, "free_bytes", lambda path: (small + large) // 2)
    with pytest.warns(UserWarning, match="the next checkpoint needs about"):
        assert not ckpt.check_free_space(tmp_path)


def test_resume_optimizer_refuses_a_moment_of_the_wrong_length():
    """--resume-optimizer must refuse a saved 1-D optimizer moment whose length differs from
    its parameter's (a different model), naming both shapes."""
    # what _check_fits reads of an optimizer (a real one would import torch._dynamo: seconds)
    optimizer = SimpleNamespace(param_groups=[{"params": [torch.zeros(4)], "lr": 1e-3}])
    saved = {"param_groups": [{"params": [0]}],
             "state": {0: {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3),
                           "exp_avg_sq": torch.zeros(4)}}}
    with pytest.raises(BertgpuError, match=r"exp_avg of shape \(3,\) for a parameter of shape "
                                           r"\(4,\)"):
        _check_fits(saved, optimizer, Path("train_state.pt"))
    saved["state"][0]["exp_avg"] = torch.zeros(4)
    _check_fits(saved, optimizer, Path("train_state.pt"))  # a matching state passes
