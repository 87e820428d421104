"""Two gloo processes on CPU: DP=2 equals DP=1 with accumulation, collective skipping, helpers."""

from __future__ import annotations

import copy
import os
import socket
import sys

import pytest
import torch
from _toy import ToyPretrain, count_fn, loss_fn, make_batch, rows
from torch import nn

from bertgpu.train import distributed
from bertgpu.train.engine import Engine

G, STEPS = 8, 3  # G = global batch (sequences per optimizer step)


def global_batch(step: int) -> dict[str, torch.Tensor]:
    return make_batch(G, 100 + step)


def micro_batches(step: int, rank: int, world: int, accum: int) -> list[dict[str, torch.Tensor]]:
    """The loader's contract: rank r takes rows [r*G/W, (r+1)*G/W), cut into `accum` pieces."""
    batch = global_batch(step)
    per_rank = G // world
    mb = per_rank // accum
    start = rank * per_rank
    return [rows(batch, start + i * mb, start + (i + 1) * mb) for i in range(accum)]


def fresh_model() -> ToyPretrain:
    torch.manual_seed(0)
    return ToyPretrain()


def run(engine: Engine, rank: int, world: int, accum: int) -> list[float]:
    return [engine.train_step(micro_batches(s, rank, world, accum), loss_fn, count_fn).loss
            for s in range(STEPS)]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # The checks run in their own frame: their DDP modules are gone before the group is torn
    # down (a DDP module that outlives it can abort the process at exit).
    with distributed.process_group("cpu") as info:
        torch.save(_checks(rank, world, info), os.path.join(out_dir, f"rank{rank}.pt"))


def _checks(rank: int, world: int, info: distributed.DistInfo) -> dict:
    assert info.backend == "gloo" and info.world_size == world and info.rank == rank
    result: dict = {}
    # Collective helpers.
    result["any_one"] = distributed.any_true(rank == 1)
    result["any_none"] = distributed.any_true(False)
    result["bcast"] = distributed.broadcast_scalar(3.5 if rank == 0 else -1.0)
    result["sum_int"] = distributed.all_reduce_sum(rank + 1)
    result["max"] = distributed.all_reduce_max(float(rank))

    # DP=2 with accumulation 1 and 2, the model wrapped in DDP.
    for accum in (1, 2):
        ddp = distributed.wrap_ddp(fresh_model(), info)
        engine = Engine(ddp, torch.optim.AdamW(ddp.parameters(), lr=1e-2))
        assert engine.ddp
        result[f"losses_acc{accum}"] = run(engine, rank, world, accum)
        result[f"params_acc{accum}"] = {k: v.detach().clone()
                                        for k, v in ddp.module.state_dict().items()}

    # A NaN on rank 1 only skips the step on both ranks. Without DDP, rank 0's own gradients
    # stay finite, so only the collective flag can make it skip.
    for use_ddp in (True, False):
        model = fresh_model()
        wrapped = distributed.wrap_ddp(model, info) if use_ddp else model
        engine = Engine(wrapped, torch.optim.AdamW(wrapped.parameters(), lr=1e-2))
        before = copy.deepcopy(model.state_dict())
        mbs = micro_batches(0, rank, world, 2)
        if rank == 1:
            mbs[1] = {**mbs[1], "poison": torch.tensor(float("nan"))}
        r = engine.train_step(mbs, loss_fn, count_fn)
        unchanged = all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
        result[f"nan_ddp{use_ddp}"] = (r.skipped, unchanged, engine.nonfinite_in_row)
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_two_gloo_ranks(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]

    for r in results:
        assert r["any_one"] is True and r["any_none"] is False
        assert r["bcast"] == 3.5 and r["sum_int"] == 3 and r["max"] == 1.0
        for use_ddp in (True, False):
            skipped, unchanged, in_row = r[f"nan_ddp{use_ddp}"]
            assert skipped and unchanged and in_row == 1, (use_ddp, r[f"nan_ddp{use_ddp}"])

    # References on one process: DP=1 with accumulation 2 (resp. 4) over the same global batches.
    for accum in (1, 2):
        model = fresh_model()
        engine = Engine(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        ref_losses = run(engine, 0, 1, accum * world)
        for r in results:
            assert r[f"losses_acc{accum}"] == pytest.approx(ref_losses, rel=1e-6)
            for k, v in model.state_dict().items():
                torch.testing.assert_close(r[f"params_acc{accum}"][k], v, rtol=1e-5, atol=1e-6)
    # Both ranks hold identical weights.
    for k, v in results[0]["params_acc2"].items():
        assert torch.equal(v, results[1]["params_acc2"][k])


def test_helpers_without_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = distributed.init_distributed("cpu")
    assert info == distributed.DistInfo(0, 1, 0, "cpu", None) and info.is_main
    assert distributed.all_reduce_sum(2.5) == 2.5 and distributed.all_reduce_max(3) == 3
    assert distributed.broadcast_scalar(1.25) == 1.25 and distributed.any_true(True)
    t = torch.ones(2)
    assert distributed.all_reduce_sum(t) is t
    model = nn.Linear(2, 2)
    assert distributed.wrap_ddp(model, info) is model
    distributed.barrier()
    assert distributed.is_main() and distributed.get_world_size() == 1
    assert distributed.resolve_nproc(3) == 3
    assert distributed.resolve_nproc("auto") == (torch.cuda.device_count()
                                                 if torch.cuda.is_available() else 1)
    with pytest.raises(Exception, match="--nproc"):
        distributed.resolve_nproc(0)


def test_launcher_command():
    from bertgpu.train import launcher

    assert launcher.launcher_command(2, ["pretrain", "cfg.toml"], "/tmp/logs") == [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", "2", "--log-dir", "/tmp/logs", "-m", "bertgpu", "pretrain",
        "cfg.toml"]


@pytest.mark.timeout(120)
def test_launch_leaves_nothing_in_the_temp_folder(tmp_path, monkeypatch):
    """torch's launcher makes a torchelastic_* folder per run (each rank's error file) and never
    removes it: one per `--nproc` run, 987 of them in /tmp on the machine that found it."""
    from bertgpu.train import launcher

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the launcher's and the workers' temp folder
    assert launcher.launch_local(2, ["--version"]) == 0
    assert sorted(p.name for p in temp.iterdir()) == []


def test_process_group_tears_down_after_the_modules_are_gone(monkeypatch):
    """A DDP module alive when its gloo group is destroyed aborts the process at exit in about one
    run in ten (SIGABRT, "terminate called without an active exception"). `process_group` tears
    the group down only after the modules built inside it are unreachable: on a normal return
    (reference cycles included) and when an exception leaves the block with frames that held them.
    """
    import weakref

    import torch.distributed as dist

    alive_at_teardown: list[bool] = []
    real_destroy = dist.destroy_process_group

    def watched_destroy(*args, **kwargs):
        alive_at_teardown.append(probe() is not None)
        return real_destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", watched_destroy)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    def build(fail: bool) -> float:
        nonlocal probe
        ddp = nn.parallel.DistributedDataParallel(nn.Linear(2, 2))
        ddp.cycle = ddp  # only the garbage collector frees it
        probe = weakref.ref(ddp)
        loss = ddp(torch.ones(1, 2)).sum()
        loss.backward()
        if fail:
            raise ValueError("bad batch")
        return float(loss.detach())

    probe = None
    with distributed.process_group("cpu", strategy="fsdp") as info:  # a group of one, no port
        assert info.backend == "gloo" and distributed.is_initialized()
        build(fail=False)
    with pytest.raises(ValueError, match="bad batch"):
        with distributed.process_group("cpu", strategy="fsdp"):
            build(fail=True)
    assert alive_at_teardown == [False, False] and not distributed.is_initialized()


def test_the_launchers_own_traceback_for_a_stop_signal_is_left_out(capsys):
    """SIGTERM to `--nproc 2`: torch's launcher ends by raising SignalException, whose traceback
    was shown between the workers' "wrote a preemption checkpoint" lines and our last line. It
    is left out once a stop signal was forwarded; a worker's line in the middle of it still
    shows, and any other traceback (or this one without a signal) is shown whole."""
    from bertgpu.train.launcher import _pass_through

    signal_tb = ["Traceback (most recent call last):\n",
                 '  File "torch/distributed/run.py", line 9, in main\n',
                 "    run(args)\n",
                 "bertgpu pretrain: SIGTERM: wrote a preemption checkpoint of step 8\n",
                 "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got "
                 "signal: 15\n"]
    other_tb = ["Traceback (most recent call last):\n", '  File "x.py", line 1\n',
                "ValueError: boom\n"]
    stream = ["W1127 Received Signals.SIGTERM death signal, shutting down workers\n",
              *signal_tb, *other_tb]
    tail = _pass_through(iter(stream), stopping=lambda: True)
    assert capsys.readouterr().err.splitlines() == [
        "W1127 Received Signals.SIGTERM death signal, shutting down workers",
        "bertgpu pretrain: SIGTERM: wrote a preemption checkpoint of step 8",
        *[line.rstrip("\n") for line in other_tb]]
    assert len(tail) == len(stream)  # describe_failure still reads everything
    _pass_through(iter(signal_tb), stopping=lambda: False)
    assert capsys.readouterr().err == "".join(
        [signal_tb[3], *signal_tb[:3], signal_tb[4]])
    # Ctrl-C while the launcher was still importing torch: Python's KeyboardInterrupt
    starting = ["Traceback (most recent call last):\n", '  File "torch/__init__.py", line 2885\n',
                "    from torch import _meta_registrations\n", "KeyboardInterrupt\n"]
    _pass_through(iter(starting), stopping=lambda: True)
    assert capsys.readouterr().err == ""


def test_a_stop_is_said_once_under_nproc(monkeypatch, capsys):
    """SIGTERM to `--nproc 2`: the worker's line ("SIGTERM: wrote a preemption checkpoint of
    step 11; re-running the same command resumes from step 11 (...)") was followed by the
    launcher's own "stopped by SIGTERM; re-running ..." saying it again. The launcher's line
    stays for a stop that no worker reported (a worker killed before its run began)."""
    import signal

    from bertgpu.train import launcher

    said = "bertgpu pretrain: SIGTERM: wrote a preemption checkpoint of step 11 in 0.1 s; " \
           "re-running the same command resumes from step 11 (np/checkpoints/step_11)\n"
    for tail, shown in (([said], False), (["W1127 Received 15 death signal\n"], True)):
        monkeypatch.setattr(launcher, "_launch_once",
                            lambda n, argv, attempt, tail=tail: (1, tail, [signal.SIGTERM]))
        assert launcher.launch_local(2, ["pretrain"], resume_hint=lambda: "hint") == 143
        err = capsys.readouterr().err
        assert (err == "bertgpu pretrain: stopped by SIGTERM; hint\n") if shown else err == "", err


def test_workers_share_the_cores_without_torchruns_banner(monkeypatch, capfd):
    """With no OMP_NUM_THREADS, torch's launcher set 1 per worker and printed a five-line banner
    about it on every `--nproc` run; the workers now get the machine's cores shared among them,
    and a value the user set is left alone."""
    import os

    from bertgpu.train import launcher

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert launcher.worker_threads(2) == {"OMP_NUM_THREADS": str(max(1, os.cpu_count() // 2))}
    assert launcher.launch_local(2, ["--version"]) == 0
    assert "OMP_NUM_THREADS" not in capfd.readouterr().err
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launcher.worker_threads(2) == {}


_REPORT = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
           "============================================================\n",
           "bertgpu FAILED\n",
           "Root Cause (first observed failure):\n",
           "[0]:\n",
           "  rank      : 0 (local_rank: 0)\n",
           "  exitcode  : {code} (pid: 20652) \n",
           "============================================================\n"]


def test_a_workers_bad_input_error_is_the_one_line_shown(capsys):
    """`finetune classify --nproc 2` on a CSV without the text column printed the same error from
    both ranks, then torch's log lines, its traceback and its 20-line failure report, then our
    line saying rank 0 failed: 45 lines around the one that matters. When the job's first failure
    exited with status 2 (a command's error), only the distinct error lines are shown; when it
    failed of something else, everything held back is shown as it came."""
    from bertgpu.train.launcher import _pass_through, failure_exit_code

    error = "bertgpu finetune: error: bad.csv:1: no column 'text'\n"
    other = "bertgpu finetune: error: dev.csv:3: no label\n"
    noise = ["W1127 09:04:48.000 1 api.py:1028] Sending process 2 closing signal SIGTERM\n",
             "Traceback (most recent call last):\n", '  File "run.py", line 9, in main\n']
    stream = ["bertgpu finetune: note: starting\n", error, error, other, *noise,
              *[line.format(code=2) for line in _REPORT]]
    tail = _pass_through(iter(stream))
    assert capsys.readouterr().err == "bertgpu finetune: note: starting\n" + error + other
    assert failure_exit_code(tail) == 2
    crashed = [error, *noise, *[line.format(code=1) for line in _REPORT]]
    tail = _pass_through(iter(crashed))
    assert capsys.readouterr().err == "".join(crashed) and failure_exit_code(tail) == 1


@pytest.mark.timeout(120)
def test_bad_input_found_by_the_workers_ends_with_their_line_and_no_restart(tmp_path, capfd):
    """Two workers that each refuse their input: the command exits 2 with that one line (once),
    and --max-restarts does not start the same failure again."""
    from bertgpu.train import launcher

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a sentence.\n", encoding="utf-8")
    argv = ["tokenizer", "--corpus", str(corpus), "--vocab-size", "-1",
            "--out", str(tmp_path / "t")]
    assert launcher.launch_local(2, argv, max_restarts=1) == 2
    err = capfd.readouterr().err
    assert err.count("error:") == 1 and "--vocab-size" in err, err
    assert "restart" not in err and "Traceback" not in err and "FAILED" not in err, err


@pytest.mark.timeout(120)
def test_the_workers_end_with_the_command_that_started_them(tmp_path):
    """`kill -9` of `bertgpu pretrain --nproc 2` left torch's launcher (in a session of its own)
    and both workers training into the run folder; re-running the command started a second job
    on it. The launcher now gets SIGTERM when the command dies, and stops its workers."""
    import os
    import signal
    import subprocess
    import sys
    import time

    marker = tmp_path / "watched-run"
    marker.mkdir()
    script = ("from bertgpu.train import launcher; "
              f"launcher.launch_local(2, ['watch', {str(marker)!r}, '--interval', '0.5'])")
    # (TMPDIR: the launcher's log folder, which a SIGKILLed launcher cannot remove, stays here)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL,
                              env={**os.environ, "TMPDIR": str(tmp_path)})

    def ours() -> list[int]:  # the launcher and its workers: their command lines name the marker
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != parent.pid:
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        if str(marker).encode() in f.read():
                            pids.append(int(entry))
                except OSError:
                    pass
        return pids

    deadline = time.monotonic() + 60
    while len(ours()) < 3 and time.monotonic() < deadline:  # the launcher and 2 workers
        time.sleep(0.2)
    assert len(ours()) >= 3, ours()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 40
    while ours() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = ours()
    for pid in left:  # do not leave them running if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, f"still running after the command was killed: {left}"
