"""The loop's checkpoint cadence beside the step count: checkpoints by wall time
(checkpoint.every_minutes), a save that uses up the budget, the final step's evaluation inside
the checkpoint of that step, and a run that asks for no final checkpoint (fine-tuning without
test predictions). A mutation probe found no test failing when any of these was broken."""

from __future__ import annotations

import types

import pytest
import torch
from test_loop import loss_fn, make_loop

from bertgpu.config.sections import CheckpointSection
from bertgpu.train import loop as loop_mod

pytestmark = pytest.mark.usefixtures("one_thread")


def _steps_of(run) -> list[int]:
    folder = run / "checkpoints"
    if not folder.exists():
        return []
    return sorted(int(p.name.split("_")[1]) for p in folder.iterdir() if p.name.startswith("step_"))


def test_the_final_steps_evaluation_is_in_its_checkpoint_and_not_redone_on_a_rerun(tmp_path):
    """max_steps 6, evaluations every 4, checkpoints every 3: step 6 is evaluated before its
    checkpoint is written, so that checkpoint says so, and the same command run again on the
    finished run evaluates nothing. Evaluated after it (only in the end-of-run code), the
    checkpoint held step 4's evaluation and the re-run evaluated step 6 a second time."""
    run = tmp_path / "run"
    lp, task, _ = make_loop(run, max_steps=6, eval_every=4, checkpoint_every=3)
    lp.run()
    assert [s for s, _ in task.evaluated] == [4, 6]
    state = torch.load(run / "checkpoints" / "step_6" / "train_state.pt", weights_only=True)
    assert state["evaluated_at"] == 6 and state["last_eval"] == {"val_step": 6}

    again, task, _ = make_loop(run, max_steps=6, eval_every=4, checkpoint_every=3)
    assert again.engine.step == 6
    res = again.run()
    assert task.evaluated == [] and res.step == 6 and res.last_eval == {"val_step": 6}


def test_checkpoints_by_wall_time_count_from_the_previous_one(tmp_path, monkeypatch):
    """checkpoint.every_minutes alone (every_steps 0): with a clock that advances 1 s a step and
    a 2.5 s interval, a checkpoint at steps 4 and 8 (the time since the previous one, read at a
    step's start, first reaches 3 s), then the final one at 10. Without the time rule only the
    final one was written; with the interval never restarted, one at every step from 4."""
    now = [0.0]
    monkeypatch.setattr(loop_mod, "time", types.SimpleNamespace(
        monotonic=lambda: now[0], perf_counter=loop_mod.time.perf_counter))
    run = tmp_path / "run"
    lp, task, _ = make_loop(run, max_steps=10)
    lp.ckpt = CheckpointSection(every_steps=0, every_minutes=2.5 / 60)

    def loss(model, batch):  # two micro batches per step: 1 s per step
        now[0] += 0.5
        return loss_fn(model, batch)

    monkeypatch.setattr(task, "loss", loss)
    assert lp.run().step == 10
    assert _steps_of(run) == [4, 8, 10]


def test_a_save_past_the_budget_ends_the_run_at_its_step(tmp_path, monkeypatch):
    """A 100 s budget, 1 s steps, a checkpoint every 5 steps that takes 200 s: the run ends at
    step 5, whose checkpoint used the budget up; one more step (at the lr of the clock before the
    save) and a second checkpoint followed when only evaluations ended the run there."""
    run = tmp_path / "run"
    lp, task, _ = make_loop(run, max_steps=0, budget_hours=100 / 3600, checkpoint_every=5)
    now = [0.0]
    lp.budget.time_fn = lambda: now[0]

    def loss(model, batch):  # two micro batches per step
        now[0] += 0.5
        return loss_fn(model, batch)

    save = lp.save

    def slow_save(*args, **kwargs):
        now[0] += 200.0
        return save(*args, **kwargs)

    monkeypatch.setattr(task, "loss", loss)
    monkeypatch.setattr(lp, "save", slow_save)
    res = lp.run()
    assert res.stop_reason == "budget" and res.step == 5
    assert _steps_of(run) == [5]


def test_a_run_without_a_final_checkpoint_writes_none_at_its_end(tmp_path):
    """final_checkpoint=False (fine-tuning without test predictions: its checkpoints only
    survive preemption): a completed run writes no checkpoint at its end, and its every_steps
    ones still come."""
    lp, _, _ = make_loop(tmp_path / "none", max_steps=4, final_checkpoint=False)
    assert lp.run().step == 4 and _steps_of(tmp_path / "none") == []
    lp, _, _ = make_loop(tmp_path / "every", max_steps=5, checkpoint_every=2,
                         final_checkpoint=False)
    assert lp.run().step == 5 and _steps_of(tmp_path / "every") == [2, 4]
