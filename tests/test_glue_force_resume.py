"""An interrupted `bertgpu glue --force` is resumed by the same command (the runs it finished are
kept), and the table of the settings it replaces goes when it starts."""

from __future__ import annotations

import json

import pytest
from test_glue_stop_keeps_finished_work import _glue, _seeds_trained, tiny_init  # noqa: F401

from bertgpu import finetune_results

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_same_force_command_keeps_the_runs_it_finished(tmp_path, tiny_init, monkeypatch):  # noqa: F811
    """A --force run of new settings stopped after 2 of 3 seeds: the same command trains the
    third only (it trained all 3 again; without --force the 2 were refused as made otherwise)."""
    out = tmp_path / "glue"
    assert _glue(tiny_init, out, "--seeds", "1", "2", "3", "--lr", "3e-4") == 0
    new = ("--seeds", "1", "2", "3", "--lr", "1e-4", "--force")
    seeds = _seeds_trained(monkeypatch, stop_at=3)
    assert _glue(tiny_init, out, *new) == 130
    assert seeds == [1, 2]
    monkeypatch.undo()

    seeds = _seeds_trained(monkeypatch)
    assert _glue(tiny_init, out, *new) == 0
    assert seeds == [3]  # old code: [1, 2, 3]
    summary = json.loads((out / "glue_results.json").read_text())
    assert summary["config"]["lr"] == 1e-4 and list(summary["tasks"]["SST-2"]["per_seed"]) == [
        "1", "2", "3"]
    for seed in (1, 2, 3):
        results = json.loads((out / "SST-2" / f"seed_{seed}" / "results.json").read_text())
        assert results["config"]["lr"] == 1e-4
    assert not (out / "glue_force.json").exists()  # the next --force trains every run again
    seeds.clear()
    assert _glue(tiny_init, out, *new) == 0 and seeds == [1, 2, 3]


def test_a_force_run_removes_the_earlier_table_when_it_starts(tmp_path, tiny_init, monkeypatch,  # noqa: F811
                                                             capsys):
    """The table of the old settings stood beside the new runs of an interrupted --force, and
    `bertgpu report` showed it as current."""
    out = tmp_path / "glue"
    assert _glue(tiny_init, out, "--predict-test") == 0
    assert (out / "glue_results.md").is_file() and (out / "submission.zip").is_file()
    capsys.readouterr()
    _seeds_trained(monkeypatch, stop_at=1)
    assert _glue(tiny_init, out, "--lr", "1e-4", "--force") == 130
    # old code: glue_results.json and .md were still there
    assert not (out / "glue_results.json").exists() and not (out / "glue_results.md").exists()
    assert sorted(p.name for p in out.iterdir()) == ["SST-2", "glue_force.json"]
    assert (f"{out}: removed the earlier table (submission.zip, submission, glue_results.json, "
            "glue_results.md): --force replaces its runs; the new one is written when every run "
            "has finished" in capsys.readouterr().out)
    monkeypatch.undo()
    assert _glue(tiny_init, out, "--lr", "1e-4", "--force") == 0
    assert sorted(p.name for p in out.iterdir()) == ["SST-2", "glue_results.json",
                                                     "glue_results.md"]


def test_a_force_run_whose_last_move_was_cut_is_not_trained_again(tmp_path, tiny_init,  # noqa: F811
                                                                  monkeypatch, capsys):
    """The same --force command keeps a run of its own whose last move a stop cut short."""
    out = tmp_path / "glue"
    flags = ("--force",)

    def cut(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(finetune_results, "replace_dir", cut)
    assert _glue(tiny_init, out, *flags) == 130
    assert (out / "SST-2" / "seed_1.tmp" / "results.json").is_file()
    assert not (out / "SST-2" / "seed_1").exists()
    monkeypatch.undo()

    seeds = _seeds_trained(monkeypatch)
    assert _glue(tiny_init, out, *flags) == 0
    assert seeds == []
    assert "holds this run finished, its last move cut short by a stop; moved to" in \
        capsys.readouterr().err
    assert not (out / "SST-2" / "seed_1.tmp").exists()
    assert (out / "SST-2" / "seed_1" / "model").is_dir()
    assert not (out / "SST-2" / "seed_1" / "checkpoints").exists()
