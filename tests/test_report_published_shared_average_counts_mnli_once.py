"""A published reference row's "average (shared tasks)" cell follows the rule of our own rows:
each shared task is the mean of its columns, so MNLI (-m and -mm) counts once. A probe that
averaged the published row over its columns (MNLI twice) found no test failing: the existing
test shares only SST-2."""

from __future__ import annotations

import json

from test_report import _table_rows

from bertgpu.report import build_report

# SST-2 90, MNLI 80 / 70 (mean 75), CoLA 50 (not shared). Over SST-2 and MNLI: (90 + 75) / 2 =
# 82.5; MNLI counted twice would give (90 + 80 + 70) / 3 = 80.0.
_PUBLISHED = {"name": "pub", "label": "Paper (published)", "average": "70.0",
              "columns": {"CoLA": 50.0, "SST-2": 90.0, "MNLI-m": 80.0, "MNLI-mm": 70.0},
              "source": "a paper", "note": "as published"}


def _task(columns: dict) -> dict:
    score = sum(columns.values()) / len(columns)
    return {"columns": columns, "metrics": {"dev": {"accuracy": score}}, "score": score,
            "per_seed": {"1": dict(columns)}}


def _glue(folder, tasks: dict) -> None:
    folder.mkdir()
    columns = {c: v for t in tasks.values() for c, v in t["columns"].items()}
    scores = [t["score"] for t in tasks.values()]
    (folder / "glue_results.json").write_text(json.dumps({
        "init": "runs/x", "convention": "glue-score", "convention_text": "mean of task scores",
        "tasks": tasks, "columns": columns, "average": sum(scores) / len(scores),
        "references": [_PUBLISHED]}), encoding="utf-8")


def test_published_shared_average_counts_mnli_once(tmp_path):
    # A: SST-2, MNLI and CoLA; B: SST-2 and MNLI. Shared: SST-2 and MNLI.
    _glue(tmp_path / "glueA", {"SST-2": _task({"SST-2": 60.0}),
                               "MNLI": _task({"MNLI-m": 50.0, "MNLI-mm": 40.0}),
                               "CoLA": _task({"CoLA": 10.0})})
    _glue(tmp_path / "glueB", {"SST-2": _task({"SST-2": 70.0}),
                               "MNLI": _task({"MNLI-m": 64.0, "MNLI-mm": 60.0})})
    md = (build_report([tmp_path / "glueA", tmp_path / "glueB"], tmp_path / "rep")
          / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md.split("Per task:")[0])
    assert rows["model"][-1] == "average (shared tasks)"
    # our rows: (60 + 45) / 2 and (70 + 62) / 2, MNLI once
    assert rows["glueA"][-1] == "52.5" and rows["glueB"][-1] == "66.0"
    # the published row by the same rule, not 80.0 (MNLI twice) nor its own 70.0
    assert rows["Paper (published)"][-1] == "82.5"
