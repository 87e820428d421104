"""The one training loop with a toy task: cadence, exact resume, budget stop, schedule; and the
fine-tuning conveniences it brings (mid-run checkpoints that resume bitwise, budget_hours)."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import pytest
import torch
from _toy import ToyPretrain, count_fn, loss_fn, make_batch, split

from bertgpu.config.sections import (
    CheckpointSection,
    DistributedSection,
    ImplSection,
    LoggingSection,
    OptimSection,
    ScheduleSection,
    TrainSection,
)
from bertgpu.telemetry.records import read_metrics
from bertgpu.train import loop as loop_mod
from bertgpu.train.checkpoint import load_resume
from bertgpu.train.distributed import DistInfo
from bertgpu.train.engine import TrainingDiverged, build_engine
from bertgpu.train.schedule import Schedule

pytestmark = pytest.mark.usefixtures("one_thread")


class ToyTask:
    """Step s trains on make_batch(8, s) in two micro batches; evaluation reports the step."""

    def __init__(self, model: torch.nn.Module, crash_at: int | None = None) -> None:
        self.model, self.crash_at = model, crash_at
        self.evaluated: list[tuple[int, float | None]] = []
        self.exported = False

    def micro_batches(self, step):
        if step == self.crash_at:
            raise KeyboardInterrupt("simulated crash")
        return split(make_batch(8, step), 2)

    loss = staticmethod(loss_fn)

    def counts(self, batch):
        return {**count_fn(batch), "tokens": batch["input_ids"].numel(),
                "sequences": batch["input_ids"].shape[0]}

    def log_scalars(self, res):
        return {"toy": 1}

    def evaluate(self, step, train_loss):
        self.evaluated.append((step, train_loss))
        return {"val_step": step}

    def state_dict(self):
        return {"toy_state": 7}

    def load_state_dict(self, state):
        assert state["toy_state"] == 7

    def export(self, step):
        self.exported = True
        return None

    def close(self):
        pass


def make_loop(run_dir: Path, max_steps: int = 6, crash_at: int | None = None, eval_every: int = 0,
              checkpoint_every: int = 0, budget_hours: float | None = None,
              impl: ImplSection | None = None, log_every: int = 2, **settings):
    torch.manual_seed(0)
    model = ToyPretrain()
    info = DistInfo()
    train = TrainSection(max_steps=max_steps, global_batch_size=8, log_every_steps=log_every,
                         eval_every_steps=eval_every, budget_hours=budget_hours)
    engine, timer = build_engine(model, info, lr=1e-2, train=train, optim=OptimSection(),
                                 impl=impl or ImplSection(), dist=DistributedSection())
    task = ToyTask(model, crash_at)
    return loop_mod.Loop(task, model, engine, info, run_dir=run_dir, train=train,
                         schedule=ScheduleSection(warmup_fraction=0.2), peak_lr=1e-2,
                         checkpoint=CheckpointSection(every_steps=checkpoint_every),
                         dist=DistributedSection(), logging=LoggingSection(tensorboard=False),
                         comm_timer=timer, resume=load_resume(run_dir, info),
                         **settings), task, model


def test_cadence_and_records(tmp_path):
    lp, task, _ = make_loop(tmp_path / "run", eval_every=4, checkpoint_every=3)
    res = lp.run()
    assert res.step == 6 and not res.preempted and res.stop_reason == "max_steps" and task.exported
    assert [s for s, _ in task.evaluated] == [4, 6]  # every 4 steps, and once at the end
    assert all(loss is not None and loss > 0 for _, loss in task.evaluated)
    recs = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in recs if r["kind"] == "train"] == [2, 4, 6]
    assert all(r["toy"] == 1 and r["tokens_per_s"] > 0 for r in recs if r["kind"] == "train")
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert ckpts == ["step_3", "step_6"]  # every 3 steps; the end is step 6 already saved
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_6" / "train_state.pt",
                       weights_only=True)
    assert state["toy_state"] == 7 and state["sequences_seen"] == 48


def test_first_logged_rate_leaves_a_slow_compile_out(tmp_path, monkeypatch, capsys):
    """A compiled model whose compile is slow (a dynamo backend that sleeps): the first logged
    tokens/s is already the steady one, not an average over the compile, and the compile's
    seconds are logged apart (compile_s) and shown on the progress line."""
    import time

    graphs = []

    def slow_backend(gm, example_inputs):
        graphs.append(gm)
        time.sleep(0.2)
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real_compile(m, backend=slow_backend))
    torch._dynamo.reset()
    try:
        lp, _, _ = make_loop(tmp_path / "run", max_steps=12, log_every=4,
                             impl=ImplSection(compile=True))
        lp.run()
    finally:
        torch._dynamo.reset()
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12] and graphs
    assert train[0]["compile_s"] >= 0.2 * len(graphs) and train[0]["compile_steps"] >= 1
    steady = sorted(r["tokens_per_s"] for r in train[1:])[0]
    # A window that averaged the compile in would show ~1/100 of it.
    assert train[0]["tokens_per_s"] > 0.25 * steady
    assert f"compile {train[0]['compile_s']:.1f} s" in capsys.readouterr().out


def test_crash_and_resume_is_bitwise_identical(tmp_path):
    ref, _, ref_model = make_loop(tmp_path / "ref", checkpoint_every=2)
    ref.run()
    first, _, _ = make_loop(tmp_path / "run", checkpoint_every=2, crash_at=5)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    again, _, model = make_loop(tmp_path / "run", checkpoint_every=2)
    assert again.engine.step == 4  # the newest checkpoint
    again.run()
    for k, v in ref_model.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


def test_budget_stops_the_run_and_is_saved(tmp_path):
    lp, task, _ = make_loop(tmp_path / "run", max_steps=0, budget_hours=1e-9)
    res = lp.run()
    assert res.stop_reason == "budget" and res.step >= 1 and task.exported
    state = torch.load(tmp_path / "run" / "checkpoints" / f"step_{res.step}" / "train_state.pt",
                       weights_only=True)
    assert state["budget"]["elapsed_s"] >= 1e-9 * 3600


@pytest.mark.timeout(60)
def test_budget_counts_the_time_spent_inside_steps(tmp_path, monkeypatch):
    """Every step's compute counts against the budget: with 0.2 s of work inside each step's loss
    (between rank 0's clock read and the all-reduce that agrees on it) a 1.2 s budget stops the
    run after at most 7 steps (a busy machine may take fewer), and the stored elapsed time is the
    time the steps took."""
    import time as time_mod

    lp, task, _ = make_loop(tmp_path / "run", max_steps=0, budget_hours=1.2 / 3600)

    def slow_loss(model, batch):  # two micro batches per step: 0.2 s per step
        time_mod.sleep(0.1)
        return loss_fn(model, batch)

    monkeypatch.setattr(task, "loss", slow_loss)
    t0 = time_mod.monotonic()
    res = lp.run()
    wall = time_mod.monotonic() - t0
    assert res.stop_reason == "budget"
    # each step takes >= 0.2 s of the 1.2 s (the read lags one step)
    assert 1 <= res.step <= 7, res.step
    state = torch.load(tmp_path / "run" / "checkpoints" / f"step_{res.step}" / "train_state.pt",
                       weights_only=True)
    assert 1.2 <= state["budget"]["elapsed_s"] <= wall


def test_every_rank_sets_a_budget_steps_lr_from_the_agreed_clock(tmp_path, monkeypatch):
    """Rank 0 reads its clock at the start of a step and the reading reaches the other ranks with
    the step's all-reduce; the step's lr must come from the clock agreed before it, which every
    rank has. Rank 0 used its fresh reading: with 2 ranks the lrs differed at every step and the
    DDP replicas drifted apart (weight sums 1993.2 vs 1965.9 after 44 steps). Here each reading
    of the clock advances it by 1 s of a 20 s budget, so the two differ at every step."""
    lp, task, _ = make_loop(tmp_path / "run", max_steps=0, budget_hours=20 / 3600)
    ticks = iter(range(1000))
    lp.budget.time_fn = lambda: float(next(ticks))
    agreed, applied = [], []
    take_step = lp._train_step

    def watched(*args, **kwargs):
        agreed.append(lp.budget.progress())  # what every rank knows before the step
        res = take_step(*args, **kwargs)
        applied.append(res.lr)
        return res

    monkeypatch.setattr(lp, "_train_step", watched)
    res = lp.run()
    assert res.stop_reason == "budget" and len(applied) == res.step >= 10
    expected = [lp.schedule.lr(p, step) for step, p in enumerate(agreed)]
    assert applied == pytest.approx(expected, rel=1e-12)
    assert applied[-1] > 0  # no last step taken after the budget was spent, at lr 0


def test_a_budget_run_its_step_limit_ends_early_says_its_lr_never_decayed(tmp_path, capsys):
    """In budget mode the lr follows the clock and max_steps is an upper bound: a run it stopped
    early (a recipe's max_steps left in with --train.budget_hours) ended near its peak lr,
    silently. Said at the end; not when the budget was nearly used up anyway."""
    from bertgpu.train.schedule import BudgetClock

    lp, _, _ = make_loop(tmp_path / "run", max_steps=4, budget_hours=1.0)
    assert lp.run().stop_reason == "max_steps"
    out = capsys.readouterr().out
    assert ("the step limit ended this 1 h budget run at step 4 after 0 s (0%): its lr follows "
            "the clock and had not decayed; allow more steps (train.max_steps, in budget mode an "
            "upper bound) to train to the budget") in out
    clock = BudgetClock(100.0, time_fn=lambda: 0.0)
    clock.elapsed_s = 96.0
    assert clock.cut_note(7) is None


def test_budget_warmup_counts_steps_not_clock():
    """Budget mode: warmup_steps ramps over optimizer steps while the decay follows the clock; in
    step mode warmup_steps is the same as warmup_steps / max_steps of progress."""
    s = Schedule(peak_lr=1.0, decay="linear", warmup_steps=10, max_steps=1000, budget_mode=True)
    assert s.lr(progress=0.0, step=0) == pytest.approx(0.0)  # the first step starts the warm-up
    assert s.lr(progress=0.0, step=4) == pytest.approx(0.4)
    assert s.lr(progress=0.5, step=4) == pytest.approx(0.2)  # ramp x clock decay
    assert s.lr(progress=0.5, step=50) == pytest.approx(0.5)  # after the ramp: the clock alone
    steps = Schedule(peak_lr=1.0, decay="linear", warmup_steps=10, max_steps=100)
    assert steps.lr(progress=0.04, step=4) == pytest.approx(0.4)  # step k at progress k / N
    assert steps.lr(progress=0.55, step=55) == pytest.approx(0.5)


def _tiny_finetune(tmp_path):
    import _tiny_init
    from test_finetune import VOCAB, sst2_fixture

    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    sst2_fixture(tmp_path / "SST-2", n_train=64, n_dev=16)
    return init, ["--epochs", "2", "--global_batch_size", "8", "--max_seq_len", "32",
                  "--lr", "1e-3", "--checkpoint_every_steps", "3"]


def _crashed_finetune(monkeypatch, tmp_path: Path, init: Path, args: list[str], out: Path) -> None:
    """`finetune sst2` to `out`, stopped by a crash in step 10: its step-9 checkpoint stays in
    OUT.tmp."""
    from bertgpu.finetune import finetune
    from bertgpu.tasks.finetuning import FinetuneTask

    original = FinetuneTask.micro_batches

    def crash(self, step):
        if step == 10:
            raise KeyboardInterrupt("simulated crash")
        return original(self, step)

    with monkeypatch.context() as patch:
        patch.setattr(FinetuneTask, "micro_batches", crash)
        with pytest.raises(KeyboardInterrupt):
            finetune("sst2", tmp_path / "SST-2", init, out, overrides=args)


def test_a_finetune_stopped_while_its_checkpoints_go_is_finished_by_the_same_command(
        tmp_path, monkeypatch):
    """At its end a fine-tuning writes results.json in OUT.tmp, removes its checkpoints and
    renames OUT.tmp to OUT. A stop while the checkpoints went left a "complete" checkpoint with
    files missing, and every re-run refused OUT.tmp ("no good checkpoint"). The same command now
    finishes that end: no training, the results as they were."""
    import shutil

    from bertgpu.finetune import finetune

    init, args = _tiny_finetune(tmp_path)
    out, real = tmp_path / "ft", shutil.rmtree

    def cut(path, *a, **k):  # at the end, a kill after the first file of a folder removed
        if "checkpoints" in Path(path).parts and (tmp_path / "ft.tmp" / "results.json").exists():
            next(p for p in sorted(Path(path).rglob("*")) if p.is_file()
                 and p.name not in ("COMPLETE", "checksums.json")).unlink()
            raise KeyboardInterrupt("stopped")
        return real(path, *a, **k)

    with monkeypatch.context() as patch:
        patch.setattr(shutil, "rmtree", cut)
        with pytest.raises(KeyboardInterrupt):
            finetune("sst2", tmp_path / "SST-2", init, out, overrides=args)
    work = tmp_path / "ft.tmp"
    first = json.loads((work / "results.json").read_text())
    assert not out.exists() and (work / "checkpoints").is_dir()
    with pytest.warns(UserWarning, match=r"ft.tmp: holds this fine-tuning finished"):
        again = finetune("sst2", tmp_path / "SST-2", init, out, overrides=args)
    assert again == first == json.loads((out / "results.json").read_text())
    assert not work.exists() and not (out / "checkpoints").exists()
    assert (out / "model" / "model.safetensors").is_file()


def test_finetune_resumes_a_crashed_run_bitwise(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from bertgpu.finetune import finetune

    init, args = _tiny_finetune(tmp_path)
    ref = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ref", overrides=args)
    _crashed_finetune(monkeypatch, tmp_path, init, args, tmp_path / "ft")
    work = tmp_path / "ft.tmp"
    assert ((work / "checkpoints" / "step_9" / "COMPLETE").is_file()
            and not (tmp_path / "ft").exists())
    state = torch.load(work / "checkpoints" / "step_9" / "train_state.pt", weights_only=True)
    res = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft", overrides=args)
    # Train times count the steps before the crash too: cumulative per epoch, across the resume.
    epoch_1, epoch_2 = (e["train_seconds"] for e in res["epochs"])
    assert epoch_1 <= state["train_seconds"] < epoch_2
    assert res["epochs"][1]["train_seconds"] == res["train_seconds"]
    assert not work.exists() and not (tmp_path / "ft" / "checkpoints").exists()
    assert res["steps"] == ref["steps"] == 16 and [e["epoch"] for e in res["epochs"]] == [1, 2]
    assert res["metrics"] == ref["metrics"]
    # The interrupted epoch's training loss is the mean over all of its steps, those before the
    # checkpoint included (it used to be the mean of the steps after the resume only).
    assert [e["train_loss"] for e in res["epochs"]] == [e["train_loss"] for e in ref["epochs"]]
    a, b = (load_file(str(p / "model" / "model.safetensors"))
            for p in (tmp_path / "ref", tmp_path / "ft"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # A different command does not pick up the interrupted run's checkpoint: it starts over.
    _crashed_finetune(monkeypatch, tmp_path, init, args, tmp_path / "ft2")
    other = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft2",
                     overrides=[*args, "--lr", "2e-3"])
    assert json.loads((tmp_path / "ft2" / "results.json").read_text())["config"]["lr"] == 2e-3
    assert other["steps"] == 16


def test_finetune_resumes_through_a_logging_change_and_never_into_other_data(tmp_path,
                                                                             monkeypatch, capsys):
    """A re-run with an added --log_every_steps discarded the interrupted run's checkpoint without
    a word; a re-run after the training file changed resumed into the new data (epochs 1-4 on
    one dataset, 7-10 on another, reported as one run). Settings that do not change the result
    now resume (bitwise, the start-up table without "initialised fresh": the head is the
    checkpoint's); other settings or other data start over, saying what changed."""
    from safetensors.torch import load_file

    from bertgpu.finetune import finetune

    init, args = _tiny_finetune(tmp_path)
    ref = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ref", overrides=args)

    _crashed_finetune(monkeypatch, tmp_path, init, args, tmp_path / "ft")
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft",
                       overrides=[*args, "--log_every_steps", "5", "--eval_batch_size", "3"])
    assert not [w for w in seen if "another run" in str(w.message)]
    out = capsys.readouterr().out
    assert "resumed from" in out and "initialised fresh" not in out
    assert res["metrics"] == ref["metrics"]
    a, b = (load_file(str(p / "model" / "model.safetensors"))
            for p in (tmp_path / "ref", tmp_path / "ft"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    _crashed_finetune(monkeypatch, tmp_path, init, args, tmp_path / "ft2")
    train = tmp_path / "SST-2" / "train.tsv"
    lines = train.read_text(encoding="utf-8").splitlines()
    train.write_text("\n".join([lines[0], *lines[1:][::-1]]) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match=r"ft2.tmp: its checkpoint \(step_9\) is of another run "
                                         r"\(the training or evaluation data\); starting over"):
        res = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft2", overrides=args)
    assert res["steps"] == 16
    _crashed_finetune(monkeypatch, tmp_path, init, args, tmp_path / "ft3")
    with pytest.warns(UserWarning, match=r"\(lr 0.001 -> 0.002\); starting over"):
        finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft3",
                 overrides=[*args, "--lr", "2e-3"])


def test_finetune_budget_hours(tmp_path):
    from bertgpu.finetune import finetune

    init, args = _tiny_finetune(tmp_path)
    res = finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft",
                   overrides=[*args, "--budget_hours", "1e-9"])
    assert 1 <= res["steps"] < 16 and "accuracy" in res["metrics"]["dev"]
    assert res["config"]["budget_hours"] == 1e-9


def test_steps_read_one_step_late_are_counted_as_if_read_at_once(tmp_path, capsys):
    """The engine reading each step's numbers one step late (its CUDA default, forced here): the
    skipped steps are reported and left out of the training loss, each evaluation gets the mean
    loss of the good steps since the previous one, and the run is the one that reads every step
    at its end (metrics, evaluations, weights)."""
    runs = {}
    for late in (False, True):
        lp, task, model = make_loop(tmp_path / f"late_{late}", eval_every=4)
        lp.engine.read_late = late
        batches, step = task.micro_batches, lp.engine.train_step
        task.micro_batches = lambda s, f=batches: (  # steps 2 and 3 (1-based) are non-finite
            [{**mb, "poison": torch.tensor(float("nan"))} for mb in f(s)] if s in (1, 2) else f(s))
        results = []
        lp.engine.train_step = lambda *a, f=step, rs=results, **k: (rs.append(f(*a, **k))
                                                                     or rs[-1])
        lp.run()
        out = capsys.readouterr().out
        assert "step 2: non-finite loss or gradients, update skipped (1 in a row)" in out
        assert "step 3: non-finite loss or gradients, update skipped (2 in a row)" in out
        assert [r.skipped for r in results] == [False, True, True, False, False, False]
        mean = lambda rs: sum(r.loss for r in rs if not r.skipped) / sum(  # noqa: E731
            not r.skipped for r in rs)
        assert task.evaluated == [(4, mean(results[:4])), (6, mean(results[4:]))]
        records = [{k: r.get(k) for k in ("kind", "step", "loss", "lr", "grad_norm",
                                          "skipped_steps", "tokens_seen", "val_step")}
                   for r in read_metrics(tmp_path / f"late_{late}" / "metrics.jsonl")]
        runs[late] = (str(records), task.evaluated, model.state_dict())
    assert runs[True][:2] == runs[False][:2]
    for k, v in runs[False][2].items():
        assert torch.equal(v, runs[True][2][k]), k


def test_a_step_is_read_behind_the_next_steps_work_not_before_it(tmp_path, monkeypatch):
    """Reading step k's numbers (loss, skip flag) makes the host wait for the device to finish
    step k; read late (the CUDA default, forced here), each is read only once step k + 1 is
    queued, except where a record asks for it (the last step's). The preemption snapshot taken
    before every step read them all first (`Engine.state_dict` in `begin_step`), so the GPU sat
    idle while the host fetched and queued each step."""
    from bertgpu.train import readback

    lp, _, _ = make_loop(tmp_path / "run", max_steps=6, log_every=100)
    lp.engine.read_late = True
    assert lp.engine.skips_on_device()
    first_read = {}  # step -> the engine's step when its numbers were first read
    read = readback.PendingStep.read
    monkeypatch.setattr(readback.PendingStep, "read", lambda self: (
        first_read.setdefault(self.step, lp.engine.step), read(self))[1])
    lp.run()
    assert first_read == {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 6}


def test_a_log_step_is_read_behind_the_next_steps_work(tmp_path, monkeypatch):
    """A train record needs its step's loss and grad norm: read at the log step itself, the
    host waited for the device to finish that step before it fetched and queued the next one,
    every log interval (10 steps in the shipped configs). Read late (the CUDA default), the
    record's host numbers are taken at its step and the record is written once the next step is
    queued; evaluation, a checkpoint and the last step read their step anyway, and are logged at
    once. The records are those of the run that reads every step at once."""
    from bertgpu.train import readback

    def records(run: str, late: bool) -> tuple[dict, list]:
        lp, _, _ = make_loop(tmp_path / run, max_steps=9, log_every=2, eval_every=4)
        lp.engine.read_late = late
        first_read = {}  # step -> the engine's step when its numbers were first read
        read = readback.PendingStep.read
        monkeypatch.setattr(readback.PendingStep, "read", lambda self: (
            first_read.setdefault(self.step, lp.engine.step), read(self))[1])
        lp.run()
        monkeypatch.setattr(readback.PendingStep, "read", read)
        return first_read, read_metrics(tmp_path / run / "metrics.jsonl")

    first_read, late = records("late", True)
    assert first_read == {1: 2, 2: 3, 3: 4, 4: 4, 5: 6, 6: 7, 7: 8, 8: 8, 9: 9}  # 4, 8: evaluated
    _, at_once = records("now", False)
    keys = ("step", "loss", "grad_norm", "lr", "mlm_acc", "skipped_steps", "tokens_seen")

    def train(recs: list) -> list:
        return [{k: r.get(k) for k in keys} for r in recs if r["kind"] == "train"]

    assert [r["step"] for r in train(late)] == [2, 4, 6, 8, 9]
    assert train(late) == train(at_once)
    kinds = [(r["kind"], r["step"]) for r in late if r["kind"] in ("train", "eval")]
    assert kinds == [("train", 2), ("train", 4), ("eval", 4), ("train", 6), ("train", 8),
                     ("eval", 8), ("train", 9), ("eval", 9)]


def test_a_record_left_for_later_is_written_as_taken_when_a_stop_ends_the_run(tmp_path):
    """Read late, a log step's record waits for the next step; a stop signal in that step ends
    the run: the record is written with the numbers of its own log interval, not taken again
    after the window was reset (its data-wait share read 0)."""
    import os
    import signal

    lp, task, _ = make_loop(tmp_path / "term", max_steps=20, log_every=3)
    lp.engine.read_late = True
    batches = task.micro_batches

    def term_at_3(step):
        if step == 3:  # the 4th step's data: steps 1-3 are done, step 3's record is pending
            os.kill(os.getpid(), signal.SIGTERM)
        return batches(step)

    task.micro_batches = term_at_3
    res = lp.run()
    assert res.preempted
    train = [r for r in read_metrics(tmp_path / "term" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [3]
    assert train[0]["data_wait_share"] > 0


def test_records_left_for_later_with_a_host_skip_and_an_error_end(tmp_path):
    """Read late but with an optimizer that skips on the host (RAdam), every step is read at its
    own end: a record left for later counted the next step's skip. And an error in the step
    after a log step (an OOM, a data error) lost that step's record: it is written with its host
    numbers (its loss may sit on a device in trouble)."""
    def train(run: str, late: bool, host_skip: bool = False, crash_at=None) -> list:
        lp, task, _ = make_loop(tmp_path / run, max_steps=6, log_every=2, crash_at=crash_at)
        lp.engine.read_late = late
        if host_skip:
            lp.engine.skips_on_device = lambda: False
        _poison_from(task, 2)  # step 3 on: non-finite
        with contextlib.suppress(KeyboardInterrupt, TrainingDiverged):
            lp.run()
        return [(r["step"], r.get("skipped_steps"), r.get("loss") is None)
                for r in read_metrics(tmp_path / run / "metrics.jsonl") if r["kind"] == "train"]

    assert train("late", True, host_skip=True) == train("now", False, host_skip=True)
    assert train("late_crash", True, crash_at=2) == [(2, None, True)]  # crash in step 3


def _poison_from(task, first: int) -> None:
    """Steps from `first` (0-based) on have a non-finite loss."""
    batches = task.micro_batches
    task.micro_batches = lambda s: (
        [{**mb, "poison": torch.tensor(float("nan"))} for mb in batches(s)] if s >= first
        else batches(s))


def test_a_run_that_stops_on_an_exception_says_so_in_its_records(tmp_path):
    """Divergence (5 non-finite steps in a row) and any other exception leaving the loop: the
    exception is raised as it was and an `end` record says why, after the `start` record that
    names the host and pid; after a divergence the newest step gets its train record (loss NaN,
    as it was)."""
    import os
    import socket

    from bertgpu.telemetry.records import process_started
    from bertgpu.train.engine import TrainingDiverged

    lp, task, _ = make_loop(tmp_path / "nan", max_steps=20, log_every=4)
    _poison_from(task, 1)  # step 1 fine, steps 2.. non-finite: the 5th in a row (6) stops it
    with pytest.raises(TrainingDiverged, match="training diverged: 5 steps in a row"):
        lp.run()
    recs = read_metrics(tmp_path / "nan" / "metrics.jsonl")
    assert recs[0]["event"] == "start" and recs[0]["step"] == 0 and recs[0]["max_steps"] == 20
    assert recs[0]["host"] == socket.gethostname() and recs[0]["pid"] == os.getpid()
    assert recs[0]["pid_started"] == process_started(os.getpid()) is not None
    train = [r for r in recs if r["kind"] == "train"]
    # step 5 unlogged at the time: logged at the end; then step 6, which made the count (its
    # result never reached the loop): `watch` read "step 5" under "diverged at step 6"
    assert [r["step"] for r in train] == [4, 5, 6]
    assert train[-1]["loss"] != train[-1]["loss"]  # NaN, as it was (null in the file)
    assert train[-1]["skipped_steps"] == 5 and 0 < train[-1]["lr"] < train[-2]["lr"]
    end = recs[-1]
    assert (end["event"], end["reason"], end["step"]) == ("end", "diverged", 6)
    assert end["error"].startswith("training diverged: 5 steps in a row")

    lp, _, _ = make_loop(tmp_path / "crash", crash_at=5, log_every=4)
    with pytest.raises(KeyboardInterrupt, match="simulated crash"):
        lp.run()
    recs = read_metrics(tmp_path / "crash" / "metrics.jsonl")
    assert [r["step"] for r in recs if r["kind"] == "train"] == [4]  # no wait on the device
    assert {k: recs[-1][k] for k in ("step", "event", "reason", "error")} == {
        "step": 5, "event": "end", "reason": "error", "error": "KeyboardInterrupt: simulated crash"}


def test_every_way_the_loop_ends_logs_its_last_step(tmp_path):
    """Steps past the last logged one get their train record at the end, before the `end`
    record: at max_steps, at the budget and at a stop signal alike."""
    import os
    import signal

    def ends(run: Path) -> tuple[list[int], dict]:
        recs = read_metrics(run / "metrics.jsonl")
        end = next(r for r in recs if r.get("event") == "end")
        train = [r for r in recs if r["kind"] == "train"]
        assert recs.index(train[-1]) < recs.index(end)
        return [r["step"] for r in train], end

    lp, _, _ = make_loop(tmp_path / "steps", max_steps=5, log_every=4, final_checkpoint=True)
    lp.run()
    assert ends(tmp_path / "steps")[0] == [4, 5]
    # A finished run's end record is its last: after the final checkpoint and the export (it
    # came before them, so `watch` said "finished" while the checkpoint was being written).
    recs = read_metrics(tmp_path / "steps" / "metrics.jsonl")
    assert recs[-1].get("event") == "end" and any(r.get("event") == "checkpoint" for r in recs)

    lp, _, _ = make_loop(tmp_path / "budget", max_steps=0, budget_hours=1e-9, log_every=100)
    res = lp.run()
    steps, end = ends(tmp_path / "budget")
    assert res.stop_reason == "budget" and steps == [res.step] and end["reason"] == "budget"

    lp, task, _ = make_loop(tmp_path / "term", max_steps=20, log_every=100)
    batches = task.micro_batches

    def term_at_3(step):
        if step == 3:  # the 4th step's data: steps 1-3 are done
            os.kill(os.getpid(), signal.SIGTERM)
        return batches(step)

    task.micro_batches = term_at_3
    res = lp.run()
    steps, end = ends(tmp_path / "term")
    assert res.preempted and res.exit_status == 143
    assert steps == [3] and (end["reason"], end["step"]) == ("preempted", 3)


def test_a_divergence_read_late_ends_at_the_step_that_made_the_count(tmp_path):
    """Read late (the CUDA default), the step that made the count is read once the next step is
    queued: the run's end record said that next step (7) while the message, the last train record
    and a run read at once said 6. Both reads now end on step 6's train record and end record."""
    def records(run: str, late: bool) -> list:
        lp, task, _ = make_loop(tmp_path / run, max_steps=20, log_every=4)
        lp.engine.read_late = late
        _poison_from(task, 1)
        with pytest.raises(TrainingDiverged, match="up to step 6|step 6"):
            lp.run()
        return [(r["kind"], r["step"], r.get("event"), r.get("reason"), r.get("skipped_steps"))
                for r in read_metrics(tmp_path / run / "metrics.jsonl")
                if r["kind"] == "train" or r.get("event") == "end"]

    at_once, late = records("now", False), records("late", True)
    assert at_once[-2:] == [("train", 6, None, None, 5), ("info", 6, "end", "diverged", None)]
    assert late[-2:] == at_once[-2:]  # read late, step 5's numbers are in step 6's record
