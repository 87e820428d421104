"""A checkpoint written right after a skipped (non-finite) step: what it keeps of the training
loss since the last evaluation leaves that step out. A mutation probe found no test failing when
the skipped step's NaN was folded into the checkpoint's loss window."""

from __future__ import annotations

import pytest
import torch
from test_loop import make_loop

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_checkpoint_right_after_a_skipped_step_keeps_the_training_loss_finite(tmp_path):
    """Step 4 is non-finite (skipped, not diverged) and checkpointed: the checkpoint's training
    loss since the last evaluation leaves it out, as the run that never stopped does, so the
    resumed run's evaluation at step 8 reads the same finite loss (it read NaN when the skipped
    step's loss was folded in)."""
    def poison_step_4(task) -> None:
        batches = task.micro_batches
        task.micro_batches = lambda s: (
            [{**mb, "poison": torch.tensor(float("nan"))} for mb in batches(s)] if s == 3
            else batches(s))

    ref, task, _ = make_loop(tmp_path / "ref", max_steps=8, eval_every=8, checkpoint_every=4)
    poison_step_4(task)
    ref.run()
    (_, expected), = task.evaluated
    assert expected is not None and expected == expected  # finite

    lp, task, _ = make_loop(tmp_path / "run", max_steps=8, eval_every=8, checkpoint_every=4,
                            crash_at=5)
    poison_step_4(task)
    with pytest.raises(KeyboardInterrupt, match="simulated crash"):
        lp.run()
    again, task, _ = make_loop(tmp_path / "run", max_steps=8, eval_every=8, checkpoint_every=4)
    assert again.engine.step == 4 and again.engine.skipped_steps == 1
    again.run()
    (step, loss), = task.evaluated
    assert step == 8 and loss == pytest.approx(expected, rel=1e-6)
