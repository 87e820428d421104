"""The GLUE table's protocol line names what the runs trained with, so that a reader can
reproduce the table: the lr as used (it said the --lr given, 1e-4, over runs that trained at
4e-4 after --lr_scaling linear), the optimizer, and any other setting that changes the scores
(--hidden_dropout_prob 0 was not named). A table of --max_eval_examples / --max_train_examples
runs says it is a subset, in glue_results.md and in `bertgpu report` (it read as a full GLUE-dev
table, beside published rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_glue_cli import tiny_init  # noqa: F401 (the fixture)
from test_report import _table_rows

from bertgpu.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "glue"

pytestmark = pytest.mark.usefixtures("one_thread")


def _glue(init: Path, out: Path, task: str, *extra: str) -> int:
    return main(["glue", "--data-dir", str(FIXTURES), "--init", str(init), "--out", str(out),
                 "--tasks", task, "--epochs", "1", "--max_seq_len", "64", *extra])


def test_the_line_names_the_lr_the_runs_used_the_optimizer_and_other_settings(tmp_path,
                                                                              tiny_init,  # noqa: F811
                                                                              capsys):
    out = tmp_path / "glue"
    assert _glue(tiny_init, out, "rte", "--lr", "1e-4", "--lr_scaling", "linear",
                 "--reference_batch_size", "8", "--global_batch_size", "32", "--optimizer",
                 "lamb", "--hidden_dropout_prob", "0") == 0
    printed = capsys.readouterr().out
    run = json.loads((out / "RTE" / "seed_1" / "results.json").read_text(encoding="utf-8"))
    assert run["peak_lr"] == pytest.approx(4e-4)
    summary = json.loads((out / "glue_results.json").read_text(encoding="utf-8"))
    p = summary["protocol"]
    assert p["lr"] == run["peak_lr"]
    assert p["lr_scaling"] == {"lr": 1e-4, "rule": "linear", "reference_batch_size": 8}
    assert p["optimizer"] == "lamb" and p["other"] == {"hidden_dropout_prob": 0.0}
    assert p["subset"] is None
    line = ("Protocol: fine-tuning 1 epoch, lamb (weight decay 0.01), lr 0.0004 (0.0001 x linear "
            "scaling from batch 8, linear decay, 10% warm-up), batch 32, max_seq_len 64, fp32, "
            "hidden_dropout_prob 0, seeds 1; each cell is the median over 1 seed per metric of "
            "the final epoch dev score.")
    md = (out / "glue_results.md").read_text(encoding="utf-8")
    assert line in md.splitlines() and line in printed.splitlines()
    assert p["text"] == line.removeprefix("Protocol: ").removesuffix(".")
    assert md.startswith("# GLUE dev results\n") and "| ours |" in md

    from bertgpu.report import build_report

    report = (build_report([out], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert f"glue: protocol: {p['text']}." in report


def test_a_table_of_default_settings_names_no_other_setting():
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.glue import summarise
    from bertgpu.tasks.glue import get_task

    runs = {"SST-2": {1: {"columns": {"SST-2": 50.0}, "max_seq_len": 128, "peak_lr": 2e-5,
                          "config": {"lr": 2e-5, "epochs": 3},
                          "metrics": {"dev": {"accuracy": 50.0}}}}}
    p = summarise(runs, [get_task("sst2")], [1], load_finetune_config(None, []), "init", [],
                  [])["protocol"]
    assert p["text"] == ("fine-tuning 3 epochs, adamw (weight decay 0.01), lr 2e-05 (linear "
                         "decay, 10% warm-up), batch 32, max_seq_len 128, fp32, seeds 1; each "
                         "cell is the median over 1 seed per metric of the final epoch dev score")
    assert p["other"] == {} and p["subset"] is None and p["lr_scaling"] is None


def test_runs_that_did_not_record_their_peak_lr_get_the_scaled_one():
    """results.json of an older bertgpu, without peak_lr: the lr scaled as the runs did."""
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.glue import summarise
    from bertgpu.tasks.glue import get_task

    runs = {"SST-2": {1: {"columns": {"SST-2": 50.0}, "metrics": {"dev": {"accuracy": 50.0}}}}}
    cfg = load_finetune_config(None, ["--lr", "1e-4", "--lr_scaling", "sqrt",
                                      "--reference_batch_size", "8", "--global_batch_size", "32",
                                      "--epochs", "2"])
    p = summarise(runs, [get_task("sst2")], [1], cfg, "init", [], [])["protocol"]
    assert p["lr"] == pytest.approx(2e-4)
    assert "lr 0.0002 (0.0001 x sqrt scaling from batch 8, " in p["text"]


def test_a_subset_table_says_so_in_its_heading_protocol_row_and_report(
        tmp_path, tiny_init, capsys):  # noqa: F811
    out = tmp_path / "glue"
    assert _glue(tiny_init, out, "mnli", "--max_eval_examples", "1", "--max_train_examples", "2",
                 "--reference", "sidsite-8gb") == 0
    printed = capsys.readouterr().out
    md = (out / "glue_results.md").read_text(encoding="utf-8")
    subset = ("Subset (--max_eval_examples 1 --max_train_examples 2): scores on the first 1 "
              "example of each dev split, trained on the first 2 examples of each task's "
              "training set; not comparable with full GLUE dev results or published rows")
    for text in (md, printed):
        assert "\n# GLUE dev results (subset)\n" in "\n" + text
        assert f"**{subset}.**" in text and "| ours (subset) |" in text
        assert ("Protocol: fine-tuning 1 epoch on the first 2 training examples of each task, "
                in text)
        assert "of the final epoch dev score on the first 1 example of each dev split." in text
    p = json.loads((out / "glue_results.json").read_text(encoding="utf-8"))["protocol"]
    assert p["subset"] == subset
    assert p["max_eval_examples"] == 1 and p["max_train_examples"] == 2

    from bertgpu.report import build_report

    report = (build_report([out], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(report)
    assert "glue (subset)" in rows and "glue" not in rows
    assert f"glue: {subset}. protocol: {p['text']}." in report


def test_the_report_marks_the_subset_table_of_an_older_glue(tmp_path):
    """A glue_results.json written before the protocol said so: its config names the cut."""
    from bertgpu.report import build_report

    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "glue_results.json").write_text(json.dumps({
        "convention": "glue-score", "convention_text": "the mean",
        "protocol": {"epochs": 1, "lr": 3e-4, "global_batch_size": 32, "max_seq_len": 128,
                     "warmup_fraction": 0.1, "decay": "linear", "weight_decay": 0.01,
                     "precision": "fp32", "seeds": [1], "aggregate": "median over 1 seed per "
                     "metric", "checkpoint": "final epoch"},
        "config": {"max_eval_examples": 5, "max_train_examples": None},
        "tasks": {"CoLA": {"score": 10.0}}, "columns": {"CoLA": 10.0}, "average": 10.0,
        "references": []}), encoding="utf-8")
    report = (build_report([folder], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "old (subset)" in _table_rows(report)
    assert ("old: Subset (--max_eval_examples 5): not comparable with full GLUE dev results or "
            "published rows. protocol: fine-tuning 1 epoch, lr 0.0003 (linear decay" in report)
