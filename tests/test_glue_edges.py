"""GLUE edge cases: Hugging Face MNLI split names, out-of-range class ids in exports, the export's
`idx` column, and how `encode_pairs` truncates pairs and stores regression targets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _tiny_init import word_tokenizer

from bertgpu.errors import BertgpuError
from bertgpu.tasks.finetuning import encode_pairs
from bertgpu.tasks.glue import Example, find_split_file
from bertgpu.tasks.glue_files import read_examples

WORDS = [f"w{i}" for i in range(40)] + ["alpha", "beta", "gamma"]


@pytest.fixture
def tok(tmp_path: Path):
    """A word-level BERT WordPiece tokenizer (vocab.txt only) as `load_tokenizer` builds it."""
    return word_tokenizer(tmp_path / "tok", WORDS)


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_huggingface_mnli_mismatched_dev_is_the_mismatched_file(tmp_path: Path) -> None:
    """With a Hugging Face MNLI export, the mismatched dev split must be read from
    validation_mismatched, not scored on the matched set."""
    d = tmp_path / "mnli"
    d.mkdir()
    row = {"premise": "p", "hypothesis": "h", "label": 0, "idx": 0}
    for name in ("train", "validation_matched", "validation_mismatched"):
        _jsonl(d / f"{name}.jsonl", [row])
    assert find_split_file(tmp_path, "mnli", "dev_mismatched").name == \
        "validation_mismatched.jsonl"
    assert find_split_file(tmp_path, "mnli", "dev_matched").name == "validation_matched.jsonl"


def test_integer_class_id_beyond_the_labels_is_refused(tmp_path: Path) -> None:
    """A JSON export with label 2 in binary SST-2 is an error naming the label, instead of being
    accepted and crashing training later."""
    path = _jsonl(tmp_path / "train.jsonl", [{"sentence": "good", "label": 1, "idx": 0},
                                             {"sentence": "odd", "label": 2, "idx": 1}])
    with pytest.raises(BertgpuError, match="unknown SST-2 label 2"):
        read_examples("sst2", path)
    ok = _jsonl(tmp_path / "dev.jsonl", [{"sentence": "good", "label": 1, "idx": 0}])
    assert read_examples("sst2", ok)[0].label == 1


def test_text_class_id_beyond_the_labels_is_refused(tmp_path: Path) -> None:
    """A CSV export (labels are text there) with label "2" in binary SST-2 is an error naming the
    label, not class 2."""
    path = tmp_path / "train.csv"
    path.write_text("sentence,label,idx\ngood,1,0\nodd,2,1\n", encoding="utf-8")
    with pytest.raises(BertgpuError, match="unknown SST-2 label '2'"):
        read_examples("sst2", path)


def test_huggingface_idx_column_becomes_the_guid(tmp_path: Path) -> None:
    """A Hugging Face export's `idx` column is each example's id (the test-submission index), not
    its row number."""
    path = _jsonl(tmp_path / "test.jsonl", [{"sentence": "a", "label": -1, "idx": 7},
                                            {"sentence": "b", "label": -1, "idx": 3}])
    assert [e.guid for e in read_examples("sst2", path)] == ["7", "3"]


def test_regression_targets_keep_their_fraction(tok) -> None:
    """STS-B scores are float targets (3.8 stays 3.8), not truncated to whole numbers."""
    enc = encode_pairs(tok, [Example("0", "alpha beta", "gamma", 3.8),
                             Example("1", "beta", "alpha", 1.25)], 32, regression=True)
    labels = enc.targets["labels"]
    assert labels.dtype == np.float32
    np.testing.assert_allclose(labels, [3.8, 1.25], rtol=1e-6)
    cls = encode_pairs(tok, [Example("0", "alpha", "beta", 1)], 32, regression=False)
    assert cls.targets["labels"].dtype == np.int64


def test_pair_truncation_cuts_the_longer_sentence_first(tok) -> None:
    """A long first sentence with a short second one is cut BERT's way (longest first): the
    pair fits max_seq_len and every token of the short sentence is kept."""
    a = " ".join(f"w{i}" for i in range(40))
    enc = encode_pairs(tok, [Example("0", a, "alpha beta gamma", 0)], 16, regression=False)
    ids, types = enc.ids[0], enc.types[0]
    assert len(ids) == 16
    vocab = tok.get_vocab()
    second = ids[types == 1].tolist()
    assert second == [vocab["alpha"], vocab["beta"], vocab["gamma"], vocab["[SEP]"]]
    assert ids[:3].tolist() == [vocab["[CLS]"], vocab["w0"], vocab["w1"]]
