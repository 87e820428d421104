"""Fixtures shared by several test files."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine their
    spin-waiting makes each backward seconds slower; the previous count is restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_faults(monkeypatch):
    """No fault injection from the environment, and fresh fault counters (testing/faults.py)."""
    from bertgpu.testing import faults

    for name in (faults.ENV, "TORCHELASTIC_RESTART_COUNT", "BERTGPU_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    faults.reset()
    yield
    faults.reset()
