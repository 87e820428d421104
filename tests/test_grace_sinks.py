"""A preemption grace that runs out closes the metric sinks before the process ends, within the
grace (train/preemption.py, telemetry/fanout.py). The process used to end with os._exit and no
close at all: TensorBoard's last records still in memory, the MLflow run left RUNNING, the W&B
run never finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertgpu.telemetry.fanout import SinkFanout, close_reserve_s
from bertgpu.train.preemption import margin, sinks_reserve

ROOT = Path(__file__).resolve().parents[1]

# A run whose step cannot be interrupted (it sleeps in C) when SIGTERM comes: its grace runs out.
# Its sinks: one that hangs in its close (a tracking server that never answers) ahead of one
# that, like TensorBoard's event file, keeps what it got in memory until it is closed.
_CHILD = """
import json, os, signal, sys, time
from pathlib import Path
from bertgpu.telemetry.metrics import MetricsLogger
from bertgpu.telemetry.sinks import end_reason
from bertgpu.train.distributed import DistInfo
from bertgpu.train.preemption import Preemption
# The stop line's hint reads the checkpoints (importing torch, which a training process has
# loaded long before): not what is tested here, and seconds of start-up in this one.
Preemption._hint = lambda self: "hint"

run, grace = Path(sys.argv[1]), float(sys.argv[2])

class Hangs:
    name, close_s = "hangs", 0.5
    def log(self, step, kind, scalars): pass
    def log_config(self, config): pass
    def close(self): time.sleep(60)

class Buffered:
    name, close_s = "buffered", 0.5
    got = []
    def log(self, step, kind, scalars): self.got.append([step, kind, dict(scalars)])
    def log_config(self, config): pass
    def close(self):
        (run / "buffered.json").write_text(json.dumps({"got": self.got, "end": end_reason(run)}))

logger = MetricsLogger(run, True, progress=False, tensorboard=False, sinks=[Hangs(), Buffered()])
logger.log(0, "info", event="start", max_steps=10)
for step in (1, 2, 3):
    logger.log(step, "train", loss=1.0 / step)
p = Preemption(grace, DistInfo(), title="child", run_dir=run)
p.step, p.phase = 3, "in step 4"
p.install()
print(time.monotonic(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
print("not reached", flush=True)
"""


@pytest.mark.timeout(60)
def test_a_grace_that_runs_out_closes_the_sinks_within_it(tmp_path):
    run, grace = tmp_path / "run", 2.0
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(run), str(grace)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # the time just before SIGTERM, on the child's clock
    out, err = proc.communicate(timeout=50)
    ended = time.monotonic()  # CLOCK_MONOTONIC: the same clock in both processes
    assert first, err[-2000:]
    assert proc.returncode == 143 and "not reached" not in out, err[-2000:]
    assert err.strip().splitlines()[-1] == (
        "child: SIGTERM: the grace of 2 s ran out in step 4; stopped without a preemption "
        "checkpoint; hint"), err[-2000:]
    # Within the grace, though one sink never ends its close (reaping the child adds a little).
    assert ended - float(first) < grace + 0.3, ended - float(first)
    # The sink that keeps its records until closed got them all, after the end record that
    # says how the run ended (MLflow's status and W&B's exit code follow it).
    buffered = json.loads((run / "buffered.json").read_text())
    assert [(s, k) for s, k, _ in buffered["got"]] == [(1, "train"), (2, "train"), (3, "train")]
    assert buffered["end"] == ["preempted", ""]


class _Exited(Exception):
    pass


def test_a_grace_that_runs_out_marks_the_mlflow_run_killed(tmp_path, monkeypatch):
    """The MLflow run of a run whose grace ran out stayed RUNNING."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from bertgpu.config.sections import LoggingSection
    from bertgpu.telemetry.run_logger import open_logger
    from bertgpu.train.distributed import DistInfo
    from bertgpu.train.preemption import Preemption

    def fake_exit(status):
        raise _Exited(status)

    monkeypatch.setattr("bertgpu.train.preemption.os._exit", fake_exit)
    monkeypatch.setattr("bertgpu.train.preemption.multiprocessing.active_children", lambda: [])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    cfg = LoggingSection(mlflow=True, tensorboard=False, gpu_monitor_interval_s=0)
    logger = open_logger(run, True, cfg, {"seed": 0}, progress=False)
    for step in (1, 2, 3):
        logger.log(step, "train", loss=1.0 / step)
    p = Preemption(20.0, DistInfo(), title="t", run_dir=run)
    p.step = 3
    try:
        p._note(signal.SIGTERM)
        with pytest.raises(_Exited):
            p._expire()  # what the deadline's thread calls
        p.restore()  # disarms the real deadline
        # Read before the logger is closed: in a real run the process is gone by now.
        run_id = json.loads((run / "sinks.json").read_text())["mlflow_run_id"]
        client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
        found = client.get_run(run_id)
        assert found.info.status == "KILLED" and found.data.tags["end_reason"] == "preempted"
        assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2, 3]
    finally:
        p.restore()
        logger.close()


class _Sink:
    def __init__(self, name: str, log_s: float = 0.0, close_s: float | None = None) -> None:
        self.name, self.log_s, self.calls = name, log_s, []
        self.inside = 0
        self.overlapped = False
        if close_s is not None:
            self.close_s = close_s

    def _enter(self, what: str) -> None:
        self.inside += 1
        self.overlapped |= self.inside > 1
        self.calls.append(what)

    def log(self, step, kind, scalars) -> None:
        self._enter(f"log {step}")
        time.sleep(self.log_s)
        self.inside -= 1

    def log_config(self, config) -> None:
        pass

    def close(self) -> None:
        self._enter("close")
        self.inside -= 1


def test_close_within_returns_in_time_past_a_sink_stuck_in_a_call():
    """A sink stuck in a call (a tracking server that hangs) holds neither the others' close nor
    the caller past its time, and is never called from a second thread meanwhile."""
    stuck, fine = _Sink("stuck", log_s=5.0), _Sink("fine")
    fanout = SinkFanout([stuck, fine])
    fanout.log(1, "train", {"loss": 1.0})
    fanout.log(2, "train", {"loss": 0.5})
    t0 = time.monotonic()
    fanout.close_within(1.0)
    assert time.monotonic() - t0 < 1.5
    assert fine.calls == ["close"]  # step 1 waits behind the stuck sink: dropped, then closed
    assert stuck.calls == ["log 1"] and not stuck.overlapped
    assert fanout.open_sinks() == [stuck]


def test_close_within_delivers_what_is_queued_first():
    a, b = _Sink("a", log_s=0.01), _Sink("b")
    fanout = SinkFanout([a, b])
    for step in range(1, 6):
        fanout.log(step, "train", {"loss": 1.0})
    fanout.close_within(5.0)
    assert a.calls == b.calls == [*(f"log {s}" for s in range(1, 6)), "close"]
    assert fanout.open_sinks() == []


def test_the_grace_keeps_what_the_open_sinks_need_to_close():
    """The deadline comes early enough for the slowest sink's close (they close side by side),
    at most a sixth of the grace; only while some sink is open."""
    base = sinks_reserve(30.0)  # other tests' loggers still open in this process, if any
    fanout = SinkFanout([_Sink("slow", close_s=4.0), _Sink("plain")])
    try:
        assert close_reserve_s() >= 4.0
        assert sinks_reserve(30.0) == max(base, 4.0) and sinks_reserve(6.0) == 1.0
        assert margin(30.0) + sinks_reserve(30.0) < 30.0
    finally:
        fanout.close(timeout_s=5)
    assert fanout.open_sinks() == []
