"""`prepare --engine ray` without --ray-address starts a Ray cluster of its own of --workers
CPUs. Ray's `init` without an address joins a cluster that `ray start` left on the machine (or
that a stale /tmp/ray/ray_current_cluster names), and then refuses num_cpus: "--engine ray:
cannot start a local Ray cluster of 2 CPUs (ValueError: When connecting to an existing
cluster, num_cpus and num_gpus must not be provided.)". It now asks for a local one."""

from __future__ import annotations

import types

import pytest

from bertgpu.data import ray_engine
from bertgpu.errors import BertgpuError


class _Ray(types.SimpleNamespace):
    """Ray as a cluster started with `ray start` on this machine makes it look."""

    def __init__(self) -> None:
        super().__init__(calls=[])

    def is_initialized(self) -> bool:
        return False

    def init(self, address=None, num_cpus=None, **options):
        self.calls.append((address, num_cpus))
        if address is None and num_cpus is not None:
            raise ValueError("When connecting to an existing cluster, num_cpus and num_gpus "
                             "must not be provided.")
        raise RuntimeError("stop here")  # what follows init is not this test's business


def test_an_engine_of_its_own_asks_for_a_local_cluster(monkeypatch):
    fake = _Ray()
    monkeypatch.setattr(ray_engine, "_ray", lambda: fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(BertgpuError, match="stop here"):  # old code: "num_cpus and num_gpus"
        ray_engine.RayEngine(job=None, address=None, workers=2, progress=None)
    assert fake.calls == [("local", 2)]
