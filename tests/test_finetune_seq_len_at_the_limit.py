"""--max_seq_len equal to the model's max_position_embeddings is the longest sequence it has
positions for (0 .. limit-1): taken as given; one more token is the one-line refusal."""

from __future__ import annotations

import warnings

import _tiny_init
import pytest
import torch
from _tiny_init import SPECIAL

from bertgpu.config.finetune import load_finetune_config
from bertgpu.errors import BertgpuError
from bertgpu.finetune import sequence_length
from bertgpu.models.hf_io import load_pretrained

pytestmark = pytest.mark.usefixtures("one_thread")


def test_max_seq_len_at_the_models_positions_is_taken_one_more_refused(tmp_path):
    init = _tiny_init.tiny_init(tmp_path, SPECIAL + ["the", "a"])  # max_position_embeddings 128
    at = load_finetune_config(None, ["--max_seq_len", "128"])
    assert sequence_length(at, 128, str(init), None) == (128, "")
    assert sequence_length(at, 384, "random", str(init)) == (128, "")
    with pytest.raises(BertgpuError, match=r"^--max_seq_len 129: longer than the model's "
                                           r"max_position_embeddings 128 \(.*config\.json\); "
                                           r"expected at most 128$"):
        sequence_length(load_finetune_config(None, ["--max_seq_len", "129"]), 128, str(init),
                        None)
    # and the model does run on 128 tokens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its fresh classifier
        model = load_pretrained(init, head="classification", num_labels=2).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.randint(5, 7, (2, 128))).logits
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()
