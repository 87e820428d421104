"""The end of a `bertgpu pretrain` run: the final checkpoint does not warn about a next one that
never comes, and a stop signal during the final checkpoint or the Hugging Face export ends the
run as a stop (one line, exit 143 / 130), not as a finished run, with no half-written export."""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_pretrain import _args  # the tiny model and run every pretrain test uses

from bertgpu import errors, fsutil
from bertgpu.cli import main
from bertgpu.telemetry.records import read_metrics
from bertgpu.train import checkpoint, full_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread", "no_faults")
FULL_DISK = "the next checkpoint needs about"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _run(shards: Path, run: Path, *extra: str) -> int:
    # A generous grace: a slow machine must not reach the deadline, which ends the process.
    return main(_args(shards, run, "--checkpoint.grace_s", "120", *extra))


def _steps(run: Path) -> list[int]:
    return [step for step, _ in checkpoint.list_checkpoints(run)]


def _end(run: Path) -> dict:
    return [r for r in read_metrics(run) if r.get("event") == "end"][-1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, written", [
    (["--checkpoint.every_steps", "1"], [1, 2, 3]),  # the last: the loop's, in the background
    (["--checkpoint.every_steps", "2", "--checkpoint.async_save", "false"], [2, 3]),  # the end's
], ids=["at-max-steps", "at-the-end"])
def test_the_last_checkpoint_of_a_run_does_not_warn_about_a_next_one(
        shards: Path, tmp_path: Path, monkeypatch, capsys, extra: list[str],
        written: list[int]) -> None:
    """A disk that holds each checkpoint as it is written (its estimate is made to fit) but not
    another: every checkpoint but the run's last warns that the next one needs more than is
    free. The last one used to warn too, though no checkpoint follows it: written in the
    background at max_steps by the loop, or in place at the end of the run."""
    monkeypatch.setattr(checkpoint, "estimate_checkpoint_bytes", lambda *a, **k: 0)
    monkeypatch.setattr(fsutil, "free_bytes", lambda path: 1000)
    run = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # the same text twice counts twice
        assert _run(shards, run, "--train.max_steps", "3", *extra) == 0
    err = capsys.readouterr().err
    assert _steps(run) == written, err
    warned = [line for line in err.splitlines() if FULL_DISK in line]
    assert len(warned) == len(written) - 1, err
    where = run / "checkpoints"
    assert warned[0].startswith(f"bertgpu pretrain: warning: {where}: {FULL_DISK} "), warned


def _signal_during(monkeypatch, owner: object, name: str, signum: int, when=None) -> None:
    """`owner.name` sends this process `signum` first, then does what it did (a stop signal
    that arrives while it works: it is not cut short)."""
    real = getattr(owner, name)

    def signalled(*args, **kwargs):
        if when is None or when(*args, **kwargs):
            os.kill(os.getpid(), signum)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, signalled)


@pytest.mark.timeout(60)
def test_sigterm_during_the_final_checkpoint_stops_the_run_without_the_export(
        shards: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """SIGTERM while the final checkpoint is written used to let the run export and exit 0, as
    if nothing had stopped it. Now the checkpoint is written (whole), the export is not, the run
    says so in one line and exits 143; the same command again makes the export and finishes."""
    run = tmp_path / "run"
    _signal_during(monkeypatch, full_checkpoints, "save_checkpoint", signal.SIGTERM,
                   when=lambda run_dir, step, *a, **k: step == 2)
    assert _run(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "0") == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"bertgpu pretrain: SIGTERM: no step completed since the newest checkpoint;"
                       f" re-running the same command resumes from step 2 "
                       f"({run / 'checkpoints' / 'step_2'})"), err
    assert _steps(run) == [2]
    assert not (run / "hf").exists() and not (run / "hf.tmp").exists()
    assert _end(run)["reason"] == "preempted"

    monkeypatch.undo()
    assert _run(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "0") == 0
    assert (run / "hf" / "model.safetensors").is_file() and _end(run)["reason"] == "max_steps"


@pytest.mark.timeout(60)
def test_ctrl_c_during_the_export_stops_the_run_and_leaves_the_export_whole(
        shards: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """SIGINT while the Hugging Face export is written used to end the run with exit status 0.
    The export is written into hf.tmp and renamed into place, so it is left whole; the run then
    stops with one line and 130."""
    from bertgpu.tasks.pretraining import PretrainTask

    run = tmp_path / "run"
    _signal_during(monkeypatch, PretrainTask, "export", signal.SIGINT)
    assert _run(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "0") == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertgpu pretrain: SIGINT: "), err
    assert err[-1].endswith(f"re-running the same command resumes from step 2 "
                            f"({run / 'checkpoints' / 'step_2'})"), err
    assert sorted(p.name for p in (run / "hf").iterdir()) >= ["config.json", "model.safetensors"]
    assert not (run / "hf.tmp").exists()
    assert _end(run)["reason"] == "preempted"


@pytest.mark.timeout(60)
def test_a_stop_raised_from_the_export_stops_the_run(shards: Path, tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    """A `Terminated` (what the command line makes of SIGTERM outside the loop) raised by the
    export is not taken for the end of the run: one line, 143, no export folder."""
    from bertgpu.tasks.pretraining import PretrainTask

    def stopped(self, step, state_dict=None):
        raise errors.Terminated()

    monkeypatch.setattr(PretrainTask, "export", stopped)
    run = tmp_path / "run"
    assert _run(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "0") == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("bertgpu pretrain: stopped by "
                                                                "SIGTERM")
    assert not (run / "hf").exists() and not (run / "hf.tmp").exists()
    assert _steps(run) == [2]
