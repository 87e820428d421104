"""Ctrl-C while `bertgpu pretrain --nproc 2` sets up its process group (train/distributed.py,
train/launcher.py): one line and exit 130, as a Ctrl-C later gives. Rank 0 used to wait inside
init_process_group, where Python never sees a signal, until torchrun killed it 30 s later, while
the other rank and the launcher each printed a line of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _e2e import ROOT, args, bertgpu_started, e2e_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return e2e_shards(tmp_path_factory)


@pytest.mark.timeout(180)
def test_ctrl_c_while_the_ranks_join_the_group_is_one_line_and_exit_130(shards, tmp_path):
    # Rank 1 takes a minute to join (a slow node); rank 0 says when it calls
    # init_process_group, where it then waits for rank 1.
    proc = bertgpu_started(args(shards, tmp_path / "run", "--nproc", "2"),
                           faults="delay_setup=0:0,delay_setup=1:60")
    lines = []
    try:
        for line in proc.stderr:  # until both ranks are in their set-up
            lines.append(line)
            if sum("joins the process group" in seen for seen in lines) == 2:
                break
        assert sum("joins the process group" in seen for seen in lines) == 2, "".join(lines)
        time.sleep(0.5)  # rank 0 is in init_process_group by now
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal's process group, this command
        interrupted = time.monotonic()
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - interrupted
    err = "".join(lines) + rest
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    ours = [line for line in err.splitlines()
            if line.startswith("bertgpu") and "fault injected" not in line]
    assert ours == ["bertgpu pretrain: SIGINT: interrupted during distributed set-up"], err
    assert took < 15, (took, err)  # not torchrun's 30 s before it kills a rank


def test_the_set_up_delay_is_parsed_and_needs_no_step():
    from bertgpu.errors import BertgpuError
    from bertgpu.testing import faults

    assert faults.parse("delay_setup=0:0,delay_setup=1:2.5").delay_setup == [
        faults.Trigger(0, seconds=0.0), faults.Trigger(1, seconds=2.5)]
    with pytest.raises(BertgpuError, match="delay_setup=1:2@step=3.*set-up has no step"):
        faults.parse("delay_setup=1:2@step=3")


_GUARDED = """
import os, signal, sys, time
from bertgpu.train.setup_signals import stop_ends_setup
rank = int(sys.argv[1])
# Python's own SIGINT handler, as in a terminal (a job started in the background of a
# non-interactive shell inherits SIGINT ignored, and Python then leaves it so)
signal.signal(signal.SIGINT, signal.default_int_handler)
with stop_ends_setup(rank):
    pass
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
try:
    os.kill(os.getpid(), signal.SIGINT)  # after the set-up: Python's KeyboardInterrupt again
    time.sleep(5)
except KeyboardInterrupt:
    print("after: KeyboardInterrupt", flush=True)
with stop_ends_setup(rank):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)  # as inside init_process_group: Python's handlers do not run in C
print("not reached", flush=True)
"""


@pytest.mark.parametrize("rank", [0, 1])
def test_a_stop_signal_during_set_up_ends_the_process_with_one_line_on_rank_0(rank):
    """The same in one process, without torch: rank 0 says it in one line, the others exit
    silently, both with status 130; before and after the set-up, Ctrl-C is Python's as ever."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _GUARDED, str(rank)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 130, done.stderr
    assert done.stdout == "after: KeyboardInterrupt\n", done.stdout
    assert done.stderr == ("bertgpu: SIGINT: interrupted during distributed set-up\n"
                           if rank == 0 else ""), done.stderr
    assert time.monotonic() - t0 < 20


_LOCKED = """
import os, signal, sys, time
from bertgpu.locks import output_lock
from bertgpu.train.setup_signals import stop_ends_setup
signal.signal(signal.SIGINT, signal.default_int_handler)
with output_lock(sys.argv[1], "bertgpu finetune"), stop_ends_setup(0):
    assert os.path.exists(sys.argv[1] + ".bertgpu-lock")
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
"""


def test_a_stop_during_set_up_removes_the_output_lock(tmp_path):
    """finetune and glue hold OUT.bertgpu-lock (locks.py) while they set up their group; the
    set-up's stop ends the process with os._exit, which skipped the lock's `finally`: the lock
    file and the folders made for it stayed beside the output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = tmp_path / "made" / "ft"
    done = subprocess.run([sys.executable, "-c", _LOCKED, str(out)], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 130, done.stderr
    assert list(tmp_path.iterdir()) == [], list(tmp_path.rglob("*"))
