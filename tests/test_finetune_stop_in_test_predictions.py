"""A stop (SIGTERM, Ctrl-C) while `finetune --predict-test` predicts the test set keeps the
finished training: the same command resumes at its last step, trains nothing and writes the
predictions. The test predictions come after the loop, and fine-tuning wrote no checkpoint at
its end: the stop left OUT.tmp with model/ and metrics.jsonl only, and the re-run trained again
from step 0 (hours for every MNLI or QQP seed of `glue --predict-test`)."""

from __future__ import annotations

import json

import pytest
from test_finetune import FAST, sst2_fixture, tiny_init

from bertgpu.errors import Terminated
from bertgpu.finetune import finetune
from bertgpu.tasks import glue
from bertgpu.tasks.finetuning import FinetuneTask

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("stop", [Terminated, KeyboardInterrupt])
def test_a_stop_in_the_test_predictions_keeps_the_training(tmp_path, monkeypatch, stop):
    init = tiny_init(tmp_path)
    sst2_fixture(tmp_path / "glue" / "SST-2", n_train=64, n_dev=16)
    args = [*FAST, "--epochs", "2"]  # 4 steps an epoch
    out, work = tmp_path / "ft", tmp_path / "ft.tmp"

    def stopped(*args, **kwargs):
        raise stop()

    monkeypatch.setattr(glue, "write_glue_submission", stopped)
    with pytest.raises(stop):
        finetune("sst2", tmp_path / "glue", init, out, overrides=args, predict_test=True)
    assert (work / "model").is_dir() and not out.exists()
    # old code: no checkpoints/ in OUT.tmp, so the re-run trained from step 0
    assert [p.name for p in (work / "checkpoints").iterdir()] == ["step_8"]
    monkeypatch.undo()

    def trained(self, step):
        raise AssertionError(f"step {step} trained again")

    monkeypatch.setattr(FinetuneTask, "micro_batches", trained)
    res = finetune("sst2", tmp_path / "glue", init, out, overrides=args, predict_test=True)
    assert res["steps"] == 8 and [e["epoch"] for e in res["epochs"]] == [1, 2], res
    assert (out / "submission" / "SST-2.tsv").read_text().count("\n") == 1 + 6
    assert json.loads((out / "results.json").read_text()) == res
    assert not work.exists() and not (out / "checkpoints").exists()


def test_a_run_without_test_predictions_writes_no_final_checkpoint(tmp_path, monkeypatch):
    """The final checkpoint is for the test predictions only: a run without them is finished
    once its model is exported."""
    from bertgpu.train import loop

    init = tiny_init(tmp_path)
    sst2_fixture(tmp_path / "glue" / "SST-2", n_train=64, n_dev=16)
    saved = []
    save = loop.Loop.save
    monkeypatch.setattr(loop.Loop, "save", lambda self, *a, **k: saved.append(1) or save(
        self, *a, **k))
    finetune("sst2", tmp_path / "glue", init, tmp_path / "ft", overrides=[*FAST, "--epochs", "1"])
    assert saved == []
