"""max_nonfinite_steps counts non-finite steps in a row: a finite step starts the count again, so
scattered skipped steps (5 in 10 here, at most 2 in a row) never end a run as diverged. A mutation
probe found no test failing when the count was never reset."""

from __future__ import annotations

import pytest
import torch
from test_loop import make_loop

from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def test_scattered_non_finite_steps_are_skipped_without_ending_the_run(tmp_path):
    lp, task, _ = make_loop(tmp_path / "run", max_steps=10, log_every=10)
    batches = task.micro_batches
    poisoned = {1, 2, 4, 5, 7}  # steps 2, 3, 5, 6 and 8: never more than 2 in a row
    task.micro_batches = lambda s: (
        [{**mb, "poison": torch.tensor(float("nan"))} for mb in batches(s)] if s in poisoned
        else batches(s))
    res = lp.run()
    assert res.step == 10 and res.stop_reason == "max_steps"
    assert lp.engine.skipped_steps == 5
    end = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "end"]
    assert [r["reason"] for r in end] == ["max_steps"]
