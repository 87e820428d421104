"""A fine-tuning that its budget (--budget_hours) ends before its last step writes the prediction
files of the model it ends with, as a run to its last step does. They were written only at the
last step: a budget run reported its final EM/F1 in results.json with no predictions.json (nor
SQuAD v2.0's null_odds.json), so the official evaluation script could not be run on it."""

from __future__ import annotations

import json

import pytest
from test_finetune import FAST, squad_fixture, tiny_init

from bertgpu.finetune import finetune

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("global_batch", ["16", "64"])
def test_a_budget_stop_writes_the_final_predictions(tmp_path, global_batch):
    """Batch 16: the budget ends the run after step 1 of 4 and the final evaluation is the
    loop's; batch 64: step 1 ends epoch 1 of 2, whose evaluation is the last one."""
    init = tiny_init(tmp_path)
    squad = tmp_path / "squad"
    squad.mkdir()
    squad_fixture(squad / "train-v1.1.json", 32, 0)
    squad_fixture(squad / "dev-v1.1.json", 12, 1)
    out = tmp_path / "ft"
    res = finetune("squad", squad, init, out,
                   overrides=[*FAST, "--epochs", "2", "--global_batch_size", global_batch,
                              "--max_seq_len", "48", "--doc_stride", "16",
                              "--budget_hours", "1e-9"])
    assert res["steps"] == 1, res  # stopped by the budget
    preds = json.loads((out / "predictions.json").read_text())  # old code: no such file
    assert len(preds) == 12 and all(isinstance(v, str) for v in preds.values())
