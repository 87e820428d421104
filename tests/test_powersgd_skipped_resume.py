"""`distributed.comm_hook = "powersgd"` resumes exactly from the checkpoint of a skipped
(non-finite) step too. The skip resets the hook's state, so the next step draws fresh Q factors;
DDP lists the parameters in another bucket order in a resumed process's first step than in the run
that went on, and fresh factors drawn per bucket from one generator then differed
(train/powersgd.py). CPU, gloo."""

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

# PowerSGD compresses from its 10th step on; step 12 is non-finite on rank 1 and checkpointed.
POWERSGD = ["--nproc", "2", "--distributed.comm_hook", "powersgd", "--train.max_steps", "16",
            "--checkpoint.every_steps", "12"]
NONFINITE = "nonfinite_rank=1@step=12"


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return e2e_shards(tmp_path_factory)


@pytest.mark.timeout(400)
def test_a_resume_from_a_skipped_steps_checkpoint_equals_the_uninterrupted_run(shards, tmp_path):
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    done = bertgpu_here(args(shards, full, *POWERSGD), faults=NONFINITE)
    assert done.returncode == 0, done.stderr[-3000:]
    done = bertgpu_here(args(shards, resumed, *POWERSGD), faults=f"{NONFINITE},kill_rank=1@step=13")
    assert done.returncode != 0
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["step_12"]
    state = torch.load(resumed / "checkpoints" / "step_12" / "train_state.pt", weights_only=True)
    assert [h["params"] for h in state["comm_hook"]] == [{}, {}]  # reset by the skip
    done = bertgpu_here(args(shards, resumed, *POWERSGD))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from" in done.stdout and "PowerSGD starts afresh" not in done.stdout
    a, b = train_records(full), train_records(resumed)
    assert a[16]["skipped_steps"] == b[16]["skipped_steps"] == 1
    for step in range(13, 17):  # it used to differ from step 13 on
        assert (b[step]["loss"], b[step]["grad_norm"]) == (a[step]["loss"], a[step]["grad_norm"])
    assert_bitwise_equal(final_weights(full), final_weights(resumed))


class _Bucket:
    """DDP's GradBucket as torch's hook reads it: the gradients are views of the flat buffer."""

    def __init__(self, index: int, params: list, grads: dict, last: bool) -> None:
        self._index, self._params, self._last = index, params, last
        self._buffer = torch.cat([grads[id(p)].reshape(-1) for p in params])
        self._grads = [v.view_as(p) for p, v in
                       zip(params, self._buffer.split([p.numel() for p in params]), strict=True)]

    def index(self) -> int:
        return self._index

    def parameters(self) -> list:
        return self._params

    def gradients(self) -> list:
        return self._grads

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def is_last(self) -> bool:
        return self._last


@pytest.fixture
def one_process_group(tmp_path):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


def test_fresh_factors_after_a_reset_do_not_depend_on_the_bucket_layout(one_process_group):
    """Two processes at the same compressed step, their states reset, their buckets laid out
    as a process's first step and as DDP's rebuild: each parameter comes out the same."""
    from bertgpu.train.powersgd import PowerSGDHook

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 10))
    w1, b1, w2, b2 = model.parameters()  # (6, 8) and (10, 6) are worth compressing at rank 1
    grads = {id(p): torch.randn(p.shape) for p in model.parameters()}
    layouts = {"first step": [[b2, w2, b1, w1]], "rebuilt": [[w1, b1], [w2, b2]]}
    saved = {}
    for what, buckets in layouts.items():
        keeper = PowerSGDHook(model)
        keeper.state.iter = 12
        keeper.state.rng.randint(10)  # a generator elsewhere than where the other one is
        keeper.reset()
        for index, params in enumerate(buckets):
            bucket = _Bucket(index, params, grads, last=index == len(buckets) - 1)
            keeper.hook(keeper.state, bucket).wait()
        saved[what] = keeper.state_dict()["params"]
    a, b = saved.values()
    assert a.keys() == b.keys() and set(a["0.weight"]) == {"error", "p", "q"}
    for name in a:
        for kind in a[name]:
            assert torch.equal(a[name][kind], b[name][kind]), (name, kind)
