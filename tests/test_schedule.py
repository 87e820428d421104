"""lr(progress) shapes at their key points, monotonicity, and the budget clock."""

from __future__ import annotations

import math

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.train.schedule import (
    BudgetClock,
    Schedule,
    lr_factor,
    progress_from_steps,
    warmup_fraction,
)


@pytest.mark.parametrize(
    ("decay", "middle"),
    [
        ("linear", 0.5 + 0.5 * 0.5),  # halfway through the decay: 1 - 0.5 over (1 - min)
        ("triangle", 0.75),
        ("one-cycle", 0.75),
        ("cosine", 0.5 + 0.5 * 0.5 * (1 + math.cos(math.pi * 0.5))),
        ("polynomial", 0.5 + 0.5 * 0.5**2),
        ("constant", 1.0),
    ],
)
def test_key_points(decay, middle):
    warm, mn = 0.2, 0.5
    f = lambda p: lr_factor(p, warm, decay, min_ratio=mn, power=2.0)  # noqa: E731
    assert f(0.0) == 0.0
    assert f(0.1) == pytest.approx(0.5)  # halfway through warm-up
    assert f(warm) == pytest.approx(1.0)  # peak at the end of warm-up
    assert f(warm + (1 - warm) / 2) == pytest.approx(middle)
    assert f(1.0) == pytest.approx(1.0 if decay == "constant" else mn)
    assert f(1.5) == f(1.0) and f(-0.1) == 0.0  # clamped


@pytest.mark.parametrize("decay", ["linear", "cosine", "polynomial", "triangle", "constant"])
def test_monotone(decay):
    ps = [i / 200 for i in range(201)]
    vals = [lr_factor(p, 0.1, decay, min_ratio=0.1, power=1.5) for p in ps]
    peak = vals.index(max(vals))
    assert ps[peak] == pytest.approx(0.1)
    assert all(a <= b + 1e-12 for a, b in zip(vals[:peak], vals[1 : peak + 1], strict=True))
    assert all(a >= b - 1e-12 for a, b in zip(vals[peak:-1], vals[peak + 1 :], strict=True))


def test_no_warmup_and_full_warmup():
    assert lr_factor(0.0, 0.0, "linear") == 1.0
    assert lr_factor(1.0, 0.0, "cosine") == pytest.approx(0.0)
    assert lr_factor(0.5, 1.0, "linear") == pytest.approx(0.5)
    assert (lr_factor(0.5, 0.5, "polynomial", power=1.0)
            == pytest.approx(lr_factor(0.5, 0.5, "linear")))
    with pytest.raises(BertgpuError, match="schedule.decay"):
        lr_factor(0.5, 0.1, "exponential")


def test_progress_and_warmup_fraction():
    assert progress_from_steps(0, 100) == 0.0
    assert progress_from_steps(25, 100) == 0.25
    assert progress_from_steps(200, 100) == 1.0
    assert warmup_fraction(10, 0.5, 100) == 0.1
    assert warmup_fraction(None, 0.05, 100) == 0.05


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_budget_clock_progress_and_resume():
    t = FakeTime()
    clock = BudgetClock(100.0, time_fn=t)
    clock.start()
    t.now += 25
    clock.sync()
    assert clock.progress() == pytest.approx(0.25) and not clock.expired()
    clock.pause()
    t.now += 1000  # paused time (e.g. evaluation excluded from the budget) does not count
    clock.start()
    t.now += 25
    assert not clock.expired()
    assert clock.progress() == pytest.approx(0.5)
    saved = clock.state_dict()

    # Resume in a "new process": the budget continues where it stopped.
    t2 = FakeTime()
    t2.now = 5.0
    resumed = BudgetClock(100.0, time_fn=t2)
    resumed.load_state_dict(saved)
    resumed.start()
    assert resumed.progress() == pytest.approx(0.5)
    t2.now += 49
    assert not resumed.expired()
    t2.now += 1
    assert resumed.expired() and resumed.progress() == 1.0
    with pytest.raises(BertgpuError):
        BudgetClock(0.0)


def test_wsd_shape():
    """Warm-up, a flat peak, then 1 - sqrt over the last decay_fraction down to min_ratio."""
    f = lambda p, **kw: lr_factor(p, 0.1, "wsd", min_ratio=0.2, decay_fraction=0.25, **kw)  # noqa: E731
    assert f(0.05) == pytest.approx(0.5)  # halfway through warm-up
    assert f(0.1) == f(0.4) == f(0.75) == 1.0  # stable until 1 - decay_fraction
    for u in (0.1, 0.25, 0.5, 0.9):  # u: fraction of the decay phase done
        assert f(0.75 + 0.25 * u) == pytest.approx(0.2 + 0.8 * (1 - math.sqrt(u)))
    assert f(1.0) == pytest.approx(0.2)
    ps = [0.75 + i / 400 for i in range(101)]
    vals = [f(p) for p in ps]
    # strictly decreasing when decaying
    assert all(a > b for a, b in zip(vals[:-1], vals[1:], strict=True))
    # 1 - sqrt falls fastest at the start of the decay: below the straight line throughout
    assert all(v < 1 - 0.8 * i / 100 for i, v in enumerate(vals) if 0 < i < 100)


def test_wsd_decay_never_eats_the_warmup():
    # decay_fraction 0.8 would start the decay at 0.2, inside a 0.3 warm-up: it starts at 0.3
    assert lr_factor(0.3, 0.3, "wsd", decay_fraction=0.8) == 1.0
    assert lr_factor(0.65, 0.3, "wsd", decay_fraction=0.8) == pytest.approx(1 - math.sqrt(0.5))
    assert lr_factor(0.9, 0.0, "wsd", decay_fraction=0.0) == 1.0  # no decay phase: flat to the end
    assert lr_factor(0.5, 0.0, "wsd", decay_fraction=1.0) == pytest.approx(1 - math.sqrt(0.5))


def test_schedule_carries_the_wsd_decay_fraction():
    sched = Schedule(peak_lr=2.0, decay="wsd", warmup_fraction=0.1, max_steps=100,
                     decay_fraction=0.5)
    assert sched.lr(0.4, 40) == 2.0
    assert sched.lr(0.75, 75) == pytest.approx(2.0 * (1 - math.sqrt(0.5)))
