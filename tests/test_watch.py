"""Tests for `bertgpu watch`: one frame (--once) of a finished and of a running run folder,
following files as they grow (cut lines, a resume), a fine-tuning run still in OUT.tmp, the
live loop, sparklines and bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bertgpu import watch
from bertgpu.cli import main as cli_main
from bertgpu.telemetry.monitor import GpuMonitor
from bertgpu.testing.nvml_sim import SimGpu, SimulatedNvml
from bertgpu.watch import RunState, eta_s, sparkline

CONFIG = ("seed = 0\n[model]\nhidden_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 2\n"
          "[train]\nmax_steps = 10\nglobal_batch_size = 8\nprecision = \"bf16\"\n")


def _train(step: int) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step, "elapsed_s": 10.0 * step,
            "loss": 8.0 / step, "lr": 1e-4 * step, "tokens_per_s": 400.0 * step,
            "tokens_per_s_per_device": 200.0 * step, "mfu": 0.2, "step_time_s": 0.5,
            "mem_peak_gib": 1.25, "tokens_seen": 1500 * step, "slowest_rank": 1,
            "slowest_vs_median": 1.31, "rank_compute_s": [0.4, 0.52]}


def _append(path: Path, rows: list[dict], tail: str = "") -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + tail)


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    run = tmp_path / "base"
    run.mkdir()
    (run / "config.toml").write_text(CONFIG, encoding="utf-8")
    _append(run / "metrics.jsonl", [_train(s) for s in (1, 2, 3, 4)] + [
        {"step": 4, "kind": "eval", "time": 1.7e9, "elapsed_s": 41.0, "val_mlm_loss": 6.25,
         "val_mlm_acc": 0.125}])
    nvml = SimulatedNvml([SimGpu(name="RTX 3090", temp_c=[70, 88], util_pct=[99, 97],
                                 throttle=[0, 0x40]), SimGpu(name="RTX 3060")])
    mon = GpuMonitor(nvml, run / "gpu.jsonl", interval_s=1.0)
    mon.sample()
    nvml.gpus[1].lost = True
    mon.sample()
    mon.close()
    return run


def _frame(capsys, monkeypatch, folder: Path) -> str:
    monkeypatch.setenv("COLUMNS", "140")
    assert cli_main(["watch", str(folder), "--once"]) == 0
    return capsys.readouterr().out


def test_once_on_a_running_run(run, capsys, monkeypatch):
    out = _frame(capsys, monkeypatch, run)
    assert "\x1b[" not in out  # not a terminal: plain text for logs and scripts
    lines = out.splitlines()
    assert lines[0].startswith(f"bertgpu watch  {run}  ·  running (updated ")
    assert "2 layers x 64 hidden, 2 heads; global batch 8, bf16" in out
    # Step 4 of 10 at 10 s a step: 60 s left; elapsed: the newest record's (the eval at 41 s).
    assert "step 4 / 10 (40.0%)  ·  elapsed 00:41  ·  ETA 01:00  ·  tokens 6.0k" in out
    loss = next(line for line in lines if line.startswith("loss"))
    assert "2.0000" in loss and loss.rstrip().endswith("█▃▂▁")  # 8, 4, 2.67, 2
    assert next(line for line in lines if line.startswith("lr")).rstrip().endswith("▁▃▆█")
    assert "tok/s 1.6k (800 per device)  ·  MFU 20.0%  ·  step 0.5 s  ·  mem 1.25 GiB" in out
    assert "slowest rank 1 (1.31x the median compute time of the other ranks)" in out
    assert "last eval @ step 4: val_mlm_loss 6.25  ·  val_mlm_acc 12.50%" in out
    gpu0 = next(line for line in lines if "RTX 3090" in line)
    assert "97%" in gpu0 and "88C" in gpu0 and "300/350 W" in gpu0 and "hw_thermal" in gpu0
    assert "10.0/24 GiB" in gpu0 and "1800 MHz" in gpu0
    gpu1 = next(line for line in lines if "RTX 3060" in line)
    assert "lost" in gpu1 and "GPU is lost" in gpu1


def test_once_into_a_log_keeps_each_line_whole(run, capsys, monkeypatch):
    """`watch --once > log` without COLUMNS: rich took 80 columns and cut lines mid-phrase
    ("data wait" on one line, its share on the next, a dangling "·")."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli_main(["watch", str(run), "--once"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"bertgpu watch  {run}  ·  running (updated "), lines[:3]
    gpu0 = next(line for line in lines if "RTX 3090" in line)
    assert "10.0/24 GiB" in gpu0 and "hw_thermal" in gpu0, lines


def test_once_on_a_finished_run_and_budget_eta(run, capsys, monkeypatch):
    _append(run / "metrics.jsonl", [{"step": 4, "kind": "info", "time": 1.7e9, "elapsed_s": 42,
                                     "event": "end", "reason": "budget"}])
    out = _frame(capsys, monkeypatch, run)
    assert "finished (budget)" in out.splitlines()[0]
    state = RunState(run)
    (run / "config.toml").write_text(CONFIG + "budget_hours = 0.0125\n", encoding="utf-8")
    state.poll()
    assert eta_s(state) == pytest.approx(5.0)  # 45 s of budget, 40 s gone; steps would need 60


def test_a_budget_run_with_a_step_cap_shows_its_share_of_the_budget(run, capsys, monkeypatch):
    """A budget run capped at 10,000 steps used to read "step 4 / 10,000 (0.0%)" while 40 s of
    its 45 s budget were gone, and "(0.0%)" still once it had ended on its budget; the share is
    now the larger of the steps' and the budget's, and says which."""
    capped = CONFIG.replace("max_steps = 10", "max_steps = 10000") + "budget_hours = 0.0125\n"
    (run / "config.toml").write_text(capped, encoding="utf-8")
    out = _frame(capsys, monkeypatch, run)
    assert "step 4 / 10,000 (88.9% of the budget)  ·  elapsed 00:41  ·  ETA 00:05" in out, out
    # Steps ahead of the budget: the steps' share, as for a step run.
    (run / "config.toml").write_text(CONFIG + "budget_hours = 1.0\n", encoding="utf-8")
    assert "step 4 / 10 (40.0%)  ·  elapsed 00:41  ·  ETA 01:00" in _frame(capsys, monkeypatch,
                                                                          run)
    (run / "config.toml").write_text(capped, encoding="utf-8")
    _append(run / "metrics.jsonl", [{"step": 4, "kind": "info", "time": 1.7e9, "elapsed_s": 42,
                                     "event": "end", "reason": "budget"}])
    out = _frame(capsys, monkeypatch, run)
    assert "finished (budget)" in out and "step 4 / 10,000 (100.0% of the budget)" in out, out


def test_the_console_eta_counts_the_budget(monkeypatch):
    """The console line of a budget run capped at 10,000 steps used to show the ETA of the
    steps alone (27:46:40 at 10 s a step) when 5 s of its 45 s budget were left, and a budget
    run without a cap showed none; the ETA is now the smaller of the two, as in watch."""
    import io

    from bertgpu.telemetry import metrics

    clock = [0.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: clock[0])
    # 10 s a step, 40 s gone: 5 s of a 45 s budget left, 20 s of steps to a cap of 6
    for total, hours, eta in ((10000, 0.0125, "ETA 00:05"), (None, 0.0125, "ETA 00:05"),
                              (6, 1.0, "ETA 00:20")):
        out = io.StringIO()
        clock[0] = 0.0
        log = metrics.MetricsLogger(None, is_main=True, total_steps=total, log_every=1,
                                    stream=out)
        log.log_config({"train": {"max_steps": total or 0, "budget_hours": hours}})
        for step in (1, 2, 3, 4):
            clock[0] += 10.0
            log.log(step, "train", loss=1.0)
        log.close()
        assert out.getvalue().splitlines()[-1].endswith(eta), (total, out.getvalue())


def test_compile_time_shown_apart_from_the_rates(run, capsys, monkeypatch):
    """The seconds of the steps that compiled, which the logged rates leave out, are shown
    beside them; a run that compiled nothing does not say so."""
    def rate_line() -> str:
        return next(line for line in _frame(capsys, monkeypatch, run).splitlines()
                    if line.startswith("tok/s"))

    _append(run / "metrics.jsonl", [{**_train(5), "compile_s": 0.0, "compile_steps": 0}])
    assert rate_line().endswith("mem 1.25 GiB")
    _append(run / "metrics.jsonl", [{**_train(6), "compile_s": 27.14, "compile_steps": 2}])
    assert rate_line().endswith("mem 1.25 GiB  ·  compile 27.1 s (2 steps)")


def test_following_growing_files_cut_lines_and_a_resume(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    state = RunState(run)
    state.poll()
    assert state.records == []
    _append(run / "metrics.jsonl", [_train(1), _train(2)], tail='{"step": 3, "ki')
    state.poll()
    assert [r["step"] for r in state.records] == [1, 2]  # the line being written waits
    _append(run / "metrics.jsonl", [], tail='nd": "train", "loss": 1.5}\n')
    state.poll()
    assert [r["step"] for r in state.records] == [1, 2, 3] and state.records[-1]["loss"] == 1.5
    # A crash cut a line, then the run resumed from step 2: the repeated steps replace the old.
    _append(run / "metrics.jsonl", [], tail='{"step": 4, "kind": "tr')
    _append(run / "metrics.jsonl", [], tail="\n")
    _append(run / "metrics.jsonl", [{**_train(3), "loss": 0.25}, _train(4)])
    state.poll()
    assert [r["step"] for r in state.records] == [1, 2, 3, 4]
    assert state.records[2]["loss"] == 0.25
    # A file that shrank (a new run in the same folder) is read again from the start.
    (run / "metrics.jsonl").write_text(json.dumps(_train(1)) + "\n", encoding="utf-8")
    state.poll()
    assert [r["step"] for r in state.records] == [1]


def test_finetune_in_progress_and_bad_input(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sst2"
    (out.with_name("sst2.tmp")).mkdir()
    _append(out.with_name("sst2.tmp") / "metrics.jsonl", [_train(1)])
    frame = _frame(capsys, monkeypatch, out)
    assert "sst2.tmp" in frame.splitlines()[0] and "step 1" in frame
    assert cli_main(["watch", str(tmp_path / "missing"), "--once"]) == 2
    err = capsys.readouterr().err
    assert "bertgpu watch: error:" in err and "missing: does not exist" in err
    assert err.count("\n") == 1
    (tmp_path / "a.txt").write_text("")
    assert cli_main(["watch", str(tmp_path / "a.txt"), "--once"]) == 2
    assert "a.txt: is a file; expected a run folder" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert "waiting for the first record" in _frame(capsys, monkeypatch, tmp_path / "empty")
    for bad in ("nan", "inf", "0", "1e20"):  # nan and inf were sleep()'s traceback
        assert cli_main(["watch", str(out), "--interval", bad]) == 2, bad
        assert (f"--interval: found {float(bad)}, expected a positive number of seconds up to "
                "86400") in capsys.readouterr().err


def test_live_loop_redraws_until_interrupted(run, capsys, monkeypatch):
    sleeps = []

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 1:
            _append(run / "metrics.jsonl", [_train(5)])
        else:
            raise KeyboardInterrupt  # Ctrl-C: the way out of a live view, not an error

    monkeypatch.setattr(watch.time, "sleep", fake_sleep)
    assert cli_main(["watch", str(run), "--interval", "0.5"]) == 0
    assert sleeps == [0.5, 0.5]
    assert "step 5 / 10" in capsys.readouterr().out


def test_sparkline():
    assert sparkline([]) == ""
    assert sparkline([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 5.0]) == "▁▁"
    assert sparkline([1.0, float("nan"), 3.0]) == "▁ █"
    # More values than width: bucket means, so the shape survives.
    assert sparkline([0.0] * 50 + [10.0] * 50, width=4) == "▁▁██"
    assert len(sparkline(list(map(float, range(1000))), width=40)) == 40


def test_status_of_a_quiet_run(run):
    state = RunState(run)
    state.poll()
    assert watch._status(state, time.time() + 3600).startswith("no new record for 1:00:")


def _info(step: int, event: str, **fields) -> dict:
    return {"step": step, "kind": "info", "time": 1.7e9 + step, "elapsed_s": 10.0 * step,
            "event": event, **fields}


def _flat(frame: str) -> str:
    """A frame's text with rich's line wrapping undone."""
    return " ".join(frame.split())


def test_a_run_that_stopped_says_how_without_an_eta(run, capsys, monkeypatch):
    """An end record other than a finish: preempted (at which step of how many, and how to
    resume), diverged (its last loss as it was: nan), an error; never an ETA."""
    _append(run / "metrics.jsonl", [_info(4, "end", reason="preempted"),
                                    _info(4, "preempted", signal="SIGTERM")])
    out = _frame(capsys, monkeypatch, run)
    assert "stopped (preempted at step 4 of 10; re-run the same command to resume)" in _flat(out)
    assert "ETA" not in out and "step 4 / 10 (40.0%)" in out
    # The same command resumed it: running again.
    _append(run / "metrics.jsonl", [_info(4, "start", host="elsewhere", pid=1, max_steps=10)])
    assert "running (updated" in _frame(capsys, monkeypatch, run).splitlines()[0]
    _append(run / "metrics.jsonl", [{**_train(5), "loss": None, "grad_norm": None},
                                    _info(6, "end", reason="diverged", error="training diverged")])
    out = _frame(capsys, monkeypatch, run)
    assert "stopped (diverged at step 6)" in _flat(out) and "ETA" not in out
    assert next(line for line in out.splitlines() if line.startswith("loss")).split()[1] == "nan"
    _append(run / "metrics.jsonl", [_info(6, "start", host="elsewhere", pid=1),
                                    _info(6, "end", reason="error", error="OSError: disk full")])
    out = _frame(capsys, monkeypatch, run)
    assert "stopped (error at step 6: OSError: disk full)" in _flat(out)


def test_a_killed_run_is_told_from_a_running_one(run, capsys, monkeypatch):
    """No end record: on the host the run started on, a process that is gone means killed
    (SIGKILL, out of memory); a live one, or a run of another host, is running."""
    import os
    import socket
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    here = socket.gethostname()
    records = run / "metrics.jsonl"
    _append(records, [_info(0, "start", host=here, pid=os.getpid(), max_steps=10)])
    out = _frame(capsys, monkeypatch, run)
    assert "running (updated" in out.splitlines()[0] and "ETA" in out
    _append(records, [_info(4, "start", host="another-node", pid=dead_pid)])
    assert "running (updated" in _frame(capsys, monkeypatch, run).splitlines()[0]
    _append(records, [_info(4, "start", host=here, pid=dead_pid)])
    out = _frame(capsys, monkeypatch, run)
    assert (f"stopped (process {dead_pid} is gone; no end record: killed or crashed)"
            in _flat(out))
    assert "ETA" not in out
    # the pid of a killed run, taken since by another process (this one): gone all the same
    from bertgpu.telemetry.records import process_started

    started = process_started(os.getpid())
    assert isinstance(started, int)
    _append(records, [_info(5, "start", host=here, pid=os.getpid(), pid_started=started + 1)])
    assert (f"stopped (process {os.getpid()} is gone; no end record: killed or crashed)"
            in _flat(_frame(capsys, monkeypatch, run)))
    _append(records, [_info(6, "start", host=here, pid=os.getpid(), pid_started=started)])
    assert "running (updated" in _frame(capsys, monkeypatch, run).splitlines()[0]


def test_live_view_of_a_run_that_ends_prints_its_last_frame_and_exits(run, capsys, monkeypatch):
    sleeps = []

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        assert len(sleeps) < 5, "the view did not stop at the end record"
        _append(run / "metrics.jsonl", [_train(5), _info(5, "end", reason="max_steps")])

    monkeypatch.setattr(watch.time, "sleep", fake_sleep)
    monkeypatch.setenv("COLUMNS", "140")
    assert cli_main(["watch", str(run), "--interval", "0.5"]) == 0
    out = _flat(capsys.readouterr().out)
    assert sleeps == [0.5] and "finished (max_steps)" in out and "step 5 / 10" in out
    # Already finished: one frame, no waiting.
    assert cli_main(["watch", str(run)]) == 0
    assert sleeps == [0.5] and "finished (max_steps)" in _flat(capsys.readouterr().out)


def test_a_shard_set_is_not_a_run(tmp_path, capsys):
    from _shards import write_synthetic_shards

    data = write_synthetic_shards(tmp_path / "data", n_train=8, n_val=2)
    assert cli_main(["watch", str(data), "--once"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertgpu watch: error:")
    assert f"{data}: a shard set (manifest.json of bertgpu prepare), not a run folder" in err
    assert "expected a run folder (metrics.jsonl)" in err


def test_a_run_killed_before_its_first_record_is_told_and_the_view_ends(tmp_path, capsys,
                                                                        monkeypatch):
    """A run SIGKILLed at start-up leaves only its lock ("PID HOST", written once held): watch
    waited for the first record for ever. Its process gone, that is the status and the live view
    ends; a live holder, or another host's, is still waited for."""
    import os
    import socket
    import subprocess
    import sys

    from bertgpu.train.run_folder import LOCK_FILE

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_FILE
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")
    assert "waiting for the first record" in _frame(capsys, monkeypatch, run)
    lock.write_text(f"{dead_pid} another-node\n")
    assert "waiting for the first record" in _frame(capsys, monkeypatch, run)
    lock.write_text(f"{dead_pid} {socket.gethostname()}\n")
    said = f"stopped (process {dead_pid} is gone before its first record: killed or crashed)"
    assert said in _flat(_frame(capsys, monkeypatch, run))
    monkeypatch.setattr(watch.time, "sleep", lambda s: pytest.fail("waited on a dead run"))
    assert cli_main(["watch", str(run)]) == 0
    assert said in _flat(capsys.readouterr().out)


def test_a_live_view_stopped_by_sigterm_exits_143(run, capsys, monkeypatch):
    """SIGTERM (a scheduler, `timeout`) ended `watch` with exit 0, as Ctrl-C does: Terminated is
    a KeyboardInterrupt, and the live view took it for the way out. Now the command line's
    "stopped by SIGTERM" and 143, as for every command; Ctrl-C still leaves with 0."""
    from bertgpu.errors import Terminated

    def stopped(s: float) -> None:
        raise Terminated

    monkeypatch.setattr(watch.time, "sleep", stopped)
    assert cli_main(["watch", str(run), "--interval", "0.5"]) == 143
    assert capsys.readouterr().err.strip().endswith("bertgpu watch: stopped by SIGTERM")
    assert cli_main(["watch", str(run.parent / "not_yet"), "--interval", "0.5"]) == 143


def test_into_a_pipe_a_frame_is_printed_each_time_the_run_logs(run, capsys, monkeypatch):
    """`watch RUN > log`: rich's live view printed nothing until the run ended (then one frame;
    none if the watch was stopped first). Now a frame whenever the run logged, and a last one at
    its end; an interval with nothing new prints nothing."""
    sleeps = []

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 1:
            _append(run / "metrics.jsonl", [_train(5)])
        elif len(sleeps) == 3:
            _append(run / "metrics.jsonl", [_info(5, "end", reason="max_steps")])

    monkeypatch.setattr(watch.time, "sleep", fake_sleep)
    assert cli_main(["watch", str(run), "--interval", "0.5"]) == 0
    out = capsys.readouterr().out
    frames = out.count("step 4 / 10") + out.count("step 5 / 10")
    assert len(sleeps) == 3 and frames == 3, out  # start, step 5, the end (not the idle one)
    assert out.index("step 4 / 10") < out.index("step 5 / 10")
