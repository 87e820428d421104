"""The warning of a finished run resumed with a longer length said "the lr of step 7 jumps from
0 to 0.000532" after a 6-step run extended to 12: 0 is the old schedule's lr at progress 1, for a
step that never ran; the run ended at the lr of its step 6 (1.77e-4 in the probe). Its "from" is
now the lr the old run's last step logged, in step mode and in budget mode; a resume part-way
keeps naming the lr the old run gave the next step (test_lr_jump_note_old_settings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_pretrain import _args  # the tiny model and run of the pretraining tests

from bertgpu.cli import main
from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread", "no_faults")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _lrs(run: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in read_metrics(run) if r["kind"] == "train"}


def _note(err: str) -> str:
    notes = [x for x in err.splitlines() if "re-stretched" in x]
    assert len(notes) == 1, err
    return notes[0]


@pytest.mark.timeout(120)
def test_a_finished_run_given_more_steps_names_the_lr_it_ended_at(shards, tmp_path, capsys):
    run, common = tmp_path / "r", ["--checkpoint.every_steps", "3"]
    assert main(_args(shards, run, "--train.max_steps", "6", *common)) == 0
    last = _lrs(run)[6]
    assert last > 0  # the probe's case: the step-6 lr is not the 0 of progress 1
    capsys.readouterr()
    assert main(_args(shards, run, "--train.max_steps", "12", *common)) == 0
    note, lrs = _note(capsys.readouterr().err), _lrs(run)
    assert lrs[6] == last  # the old run's record, kept
    assert note.endswith(
        f"train.max_steps 6 -> 12: the lr schedule is re-stretched to the new length, so at step "
        f"6 its progress goes from 100.0% to 50.0% and the lr jumps from {last:.3g} (step 6's, "
        f"the last the old run took) to {lrs[7]:.3g} (step 7's); give the old value to go on "
        "with the schedule as it was"), note
    assert last < lrs[7]  # "at a higher lr than it ended at" (README)


@pytest.mark.timeout(120)
def test_a_finished_budget_run_given_more_time_names_the_lr_it_ended_at(shards, tmp_path,
                                                                        capsys):
    run, common = tmp_path / "r", ["--train.max_steps", "0", "--checkpoint.every_steps", "0"]
    assert main(_args(shards, run, "--train.budget_hours", "0.0002", *common)) == 0
    old = _lrs(run)
    step = max(old)
    capsys.readouterr()
    assert main(_args(shards, run, "--train.budget_hours", "0.0004", *common)) == 0
    note = _note(capsys.readouterr().err)
    found = re.search(r"and the lr jumps from (\S+) \(step (\d+)'s, the last the old run took\) "
                      r"to \S+ \(step (\d+)'s\);", note)
    assert found, note
    assert (found[1], int(found[2]), int(found[3])) == (f"{old[step]:.3g}", step, step + 1)
    assert old[step] > 0 and "jumps from 0 " not in note


def test_a_budget_checkpoint_without_its_optimizer_lr_names_no_lr_of_the_old_run(tmp_path):
    """A budget run's last step ran at a clock the checkpoint does not keep: its lr is read from
    the optimizer state (set for that step); a sharded checkpoint has none in the train state,
    and the warning then names the new lr alone, not an lr no step ran at."""
    from bertgpu.train.loop_state import length_change_note
    from bertgpu.train.schedule import Schedule

    schedule = Schedule(peak_lr=1e-3, warmup_fraction=0.0, max_steps=0, budget_mode=True)
    spent = {"budget": {"elapsed_s": 3.6, "budget_s": 3.6}}
    note = length_change_note(spent, tmp_path, schedule, 9, 0.5, 7.2)
    assert note is not None and ("and the lr of step 10 is 0.0005, after the old run ended its "
                                 "schedule; give the old value") in note, note
    saved = {**spent, "optimizer": {"param_groups": [{"lr": 2.5e-5, "params": [0]}]}}
    note = length_change_note(saved, tmp_path, schedule, 9, 0.5, 7.2)
    assert note is not None and ("and the lr jumps from 2.5e-05 (step 9's, the last the old run "
                                 "took) to 0.0005 (step 10's);") in note, note
