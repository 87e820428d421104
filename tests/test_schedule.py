"""lr(progress) shapes at their key points, monotonicity, and the budget clock; the decay over the
whole run (schedule.decay_span) against NVIDIA's and BERT TF's schedules; budget mode's warm-up."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from bertgpu.config.render import dump_toml
from bertgpu.config.schema import load_config
from bertgpu.errors import BertgpuError
from bertgpu.train.schedule import (
    BudgetClock,
    Schedule,
    lr_factor,
    progress_from_steps,
    warmup_fraction,
)

ROOT = Path(__file__).resolve().parents[1]


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


# --- schedule.decay_span: NVIDIA's and BERT TF's decay over the whole run -----------------------


def nvidia_poly_warmup_lr(base_lr: float, warmup: float, total_steps: int, degree: float,
                          step: int) -> float:
    """NVIDIA DeepLearningExamples' BERT `PolyWarmUpScheduler.get_lr` (PyTorch/LanguageModeling/
    BERT/schedulers.py), the lr of optimizer step `step` (0-based, at progress step / total_steps
    as our convention): a linear warm-up, then (1 - progress) ** degree over the WHOLE run."""
    progress = step / total_steps
    if progress < warmup:
        return base_lr * progress / warmup
    return base_lr * (1.0 - progress) ** degree


def bert_tf_lr(init_lr: float, num_train_steps: int, num_warmup_steps: int, step: int,
               power: float = 1.0, end_lr: float = 0.0) -> float:
    """BERT's TF optimization.py `create_optimizer`: tf.train.polynomial_decay(init_lr,
    global_step, num_train_steps, end_learning_rate, power, cycle=False), then the linear warm-up
    replaces it while global_step < num_warmup_steps."""
    done = min(step, num_train_steps) / num_train_steps
    lr = (init_lr - end_lr) * (1.0 - done) ** power + end_lr
    if step < num_warmup_steps:
        lr = init_lr * step / num_warmup_steps
    return lr


@pytest.mark.parametrize(("warmup", "steps"), [(0.2843, 7038), (0.128, 1563), (0.2843, 50)])
def test_whole_run_polynomial_is_nvidias_poly_warmup_scheduler(warmup, steps):
    """The recipes' schedule (warm-up 0.2843 or 0.128, power 0.5) at every step of a run. With
    the decay over the post-warm-up fraction the bert-base recipe's mean lr was 13% above
    NVIDIA's."""
    s = Schedule(peak_lr=6e-3, decay="polynomial", warmup_fraction=warmup, max_steps=steps,
                 power=0.5, decay_span="whole_run")
    ours = [s.lr(k / steps, k) for k in range(steps)]
    ref = [nvidia_poly_warmup_lr(6e-3, warmup, steps, 0.5, k) for k in range(steps)]
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-18)
    end = math.ceil(warmup * steps)  # the first step past the warm-up: down from the peak
    assert ours[end] == pytest.approx(6e-3 * (1 - warmup) ** 0.5, rel=0.02)


@pytest.mark.parametrize(("decay", "min_ratio"), [("linear", 0.0), ("polynomial", 0.0),
                                                  ("linear", 0.1), ("polynomial", 0.1)])
def test_whole_run_linear_is_bert_tf_optimization(decay, min_ratio):
    """BERT's TF schedule (power 1, warm-up of num_warmup_steps, end lr min_ratio x init lr)."""
    steps, warm = 100, 10
    s = Schedule(peak_lr=1e-4, decay=decay, warmup_steps=warm, max_steps=steps,
                 min_lr_ratio=min_ratio, decay_span="whole_run")
    ours = [s.lr(k / steps, k) for k in range(steps)]
    ref = [bert_tf_lr(1e-4, steps, warm, k, end_lr=min_ratio * 1e-4) for k in range(steps)]
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-18)


def test_whole_run_cosine_and_the_default_span():
    """Cosine over the whole run is the half cosine of progress past the warm-up; the default
    (after_warmup) still starts each decay at 1 when the warm-up ends."""
    for p in (0.2, 0.5, 0.9, 1.0):
        assert lr_factor(p, 0.2, "cosine", span="whole_run") == pytest.approx(
            0.5 * (1 + math.cos(math.pi * p)))
        assert lr_factor(p, 0.2, "polynomial", power=0.5) == pytest.approx(
            (1 - (p - 0.2) / 0.8) ** 0.5)
    assert lr_factor(0.1, 0.2, "cosine", span="whole_run") == pytest.approx(0.5)  # warm-up
    assert lr_factor(0.5, 1.0, "linear", span="whole_run") == pytest.approx(0.5)  # all warm-up


@pytest.mark.parametrize("decay", ["constant", "wsd", "triangle", "one-cycle"])
def test_whole_run_is_refused_where_it_means_nothing(decay):
    with pytest.raises(BertgpuError, match=r"^command line: schedule\.decay_span = 'whole_run': "
                                           r"expected after_warmup with schedule\.decay"):
        load_config(None, ["--schedule.decay", decay, "--schedule.decay_span", "whole_run"])
    with pytest.raises(BertgpuError, match=r"schedule\.decay_span"):
        lr_factor(0.5, 0.1, decay, span="whole_run")
    assert load_config(None, ["--schedule.decay", decay]).schedule.decay_span == "after_warmup"


def test_an_unknown_decay_span_is_refused():
    with pytest.raises(BertgpuError, match=r"^command line: schedule\.decay_span = 'whole': "
                                           r"expected one of after_warmup, whole_run$"):
        load_config(None, ["--schedule.decay_span", "whole"])


@pytest.mark.parametrize("name", ["bert-base", "bert-large", "bert-base-phase2"])
def test_nvidia_recipes_decay_over_the_whole_run_and_round_trip(name, tmp_path):
    """The three recipes that present NVIDIA's schedule use it, and a config.toml written from
    them (render.dump_toml, as a run folder's) reads back to the same schedule."""
    cfg = load_config(str(ROOT / "configs" / f"{name}.toml"), [])
    s = cfg.schedule
    assert (s.decay, s.power, s.decay_span) == ("polynomial", 0.5, "whole_run")
    path = tmp_path / "config.toml"
    path.write_text(dump_toml(cfg), encoding="utf-8")
    assert 'decay_span = "whole_run"' in path.read_text(encoding="utf-8")
    assert load_config(str(path), []).schedule == s
    default = load_config(None, [])
    path.write_text(dump_toml(default), encoding="utf-8")
    assert load_config(str(path), []).schedule.decay_span == "after_warmup"


# --- budget mode's warm-up in steps: the ramp of step mode ---------------------------------------


@pytest.mark.parametrize("warm", [1, 4, 10])
def test_budget_and_step_mode_warmups_give_the_same_lr_per_step(warm):
    """Step k of the ramp runs at k / warmup_steps of the peak in both modes (the first at 0, step
    warmup_steps at the peak). Budget mode ran one step ahead: (k + 1) / W, so its first step ran
    at lr / W and warmup_steps 1 was no warm-up at all."""
    steps = Schedule(peak_lr=1.0, decay="constant", warmup_steps=warm, max_steps=100)
    budget = Schedule(peak_lr=1.0, decay="constant", warmup_steps=warm, max_steps=100,
                      budget_mode=True)
    for k in range(warm + 2):
        want = min(k / warm, 1.0)
        assert steps.lr(k / 100, k) == pytest.approx(want)
        assert budget.lr(0.3, k) == pytest.approx(want)  # the clock is anywhere: constant decay
    linear = dataclasses.replace(budget, decay="linear")
    assert [linear.lr(0.0, k) for k in range(warm + 1)] == pytest.approx(
        [steps.lr(k / 100, k) for k in range(warm + 1)])


def test_a_checkpoint_holds_the_budget_clock_at_the_save_not_at_the_last_agreement():
    """The loop agrees the clock at the start of each step; the step, an evaluation and the save
    after it count too. A checkpoint that held the agreed value lost them on every resume (a
    run killed after a long evaluation trained past its budget)."""
    t = FakeTime()
    clock = BudgetClock(100.0, time_fn=t)
    clock.start()
    t.now += 20
    clock.agree(clock.read())  # the step's agreement
    t.now += 7  # the step, its evaluation, the save
    assert clock.progress() == pytest.approx(0.20)  # the lr still follows the agreed value
    assert clock.state_dict()["elapsed_s"] == pytest.approx(27.0)
    clock.pause()
    assert clock.state_dict()["elapsed_s"] == pytest.approx(27.0)
