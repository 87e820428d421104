"""A stop signal under `--nproc 2` (train/launcher.py) is a stop wherever it lands: on the
`bertgpu` process, on torch's agent (its child) or on one worker. Each ends with exit status 143
(130 for SIGINT), the stop line alone and no restart. A SIGTERM to one worker used to end in
torch's traceback, its failure report and "rank 1 failed with exit code 143" (exit 1); with
--max-restarts the job was started again and trained on to its end (exit 0). The line sequences
below are the launcher's real stderr (torch 2.13; paths shortened)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from _e2e import args, bertgpu_started, e2e_shards

from bertgpu.train import launcher

_LOG = "W1127 23:47:09.856000 807 torch/distributed/elastic/"
_STOP = ("bertgpu pretrain: SIGTERM: wrote a preemption checkpoint of step 6 in 0.0 s; re-running "
         "the same command resumes from step 6 (r/checkpoints/step_6)\n")
_FRAMES = ['  File "<frozen runpy>", line 198, in _run_module_as_main\n',
           '  File "torch/distributed/run.py", line 1028, in main\n', "    run(args)\n",
           "           ^^^^^^^^^^^^^\n"]
_SIGNAL_EXCEPTION = ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 807 "
                     "got signal: 15\n")


def _report(code: int) -> list[str]:
    """torch's ChildFailedError and failure report: rank 1 exited first with `code`, then rank 0
    died of the agent's SIGTERM."""
    return [
        "E1127 23:55:05.065000 3932 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
        f"(exitcode: {code}) local_rank: 1 (pid: 3985) of binary: /usr/bin/python\n",
        "Traceback (most recent call last):\n", *_FRAMES,
        '  File "torch/distributed/launcher/api.py", line 383, in launch_agent\n',
        "    raise ChildFailedError(\n",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
        "============================================================\n", "bertgpu FAILED\n",
        "------------------------------------------------------------\n", "Failures:\n", "[1]:\n",
        "  time      : 2026-11-27_23:55:05\n", "  host      : localhost\n",
        "  rank      : 0 (local_rank: 0)\n", "  exitcode  : -15 (pid: 3984)  (SIGTERM)\n",
        "  error_file: <N/A>\n", "  traceback : Signal 15 (SIGTERM) received by PID 3984\n",
        "------------------------------------------------------------\n",
        "Root Cause (first observed failure):\n", "[0]:\n", "  time      : 2026-11-27_23:55:04\n",
        "  host      : localhost\n", "  rank      : 1 (local_rank: 1)\n",
        f"  exitcode  : {code} (pid: 3985) \n", "  error_file: <N/A>\n",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n",
        "============================================================\n"]


def _worker_stopped(code: int = 143) -> list[str]:
    """SIGTERM to rank 1 only: rank 0 writes the preemption checkpoint and says so, rank 1 exits
    143, and torch's agent closes rank 0 and reports the job failed."""
    return [_STOP, f"{_LOG}multiprocessing/api.py:1028] Sending process 3984 closing signal "
            "SIGTERM\n", *_report(code)]


def test_a_workers_stop_is_its_line_alone(capsys):
    tail = launcher._pass_through(iter(_worker_stopped()))
    assert capsys.readouterr().err == _STOP
    assert len(tail) == len(_worker_stopped())  # describe_failure still reads everything
    # the same report after a crash (rank 1 exited 1) is shown whole
    crashed = _worker_stopped(1)
    launcher._pass_through(iter(crashed))
    assert capsys.readouterr().err == "".join(crashed)


@pytest.mark.parametrize("code, expected", [(143, 143), (130, 130), (-15, 143), (1, None)])
def test_a_workers_stop_is_not_restarted(monkeypatch, capsys, code, expected):
    """--max-restarts restarts a failed job, not a stopped one: the first attempt's end is
    the command's."""
    attempts = []

    def once(nproc, argv, attempt):
        attempts.append(attempt)
        return 1, _worker_stopped(code) if attempt == 0 else ["x\n"], []

    monkeypatch.setattr(launcher, "_launch_once", once)
    rc = launcher.launch_local(2, ["pretrain"], max_restarts=1, resume_hint=lambda: "hint")
    err = capsys.readouterr().err
    if expected is None:  # a crash is still restarted
        assert attempts == [0, 1] and "restart 1 of 1" in err, err
        return
    assert rc == expected and attempts == [0], err
    assert err == "", err  # rank 0's line said it (the launcher's own would repeat it)


def test_a_crash_while_stopping_is_named_last(monkeypatch, capsys):
    """A stop forwarded by this process, and the launcher's report names a crash as the first
    failure: the report (shown) is followed by one line naming it, and the job is not
    restarted."""
    monkeypatch.setattr(launcher, "_launch_once",
                        lambda n, argv, attempt: (1, _report(1), [signal.SIGTERM]))
    assert launcher.launch_local(2, ["pretrain"], max_restarts=1, resume_hint=lambda: "h") == 143
    assert capsys.readouterr().err == ("bertgpu pretrain: rank 1 failed with exit code 1 (its "
                                       "error is above) while stopping on SIGTERM; h\n")


def test_a_stop_signal_to_torchs_agent_is_a_stop(monkeypatch, capsys):
    """SIGTERM to torch's agent: it logs the signal, closes the workers (rank 0 says how they
    stopped) and raises SignalException. That traceback used to be shown, then "the workers
    failed (the launcher's report is above)", exit 1."""
    received = f"{_LOG}agent/server/api.py:753] Received 15 death signal, shutting down workers\n"
    stream = [received, _STOP, "Traceback (most recent call last):\n", *_FRAMES,
              _SIGNAL_EXCEPTION]
    tail = launcher._pass_through(iter(stream))
    assert capsys.readouterr().err == received + _STOP
    monkeypatch.setattr(launcher, "_launch_once", lambda n, argv, attempt: (1, tail, []))
    assert launcher.launch_local(2, ["pretrain"], max_restarts=1, resume_hint=lambda: "h") == 143
    assert capsys.readouterr().err == ""
    # before torch's handlers were in place the agent died of the signal: a stop, said here
    monkeypatch.setattr(launcher, "_launch_once", lambda n, argv, attempt: (-2, [], []))
    assert launcher.launch_local(2, ["pretrain"], max_restarts=1, resume_hint=lambda: "h") == 130
    assert capsys.readouterr().err == "bertgpu pretrain: stopped by SIGINT; h\n"


def test_a_second_sigterm_leaves_no_part_of_the_chained_traceback(capsys):
    """A second SIGTERM while torch's agent waits for its workers: it raises SignalException
    again while handling the first, and Python prints the two tracebacks chained. The header
    between them ("During handling of the above exception, another exception occurred:") was
    printed after the stop line."""
    closing = [f"{_LOG}multiprocessing/api.py:1028] Sending process {pid} closing signal SIGTERM\n"
               for pid in (824, 825)]
    second = ("bertgpu pretrain: second SIGTERM: stopped at once in step 6; re-running the same "
              "command resumes from step 4 (r/checkpoints/step_4)\n")
    first_tb = ["Traceback (most recent call last):\n",
                '  File "torch/distributed/elastic/agent/server/api.py", line 745, in run\n',
                "    result = self._invoke_run(role)\n", _SIGNAL_EXCEPTION]
    chained = ["\n", "During handling of the above exception, another exception occurred:\n", "\n",
               "Traceback (most recent call last):\n", *_FRAMES,
               '  File "torch/distributed/elastic/multiprocessing/api.py", line 86, in '
               "_terminate_process_handler\n", _SIGNAL_EXCEPTION]
    stream = [f"{_LOG}agent/server/api.py:753] Received 15 death signal, shutting down workers\n",
              *closing, *closing, second, *first_tb, *chained]
    for stopping in (True, False):  # forwarded by this process, or sent to the agent itself
        tail = launcher._pass_through(iter(stream), stopping=lambda stopping=stopping: stopping)
        assert capsys.readouterr().err == "".join(stream[:6])
        assert len(tail) == len(stream)
    # a traceback chained to one that is shown is shown too, header included
    shown = ["Traceback (most recent call last):\n", '  File "x.py", line 1\n', "ValueError: x\n"]
    launcher._pass_through(iter([*shown, *chained, "after\n"]), stopping=lambda: True)
    assert capsys.readouterr().err == "".join([*shown, *chained, "after\n"])
    # ... but not one that merely follows it
    launcher._pass_through(iter([*shown, *chained[3:]]), stopping=lambda: True)
    assert capsys.readouterr().err == "".join(shown)


# -- end to end -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return e2e_shards(tmp_path_factory)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1]
                                            .split()[1]) == pid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def _local_rank(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(v.split(b"=")[1]) for v in env if v.startswith(b"LOCAL_RANK=")), None)


@pytest.mark.timeout(240)
def test_sigterm_to_one_worker_ends_the_job_as_a_stop(shards, tmp_path):
    """`--nproc 2 --max-restarts 1`; SIGTERM at step 5 to rank 1 alone: exit 143, rank 0's stop
    line last, no traceback, no failure report, no restart, and the checkpoint that line names
    is complete and holds the step the run stopped at. (A SIGTERM to torch's agent alone ends
    the same way: `test_a_stop_signal_to_torchs_agent_is_a_stop` reads its real lines.)"""
    run = tmp_path / "run"
    proc = bertgpu_started(args(shards, run, "--nproc", "2", "--max-restarts", "1"),
                           faults="delay_rank=0:0.2")
    try:
        metrics, deadline = run / "metrics.jsonl", time.monotonic() + 120
        while not (metrics.exists() and '"step": 5, "kind": "train"' in metrics.read_text()):
            assert time.monotonic() < deadline and proc.poll() is None, "the run never got there"
            time.sleep(0.02)
        agent = _children(proc.pid)
        assert len(agent) == 1, agent
        os.kill(next(w for w in _children(agent[0]) if _local_rank(w) == 1), signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("bertgpu pretrain: SIGTERM: "), err  # rank 0's stop line
    for noise in ("Traceback", "FAILED", "During handling", "restart", "failed", "stopped by"):
        assert noise not in err, err[-3000:]
    step = int(last.rsplit("resumes from step ", 1)[1].split()[0])
    assert 5 <= step < 12 and not (run / "hf").exists(), err
    assert last.endswith(f"({run / 'checkpoints' / f'step_{step}'})")
    assert (run / "checkpoints" / f"step_{step}" / "COMPLETE").exists()


def test_more_processes_than_cores_on_a_cpu_is_said(monkeypatch, capsys):
    """`--nproc 3` on a 2-core machine without CUDA ran oversubscribed without a word."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(launcher, "_launch_once", lambda n, argv, attempt: (0, [], []))
    assert launcher.launch_local(3, ["pretrain"]) == 0
    assert capsys.readouterr().err == (
        "bertgpu pretrain: warning: --nproc 3 on 2 CPU cores: the processes share them, one "
        "thread each, and train slower than 2 would; expected at most 2 on a CPU\n")
    assert launcher.launch_local(2, ["pretrain"]) == 0
    assert capsys.readouterr().err == ""
