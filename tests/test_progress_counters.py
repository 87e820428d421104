"""What a run reports of its progress: the `epoch` of a train record, a budget run's ETA and share
of the budget (from the clock the run stops on), and the warning of a run resumed with another
length (train.max_steps or train.budget_hours), whose lr schedule is re-stretched."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_loop import _tiny_finetune, make_loop
from test_pretrain import _args  # the tiny model and run of the pretraining tests
from test_watch import CONFIG, _append, _train

from bertgpu.cli import main
from bertgpu.telemetry.console import duration
from bertgpu.telemetry.records import read_metrics
from bertgpu.train.loop_state import length_change_note
from bertgpu.train.schedule import Schedule
from bertgpu.watch import RunState, budget_share, eta_s

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    # 96 sequences at a global batch of 8: 12 steps an epoch
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _train_records(run: Path) -> list[dict]:
    return [r for r in read_metrics(run) if r["kind"] == "train"]


@pytest.mark.timeout(120)
def test_the_epoch_is_the_one_the_steps_samples_came_from(shards, tmp_path):
    """Pretraining logged the loader's position after the step: the last step of the first pass
    (step 12, samples 88..95 of 96) said epoch 1 of a 0-based count, the next pass's number. It
    is now the pass the step's samples came from, 1-based as fine-tuning's: in both, the last
    step of the first epoch says 1 and the next step 2."""
    from bertgpu.finetune import finetune

    run = tmp_path / "pre"
    assert main(_args(shards, run, "--train.max_steps", "14", "--checkpoint.every_steps", "0")) == 0
    epochs = {r["step"]: r["epoch"] for r in _train_records(run)}
    assert epochs[12] == epochs[1] and epochs[13] == epochs[1] + 1, epochs  # whatever the base
    assert epochs == {s: 1 if s <= 12 else 2 for s in range(1, 15)}, epochs

    init, args = _tiny_finetune(tmp_path)  # 64 examples at a global batch of 8: 8 steps an epoch
    finetune("sst2", tmp_path / "SST-2", init, tmp_path / "ft",
             overrides=[*args, "--log_every_steps", "1"])
    epochs = {r["step"]: r["epoch"] for r in _train_records(tmp_path / "ft")}
    assert epochs == {s: 1 if s <= 8 else 2 for s in range(1, 17)}, epochs


def test_the_budget_eta_is_what_the_budget_clock_leaves(tmp_path, capsys):
    """The console ETA of a budget run was the budget minus the logger's wall clock, which is
    not the clock the run stops on (it counts a first evaluation, and restarts differently);
    here that clock advances 1 s a step (a fake one), so by the wall clock the 10 s budget
    looked untouched ("ETA 00:10" on every line) while the run stopped after 10 steps. Train
    records now carry the budget clock (budget_elapsed_s, budget_left_s) and the ETA is it."""
    lp, _, _ = make_loop(tmp_path / "run", max_steps=0, budget_hours=10 / 3600, log_every=1,
                         config={"train": {"max_steps": 0, "budget_hours": 10 / 3600}})
    ticks = itertools.count()
    lp.budget.time_fn = lambda: float(next(ticks))
    res = lp.run()
    assert res.stop_reason == "budget" and res.step == 10
    train = _train_records(tmp_path / "run")
    assert [(r["budget_elapsed_s"], r["budget_left_s"]) for r in train] == [
        (float(s), 10.0 - s) for s in range(1, 11)]
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("train step ")]
    assert [x.rsplit(" | ", 1)[1] for x in lines] == [f"ETA {duration(10 - s)}"
                                                      for s in range(1, 11)], lines
    assert not any("budget_" in x for x in lines)  # the ETA says it; the file keeps the keys


def test_watch_reads_the_budget_clock(tmp_path):
    """`bertgpu watch` took a budget run's share and ETA from elapsed_s too: 40 s of wall time
    (15 of them before the budget clock started) of a 45 s budget read as 88.9% done, 5 s left,
    when the run had 20 s to go."""
    run = tmp_path / "base"
    run.mkdir()
    (run / "config.toml").write_text(CONFIG.replace("max_steps = 10", "max_steps = 10000")
                                     + "budget_hours = 0.0125\n", encoding="utf-8")
    _append(run / "metrics.jsonl", [{**_train(s), "budget_elapsed_s": 10.0 * s - 15.0,
                                     "budget_left_s": 60.0 - 10.0 * s} for s in (2, 3, 4)])
    state = RunState(run)
    state.poll()
    assert eta_s(state) == pytest.approx(20.0)
    assert budget_share(state) == pytest.approx(25 / 45)


@pytest.mark.timeout(120)
def test_a_resume_with_more_steps_warns_that_the_lr_jumps(shards, tmp_path, capsys):
    """A run finished at step 6 of 6 re-run with train.max_steps 12 resumes at
    progress 0.5, back at a high lr, and used to say only that the setting changed. One
    warning now names the old and new value and the lr's jump; its new lr is the one step 7
    logs. Resuming with the same length says nothing of the kind."""
    run, common = tmp_path / "r", ["--checkpoint.every_steps", "3"]
    assert main(_args(shards, run, "--train.max_steps", "6", *common)) == 0
    capsys.readouterr()
    assert main(_args(shards, run, "--train.max_steps", "12", *common)) == 0
    err = capsys.readouterr().err
    notes = [x for x in err.splitlines() if "re-stretched" in x]
    lr = next(r["lr"] for r in _train_records(run) if r["step"] == 7)
    last = next(r["lr"] for r in _train_records(run) if r["step"] == 6)  # the old run's
    assert notes == [f"bertgpu pretrain: warning: train.max_steps 6 -> 12: the lr schedule is "
                     f"re-stretched to the new length, so at step 6 its progress goes from "
                     f"100.0% to 50.0% and the lr jumps from {last:.3g} (step 6's, the last the "
                     f"old run took) to {lr:.3g} (step 7's); give the old value to go on with the "
                     "schedule as it was"], err
    # The same length again (as after a crash past the step-9 checkpoint): no warning.
    shutil.rmtree(run / "checkpoints" / "step_12")
    assert main(_args(shards, run, "--train.max_steps", "12", *common)) == 0
    assert "re-stretched" not in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_resume_with_a_larger_budget_warns_that_the_lr_jumps(shards, tmp_path, capsys):
    run, common = tmp_path / "r", ["--train.max_steps", "0", "--checkpoint.every_steps", "0"]
    assert main(_args(shards, run, "--train.budget_hours", "0.0002", *common)) == 0
    capsys.readouterr()
    assert main(_args(shards, run, "--train.budget_hours", "0.0004", *common)) == 0
    notes = [x for x in capsys.readouterr().err.splitlines() if "re-stretched" in x]
    assert len(notes) == 1 and re.fullmatch(
        r"bertgpu pretrain: warning: train\.budget_hours 0\.0002 -> 0\.0004: the lr schedule is "
        r"re-stretched to the new length, so at step \d+ its progress goes from 100\.0% to "
        r"5\d\.\d% and the lr jumps from \S+ \(step \d+'s, the last the old run took\) to \S+ "
        r"\(step \d+'s\); give the old value to go on with "
        r"the schedule as it was", notes[0]), notes


def test_a_checkpoint_that_predates_the_stored_max_steps_is_read_from_its_config(tmp_path):
    """A checkpoint written before train_state held max_steps: its config.toml says it."""
    (tmp_path / "config.toml").write_text("[train]\nmax_steps = 6\n", encoding="utf-8")
    schedule = Schedule(peak_lr=1e-3, warmup_fraction=0.0, max_steps=12)
    note = length_change_note({"budget": None}, tmp_path, schedule, 6, 0.5, None)
    assert note is not None and note.startswith("train.max_steps 6 -> 12: ")
    assert "(step 6's, the last the old run took) to 0.0005 (step 7's);" in note
    assert length_change_note({"budget": None, "max_steps": 12}, tmp_path, schedule, 6, 0.5,
                              None) is None
    assert length_change_note({"budget": None}, tmp_path / "none", schedule, 6, 0.5, None) is None


def test_a_skipped_steps_unread_loss_is_not_checkpointed():
    """A skipped (non-finite) step's loss stays out of the checkpointed training loss."""
    from types import SimpleNamespace

    from bertgpu.train.loop_state import loss_state

    skipped = SimpleNamespace(skipped=True, loss=float("inf"))
    assert loss_state((6.0, 3, (skipped, 2))) == {"loss_sum": 6.0, "loss_n": 3}
    taken = SimpleNamespace(skipped=False, loss=1.5)
    assert loss_state((6.0, 3, (taken, 2))) == {"loss_sum": 9.0, "loss_n": 5}
    assert loss_state(None) is None


def test_train_loss_without_reset_keeps_the_window():
    """train_loss(reset=False) (an evaluation reading it before it completes) leaves the mean
    for the next read; the default read resets it."""
    from types import SimpleNamespace

    from bertgpu.train.loop_state import LogWindow

    window = LogWindow(1, 0, 10)
    window.add_loss(SimpleNamespace(skipped=False, loss=2.0), 4)
    window.add_loss(SimpleNamespace(skipped=False, loss=1.0), 4)
    assert window.train_loss(reset=False) == pytest.approx(1.5)
    assert window.train_loss() == pytest.approx(1.5)
    assert window.train_loss() is None
