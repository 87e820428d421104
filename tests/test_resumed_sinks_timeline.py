"""A resumed run's TensorBoard and MLflow hold each step once, as its metrics.jsonl does: the
process that died had logged steps past the checkpoint the run resumed from, and the resumed
run goes through them again (a probe read train/loss at steps 25 and 30 twice in both)."""

from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import pytest

from bertgpu.config.sections import LoggingSection
from bertgpu.telemetry.metrics import MetricsLogger
from bertgpu.telemetry.records import read_metrics
from bertgpu.telemetry.run_logger import open_logger
from bertgpu.telemetry.sinks import MlflowSink

CONFIG = {"model": {"hidden_size": 32}, "train": {"max_steps": 40}}
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
# MLflow: points cannot be deleted, so the steps an earlier process logged are not logged again
# --------------------------------------------------------------------------------------------


@pytest.fixture
def mlflow_store(monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return LoggingSection(mlflow=True, mlflow_experiment="tests", tensorboard=False,
                          gpu_monitor_interval_s=0)


def _history(run: Path, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    (found,) = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
    return sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, key))


def test_a_resumed_mlflow_run_holds_each_step_once(tmp_path, mlflow_store):
    run = tmp_path / "run"
    _died_and_resumed(run, lambda step: open_logger(run, True, mlflow_store, CONFIG,
                                                    stream=io.StringIO(), initial_step=step))
    loss = _history(run, "train/loss")
    assert [s for s, _ in loss] == list(range(5, 41, 5))
    assert [v for _, v in loss] == pytest.approx([10.0 / s for s in range(5, 41, 5)])
    assert [s for s, _ in _history(run, "eval/val_mlm_loss")] == [10, 20, 30, 40]
    # Steps 25 and 30 keep the rates the first process measured; the resumed run's follow.
    rate = dict(_history(run, "train/tokens_per_s"))
    assert (rate[25], rate[30], rate[35], rate[40]) == (1025.0, 1030.0, 2035.0, 2040.0)


def test_a_resumed_mlflow_run_logs_what_the_earlier_process_did_not_get_to(tmp_path,
                                                                          mlflow_store):
    """Sinks log on a background thread: the process that died may have written step 30 to
    metrics.jsonl but not yet to MLflow. Each metric goes on after its own last step."""
    run = tmp_path / "run"
    first = MlflowSink(run, mlflow_store)
    for step in range(5, 31, 5):
        first.log(step, "train", {"loss": 10.0 / step, **({"lr": 0.1} if step <= 25 else {})})
    resumed = MlflowSink(run, mlflow_store)
    assert resumed.run_id == first.run_id and resumed.resumed
    for step in range(25, 41, 5):
        resumed.log(step, "train", {"loss": 10.0 / step, "lr": 0.2})
    resumed.close()
    assert [s for s, _ in _history(run, "train/loss")] == list(range(5, 41, 5))
    assert _history(run, "train/lr") == [(s, 0.1) for s in range(5, 26, 5)] + [
        (30, 0.2), (35, 0.2), (40, 0.2)]


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
