"""The GLUE section names the model each folder evaluated and breaks every cell down into its
metrics and seeds, as `bertgpu glue`'s own glue_results.md does (an STS-B "-15.8" was Pearson
-31.6 and Spearman 0, seeds 43.3 and -74.9, and the report showed none of it); and under an
"average (shared tasks)" header the published rows' cells are their mean over those same tasks,
not their own all-task averages."""

from __future__ import annotations

import json

from test_report import _table_rows

from bertgpu.report import build_report

_SIDSITE = {"name": "sidsite-8gb", "label": "BERT 8 GB (published)", "average": "72.7",
            "columns": {"CoLA": 41.0, "SST-2": 89.1, "MRPC": 74.8, "STS-B": 61.9,
                        "MNLI-m": 79.3, "MNLI-mm": 80.1},
            "source": "sidsite.com", "note": "average as published"}
_CARD = {"name": "card", "label": "Card (published)", "average": "78.6-80.7",
         "columns": {"SST-2": 92.0, "MNLI-m": 84.1, "MNLI-mm": 84.6}, "source": "a card",
         "note": "a range"}


def _task(columns: dict, metrics: dict, per_seed: dict) -> dict:
    return {"columns": columns, "metrics": metrics, "score": sum(columns.values()) / len(columns),
            "per_seed": per_seed}


def _glue(folder, init: str, step: int, tasks: dict) -> None:
    folder.mkdir()
    columns = {c: v for t in tasks.values() for c, v in t["columns"].items()}
    scores = [t["score"] for t in tasks.values()]
    (folder / "glue_results.json").write_text(json.dumps({
        "init": init, "init_checkpoint": {"path": f"{init}/checkpoints/step_{step}",
                                          "step": step, "sha256": "0" * 64},
        "convention": "glue-score", "convention_text": "mean of task scores",
        "tasks": tasks, "columns": columns, "average": sum(scores) / len(scores),
        "references": [_SIDSITE, _CARD]}), encoding="utf-8")


def _report(tmp_path) -> str:
    _glue(tmp_path / "glueA", "runs/A", 60, {
        "SST-2": _task({"SST-2": 50.0}, {"dev": {"accuracy": 50.0}},
                       {"1": {"SST-2": 50.0}, "2": {"SST-2": 50.0}}),
        "STS-B": _task({"STS-B": -15.79565}, {"dev": {"pearson": -31.5913, "spearman": 0.0}},
                       {"1": {"STS-B": 43.3373}, "2": {"STS-B": -74.9286}})})
    _glue(tmp_path / "glueB", "runs/B", 30, {
        "SST-2": _task({"SST-2": 60.0}, {"dev": {"accuracy": 60.0}}, {"1": {"SST-2": 60.0}}),
        "MNLI": _task({"MNLI-m": 50.0, "MNLI-mm": 40.0},
                      {"dev_matched": {"accuracy": 50.0}, "dev_mismatched": {"accuracy": 40.0}},
                      {"1": {"MNLI-m": 50.0, "MNLI-mm": 40.0}})})
    return (build_report([tmp_path / "glueA", tmp_path / "glueB"], tmp_path / "rep")
            / "README.md").read_text(encoding="utf-8")


def test_glue_names_the_model_of_each_folder_and_breaks_its_cells_down(tmp_path):
    md = _report(tmp_path)
    assert " Model: `runs/A` (checkpoint `runs/A/checkpoints/step_60`, step 60)." in md
    assert " Model: `runs/B` (checkpoint `runs/B/checkpoints/step_30`, step 30)." in md
    assert "| glueA | STS-B | dev: pearson -31.6, spearman 0.0 | 1: 43.3, 2: -74.9 |" in md
    assert ("| glueB | MNLI | dev_matched: accuracy 50.0; dev_mismatched: accuracy 40.0 "
            "| 1: 50.0/40.0 |") in md


def test_published_rows_average_over_the_shared_tasks_under_that_header(tmp_path):
    md = _report(tmp_path)
    rows = _table_rows(md.split("Per task:")[0])  # the scores table, not the breakdown
    assert rows["model"][-1] == "average (shared tasks)"  # SST-2, the one task both have
    assert rows["glueA"][-1] == "50.0" and rows["glueB"][-1] == "60.0"
    # the published rows over SST-2 too, not their own 72.7 and 78.6-80.7 (all their tasks)
    assert rows["BERT 8 GB (published)"][-1] == "89.1"
    assert rows["Card (published)"][-1] == "92.0"
    assert "not their own averages: BERT 8 GB (published) 72.7, Card (published) 78.6-80.7." in md
