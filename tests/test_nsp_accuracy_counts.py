"""The NSP accuracy's numerator (`nsp_correct`, behind nsp_acc and val_nsp_acc) counts the rows
whose most likely class is the label: an NSP head set by hand to say "IsNext" (class 0) or
"NotNext" (class 1) for every pair gives a known count for known labels."""

from __future__ import annotations

import pytest
import torch
from _tiny import TINY, tiny_batch

from bertgpu.models.bert.config import BertConfig
from bertgpu.models.bert.model import BertForPreTraining

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("says", [0, 1])
def test_nsp_correct_counts_the_rows_the_head_gets_right(says):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=True).eval()
    head = model.cls.seq_relationship
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(torch.tensor([3.0, -3.0] if says == 0 else [-3.0, 3.0]))
    b = tiny_batch()
    b["next_sentence_label"] = torch.tensor([0, 1, 0])  # two IsNext, one NotNext
    with torch.no_grad():
        out = model(**b)
    assert out.seq_relationship_logits.argmax(-1).tolist() == [says] * 3
    right = 2 if says == 0 else 1
    assert int(out.nsp_count) == 3 and int(out.nsp_correct) == right
    # the loss is the summed cross-entropy of those logits: -log softmax of the label's class
    p_right = torch.softmax(torch.tensor([3.0, -3.0]), 0)
    want = -(right * p_right[0].log() + (3 - right) * p_right[1].log())
    torch.testing.assert_close(out.nsp_loss_sum, want)


def test_ignored_nsp_labels_count_neither_as_right_nor_as_rows():
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**TINY), with_nsp=True).eval()
    with torch.no_grad():
        model.cls.seq_relationship.weight.zero_()
        model.cls.seq_relationship.bias.copy_(torch.tensor([-3.0, 3.0]))  # always NotNext
    b = tiny_batch()
    b["next_sentence_label"] = torch.tensor([1, -100, 1])
    with torch.no_grad():
        out = model(**b)
    assert int(out.nsp_count) == 2 and int(out.nsp_correct) == 2
