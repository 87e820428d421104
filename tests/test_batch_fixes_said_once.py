"""`--train.global_batch_size 33 --impl.micro_batch_size 1 --nproc 2` printed "e.g.
--train.global_batch_size 32, --train.global_batch_size 34, or a multiple of 2 for micro batch 1:
--train.global_batch_size 32 or 34": with micro batch 1 the multiples of micro x devices are the
multiples of the devices, named twice. Each suggestion is now said once (a batch below the
devices gets the next two multiples, not one twice)."""

from __future__ import annotations

import re

import pytest

from bertgpu.config.finetune import check_batch, load_finetune_config
from bertgpu.config.sections import resolve_batch
from bertgpu.errors import BertgpuError


def _fixes(message: str) -> list[str]:
    """Every batch the message suggests, a pair's micro batch with it."""
    fixes = message.partition("; expected ")[2]
    said = re.findall(r"(?:--train\.|--)global_batch_size \d+(?: --(?:impl\.)?micro_batch_size "
                      r"\d+)?", fixes)
    tail = re.search(r"or a multiple of \d+ for micro batch \d+: \S+ ([\d or]+)$", fixes)
    return said + (tail[1].split(" or ") if tail else [])


def _said(batch: int, micro: int, world: int) -> str:
    with pytest.raises(BertgpuError) as err:
        resolve_batch(batch, micro, world)
    return str(err.value)


def test_the_probes_case_says_each_batch_once():
    message = _said(33, 1, 2)
    assert message == (
        "train.global_batch_size 33 is not divisible by impl.micro_batch_size 1 × 2 devices = 2; "
        "expected a global batch that the 2 devices share equally (a multiple of 2) in whole "
        "micro batches, e.g. --train.global_batch_size 32 or --train.global_batch_size 34")
    assert "or a multiple of" not in message


@pytest.mark.parametrize("batch", [1, 3, 7, 33, 250])
@pytest.mark.parametrize("world", [2, 3, 8])
def test_micro_batch_1_names_no_batch_twice(batch, world):
    if batch % world == 0:
        return
    message = _said(batch, 1, world)
    numbers = [int(re.findall(r"\d+", f)[-1]) for f in _fixes(message)]
    assert len(numbers) == 2 and len(set(numbers)) == 2, message
    assert all(resolve_batch(b, 1, world) >= 1 for b in numbers), message


def test_finetunings_flat_flags_too():
    cfg = load_finetune_config(None, ["--global_batch_size", "1", "--micro_batch_size", "1"])
    with pytest.raises(BertgpuError) as err:
        check_batch(cfg, 2)
    assert str(err.value).endswith(
        "expected a global batch that the 2 devices share equally (a multiple of 2) in whole "
        "micro batches, e.g. --global_batch_size 2 or --global_batch_size 4")
