"""The fine-tuning table gave scores and metrics to 4 significant digits ("58.33", "mcc 0")
while the GLUE table beside it gives one decimal ("58.3", "0.0"): one rounding for both now."""

from __future__ import annotations

import json

from test_report import _table_rows

from bertgpu.report import build_report


def test_finetune_scores_and_metrics_have_one_decimal_as_glue(tmp_path):
    run = tmp_path / "mrpc"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({
        "task": "MRPC", "score": 58.333333, "steps": 10,
        "metrics": {"dev": {"f1": 66.666667, "accuracy": 50.0, "mcc": 0.0}}}), encoding="utf-8")
    md = (build_report([run], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert _table_rows(md)["mrpc"][:3] == ["MRPC", "58.3", "dev: f1 66.7, accuracy 50.0, mcc 0.0"]
