"""A resume at another world size cannot restore each rank's generator (the checkpoint holds
another number of them): `loop_state.restore_rank_states` reseeds dropout from (seed, rank,
step). The step matters: without it every such resume draws the masks a fresh run drew at step
0, whatever step it resumes at. (A mutation probe found no test failing with the step left out.)
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertgpu.models.dropout import dropout
from bertgpu.train import loop_state
from bertgpu.train.checkpoint import rng_state
from bertgpu.train.distributed import DistInfo
from bertgpu.train.engine import seed_dropout

SEED = 3


@pytest.fixture(autouse=True)
def generators_kept():
    """The test reseeds the global generators: they are put back afterwards."""
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()
    yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])


def _next_mask() -> torch.Tensor:
    """The dropout mask the next training step's first site draws."""
    return dropout(torch.ones(4096), 0.5) == 0


def _resumed_mask(step: int, rank: int = 0, world: int = 2, saved_ranks: int = 1
                  ) -> torch.Tensor:
    torch.manual_seed(12345)  # whatever the generator held before: it must not matter
    saved = [rng_state() for _ in range(saved_ranks)]
    torch.manual_seed(999)
    engine = SimpleNamespace(step=step, model=torch.nn.Linear(2, 2))  # no comm hook
    loop_state.restore_rank_states({"rng": saved}, engine, DistInfo(rank, world), SEED)
    return _next_mask()


def test_another_world_size_reseeds_dropout_by_step_and_rank():
    at = {step: _resumed_mask(step) for step in (0, 4, 8)}
    assert torch.equal(at[4], _resumed_mask(4))  # a function of (seed, rank, step) only
    assert not torch.equal(at[4], at[8]) and not torch.equal(at[0], at[4])
    assert not torch.equal(at[4], _resumed_mask(4, rank=1))
    # A fresh run's first masks (seed_dropout): a resume at step 4 does not replay them.
    seed_dropout(SEED, 0)
    fresh = _next_mask()
    assert not torch.equal(at[4], fresh) and not torch.equal(at[8], fresh)


def test_the_same_world_size_restores_the_saved_generator():
    torch.manual_seed(12345)
    saved = [rng_state(), rng_state()]
    want = _next_mask()
    torch.manual_seed(999)
    engine = SimpleNamespace(step=4, model=torch.nn.Linear(2, 2))
    loop_state.restore_rank_states({"rng": saved}, engine, DistInfo(1, 2), SEED)
    assert torch.equal(_next_mask(), want)
