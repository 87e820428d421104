"""Disk full and I/O errors while saving a checkpoint: one clear line (folder, bytes needed and
free), the partial `.tmp` removed, the previous checkpoint intact and loadable; the free-space
check that warns before a save that will not fit. The faults are injected (BERTGPU_FAULTS), real
(a file-size limit makes the kernel fail the write inside torch's zip writer and safetensors),
and, where the machine allows mounting, a real full filesystem (a 1 MB tmpfs)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import warnings

import pytest
import torch

from bertgpu import fsutil
from bertgpu.errors import BertgpuError
from bertgpu.testing import faults
from bertgpu.train import checkpoint as ckpt

EXTRA = {"config.toml": "seed = 1\n", "config.json": "{}\n"}
# Files one save writes, in order: model.safetensors, train_state.pt, the two extra files,
# checksums.json, COMPLETE.
WRITES = ["model.safetensors", "train_state.pt", "config.toml", "config.json",
          "checksums.json", "COMPLETE"]


pytestmark = pytest.mark.usefixtures("no_faults")


def model_state(n: int = 300, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"emb.weight": torch.randn(n, 8, generator=g), "norm.bias": torch.randn(8, generator=g)}


def state(step: int, n: int = 300) -> dict:
    return {"step": step, "optimizer": {"exp_avg": torch.full((n, 8), float(step))},
            "loader": {"position": step}}


def assert_intact(run, step: int, seed: int = 0) -> None:
    latest = ckpt.latest_checkpoint(run)
    assert latest is not None and latest.name == f"step_{step}"
    assert ckpt.checkpoint_problem(latest) is None
    weights, st = ckpt.load_checkpoint(latest)
    assert (torch.equal(weights["emb.weight"], model_state(seed=seed)["emb.weight"])
            and st["step"] == step)
    leftovers = [p.name for p in (run / "checkpoints").iterdir()
                 if p.name.endswith((".tmp", ".old"))]
    assert leftovers == []


@pytest.mark.parametrize("nth", range(1, len(WRITES) + 1), ids=WRITES)
def test_injected_enospc_on_each_write(tmp_path, monkeypatch, nth):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 10, model_state(), state(10), extra_files=EXTRA)
    monkeypatch.setenv(faults.ENV, f"enospc_write={nth}")
    with pytest.raises(BertgpuError) as err:
        ckpt.save_checkpoint(run, 20, model_state(seed=1), state(20), extra_files=EXTRA)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"{run / 'checkpoints'}: cannot write step_20: No space left on device")
    assert " (needs about " in msg and " free); step_10 is intact: free space and re-run" in msg
    assert not (run / "checkpoints" / "step_20.tmp").exists()
    assert_intact(run, 10)
    # Space freed (the fault gone): the re-run's save works and is the newest.
    monkeypatch.delenv(faults.ENV)
    ckpt.save_checkpoint(run, 20, model_state(seed=1), state(20), extra_files=EXTRA)
    assert ckpt.latest_checkpoint(run).name == "step_20"


def test_injected_enospc_on_the_first_save_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv(faults.ENV, "enospc_write=2")
    with pytest.raises(BertgpuError,
                       match="no earlier checkpoint: free space and re-run the same command$"):
        ckpt.save_checkpoint(tmp_path, 1, model_state(), state(1))
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_injected_enospc_when_replacing_the_same_step(tmp_path, monkeypatch):
    """The end of a resumed run saves its step again: a failure keeps the old copy in place."""
    ckpt.save_checkpoint(tmp_path, 10, model_state(), state(10))
    monkeypatch.setenv(faults.ENV, "enospc_write=1")
    with pytest.raises(BertgpuError, match="cannot write step_10: No space left on device"):
        ckpt.save_checkpoint(tmp_path, 10, model_state(seed=1), state(10))
    assert_intact(tmp_path, 10)


class _FileSizeLimit:
    """RLIMIT_FSIZE for this process: a write past it fails in the kernel with EFBIG, the same
    path (and the same swallowed error inside torch's zip writer) as a full disk."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def __enter__(self):
        self.soft, self.hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        self.handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills us
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.limit, self.hard))

    def __exit__(self, *exc):
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.soft, self.hard))
        signal.signal(signal.SIGXFSZ, self.handler)


@pytest.mark.parametrize("big", ["model", "train_state"])
def test_real_write_error_inside_the_serialisers(tmp_path, big):
    """torch.save reports a failed write only as 'unexpected pos N vs M' and safetensors as its own
    error type; both come out as the kernel's reason."""
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 10, model_state(), state(10))
    weights = model_state(n=20_000 if big == "model" else 300, seed=1)  # 640 kB or 10 kB
    st = state(20, n=20_000 if big == "train_state" else 300)
    with _FileSizeLimit(200_000), pytest.raises(BertgpuError) as err:
        ckpt.save_checkpoint(run, 20, weights, st)
    assert str(err.value).startswith(f"{run / 'checkpoints'}: cannot write step_20: File too "
                                     "large (needs about")
    assert "unexpected pos" not in str(err.value)
    assert_intact(run, 10)


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MB filesystem (tmpfs); skipped where mounting is not allowed (not root, CI)."""
    where = tmp_path / "disk"
    where.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_real_full_disk(small_disk):
    run = small_disk / "run"
    ckpt.save_checkpoint(run, 10, model_state(), state(10))  # ~20 kB
    free_before = fsutil.free_bytes(run)
    big = model_state(n=20_000, seed=1)  # 640 kB of weights + 640 kB of optimizer state: no room
    with warnings.catch_warnings(record=True) as caught, pytest.raises(BertgpuError) as err:
        warnings.simplefilter("always")
        ckpt.save_checkpoint(run, 20, big, state(20, n=20_000))
    assert any("the next checkpoint needs about 1.4 MB but only" in str(w.message) for w in caught)
    msg = str(err.value)
    assert msg.startswith(f"{run / 'checkpoints'}: cannot write step_20: No space left on device "
                          "(needs about 1.4 MB, ")
    assert msg.endswith("free); step_10 is intact: free space and re-run the same command to "
                        "resume from it")
    assert fsutil.free_bytes(run) == free_before  # the partial step_20.tmp is gone
    assert_intact(run, 10)


def test_free_space_check_warns_before_a_save_that_will_not_fit(tmp_path, monkeypatch):
    run = tmp_path / "run"
    ckpt.save_checkpoint(run, 10, model_state(), state(10))
    size = fsutil.folder_bytes(run / "checkpoints" / "step_10")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.check_free_space(run)  # a real disk with room: no warning
        assert ckpt.check_free_space(tmp_path / "fresh")  # nothing saved yet: nothing to compare

    monkeypatch.setattr(fsutil, "free_bytes", lambda path: size - 1)
    with pytest.warns(UserWarning,
                      match=r"checkpoints: the next checkpoint needs about .* but only .* is free; "
                            r"it will fail unless space is freed"):
        assert not ckpt.check_free_space(run)  # estimated from the newest checkpoint
    with pytest.warns(UserWarning, match="the next checkpoint needs about"):
        ckpt.save_checkpoint(run, 20, model_state(), state(20))  # estimated from the state
    assert ckpt.latest_checkpoint(run).name == "step_20"  # a warning, not a refusal


def test_estimate_matches_what_is_written(tmp_path):
    weights = {f"w{i}": torch.randn(256, 1024) for i in range(4)}  # 4 MB
    st = {"optimizer": {"state": {i: {"exp_avg": torch.zeros(256, 1024), "step": torch.tensor(3.0)}
                                  for i in range(4)}}, "rng": [torch.get_rng_state()], "step": 3}
    estimate = ckpt.estimate_checkpoint_bytes(weights, st, EXTRA)
    path = ckpt.save_checkpoint(tmp_path, 3, weights, st, extra_files=EXTRA)
    actual = fsutil.folder_bytes(path)
    assert actual <= estimate <= actual * 1.02


def test_human_bytes():
    assert [fsutil.human_bytes(n) for n in (0, 999, 1000, 1_340_000_000, 2.5e13)] == [
        "0 bytes", "999 bytes", "1.0 kB", "1.3 GB", "25.0 TB"]
