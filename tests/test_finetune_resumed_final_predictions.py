"""A budget run stopped after the checkpoint of its final evaluation and before its export
(a SIGKILL there, here an error) is finished by the same command with the prediction files an
uninterrupted run writes. They come from the final evaluation, which the checkpoint does not
hold: the resumed run, with nothing left to train or evaluate, exported the model and wrote no
predictions.json (nor null_odds.json, predictions.conll)."""

from __future__ import annotations

import json

import pytest
from test_finetune import FAST, squad_fixture, tiny_init

from bertgpu.finetune import finetune
from bertgpu.tasks.finetuning import FinetuneTask

pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(Exception):
    """Stands for the SIGKILL: the run ends where it is raised, its OUT.tmp as it was."""


def test_a_run_killed_before_its_export_writes_the_predictions_when_resumed(tmp_path,
                                                                              monkeypatch):
    init = tiny_init(tmp_path)
    squad = tmp_path / "squad"
    squad.mkdir()
    squad_fixture(squad / "train-v1.1.json", 32, 0)
    squad_fixture(squad / "dev-v1.1.json", 12, 1)
    # Batch 64: step 1 ends epoch 1 of 2, evaluated and then checkpointed; the budget ends there.
    args = [*FAST, "--epochs", "2", "--global_batch_size", "64", "--max_seq_len", "48",
            "--doc_stride", "16", "--budget_hours", "1e-9", "--checkpoint_every_steps", "1"]
    whole = finetune("squad", squad, init, tmp_path / "whole", overrides=args)
    assert whole["steps"] == 1, whole

    out = tmp_path / "ft"

    def killed(self, step):
        raise Killed

    monkeypatch.setattr(FinetuneTask, "export", killed)
    with pytest.raises(Killed):
        finetune("squad", squad, init, out, overrides=args)
    work = tmp_path / "ft.tmp"
    assert (work / "checkpoints" / "step_1").is_dir() and not (work / "predictions.json").exists()
    monkeypatch.undo()

    res = finetune("squad", squad, init, out, overrides=args)
    assert res["steps"] == 1 and res["metrics"] == whole["metrics"], res
    files = sorted(p.name for p in (tmp_path / "whole").iterdir() if p.suffix != ".jsonl")
    assert sorted(p.name for p in out.iterdir() if p.suffix != ".jsonl") == files
    # old code: no predictions.json
    preds = json.loads((out / "predictions.json").read_text())
    assert preds == json.loads((tmp_path / "whole" / "predictions.json").read_text())
