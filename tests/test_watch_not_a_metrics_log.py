"""`watch` of a folder whose metrics.jsonl is not a metrics log (binary, or another file saved
under that name) says so in one line: it showed "running ... no train records yet" for ever,
each bad line skipped as a crash's cut line."""

from __future__ import annotations

from bertgpu.cli import main


def test_a_metrics_file_that_is_not_a_log_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b"\x00\x9f binary \xff\n" * 40)
    assert main(["watch", str(run), "--once"]) == 2  # old code: 0, "no train records yet"
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "metrics.jsonl:1: found" in err, err
    assert "expected one JSON object per line" in err


def test_a_cut_line_after_the_first_is_still_skipped(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"kind": "info", "step": 0, "event": "start", "time": 1.0}\n'
        '{"kind": "train", "step": 1, "lo\n'  # cut by a crash, then a resume wrote on
        '{"kind": "train", "step": 1, "loss": 2.5, "time": 2.0}\n', encoding="utf-8")
    assert main(["watch", str(run), "--once"]) == 0
    assert "step 1" in capsys.readouterr().out
