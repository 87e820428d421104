"""Stop signals and background checkpoints, in process (train/preemption.py,
train/full_checkpoints.py, train/hostcopy.py); the end-to-end runs are in
test_preemption_e2e.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertgpu.errors import BertgpuError
from bertgpu.train.distributed import DistInfo
from bertgpu.train.preemption import Preempted, Preemption

ROOT = Path(__file__).resolve().parents[1]


def _wait_for(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def preemption():
    p = Preemption(25.0, DistInfo(), title="t")
    p.install()
    yield p
    p.restore()  # also disarms the deadline, which would end this process


def test_a_signal_is_seen_at_the_next_safe_point_and_sets_the_exit_status(preemption):
    assert preemption.check(3) == 3  # nothing received: the micro batches come back
    os.kill(os.getpid(), signal.SIGINT)
    _wait_for(lambda: preemption.signum is not None)
    with pytest.raises(Preempted):
        preemption.check(3)
    assert preemption.exit_status == 130 and preemption.deadline is not None
    assert 0 < preemption.deadline - time.monotonic() < 25


def test_a_data_wait_or_an_evaluation_is_cut_short(preemption):
    t0 = time.monotonic()

    def long_wait() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(20)  # the handler raises out of this
        return "finished"

    assert preemption.interruptible("waiting", long_wait) is None
    assert time.monotonic() - t0 < 5
    # Once a signal came, the next interruptible work does not start at all.
    assert preemption.interruptible("evaluating", lambda: "ran") is None
    with pytest.raises(Preempted):
        preemption.check()


def test_work_outside_an_interruptible_region_is_not_cut(preemption):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # a step in flight: the handler only notes the signal
    assert preemption.requested


def test_the_loss_is_checked_after_every_micro_step_but_the_last(preemption):
    calls: list[int] = []
    loss = preemption.checked_loss(lambda i: calls.append(i) or i, 2)
    os.kill(os.getpid(), signal.SIGTERM)
    _wait_for(lambda: preemption.requested)
    loss(0)  # micro-step 1: the step's own check came just before it
    with pytest.raises(Preempted):
        loss(1)  # the check after micro-step 1
    loss(2)  # a rank with more micro batches than the others: no check they would not join
    assert calls == [0, 2]
    assert preemption.checked_loss(len, 1) is len  # one micro-step: nothing in between


def test_a_signal_noted_as_the_run_ends_arms_no_deadline_after_it():
    """The listener may read a signal's byte only after the run ended: no deadline may outlive
    the run (in a library caller's process it would end the process 23 s later)."""
    p = Preemption(25.0, DistInfo())
    note = p._note
    p._note = lambda signum: (time.sleep(0.3), note(signum))  # the listener lags behind
    p.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        p.restore()
    try:
        assert p.signum == signal.SIGTERM  # noted all the same
        if p._timer is not None:
            p._timer.join(1.0)  # a cancelled deadline's thread ends at once
            assert not p._timer.is_alive()
    finally:
        if p._timer is not None:
            p._timer.cancel()


_CHILD = """
import os, signal, sys, time
from bertgpu.train.distributed import DistInfo
from bertgpu.train.preemption import Preemption
p = Preemption(float(sys.argv[1]), DistInfo(), title="child")
p.install()
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGTERM)  # delivered twice, as torchrun forwards it: counted once
time.sleep(float(sys.argv[2]))
print("second", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30)
print("not reached", flush=True)
"""


_RELAYED = """
import os, signal, sys, time
from bertgpu.train.distributed import DistInfo
from bertgpu.train.preemption import Preemption
p = Preemption(2.0, DistInfo(), title="child")
p.install()
os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C (or pkill) that reached the worker itself ...
time.sleep(0.3)
os.kill(os.getpid(), signal.SIGTERM)  # ... and torchrun's SIGTERM for the same stop
time.sleep(0.2)
print("relayed", flush=True)
time.sleep(30)
"""


def test_a_stop_relayed_as_the_other_signal_counts_once(tmp_path):
    """Under --nproc, a SIGINT to every process reaches a worker directly and again as the
    SIGTERM torchrun sends its workers when it is signalled. That counted as a second signal:
    "second SIGTERM: stopped at once", without the preemption checkpoint. Now the grace runs
    as for one signal (the exit status is the first signal's)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", _RELAYED], env=env, capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 130, done.stderr
    assert "relayed" in done.stdout and "second" not in done.stderr, done.stderr
    assert "child: SIGINT: the grace of 2 s ran out" in done.stderr


@pytest.mark.parametrize("grace_s, pause_s, message", [
    (20.0, 1.5, "child: second SIGTERM: stopped at once"),
    (1.0, 5.0, "child: SIGTERM: the grace of 1 s ran out"),
])
def test_a_second_signal_or_the_deadline_ends_the_process_at_once(tmp_path, grace_s, pause_s,
                                                                   message):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _CHILD, str(grace_s), str(pause_s)], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    took = time.monotonic() - t0
    assert done.returncode == 143, done.stderr
    assert message in done.stderr and "not reached" not in done.stdout, done.stderr
    assert ("second" in done.stdout) == (grace_s > pause_s)  # the duplicate did not end it
    assert took < 15


class _State:
    def state_dict(self):
        return {}

    def state_later(self):
        return self.state_dict


class _Exited(Exception):
    pass


@pytest.fixture
def no_exit(monkeypatch):
    """`os._exit` raises `_Exited` with the status instead of ending pytest."""
    def fake_exit(status):
        raise _Exited(status)

    monkeypatch.setattr("bertgpu.train.preemption.os._exit", fake_exit)
    monkeypatch.setattr("bertgpu.train.preemption.multiprocessing.active_children", lambda: [])


def test_a_step_is_named_as_such_once_its_data_came(no_exit, capfd):
    """After the data wait of a step the run is "in step N" again: the phase of the data wait
    used to stay, and a grace that ran out while the step computed said "waiting for the data
    of step N"."""
    p = Preemption(2.0, DistInfo(), title="t")
    p.begin_step(2, _State(), _State())
    seen: list[str] = []
    assert p.interruptible("waiting for the data of step 3", lambda: seen.append(p.phase)) is None
    assert seen == ["waiting for the data of step 3"] and p.phase == "in step 3"
    p._seen = signal.SIGTERM  # a work cut short (here: not started) gives the phase back too
    assert p.interruptible("in the evaluation at step 3", lambda: "ran") is None
    assert p.phase == "in step 3"
    with pytest.raises(_Exited):
        p._expire()
    assert "the grace of 2 s ran out in step 3;" in capfd.readouterr().err


@pytest.mark.parametrize("how", ["deadline", "second signal"])
def test_a_stop_that_ends_at_once_still_writes_the_end_record(tmp_path, no_exit, capfd, how):
    """A grace that runs out, or a second signal, ends the process with an `end` record
    (reason preempted) on metrics.jsonl; there used to be none, and `bertgpu watch` said
    "killed or crashed"."""
    from bertgpu.telemetry.records import describe_end, read_metrics, run_end

    (tmp_path / "metrics.jsonl").write_text(json.dumps(
        {"step": 3, "kind": "info", "time": 1.0, "elapsed_s": 1.0, "event": "start",
         "max_steps": 12}) + "\n" + '{"step": 6, "kind": "tr')  # a line being written
    p = Preemption(20.0, DistInfo(), title="t", run_dir=tmp_path)
    p.elapsed = lambda: 42.0
    p.begin_step(5, _State(), _State())
    p.end_step(6)
    try:
        with pytest.raises(_Exited) as exited:
            if how == "deadline":
                p._note(signal.SIGTERM)
                p._expire()
            else:
                p._note(signal.SIGTERM)
                p._own = (p._own[0], p._own[1] - 10.0)  # later than a relayed copy would come
                p._note(signal.SIGINT)
    finally:
        p.restore()  # disarms the deadline
    assert exited.value.args == (143,)
    records = read_metrics(tmp_path / "metrics.jsonl")
    end = run_end(records)
    assert end is not None and records[-1] is end, records
    assert (end["reason"], end["step"], end["elapsed_s"], end["world_size"]) == (
        "preempted", 6, 42.0, 1)
    assert describe_end(end, 12).startswith("stopped (preempted at step 6 of 12;")
    # When the loop wrote its end record already, no second one.
    p2 = Preemption(20.0, DistInfo(), title="t", run_dir=tmp_path)
    p2.end_logged = True
    with pytest.raises(_Exited):
        p2._exit_now("stopped")
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == len(records)


class _Ckpts:
    def __init__(self, last_write_s, pending=None):
        self.last_write_s, self._pending = last_write_s, pending

    def pending(self):
        return self._pending


def test_the_preemption_checkpoint_is_written_only_when_it_fits():
    model = torch.nn.Linear(1000, 1000)  # ~4 MB of weights, ~12 MB with Adam's moments
    p = Preemption(25.0, DistInfo())
    p.deadline = time.monotonic() + 10.0
    assert p._decide(5, 5, _Ckpts(1.0), model)[0] == 2  # no step since the newest checkpoint
    assert p._decide(0, None, _Ckpts(None), model)[0] == 2  # no step at all
    verdict, estimate, left = p._decide(6, 5, _Ckpts(2.0), model)
    assert verdict == 1 and estimate == pytest.approx(2.5) and 9 < left <= 10
    assert p._decide(6, 5, _Ckpts(9.0), model)[0] == 3  # 11.25 s would not fit in 10
    # A write in flight finishes first: 2.5 s for it (1 s of it done) + 2.5 s for the new one.
    assert p._decide(6, 5, _Ckpts(2.0, (5, 1.0)), model)[1] == pytest.approx(4.0)
    # Never measured: the state's bytes at 200 MB/s.
    assert p._decide(6, None, _Ckpts(None), model)[1] == pytest.approx(
        1.25 * (4 * 1001000 * 3) / 200e6, rel=0.01)


# -- background checkpoints --------------------------------------------------------------------


def _model_and_optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied, as the MLM decoder and the word embeddings
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.arange(10)).sum().backward()
    opt.step()
    return model, opt


def _files(folder: Path) -> dict:
    state = torch.load(folder / "train_state.pt", weights_only=True)
    return {"model": load_file(str(folder / "model.safetensors")),
            "optim": state["optimizer"]["state"], "rest": state["note"]}


def test_a_background_checkpoint_holds_the_state_of_its_step(tmp_path, no_faults, monkeypatch):
    from bertgpu.train.full_checkpoints import FullCheckpoints

    model, opt = _model_and_optimizer()
    sync = FullCheckpoints(tmp_path / "sync", DistInfo(), keep_last=0)
    bg = FullCheckpoints(tmp_path / "bg", DistInfo(), keep_last=0, background=True)
    history = [{"epoch": 1}]
    assert sync.save(1, model, opt, {"note": history}, {"a.txt": "x"}) is not None
    monkeypatch.setenv("BERTGPU_FAULTS", "slow_write=0.5")  # the write starts after training
    assert bg.save(1, model, opt, {"note": history}, {"a.txt": "x"}, background=True) is None
    model(torch.arange(10)).sum().backward()
    opt.step()  # changes weights and moments in place while the write waits
    history.append({"epoch": 2})
    assert bg.poll() is None and bg.pending()[0] == 1
    written = bg.wait()
    assert written.step == 1 and written.write_s >= 0.5 and bg.last_write_s >= 0.5
    a, b = _files(tmp_path / "sync/checkpoints/step_1"), _files(tmp_path / "bg/checkpoints/step_1")
    assert a["rest"] == b["rest"] == [{"epoch": 1}]
    assert a["model"].keys() == b["model"].keys() and all(
        torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["optim"][i][k], b["optim"][i][k])
               for i in a["optim"] for k in a["optim"][i])
    assert (tmp_path / "bg/checkpoints/step_1/a.txt").read_text() == "x"


def test_the_host_copy_keeps_its_buffers_and_one_copy_of_tied_tensors():
    from bertgpu.train.hostcopy import HostCopy

    w = torch.ones(3, 4)
    host = HostCopy()
    first = host.copy({"a": w, "b": w, "n": [w[0], 7]})
    assert first["a"] is first["b"] and first["a"] is not w and first["n"][1] == 7
    w.add_(1)
    assert torch.equal(first["a"], torch.ones(3, 4))  # a copy, not a view of the live tensor
    second = host.copy({"a": w, "b": w, "n": [w[0], 7]})
    assert second["a"] is first["a"] and torch.equal(second["a"], w)  # the same buffer again
    assert host.nbytes == (12 + 4) * 4


def test_a_failed_background_write_is_reported_in_one_line(tmp_path, no_faults, monkeypatch):
    from bertgpu.train.full_checkpoints import FullCheckpoints

    model, opt = _model_and_optimizer()
    bg = FullCheckpoints(tmp_path / "run", DistInfo(), keep_last=0, background=True)
    monkeypatch.setenv("BERTGPU_FAULTS", "enospc_write=1")
    bg.save(1, model, opt, {}, {}, background=True)
    _wait_for(lambda: bg._pending.future.done())
    assert bg.poll() is None and bg.failed
    with pytest.raises(BertgpuError, match="No space left on device") as err:
        bg.wait()
    assert len(str(err.value).splitlines()) == 1
    assert not list((tmp_path / "run/checkpoints").glob("step_*"))  # no half-written folder


def test_grace_s_must_be_positive():
    from bertgpu.config import schema

    cfg = schema.load_config(None, ["--train.max_steps", "1"])
    assert cfg.checkpoint.async_save and cfg.checkpoint.grace_s == 25.0
    with pytest.raises(BertgpuError, match="checkpoint.grace_s") as err:
        schema.load_config(None, ["--checkpoint.grace_s", "0"])
    assert len(str(err.value).splitlines()) == 1


def test_the_report_shows_how_long_checkpoints_stopped_training(tmp_path):
    import json

    from bertgpu.report import build_report

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text("seed = 0\n", encoding="utf-8")
    records = [{"step": 1, "kind": "train", "loss": 5.0},
               {"step": 4, "kind": "info", "event": "checkpoint", "stall_s": 0.25, "wait_s": 0.0,
                "background": True},
               {"step": 6, "kind": "info", "event": "checkpoint_written", "saved_step": 4,
                "write_s": 3.0},
               {"step": 8, "kind": "info", "event": "checkpoint", "stall_s": 1.75, "wait_s": 1.5,
                "background": True},
               {"step": 9, "kind": "info", "event": "checkpoint_written", "saved_step": 8,
                "write_s": 2.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    md = (build_report([run], tmp_path / "report") / "README.md").read_text()
    for row in ("| checkpoints | 2 |", "| mean checkpoint stall (training waits) | 1 s |",
                "| longest checkpoint stall | 1.75 s |",
                "| mean background checkpoint write | 2.5 s |"):
        assert row in md, md


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_host_copy_of_cuda_tensors_is_pinned_and_complete_after_one_synchronisation():
    from bertgpu.train.hostcopy import HostCopy

    w = torch.randn(1024, 1024, device="cuda")
    step = torch.tensor(3.0, device="cuda")
    host = HostCopy().copy({"w": w, "opt": {"step": step, "cpu": torch.ones(2)}})
    expected = w.cpu()
    w.mul_(2)  # queued after the copies: the copy must hold the values from before
    assert host["w"].is_pinned() and host["w"].device.type == "cpu"
    assert torch.equal(host["w"], expected) and host["opt"]["step"].item() == 3.0
    assert not host["opt"]["cpu"].is_pinned()  # only what came from the GPU


def test_slow_writes_of_one_step_and_slow_evaluations_are_injected(no_faults, monkeypatch):
    from bertgpu.testing import faults

    monkeypatch.setenv(faults.ENV, "slow_write=0.3@step=8,slow_eval=0.2")
    t0 = time.monotonic()
    faults.slow_write(4)  # another step's checkpoint: no delay
    assert time.monotonic() - t0 < 0.1
    faults.slow_write(8)
    faults.slow_eval()
    assert time.monotonic() - t0 >= 0.5
    with pytest.raises(BertgpuError, match="slow_eval"):
        faults.parse("slow_eval=1@step=2")


def test_the_agreed_signal_of_another_rank_sets_the_exit_status_over_the_one_seen_here(
        monkeypatch):
    """Rank 0's handler saw SIGINT (its listener had not noted it yet) while rank 1's SIGTERM
    came first: the check agrees on SIGTERM (the MAX of the ranks' signals), and this rank exits
    with 143 like the others, not 130 from the signal it saw itself. A unit test: the other rank
    is simulated by the all-reduce of the check's group."""
    import torch.distributed as dist

    p = Preemption(25.0, DistInfo(), title="t")
    p._group = object()  # several ranks: `check` all-reduces over this group
    p._seen = signal.SIGINT  # set by `_handle` at once; `signum` waits for the listener
    other_left = 20.0  # rank 1's grace left

    def all_reduce(flags, op=None, group=None):  # rank 1: [SIGTERM, -micro_batches, -left]
        assert group is p._group and op == dist.ReduceOp.MAX
        flags.copy_(torch.maximum(flags, torch.tensor([float(signal.SIGTERM), -3.0,
                                                       -other_left], dtype=torch.float64)))

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    try:
        with pytest.raises(Preempted, match="SIGTERM"):
            p.check(3)
        assert p.signum == signal.SIGTERM and p._seen == signal.SIGINT
        assert p.exit_status == 128 + signal.SIGTERM == 143
        assert p.deadline is not None and p.deadline - time.monotonic() < other_left
    finally:
        p.restore()  # disarms the deadline the check armed


def test_an_ignored_sigint_is_still_a_stop_and_an_ignored_sighup_stays_ignored():
    """`sh -c "bertgpu ... &"` starts the command with SIGINT ignored; when SIGHUP became a stop
    signal, the skip of ignored signals (for nohup's SIGHUP) took SIGINT along: `kill -INT` no
    longer stopped a run started from a script."""
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    p = Preemption(25.0, DistInfo())
    try:
        p.install()
        assert signal.getsignal(signal.SIGINT) == p._handle
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        p.restore()
        for sig, handler in before.items():
            signal.signal(sig, handler)
