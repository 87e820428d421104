"""Validation masks single tokens whatever the training masking (README, `data.eval_mask_rate`:
"so recipes compare"): a probe found a whole-word run's validation masks were whole words, so
its validation loss scored a harder task than a token-level recipe's on the same sequences."""

from __future__ import annotations

from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_pretrain import _args  # the tiny run's flags

from bertgpu import pretrain
from bertgpu.config import schema
from bertgpu.train.distributed import DistInfo

TINY = str(Path(__file__).resolve().parents[1] / "configs" / "tiny.toml")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("whole_word", ["true", "false"])
def test_validation_masks_are_single_tokens(tmp_path, whole_word):
    data = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32, vocab_size=100)
    words = _args(data, tmp_path / "r", "--data.whole_word_masking", whole_word)[2:]
    loop = pretrain.build(schema.load_config(TINY, words), DistInfo())
    task = loop.task
    task.close()
    assert task.masking.whole_word is (whole_word == "true")
    assert task.eval_masking.whole_word is False
    assert task.eval_masking.mask_rate == 0.15
