"""`bertgpu watch OUT` on a fine-tuning run in progress follows its OUT.tmp; once the run
finished, OUT.tmp becomes OUT (fsutil.replace_dir). The view stayed on the vanished OUT.tmp,
read nothing more (not the end record) and, the run's process gone, said "killed or crashed".
It now moves with the folder and reads each file on from where it was."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from bertgpu import watch
from bertgpu.cli import main as cli_main
from bertgpu.fsutil import SCRATCH_MARK, replace_dir
from bertgpu.telemetry.run_folders import resolve
from bertgpu.watch import RunState, ended


def _train(step: int) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step, "elapsed_s": 2.0 * step,
            "loss": 0.7 / step, "epoch": 1, "lr": 1e-4, "tokens_seen": 500 * step}


def _info(step: int, event: str, **fields) -> dict:
    return {"step": step, "kind": "info", "time": 1.7e9 + step, "elapsed_s": 2.0 * step,
            "event": event, **fields}


def _append(path: Path, rows: list[dict], tail: str = "") -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + tail)


def _dead_pid() -> int:
    """The pid of a process that has exited: the fine-tune, gone once it renamed its folder."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def _running_finetune(out: Path, pid: int | None = None) -> Path:
    work = out.with_name(out.name + ".tmp")
    work.mkdir()
    (work / SCRATCH_MARK).touch()
    _append(work / "metrics.jsonl", [
        _info(0, "start", host=socket.gethostname(), pid=pid or _dead_pid(), world_size=1,
              max_steps=12, task="SST-2"), _train(1), _train(2)])
    return work


def test_the_view_follows_the_run_into_out_and_reads_on(tmp_path):
    out = tmp_path / "ft7"
    work = _running_finetune(out)
    state = RunState(resolve(out))
    state.poll()
    assert state.folder == work and [r["step"] for r in state.records] == [0, 1, 2]
    # a line half written when the run renamed its folder: its rest is read from OUT
    _append(work / "metrics.jsonl", [_train(3)], tail='{"step": 4, "kind": "tr')
    state.poll()
    _append(work / "metrics.jsonl", [], tail='ain", "loss": 0.1}\n')
    _append(work / "metrics.jsonl", [_train(12), _info(12, "end", reason="max_steps")])
    replace_dir(work, out)
    state.poll()
    assert state.folder == out
    assert [r["step"] for r in state.records] == [0, 1, 2, 3, 4, 12, 12]  # none twice or lost
    assert ended(state) == "finished (max_steps)"


def test_another_runs_out_is_not_taken_for_this_one(tmp_path):
    """OUT.tmp gone (deleted), and OUT holds an earlier run's records: not this run's rest."""
    out = tmp_path / "ft7"
    out.mkdir()
    _append(out / "metrics.jsonl", [_train(1), _info(1, "end", reason="max_steps")])
    work = _running_finetune(out)
    state = RunState(work)
    state.poll()
    for name in os.listdir(work):
        (work / name).unlink()
    work.rmdir()
    state.poll()
    assert state.folder == work and [r["step"] for r in state.records] == [0, 1, 2]


def test_a_run_that_finished_before_its_first_record_was_read(tmp_path):
    """watch started on an OUT.tmp holding only its scratch mark: the whole file, from OUT."""
    out = tmp_path / "ft7"
    work = out.with_name("ft7.tmp")
    work.mkdir()
    (work / SCRATCH_MARK).touch()
    state = RunState(resolve(out))
    state.poll()
    _append(work / "metrics.jsonl", [_train(12), _info(12, "end", reason="max_steps")])
    replace_dir(work, out)
    state.poll()
    assert state.folder == out and ended(state) == "finished (max_steps)"


def test_the_live_view_ends_with_the_finish_at_the_last_step(tmp_path, capsys, monkeypatch):
    out = tmp_path / "ft7"
    work = _running_finetune(out, pid=os.getpid())  # the fine-tune: running until it renamed
    exited = []
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:  # os.kill(pid, 0): is it there?
        if pid == os.getpid() and sig == 0 and exited:
            raise ProcessLookupError(pid)
        real_kill(pid, sig)

    def finish(seconds: float) -> None:  # the run's last records, its rename, its exit
        _append(work / "metrics.jsonl", [_train(12), _info(12, "end", reason="max_steps")])
        replace_dir(work, out)
        exited.append(True)

    monkeypatch.setattr(os, "kill", kill)
    monkeypatch.setattr(watch.time, "sleep", finish)
    monkeypatch.setenv("COLUMNS", "160")
    assert cli_main(["watch", str(out), "--interval", "1"]) == 0
    last = capsys.readouterr().out.strip().split("bertgpu watch")[-1]
    assert " ".join(last.split()).startswith(f"{out} · finished (max_steps)"), last
    assert "step 12 / 12 (100.0%)" in last and "killed" not in last
