"""A stop signal during an evaluation, in process (the loop's own handler): during the end-of-run
evaluation of a budget run, the run ends as preempted, not as finished; during an evaluation due
mid-run after an earlier one, the resumed run does that evaluation first. A mutation probe found
no test failing when either was broken (the end record said reason "budget", `bertgpu watch`
"finished"; the resumed run skipped the evaluation cut short)."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from test_loop import make_loop

from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def _stop_in_evaluation_at(task, at: int) -> None:
    evaluate = task.evaluate

    def stopped(step, train_loss):
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)  # raises Preempted out of the evaluation
        return evaluate(step, train_loss)

    task.evaluate = stopped


def test_a_stop_in_a_budget_runs_final_evaluation_ends_it_as_preempted(tmp_path):
    run = tmp_path / "run"
    lp, task, _ = make_loop(run, max_steps=0, budget_hours=1e-9)
    _stop_in_evaluation_at(task, 1)  # the budget ends the run after its first step
    res = lp.run()
    assert res.preempted and res.stop_reason == "preempted" and res.exit_status == 143
    assert res.step == 1 and task.evaluated == [] and not task.exported
    end = [r for r in read_metrics(run / "metrics.jsonl") if r.get("event") == "end"]
    assert [(r["step"], r["reason"]) for r in end] == [(1, "preempted")]


def test_an_evaluation_cut_short_after_an_earlier_one_is_done_first_on_resume(tmp_path):
    """Evaluations and checkpoints every 4 steps: the stop comes in the evaluation of step 8,
    whose preemption checkpoint holds step 4's evaluation as the newest done. The resumed run
    evaluates step 8 (with the training loss of steps 5-8) before its first step."""
    run = tmp_path / "run"
    lp, task, _ = make_loop(run, max_steps=12, eval_every=4, checkpoint_every=4)
    _stop_in_evaluation_at(task, 8)
    res = lp.run()
    assert res.preempted and res.step == 8 and [s for s, _ in task.evaluated] == [4]
    state = torch.load(run / "checkpoints" / "step_8" / "train_state.pt", weights_only=True)
    assert state["evaluated_at"] == 4

    again, task, _ = make_loop(run, max_steps=12, eval_every=4, checkpoint_every=4)
    assert again.engine.step == 8
    again.run()
    assert [s for s, _ in task.evaluated] == [8, 12]
    assert task.evaluated[0][1] is not None  # steps 5-8's loss, kept in the checkpoint

