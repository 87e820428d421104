"""`bertgpu glue` after a stop keeps a run's finished work: a seed whose last move (seed_N.tmp
renamed seed_N) the stop cut short is moved into place, as `finetune` does, not trained again;
a stop in a seed's test predictions keeps its training."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_glue_probe_fixes import FAST, FIXTURES, tiny_init  # noqa: F401 (a fixture)

from bertgpu import finetune, finetune_results
from bertgpu.cli import main
from bertgpu.tasks import glue as glue_tasks
from bertgpu.tasks.finetuning import FinetuneTask

pytestmark = pytest.mark.usefixtures("one_thread")


def _glue(init: Path, out: Path, *extra: str) -> int:
    return main(["glue", "--data-dir", str(FIXTURES), "--init", str(init), "--out", str(out),
                 "--tasks", "sst2", *FAST, *extra])


def _seeds_trained(monkeypatch, stop_at: int | None = None) -> list[int]:
    """The seeds glue fine-tunes from now on (a Ctrl-C as seed `stop_at` starts)."""
    real, seeds = finetune.finetune, []

    def counted(task, data, init, out, cfg, overrides, **kwargs):
        seed = int(overrides[overrides.index("--seed") + 1])
        if seed == stop_at:
            raise KeyboardInterrupt
        seeds.append(seed)
        return real(task, data, init, out, cfg, overrides, **kwargs)

    monkeypatch.setattr(finetune, "finetune", counted)
    return seeds


@pytest.mark.parametrize(("cut_in", "flags"), [("replace_dir", ()),
                                              ("drop_checkpoints", ("--predict-test",))])
def test_a_run_whose_last_move_was_cut_is_not_trained_again(tmp_path, tiny_init, monkeypatch,  # noqa: F811
                                                            capsys, cut_in, flags):
    """A stop after seed_1.tmp's results.json, before seed_1.tmp became seed_1 (while its
    checkpoints went, or at the rename): glue trained the seed again from scratch (standalone
    finetune finished the move)."""
    out = tmp_path / "glue"

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune_results, cut_in, cut)
    assert _glue(tiny_init, out, *flags) == 130
    assert (out / "SST-2" / "seed_1.tmp" / "results.json").is_file()
    assert not (out / "SST-2" / "seed_1").exists()
    monkeypatch.undo()

    seeds = _seeds_trained(monkeypatch)
    assert _glue(tiny_init, out, *flags) == 0
    assert seeds == []  # old code: [1]
    assert "holds this run finished, its last move cut short by a stop; moved to" in \
        capsys.readouterr().err
    assert not (out / "SST-2" / "seed_1.tmp").exists()
    assert (out / "SST-2" / "seed_1" / "model").is_dir()
    assert not (out / "SST-2" / "seed_1" / "checkpoints").exists()


def test_a_stop_in_a_runs_test_predictions_keeps_its_training(tmp_path, tiny_init, monkeypatch):  # noqa: F811
    """`glue --predict-test` stopped while a seed predicted its test set: the same command
    resumes the seed at its last step (finetune's final checkpoint) and trains nothing."""
    out = tmp_path / "glue"

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(glue_tasks, "write_glue_submission", stopped)
    assert _glue(tiny_init, out, "--predict-test") == 130
    monkeypatch.undo()

    def trained(self, step):
        raise AssertionError(f"step {step} trained again")

    monkeypatch.setattr(FinetuneTask, "micro_batches", trained)
    assert _glue(tiny_init, out, "--predict-test") == 0  # old code: step 0 trained again
    assert (out / "SST-2" / "seed_1" / "submission" / "SST-2.tsv").is_file()
    assert (out / "submission.zip").is_file()
