"""`evaluate_first` (a continued pretraining run's baseline): one evaluation at step 0 of a new
run, before any step, and none when the run resumes from a checkpoint of a later step. A
mutation probe found no test of it at all: evaluating at every start went unnoticed."""

from __future__ import annotations

import pytest
from test_loop import make_loop

from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def _evals(run) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "eval"]


def test_the_baseline_evaluation_comes_once_at_step_0_and_not_after_a_resume(tmp_path):
    run = tmp_path / "run"
    lp, task, _ = make_loop(run, max_steps=4, checkpoint_every=2, crash_at=3,
                            evaluate_first=True)
    with pytest.raises(KeyboardInterrupt, match="simulated crash"):
        lp.run()
    assert task.evaluated == [(0, None)]  # no training loss before the first step
    assert _evals(run) == [0]

    again, task, _ = make_loop(run, max_steps=4, checkpoint_every=2, evaluate_first=True)
    assert again.engine.step == 2
    res = again.run()
    assert [s for s, _ in task.evaluated] == [4] and res.last_eval == {"val_step": 4}
    assert _evals(run) == [0, 4]
