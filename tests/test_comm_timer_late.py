"""The DDP all-reduce timer reads a step's CUDA events one step late, not at the end of the
step: waiting for them made the host wait for the step's backward and all-reduce every step.
No GPU here: stand-in events with a clock, which record which ones were waited for."""

from __future__ import annotations

import pytest
import torch

from bertgpu.train.distributed import CommTimer


class FakeEvent:
    clock = 0.0
    waited: list[FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = None

    def record(self) -> None:
        self.at = FakeEvent.clock

    def synchronize(self) -> None:
        FakeEvent.waited.append(self)

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.at - self.at) * 1000.0  # ms


@pytest.fixture
def timer(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.clock, FakeEvent.waited = 0.0, []
    return CommTimer(torch.device("cuda", 0))


def _step(timer: CommTimer, start: float, exposed: float) -> list[FakeEvent]:
    """One synchronising backward: two buckets ready at `start`, `start + 1`; the last
    all-reduce done `exposed` s after the last bucket was ready."""
    events = []
    for ready, done in ((start, start + 0.5), (start + 1, start + 1 + exposed)):
        FakeEvent.clock = ready
        timer._ready.append(timer._now())
        FakeEvent.clock = done
        timer._done.append(timer._now())
        events.append(timer._done[-1])
    return events


def test_a_steps_events_are_waited_for_one_step_late(timer):
    first = _step(timer, 0.0, 0.25)
    assert timer.pop_step() == 0.0
    assert FakeEvent.waited == []  # the host goes on to queue the next step
    second = _step(timer, 10.0, 0.5)
    assert timer.pop_step() == pytest.approx(0.25)  # the first step's, complete by now
    assert set(FakeEvent.waited) <= set(first)
    # a log step settles what is kept: the window's sum is exact
    assert timer.settle() == pytest.approx(0.5)
    assert set(FakeEvent.waited) <= set(first) | set(second)
    assert timer.settle() == 0.0 and timer.pop_step() == 0.0


def test_the_cpu_timer_answers_at_once():
    timer = CommTimer(torch.device("cpu"))
    timer._ready += [1.0, 2.0]
    timer._done += [1.5, 2.75]
    assert timer.pop_step() == pytest.approx(0.75) and timer.settle() == 0.0
