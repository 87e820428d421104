"""Budget mode: an evaluation (or a save, or the first step's compile) that uses up the budget
ends the run there.

The loop stops when the agreed clock says the budget is spent, and the clock was agreed only on
the steps' all-reduce, from a reading taken at a step's start: an evaluation that ran past the
budget was followed by one more optimizer step at the lr of the clock before it (20-77% of the
peak in a probe's runs, where the schedule was at 0) and a second, final evaluation.
"""

from __future__ import annotations

import pytest
import torch
from test_loop import loss_fn, make_loop

from bertgpu.config.sections import ImplSection

pytestmark = pytest.mark.usefixtures("one_thread")


def _fake_clock(lp, task, monkeypatch, step_s: float, eval_s: float):
    """The budget's clock advances ``step_s`` each step and ``eval_s`` each evaluation."""
    now = [0.0]
    lp.budget.time_fn = lambda: now[0]

    def loss(model, batch):  # two micro batches per step
        now[0] += step_s / 2
        return loss_fn(model, batch)

    evaluate = task.evaluate

    def slow_evaluate(step, train_loss):
        now[0] += eval_s
        return evaluate(step, train_loss)

    monkeypatch.setattr(task, "loss", loss)
    monkeypatch.setattr(task, "evaluate", slow_evaluate)


def test_an_evaluation_past_the_budget_ends_the_run_at_its_step(tmp_path, monkeypatch):
    lp, task, _ = make_loop(tmp_path / "run", max_steps=0, budget_hours=100 / 3600,
                            eval_every=5)
    _fake_clock(lp, task, monkeypatch, step_s=1.0, eval_s=200.0)
    res = lp.run()
    assert res.stop_reason == "budget"
    assert res.step == 5  # old code: 6, its lr from the clock before the evaluation
    assert [s for s, _ in task.evaluated] == [5]  # old code: [5, 6]


def test_a_first_step_that_uses_up_the_budget_is_the_last(tmp_path, monkeypatch):
    """The first step of a compiled run compiles: minutes, in a budget of less."""
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend="eager"))
    torch._dynamo.reset()
    lp, task, _ = make_loop(tmp_path / "run", max_steps=0, budget_hours=100 / 3600,
                            impl=ImplSection(compile=True))
    now = [0.0]
    lp.budget.time_fn = lambda: now[0]

    def loss(model, batch):  # the first step takes 150 s, the others 1 s
        now[0] += 75.0 if not task.stepped else 0.5
        return loss_fn(model, batch)

    task.stepped = False
    take_step = lp._train_step

    def step(*args, **kwargs):
        res = take_step(*args, **kwargs)
        task.stepped = True
        return res

    monkeypatch.setattr(task, "loss", loss)
    monkeypatch.setattr(lp, "_train_step", step)
    try:
        res = lp.run()
    finally:
        torch._dynamo.reset()
    assert res.stop_reason == "budget" and res.step == 1  # old code: 2
