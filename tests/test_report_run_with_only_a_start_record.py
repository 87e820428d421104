"""A run folder whose metrics.jsonl holds only its start record (a run starting up) showed a
summary of "devices 1" and "wall time 0 s", as if it had run, and not the "No train or eval
records logged yet." a folder without records gets."""

from __future__ import annotations

from test_report import _table_rows, _write_jsonl

from bertgpu.report import build_report

_START = {"step": 0, "kind": "info", "event": "start", "elapsed_s": 0.0, "host": "h", "pid": 1,
          "world_size": 1, "max_steps": 60, "device": "cpu", "torch": "2.13.0+cpu"}


def test_a_run_with_only_its_start_record_has_logged_nothing_yet(tmp_path):
    run = tmp_path / "starting"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [_START])
    md = (build_report([run], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "No train or eval records logged yet." in md
    assert "| devices |" not in md and "wall time" not in md


def test_beside_a_run_that_logged_its_column_is_empty_and_said_so(tmp_path):
    starting, done = tmp_path / "starting", tmp_path / "done"
    for folder in (starting, done):
        folder.mkdir()
    _write_jsonl(starting / "metrics.jsonl", [_START])
    _write_jsonl(done / "metrics.jsonl", [
        _START, {"step": 10, "kind": "train", "elapsed_s": 5.0, "loss": 7.0, "steps_per_s": 2.0,
                 "tokens_per_s": 5000.0}])
    md = (build_report([starting, done], tmp_path / "rep") / "README.md").read_text(
        encoding="utf-8")
    rows = _table_rows(md)
    assert rows["devices"] == ["", "1"]
    assert rows["wall time (of the kept timeline: work lost to a crash not counted)"] == ["", "5 s"]
    assert "starting: no train or eval records logged yet." in md
