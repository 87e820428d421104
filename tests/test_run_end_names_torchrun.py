"""The end record of a crash under torchrun with restarts left names torch's agent, as the start
record does: a probe's `torchrun --max-restarts 3` job had `bertgpu watch` say "stopped (error at
step 8 ...)" and leave while torchrun started the job again (`restart_by` read bertgpu's own
launcher's variable only)."""

from __future__ import annotations

import os

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.telemetry.records import RESTART_BY_ENV
from bertgpu.train.run_end import restart_by


@pytest.fixture
def torchrun_with_restarts_left(monkeypatch):
    monkeypatch.delenv(RESTART_BY_ENV, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")


@pytest.mark.usefixtures("torchrun_with_restarts_left")
@pytest.mark.parametrize("error", [RuntimeError("worker crashed"), BertgpuError("bad input")])
def test_a_failure_under_torchrun_names_its_agent(error):
    # torchrun restarts on any failed worker, bad input as well
    assert restart_by(error)["launcher_pid"] == os.getppid()


@pytest.mark.usefixtures("torchrun_with_restarts_left")
def test_a_stop_names_no_launcher():
    assert restart_by(KeyboardInterrupt()) == {}


def test_no_restart_left_names_no_launcher(monkeypatch):
    monkeypatch.delenv(RESTART_BY_ENV, raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert restart_by(RuntimeError("worker crashed")) == {}


def test_bertgpus_launcher_does_not_restart_bad_input(monkeypatch):
    monkeypatch.setenv(RESTART_BY_ENV, f"{os.getpid()} 123")
    assert restart_by(BertgpuError("bad input")) == {}
    assert restart_by(RuntimeError("crash")) == {"launcher_pid": os.getpid(),
                                                 "launcher_pid_started": 123}
