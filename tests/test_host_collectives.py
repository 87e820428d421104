"""Host numbers (a step's counts and clocks, scalar flags) are reduced through gloo under NCCL.

Through NCCL a collective queues behind every kernel queued before it, so reading its result
back made the host wait for the previous step's backward and update on every step. No NCCL
here: a stand-in for torch.distributed says "nccl" and records where each collective went.
"""

from __future__ import annotations

import torch

from bertgpu.train import distributed
from bertgpu.train.engine import Engine


class FakeNcclDist:
    """torch.distributed as an NCCL run of 2 ranks sees it; each collective adds the other
    rank's equal contribution and is recorded with its group and its tensor's device."""

    class group:  # noqa: N801 (torch.distributed.group)
        WORLD = object()

    def __init__(self) -> None:
        self.calls: list[tuple[str, object, str]] = []
        self.groups_made: list[str] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_backend(self, group: object = None) -> str:
        return "gloo" if group is not None and group is not self.group.WORLD else "nccl"

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return 0

    def new_group(self, backend: str, timeout: object = None) -> str:
        self.groups_made.append(backend)
        return f"{backend}-group-{len(self.groups_made)}"

    def all_reduce(self, t: torch.Tensor, op: object = None, group: object = None) -> None:
        self.calls.append(("all_reduce", group, t.device.type))
        t.mul_(2)

    def broadcast(self, t: torch.Tensor, src: int = 0, group: object = None) -> None:
        self.calls.append(("broadcast", group, t.device.type))

    class ReduceOp:
        SUM, MAX = "sum", "max"


def test_host_numbers_go_through_one_gloo_group_made_once(monkeypatch):
    fake = FakeNcclDist()
    monkeypatch.setattr(distributed, "_dist", lambda: fake)
    monkeypatch.setattr(distributed, "_host", {}, raising=False)
    batches = [{"n": 3}, {"n": 4}]
    totals, signals = Engine._global_counts(  # uses no engine state
        None, batches, lambda mb: {"mlm": mb["n"]}, {"since_checkpoint_s": 1.5})
    assert totals == {"mlm": 14.0} and signals == {"since_checkpoint_s": 3.0}
    assert distributed.all_reduce_sum(5) == 10
    assert distributed.any_true(True)
    assert distributed.broadcast_scalar(2.5) == 2.5
    assert fake.groups_made == ["gloo"]  # one group for the whole run
    assert fake.calls == [("all_reduce", "gloo-group-1", "cpu"),
                          ("all_reduce", "gloo-group-1", "cpu"),
                          ("all_reduce", "gloo-group-1", "cpu"),
                          ("broadcast", "gloo-group-1", "cpu")]


def test_a_new_process_group_gets_a_new_host_group(monkeypatch):
    """A process that tears its group down and makes another (tests, notebooks) must not
    reduce through the gloo group of the destroyed one."""
    fake = FakeNcclDist()
    monkeypatch.setattr(distributed, "_dist", lambda: fake)
    monkeypatch.setattr(distributed, "_host", {}, raising=False)
    first = distributed.host_group()
    assert distributed.host_group() is first
    monkeypatch.setattr(FakeNcclDist.group, "WORLD", object())
    assert distributed.host_group() != first and fake.groups_made == ["gloo", "gloo"]


def test_under_gloo_the_default_group_carries_host_numbers(monkeypatch):
    fake = FakeNcclDist()
    monkeypatch.setattr(fake, "get_backend", lambda group=None: "gloo")
    monkeypatch.setattr(distributed, "_dist", lambda: fake)
    monkeypatch.setattr(distributed, "_host", {}, raising=False)
    assert distributed.all_reduce_sum(2.0) == 4.0
    assert fake.calls == [("all_reduce", None, "cpu")] and fake.groups_made == []


def test_a_world_of_one_reduces_no_host_number(monkeypatch):
    """FSDP on one GPU runs in an NCCL group of one, which takes no CPU tensor."""
    fake = FakeNcclDist()
    monkeypatch.setattr(fake, "get_world_size", lambda: 1)
    monkeypatch.setattr(distributed, "_dist", lambda: fake)
    monkeypatch.setattr(distributed, "_host", {}, raising=False)
    assert distributed.all_reduce_sum(3) == 3 and distributed.broadcast_scalar(1.5) == 1.5
    assert distributed.host_all_reduce_sum(torch.ones(2)).tolist() == [1.0, 1.0]
    assert fake.calls == [] and fake.groups_made == []
