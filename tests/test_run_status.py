"""How a run's records say it started and ended (`telemetry.records.run_end`, `describe_end`),
and the tester's runs end to end: a diverged run, a run that ends on its budget and a SIGKILLed
run, each seen by `bertgpu watch --once` and `bertgpu report`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _shards import write_synthetic_shards

from bertgpu.cli import main
from bertgpu.telemetry.records import describe_end, read_metrics, run_end, run_start

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")

pytestmark = pytest.mark.usefixtures("one_thread")


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", TINY, "--data", str(data), "--out", str(out),
            "--model.vocab_size", "100", "--model.hidden_size", "32",
            "--model.intermediate_size", "64", "--model.max_position_embeddings", "64",
            "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
            "--train.eval_sequences", "8", "--checkpoint.every_steps", "0", *extra]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _watch(run: Path, capsys, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    assert main(["watch", str(run), "--once"]) == 0
    return _flat(capsys.readouterr().out)


def _report_rows(run: Path, out: Path) -> dict[str, str]:
    assert main(["report", str(run), "--out", str(out)]) == 0
    rows = {}
    for line in (out / "README.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1] if len(cells) > 1 else ""
    return rows


def test_run_end_follows_starts_resumes_and_older_runs():
    def train(step):
        return {"step": step, "kind": "train", "loss": 1.0}

    def info(step, event, **kw):
        return {"step": step, "kind": "info", "event": event, **kw}

    preempted = info(9, "end", reason="preempted")
    records = [info(0, "start", pid=1), train(9), preempted, info(9, "preempted")]
    assert run_end(records) is preempted and run_start(records)["pid"] == 1
    assert run_end([*records, info(9, "start", pid=2)]) is None  # resumed at the same step
    assert run_end([train(9), preempted, train(10)]) is None  # resumed by an older version
    assert run_end([train(9), preempted, train(9)]) is preempted  # not a later step
    assert run_end([train(1)]) is None and run_start([train(1)]) is None
    assert describe_end(preempted, 30) == ("stopped (preempted at step 9 of 30; re-run the same "
                                           "command to resume)")
    assert describe_end(preempted) == "stopped (preempted at step 9; re-run the same command " \
                                      "to resume)"
    assert describe_end(info(6, "end", reason="diverged")) == "stopped (diverged at step 6)"
    assert (describe_end(info(3, "end", reason="error", error="OSError: x"))
            == "stopped (error at step 3: OSError: x)")
    assert describe_end(info(3, "end", reason="budget")) == "finished (budget)"
    assert describe_end(info(3, "end")) == "finished"


@pytest.mark.timeout(120)
def test_a_diverged_run_says_so_in_watch_and_report(shards, tmp_path, capsys, monkeypatch):
    run = tmp_path / "r_nan"
    rc = main(_args(shards, run, "--optim.lr", "1e6", "--train.grad_clip", "0",
                    "--schedule.warmup_steps", "0", "--train.max_steps", "30",
                    "--train.log_every_steps", "1", "--train.eval_every_steps", "0"))
    assert rc == 2 and "training diverged" in capsys.readouterr().err
    end = read_metrics(run)[-1]
    assert (end["event"], end["reason"]) == ("end", "diverged")
    frame = _watch(run, capsys, monkeypatch)
    assert f"stopped (diverged at step {end['step']})" in frame and "ETA" not in frame
    assert "loss nan" in frame
    rows = _report_rows(run, tmp_path / "rep")
    assert rows["final train loss"] == "nan"
    assert rows["how the run ended"] == f"stopped (diverged at step {end['step']})"


@pytest.mark.timeout(120)
def test_a_run_ended_by_its_budget_has_its_last_step_logged(shards, tmp_path, capsys,
                                                            monkeypatch):
    run = tmp_path / "r_bud"
    assert main(_args(shards, run, "--train.budget_hours", "0.0002", "--train.max_steps", "0",
                      "--train.log_every_steps", "1000", "--train.eval_every_steps", "0")) == 0
    records = read_metrics(run)
    end = next(r for r in records if r.get("event") == "end")
    train = [r for r in records if r["kind"] == "train"]
    assert end["reason"] == "budget" and [r["step"] for r in train] == [end["step"]]
    frame = _watch(run, capsys, monkeypatch)
    assert "finished (budget)" in frame and "no train records yet" not in frame
    assert f"step {end['step']:,}" in frame and "ETA" not in frame
    rows = _report_rows(run, tmp_path / "rep")
    assert rows["optimizer steps"] == f"{end['step']:,}"
    assert rows["tokens seen"] and rows["final train loss"] == f"{train[-1]['loss']:.4f}"


@pytest.mark.timeout(180)
def test_a_sigkilled_run_is_not_shown_as_running(shards, tmp_path, capsys, monkeypatch):
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("BERTGPU_FAULTS", None)
    proc = subprocess.Popen([sys.executable, "-m", "bertgpu",
                             *_args(shards, run, "--train.max_steps", "100000",
                                    "--train.log_every_steps", "1")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 120
        while (time.monotonic() < deadline
               and not (metrics.exists() and metrics.read_text().count('"train"') >= 2)):
            time.sleep(0.05)
        start = json.loads(metrics.read_text().splitlines()[0])
        assert (start["event"], start["pid"]) == ("start", proc.pid)
        frame = _watch(run, capsys, monkeypatch)
        assert "running (updated" in frame
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    frame = _watch(run, capsys, monkeypatch)
    assert f"stopped (process {proc.pid} is gone; no end record: killed or crashed)" in frame
    assert "ETA" not in frame


def test_a_long_error_is_cut_at_a_word_without_an_open_code_span():
    """The report showed an error cut at 200 characters inside a `code span`: its backtick never
    closed, and the rest of the report's markdown ran on as code."""
    from bertgpu.telemetry.records import describe_end

    error = ("RuntimeError: Too many open files. Communication with the workers is no longer "
             "possible. Please increase the limit using `ulimit -n` in the shell or change the "
             "sharing strategy by calling "
             "`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of "
             "your code")
    text = describe_end({"event": "end", "reason": "error", "step": 3, "error": error}, 10)
    assert text.count("`") % 2 == 0, text
    assert text.endswith(" …)") and "torch.multiprocessing" not in text, text
    short = describe_end({"event": "end", "reason": "error", "step": 3, "error": "x `y` z"}, 10)
    assert short.endswith(": x `y` z)"), short
