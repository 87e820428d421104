"""Edges of train/ that other tests leave open: the budget clock's `budget_left_s` never goes
below zero, a step's fp16 loss-scale flag, the `end` record's error text for a non-bertgpu
exception, the host memory available under a cgroup v2 limit, the HSDP mesh refusing ranks that
do not split into nodes, and the PowerSGD hook's statistics and random generator across a resume
(a bucket with nothing worth compressing)."""

from __future__ import annotations

import types

import pytest
import torch
from test_powersgd_resume import _Bucket

from bertgpu.errors import BertgpuError
from bertgpu.train import hostcopy
from bertgpu.train.distributed import DistInfo
from bertgpu.train.powersgd import PowerSGDHook
from bertgpu.train.readback import PendingStep
from bertgpu.train.run_end import log_failure
from bertgpu.train.schedule import BudgetClock
from bertgpu.train.sharding import fsdp_mesh

GiB = 1 << 30


def test_budget_left_is_zero_not_negative_once_the_budget_is_overrun():
    clock = BudgetClock(10.0, time_fn=iter([0.0, 12.5]).__next__)
    clock.start()
    clock.agree(clock.read())
    assert clock.fields() == {"budget_elapsed_s": 12.5, "budget_left_s": 0.0}


def _scale_flag(before: float, after: float) -> bool:
    # loss term mlm, no extras; then the two non-finite flags, grad norm, scale before, after
    vector = torch.tensor([2.0, 0.0, 0.0, 1.5, before, after], dtype=torch.float64)
    return PendingStep(0, 1e-4, vector, ["mlm"], [], {"mlm": 1.0}).read().scale_changed


def test_a_step_says_the_fp16_loss_scale_changed_only_when_it_moved():
    assert _scale_flag(1024.0, 512.0) is True
    assert _scale_flag(1024.0, 1024.0) is False


class _Logger:
    def __init__(self) -> None:
        self.records: list[dict] = []

    def log(self, step, kind, **fields) -> None:
        self.records.append({"step": step, "kind": kind, **fields})


def _end_error(error: BaseException) -> str:
    engine = types.SimpleNamespace(step=7)
    loop = types.SimpleNamespace(_window=None, info=DistInfo(), engine=engine, world=1)
    logger = _Logger()
    log_failure(loop, logger, error)
    (record,) = logger.records
    assert record["event"] == "end" and record["reason"] == "error" and record["step"] == 7
    return record["error"]


def test_the_end_record_names_the_type_of_a_foreign_exception():
    assert _end_error(RuntimeError("boom\nmore")) == "RuntimeError: boom"
    assert _end_error(ValueError()) == "ValueError"
    assert _end_error(BertgpuError("data.glob: no files\nhint")) == "data.glob: no files"


def test_available_memory_is_the_smaller_of_meminfo_and_the_cgroup_headroom(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemTotal: {16 * GiB // 1024} kB\nMemAvailable: {8 * GiB // 1024} kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(f"{2 * GiB}\n")
    (cgroup / "memory.current").write_text(f"{GiB}\n")
    real_open, real_path = open, hostcopy.Path

    def fake_open(path, *args, **kwargs):
        return real_open(meminfo if str(path) == "/proc/meminfo" else path, *args, **kwargs)

    def fake_path(path, *rest):
        return real_path(cgroup if str(path) == "/sys/fs/cgroup" else path, *rest)

    monkeypatch.setattr(hostcopy, "open", fake_open, raising=False)
    monkeypatch.setattr(hostcopy, "Path", fake_path)
    assert hostcopy.available_bytes() == GiB
    (cgroup / "memory.max").write_text("max\n")  # no limit: MemAvailable alone
    assert hostcopy.available_bytes() == 8 * GiB


def test_hsdp_refuses_ranks_that_do_not_split_into_nodes_before_any_group(monkeypatch):
    import torch.distributed.device_mesh as device_mesh

    def no_mesh(*args, **kwargs):
        raise AssertionError("a device mesh was built")

    monkeypatch.setattr(device_mesh, "init_device_mesh", no_mesh)
    info = DistInfo(rank=0, world_size=6, local_world_size=4)
    with pytest.raises(BertgpuError, match=r"shard_within_node: 6 ranks do not split into "
                                           r"nodes of 4"):
        fsdp_mesh(info, shard_within_node=True)


def test_powersgd_compression_statistics_survive_a_resume():
    model = torch.nn.Linear(4, 3)
    saved = PowerSGDHook(model)
    saved.state.total_numel_before_compression = 100
    saved.state.total_numel_after_compression = 7
    resumed = PowerSGDHook(model)
    resumed.load_state_dict(saved.state_dict())
    assert (resumed.state.total_numel_before_compression,
            resumed.state.total_numel_after_compression) == (100, 7)


@pytest.fixture
def group_of_one():
    """A gloo process group of this one process (an in-memory store), destroyed after."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_resumed_bucket_without_matrices_draws_no_new_seed(group_of_one):
    """A bucket of 1-D tensors only (nothing compressed): after a resume, torch's hook must not
    draw a seed for its (empty) factors again, or the generator leaves the uninterrupted run's."""
    model = torch.nn.Linear(8, 6)
    bias = model.bias

    def step(hook: PowerSGDHook) -> None:
        hook.hook(hook.state, _Bucket(0, [bias], last=True))

    uninterrupted = PowerSGDHook(model)
    uninterrupted.state.iter = 10  # compressing from the next step on
    step(uninterrupted)  # the first compressed step draws the seed of its factors
    saved = uninterrupted.state_dict()
    resumed = PowerSGDHook(model)
    resumed.load_state_dict(saved)
    step(uninterrupted)
    step(resumed)
    assert resumed.state.iter == uninterrupted.state.iter == 12
    want = uninterrupted.state.rng.get_state()
    got = resumed.state.rng.get_state()
    assert got[2] == want[2] and (got[1] == want[1]).all()
