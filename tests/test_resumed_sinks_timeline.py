"""A resumed run's TensorBoard holds each step once, as its metrics.jsonl does: the
process that died had logged steps past the checkpoint the run resumed from, and the resumed
run goes through them again (a probe read train/loss at steps 25 and 30 twice)."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import pytest

from bertgpu.telemetry.metrics import MetricsLogger
from bertgpu.telemetry.records import read_metrics

CHECKPOINT = 20  # the step the second process resumes from


def _process(logger: MetricsLogger, steps: range, tokens_per_s: float) -> None:
    """Train records every 5 steps, an evaluation every 10: the loss is the step's own (the
    same in both processes, as after an exact resume), the rate this process's."""
    for step in steps:
        logger.log(step, "train", loss=10.0 / step, tokens_per_s=tokens_per_s + step)
        if step % 10 == 0:
            logger.log(step, "eval", val_mlm_loss=5.0 / step)
    logger.close()


def _died_and_resumed(run: Path, make_logger) -> None:
    """The first process logs steps 5-30 and dies (at step 33); the second resumes from the
    step-20 checkpoint and runs to step 40."""
    _process(make_logger(0), range(5, 31, 5), tokens_per_s=1000.0)
    _process(make_logger(CHECKPOINT), range(25, 41, 5), tokens_per_s=2000.0)
    train = [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert train == list(range(5, 41, 5))  # the file held each step once before this fix too


# --------------------------------------------------------------------------------------------
# TensorBoard: the resumed writer purges the earlier events of the steps it goes through again
# --------------------------------------------------------------------------------------------


def test_a_resumed_run_s_tensorboard_writer_purges_the_steps_after_its_checkpoint(
        tmp_path, monkeypatch):
    """What the sink asks of TensorBoard's writer, with a stand-in (tensorboard is optional):
    readers drop the earlier events from the step after the checkpoint on; a folder without
    events (a new run) gets no purge."""
    opened: list[dict] = []

    class Writer:
        def __init__(self, **kwargs):
            opened.append(kwargs)
            folder = Path(kwargs["log_dir"])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"events.out.tfevents.{len(opened)}").touch()  # as the real one does

        def add_scalar(self, tag, value, global_step):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard",
                        types.SimpleNamespace(SummaryWriter=Writer))
    run = tmp_path / "run"
    _died_and_resumed(run, lambda step: MetricsLogger(run, True, initial_step=step,
                                                      stream=io.StringIO()))
    assert opened == [{"log_dir": str(run / "tensorboard")},
                      {"log_dir": str(run / "tensorboard"), "purge_step": CHECKPOINT + 1}]
    # Killed before its first checkpoint and started again: all its steps go, as in the file.
    MetricsLogger(run, True, initial_step=0, stream=io.StringIO()).close()
    assert opened[-1]["purge_step"] == 1


def test_tensorboard_readers_see_each_step_of_a_resumed_run_once(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    _died_and_resumed(run, lambda step: MetricsLogger(run, True, initial_step=step,
                                                      stream=io.StringIO()))
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    loss = [(e.step, e.value) for e in events.Scalars("train/loss")]
    assert [s for s, _ in loss] == list(range(5, 41, 5))
    assert [s for s, _ in loss] == sorted(s for s, _ in loss)
    assert [e.step for e in events.Scalars("eval/val_mlm_loss")] == [10, 20, 30, 40]
    rate = {e.step: e.value for e in events.Scalars("train/tokens_per_s")}
    assert (rate[20], rate[25], rate[30]) == (1020.0, 2025.0, 2030.0)  # as metrics.jsonl
