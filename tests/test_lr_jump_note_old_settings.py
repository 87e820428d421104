"""The warning of a run resumed with another length names the lr the old run gave the next
step: under the checkpoint's own lr settings, also when the resume changes the lr too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_pretrain import _args  # the tiny model and run of the pretraining tests

from bertgpu.cli import main
from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


@pytest.mark.timeout(120)
def test_the_lr_jump_starts_at_the_lr_the_old_run_took(shards: Path, tmp_path: Path,
                                                       capsys) -> None:
    """Resumed at step 3 of 6 with train.max_steps 12 and half the lr, the warning said the lr
    of step 4 jumps from the new peak lr at the old progress (an lr no step ran at): the old
    schedule was rebuilt with the new settings. Its "from" is now the lr step 4 logged in the
    old run, and its "to" the lr step 4 logs after the resume."""
    run, common = tmp_path / "r", ["--checkpoint.every_steps", "3", "--schedule.warmup_steps", "1"]
    assert main(_args(shards, run, "--train.max_steps", "6", *common)) == 0
    old = next(r["lr"] for r in read_metrics(run) if r["kind"] == "train" and r["step"] == 4)
    shutil.rmtree(run / "checkpoints" / "step_6")
    capsys.readouterr()
    assert main(_args(shards, run, "--train.max_steps", "12", "--optim.lr", "5e-4",
                      *common)) == 0
    new = next(r["lr"] for r in read_metrics(run) if r["kind"] == "train" and r["step"] == 4)
    notes = [x for x in capsys.readouterr().err.splitlines() if "re-stretched" in x]
    assert len(notes) == 1 and f"the lr of step 4 jumps from {old:.3g} to {new:.3g};" in notes[0], \
        (notes, old, new)
