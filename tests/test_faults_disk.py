"""Disk full and I/O errors while saving a checkpoint: one clear line (folder, bytes needed and
free), the partial `.tmp` removed, the previous checkpoint intact and loadable; the free-space
check that warns before a save that will not fit. The faults are injected (BERTGPU_FAULTS), real
(a file-size limit makes the kernel fail the write inside torch's zip writer and safetensors),
and, where the machine allows mounting, a real full filesystem (a 1 MB tmpfs)."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import warnings
from pathlib import Path

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


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM, errno.EROFS],
                         ids=["EACCES", "EPERM", "EROFS"])
def test_a_folder_that_is_not_writable_is_not_a_full_disk(tmp_path, monkeypatch, code):
    """A save refused with Permission denied said "free space and re-run" with 54 GB free: the
    space figures and that advice are for a full disk (or quota) only."""
    run = tmp_path / "run"
    root = run / "checkpoints"
    ckpt.save_checkpoint(run, 10, model_state(), state(10))

    def refused(obj, path):
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(ckpt, "_torch_save", refused)  # train_state.pt, after model.safetensors
    with pytest.raises(BertgpuError) as err:
        ckpt.save_checkpoint(run, 20, model_state(seed=1), state(20))
    fix = ("remount the folder's file system read-write" if code == errno.EROFS
           else "fix the folder's permissions")
    assert str(err.value) == (f"{root}: cannot write step_20: {os.strerror(code)} (the folder is "
                              f"not writable); step_10 is intact: {fix} and re-run the same "
                              "command to resume from it")
    assert not (root / "step_20.tmp").exists()
    assert_intact(run, 10)


def test_a_full_quota_is_a_full_disk(tmp_path, monkeypatch):
    def over_quota(obj, path):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(path))

    monkeypatch.setattr(ckpt, "_torch_save", over_quota)
    with pytest.raises(BertgpuError, match=r"cannot write step_1: Disk quota exceeded \(needs "
                                           r"about .* free\); no earlier checkpoint: free space "
                                           r"and re-run the same command$"):
        ckpt.save_checkpoint(tmp_path, 1, model_state(), state(1))


# ---------------------------------------------------------------------------------------------
# The Hugging Face export (bertgpu export, pretrain's hf/ at its end, finetune's model/)


def _full_disk_in(scratch_name: str, monkeypatch) -> None:
    """safetensors' save_file fails as it does on a full disk (its own error type, the system's
    reason inside, part of the file written) when it writes into a folder named
    `scratch_name`; every other write works."""
    import safetensors.torch
    from safetensors import SafetensorError

    real = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        if os.path.basename(os.path.dirname(filename)) != scratch_name:
            return real(tensors, filename, metadata=metadata)
        with open(filename, "wb") as f:
            f.write(b"\0" * 1000)
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def test_full_disk_during_export_is_one_line_and_leaves_no_scratch(tmp_path, monkeypatch,
                                                                  capsys):
    """`bertgpu export` onto a full disk ended in a SafetensorError traceback and left OUT.tmp."""
    from _tiny import TINY

    from bertgpu.cli import main as cli
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.hf_export import hf_config

    run, out = tmp_path / "run", tmp_path / "hf"
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=False)
    ckpt.save_checkpoint(run, 10, model.state_dict(), {"step": 10},
                         extra_files={"config.json": json.dumps(hf_config(model))})
    _full_disk_in("hf.tmp", monkeypatch)
    try:
        code = cli(["export", str(run), "--out", str(out)])
    except Exception as exc:  # noqa: BLE001 - what the old code did: a traceback
        code = f"{type(exc).__name__}: {exc}"
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bertgpu export: error: {tmp_path}: cannot write hf: No space left "
                          "on device (needs about ")
    assert err.endswith(" free); free space and re-run the same command\n") and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no hf, no hf.tmp


def test_full_disk_at_pretrainings_end_export_is_one_line(tmp_path, monkeypatch, capsys,
                                                           one_thread):
    """The end-of-run export (RUN/hf) on a full disk: a traceback after "event end | reason
    error", hf.tmp left in the run folder. Now one line and exit 2; the final checkpoint is whole,
    and a re-run with space writes hf/."""
    from _shards import write_synthetic_shards

    from bertgpu.cli import main as cli

    data = write_synthetic_shards(tmp_path / "data", n_train=32, n_val=8, seq_len=32,
                                  vocab_size=100)
    run = tmp_path / "run"
    args = ["pretrain", str(Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"),
            "--data", str(data), "--out", str(run), "--model.vocab_size", "100",
            "--model.hidden_size", "32", "--model.intermediate_size", "64",
            "--model.max_position_embeddings", "64", "--train.global_batch_size", "8",
            "--impl.micro_batch_size", "8", "--train.max_steps", "2",
            "--train.eval_every_steps", "0", "--train.eval_sequences", "8",
            "--checkpoint.every_steps", "0"]
    with monkeypatch.context() as full:
        _full_disk_in("hf.tmp", full)
        try:
            code = cli(args)
        except Exception as exc:  # noqa: BLE001 - what the old code did: a traceback
            code = f"{type(exc).__name__}: {exc}"
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"bertgpu pretrain: error: {run}: cannot write hf: No space left on "
                           "device (needs about ")
    assert not (run / "hf.tmp").exists() and not (run / "hf").exists()
    assert ckpt.checkpoint_problem(run / "checkpoints" / "step_2") is None
    # space freed: the re-run exports the finished run
    assert cli(args) == 0 and (run / "hf" / "model.safetensors").is_file()


def test_a_full_disk_under_metrics_jsonl_mid_run_is_one_line(tmp_path, capsys, one_thread):
    """metrics.jsonl written to a full disk (/dev/full answers every write with ENOSPC): the
    OSError of a write to an open file names no path, so the run ended in three chained
    tracebacks (the end record and close() failing again over the first). Now one line naming
    the file, exit 2; and an ENOSPC without a path is said of the --out typed."""
    from _shards import write_synthetic_shards

    from bertgpu.cli import main as cli
    from bertgpu.cli import place_error

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    data = write_synthetic_shards(tmp_path / "data", n_train=32, n_val=8, seq_len=32,
                                  vocab_size=100)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to("/dev/full")
    args = ["pretrain", str(Path(__file__).resolve().parents[1] / "configs" / "tiny.toml"),
            "--data", str(data), "--out", str(run), "--model.vocab_size", "100",
            "--model.hidden_size", "32", "--model.intermediate_size", "64",
            "--model.max_position_embeddings", "64", "--train.global_batch_size", "8",
            "--impl.micro_batch_size", "8", "--train.max_steps", "2",
            "--train.eval_every_steps", "0", "--train.eval_sequences", "8"]
    try:
        code = cli(args)
    except OSError as exc:  # what the old code did: a traceback
        code = f"{type(exc).__name__}: {exc}"
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bertgpu pretrain: error: {run / 'metrics.jsonl'}: No space left on device; "
                   "free space on that file system or choose another path, then re-run"], err
    full = OSError(errno.ENOSPC, "No space left on device")  # a write to an open shard file
    assert place_error(full, ["prepare", "--out", "d"]) == (
        "d: No space left on device (writing this output or a file beside it); free space on "
        "that file system or choose another path, then re-run")
    assert place_error(full, ["prepare", "--out=d"]).startswith("d: No space left")
    assert place_error(full, ["report", "r"]) is None  # no --out: a traceback as before
    assert place_error(OSError(errno.EBADF, "Bad file descriptor"), ["--out", "d"]) is None
