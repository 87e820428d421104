"""Resuming a pretraining run with other optimizer settings (a probe found both): a new
weight decay, betas or eps was announced ("resuming ... with changed settings") and written to
config.toml, while torch's load_state_dict put the checkpoint's values back into the optimizer,
so the steps used the old ones; another optimizer (LAMB's state resumed as AdamW's) ended in a
traceback after config.toml had been rewritten to the new name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _shards import write_synthetic_shards
from test_pretrain import _args  # the tiny run's flags

from bertgpu.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _groups(run: Path, step: int) -> list[dict]:
    state = torch.load(run / "checkpoints" / f"step_{step}" / "train_state.pt",
                       weights_only=True)
    return state["optimizer"]["param_groups"]


def test_a_resume_with_other_optimizer_settings_uses_them(shards, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_args(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "1",
                      "--optim.name", "adamw")) == 0
    assert main(_args(shards, run, "--train.max_steps", "4", "--checkpoint.every_steps", "1",
                      "--optim.name", "adamw", "--optim.weight_decay", "0.5",
                      "--optim.betas", "0.5,0.6", "--optim.eps", "0.01")) == 0
    assert "optim.weight_decay 0.5 (was 0.01)" in capsys.readouterr().out
    decayed = _groups(run, 3)[0]  # the state saved after step 3: the optimizer's own groups
    assert (decayed["weight_decay"], tuple(decayed["betas"]), decayed["eps"]) == (0.5, (0.5, 0.6),
                                                                                  0.01)
    assert _groups(run, 3)[1]["weight_decay"] == 0.0  # biases and LayerNorms: still none
    assert _groups(run, 2)[0]["weight_decay"] == 0.01  # the steps before kept theirs


def test_a_resume_with_another_optimizer_is_one_line_and_changes_nothing(shards, tmp_path,
                                                                          capsys):
    run = tmp_path / "run"
    assert main(_args(shards, run, "--train.max_steps", "2", "--checkpoint.every_steps", "1",
                      "--optim.name", "lamb")) == 0
    config = (run / "config.toml").read_text()
    capsys.readouterr()
    assert main(_args(shards, run, "--train.max_steps", "4", "--optim.name", "adamw")) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"bertgpu pretrain: error: {run / 'checkpoints' / 'step_2'}: the run resumes "
                   "from this checkpoint, whose optimizer state is lamb's, not adamw's; resume "
                   "with --optim.name lamb, or give another --out (--init "
                   f"{run / 'checkpoints' / 'step_2'} continues from its weights with a fresh "
                   "adamw)"), err
    assert (run / "config.toml").read_text() == config
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_1", "step_2"]
