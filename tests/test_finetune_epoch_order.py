"""Fine-tuning reshuffles its training set every epoch: each epoch's batches together are a
permutation of the training set, two epochs' orders differ, and the same seed gives the same
orders again (a resumed or repeated run sees the batches the first one saw).

(A mutation probe found no test failing when every epoch used epoch 1's order.)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from bertgpu.tasks.finetuning import Encoded, FinetuneTask, Job
from bertgpu.train.distributed import DistInfo

N, BATCH, MICRO, EPOCHS = 16, 4, 2, 3


def _orders(seed: int, tmp_path: Path) -> list[list[int]]:
    """Per epoch, the training examples in the order the micro batches deliver them."""
    ids = [np.array([2, 10 + i, 3], dtype=np.int64) for i in range(N)]
    train = Encoded(ids, [np.zeros(3, dtype=np.int64)] * N, {"labels": np.arange(N)})
    job = Job("order", "classification", 2, train, [], lambda m: 0.0)
    task = FinetuneTask(job, torch.nn.Linear(1, 1), pad_id=0, seed=seed, global_batch_size=BATCH,
                        micro_batch_size=MICRO, epochs=EPOCHS, eval_batch_size=BATCH,
                        autocast=contextlib.nullcontext, info=DistInfo(), work_dir=tmp_path,
                        export=lambda: tmp_path)
    assert task.steps_per_epoch == N // BATCH
    orders: list[list[int]] = [[] for _ in range(EPOCHS)]
    for step in range(task.total_steps):
        batches = task.micro_batches(step)
        assert [len(b["labels"]) for b in batches] == [MICRO] * (BATCH // MICRO)
        for b in batches:
            # the example id is in the tokens as well as the label: the rows stay whole
            assert (b["input_ids"][:, 1] - 10).tolist() == b["labels"].tolist()
            orders[task.epoch_of(step) - 1] += b["labels"].tolist()
    return orders


def test_every_epoch_is_a_new_permutation_and_a_seed_repeats_them(tmp_path: Path) -> None:
    orders = _orders(0, tmp_path)
    for order in orders:
        assert sorted(order) == list(range(N))
    assert len({tuple(o) for o in orders}) == EPOCHS, "an epoch repeated another's order"
    assert orders[0] != list(range(N))
    assert _orders(0, tmp_path) == orders
    assert _orders(1, tmp_path) != orders
