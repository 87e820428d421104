"""`distributed.comm_hook = "powersgd"` resumes exactly: every rank's PowerSGD state (iteration
count, error-feedback residuals, P/Q factors, its generator) goes into the checkpoint and comes
back, per parameter, across DDP's bucket rebuild (train/powersgd.py). CPU, gloo, 2 processes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _e2e import (
    args,
    assert_bitwise_equal,
    bertgpu_here,
    e2e_shards,
    final_weights,
    train_records,
)

from bertgpu.train import loop_state
from bertgpu.train.distributed import DistInfo

# PowerSGD compresses from its 10th step on: the resume at step 12 needs its residuals.
POWERSGD = ["--nproc", "2", "--distributed.comm_hook", "powersgd", "--train.max_steps", "16",
            "--checkpoint.every_steps", "12"]
# Wider layers in 1 MB buckets: two buckets once DDP has rebuilt them (one at a process's first
# step), so the state is re-cut across buckets, and gloo sees two buckets' collectives per step.
TWO_BUCKETS = ["--model.hidden_size", "64", "--model.intermediate_size", "1024",
               "--distributed.bucket_cap_mb", "1"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return e2e_shards(tmp_path_factory)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("buckets", ["one", "two"])
def test_an_interrupted_powersgd_run_equals_the_uninterrupted_one(shards, tmp_path, buckets):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    powersgd = [*POWERSGD, *(TWO_BUCKETS if buckets == "two" else [])]
    done = bertgpu_here(args(shards, full, *powersgd))
    assert done.returncode == 0, done.stderr[-3000:]
    # Stopped after step 13 (a preemption's checkpoint is of step 12: the same state), re-run.
    done = bertgpu_here(args(shards, resumed, *powersgd), faults="kill_rank=1@step=13")
    assert done.returncode != 0
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["step_12"]
    done = bertgpu_here(args(shards, resumed, *powersgd))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout and "PowerSGD starts afresh" not in done.stdout
    a, b = train_records(full), train_records(resumed)
    for step in range(13, 17):  # it used to differ from step 13 on
        assert (b[step]["loss"], b[step]["grad_norm"]) == (a[step]["loss"], a[step]["grad_norm"])
    assert_bitwise_equal(final_weights(full), final_weights(resumed))

    state = torch.load(resumed / "checkpoints" / "step_12" / "train_state.pt", weights_only=True)
    hooks = state["comm_hook"]
    assert len(hooks) == 2 and all(h["iter"] == 12 for h in hooks)
    # per rank: each rank's residual is what compressing its own gradient lost
    word = "bert.embeddings.word_embeddings.weight"
    assert not torch.equal(hooks[0]["params"][word]["error"], hooks[1]["params"][word]["error"])


class _Engine:
    """What `restore_rank_states` reads of an engine: its step and its (DDP) model."""

    def __init__(self, keeper) -> None:
        self.step = 12
        self.model = torch.nn.Module()
        self.model.comm_hook_state = keeper


def test_another_world_size_starts_powersgd_afresh_and_says_so(capsys):
    from bertgpu.train.powersgd import PowerSGDHook

    model = torch.nn.Linear(4, 3)
    saved = PowerSGDHook(model)
    saved.state.iter = 12
    saved._pool = {"weight": {"error": torch.ones(12)}}
    state = {"rng": [], "comm_hook": [saved.state_dict(), saved.state_dict()]}

    keeper = PowerSGDHook(model)
    loop_state.restore_rank_states(state, _Engine(keeper), DistInfo(0, 4), seed=0)
    assert keeper.state.iter == 0 and not keeper._pool  # afresh
    out = capsys.readouterr().out.strip()
    assert out.splitlines() == [
        "distributed.comm_hook powersgd: the checkpoint of step 12 holds the PowerSGD state of 2 "
        "ranks, not 4; PowerSGD starts afresh (uncompressed for 10 steps, then without the error "
        "feedback from before the resume)"]
    loop_state.restore_rank_states({"rng": []}, _Engine(keeper), DistInfo(0, 2), seed=0)
    assert "the checkpoint of step 12 holds no PowerSGD state;" in capsys.readouterr().out

    loop_state.restore_rank_states(state, _Engine(keeper), DistInfo(1, 2), seed=0)
    assert keeper.state.iter == 12 and torch.equal(keeper._pool["weight"]["error"], torch.ones(12))
    assert capsys.readouterr().out == ""


class _Bucket:
    """What torch's hook and ours read of DDP's GradBucket: its index, parameters, gradients."""

    def __init__(self, index: int, params: list, last: bool) -> None:
        self._index, self._params, self._last = index, params, last
        self._grads = [torch.zeros_like(p) for p in params]

    def index(self) -> int:
        return self._index

    def parameters(self) -> list:
        return self._params

    def gradients(self) -> list:
        return self._grads

    def buffer(self) -> torch.Tensor:
        return torch.zeros(sum(g.numel() for g in self._grads))

    def is_last(self) -> bool:
        return self._last


def test_the_state_follows_each_parameter_into_other_buckets():
    from bertgpu.train.powersgd import PowerSGDHook

    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 10))
    w1, b1, w2, b2 = model.parameters()  # (6, 8) and (10, 6) are worth compressing at rank 1
    seen: list[dict] = []
    keeper = PowerSGDHook(model)
    keeper._inner = lambda state, bucket: seen.append(
        {k: dict(m) for k, m in keeper._memories().items()})
    # One bucket, as a process's first step has it, with the state torch's hook leaves.
    keeper.hook(keeper.state, _Bucket(0, [w1, b1, w2, b2], last=True))
    error = torch.arange(48 + 6 + 60 + 10, dtype=torch.float32)  # the bucket's flat gradient
    p, q = torch.arange(16.0) + 1000, torch.arange(14.0) + 2000  # w1: 6 and 8, w2: 10 and 6
    s = keeper.state
    s.error_dict[0], s.p_memory_dict[0], s.q_memory_dict[0] = error, p, q
    e_w1, e_b1, e_w2, e_b2 = error.split([48, 6, 60, 10])

    # DDP rebuilds its buckets: [b2, w2] and [b1, w1].
    keeper.hook(keeper.state, _Bucket(0, [b2, w2], last=False))
    keeper.hook(keeper.state, _Bucket(1, [b1, w1], last=True))
    assert torch.equal(seen[-1]["error"][0], torch.cat([e_b2, e_w2]))
    assert torch.equal(seen[-1]["error"][1], torch.cat([e_b1, e_w1]))
    assert torch.equal(seen[-1]["p"][0], p[6:]) and torch.equal(seen[-1]["q"][0], q[8:])
    assert torch.equal(seen[-1]["p"][1], p[:6]) and torch.equal(seen[-1]["q"][1], q[:8])

    # Saved per parameter and loaded into a new process, whose first step has one bucket again.
    saved = keeper.state_dict()
    assert torch.equal(saved["params"]["1.weight"]["error"], e_w2)
    other = PowerSGDHook(model)
    other.load_state_dict(saved)
    other._inner = lambda state, bucket: seen.append(
        {k: dict(m) for k, m in other._memories().items()})
    other.hook(other.state, _Bucket(0, [w1, b1, w2, b2], last=True))
    assert torch.equal(seen[-1]["error"][0], error)
    assert torch.equal(seen[-1]["p"][0], p) and torch.equal(seen[-1]["q"][0], q)
    other.reset()
    assert not other.state.error_dict and not other._pool
