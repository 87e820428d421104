"""`bertgpu watch` across a resume that cut metrics.jsonl: the restarted job (a `--max-restarts`
restart, or a re-run) removes the records after its checkpoint (records.cut_after) and writes its
own, which soon make the file longer than where watch had read to. Watch read on from there, in
the middle of the new records: it missed the new start record (and showed the dead rank 0's: a
"waiting for a restart" all through the restarted job, seen end to end) and took the old attempt's
last train records for the run's. Now a follower checks that the bytes it read last are still
where it read them, and reads the file anew when they are not."""

from __future__ import annotations

import json
from pathlib import Path

from bertgpu.telemetry.records import JsonlFollower, cut_after, run_start
from bertgpu.watch import RunState


def _train(step: int, attempt: int) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step + attempt, "elapsed_s": 1.0 * step,
            "loss": 8.0 / step + attempt, "lr": 1e-4, "tokens_per_s": 800.0 * (attempt + 1)}


def _start(step: int, pid: int) -> dict:
    return {"step": step, "kind": "info", "time": 1.7e9 + step, "elapsed_s": 1.0 * step,
            "event": "start", "host": "h", "pid": pid, "world_size": 2, "max_steps": 12}


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))


def _first_attempt(run: Path) -> Path:
    """Rank 0 (pid 101) logged steps 1 to 6, then was killed; its checkpoint is of step 4."""
    run.mkdir()
    log = run / "metrics.jsonl"
    _append(log, [_start(0, 101), *(_train(s, 0) for s in range(1, 7))])
    return log


def _restarted(log: Path) -> None:
    """The restart resumes from step 4: the records of steps 5 and 6 go, its own come."""
    assert cut_after(log, 4) == 2
    _append(log, [_start(4, 202), *(_train(s, 1) for s in range(5, 9))])


def test_a_follower_reads_a_cut_and_regrown_file_anew(tmp_path):
    log = _first_attempt(tmp_path / "run")
    follower = JsonlFollower(log)
    assert len(follower.poll()) == 7
    read_to = log.stat().st_size
    _restarted(log)
    assert log.stat().st_size > read_to  # grown past where the follower had read
    again = follower.poll()
    assert follower.reset  # old code: False, and the records from the middle of the new ones
    assert [(r["step"], r.get("event") or r["kind"]) for r in again] == [
        (0, "start"), *((s, "train") for s in range(1, 5)), (4, "start"),
        *((s, "train") for s in range(5, 9))]
    _append(log, [_train(9, 1)])  # appended to: read on, not anew
    assert [r["step"] for r in follower.poll()] == [9] and not follower.reset
    assert follower.poll() == [] and not follower.reset


def test_watch_shows_the_restarted_job_not_the_killed_one(tmp_path):
    log = _first_attempt(tmp_path / "run")
    state = RunState(tmp_path / "run")
    state.poll()
    _restarted(log)
    state.poll()
    assert run_start(state.records)["pid"] == 202  # old code: 101, the killed rank 0
    train = state.of_kind("train")
    assert [r["step"] for r in train] == list(range(1, 9))
    assert [r["tokens_per_s"] for r in train[4:]] == [1600.0] * 4  # the restarted job's records
