"""classify's predictions.jsonl and its CSV labels written as numbers.

A mutation probe found no test failing when predictions.jsonl swapped "label" (the dev file's)
and "prediction" (the model's), or when the dev and training rows were looked up by their text
rather than their value, which refused a CSV label "1.0" (pandas writes it for an int column
that held a NaN) against the class "1" that discover_labels names it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.tasks import classify

WORDS = ["apple", "river", "stone", "cloud", "good", "bad", "meh"]


def _tok(tmp_path: Path):
    return word_tokenizer(tmp_path / "tok", WORDS)


def test_predictions_jsonl_pairs_each_dev_row_with_its_label_and_the_models_class(
        tmp_path: Path) -> None:
    """One line per dev row, in file order: id FILE:LINE, "label" as the dev file spells it,
    "prediction" the class of the row's largest logit (names, not ids)."""
    (tmp_path / "train.csv").write_text("text,label\napple good,pos\nriver bad,neg\n"
                                        "stone meh,mid\ncloud good,pos\n", encoding="utf-8")
    (tmp_path / "dev.csv").write_text("text,label\napple good,pos\n\nriver bad,neg\n"
                                      "stone meh,mid\n", encoding="utf-8")
    job = classify.classify_job(tmp_path / "train.csv", tmp_path / "dev.csv", _tok(tmp_path),
                                FinetuneConfig())
    assert job.labels == ("mid", "neg", "pos")
    # row 1 (pos) predicted neg, row 2 (neg) predicted neg, row 3 (mid) predicted pos
    logits = np.array([[0.0, 3.0, 1.0], [0.1, 2.0, -1.0], [-1.0, 0.0, 4.0]], dtype=np.float32)
    out = tmp_path / "out"
    out.mkdir()
    metrics = job.evals[0].score({"logits": logits}, out)
    lines = [json.loads(x) for x in
             (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert lines == [
        {"id": "dev.csv:2", "label": "pos", "prediction": "neg"},
        {"id": "dev.csv:4", "label": "neg", "prediction": "neg"},
        {"id": "dev.csv:5", "label": "mid", "prediction": "pos"},
    ]
    assert metrics["accuracy"] == pytest.approx(100 / 3)


def test_csv_labels_equal_as_numbers_are_one_class_in_train_and_dev(tmp_path: Path) -> None:
    """CSV text "1.0" is the class "1" (the module docstring: "labels equal as numbers are one
    class, named by its value ... in the dev file too"); the JSON test of it never reaches the
    lookup, since JSON 1.0 is read as the number 1."""
    (tmp_path / "train.csv").write_text("text,label\napple,1\nriver,0\nstone,1.0\ncloud,0.00\n",
                                        encoding="utf-8")
    (tmp_path / "dev.csv").write_text("text,label\napple,1.0\nriver,0\nstone,01\n",
                                      encoding="utf-8")
    job = classify.classify_job(tmp_path / "train.csv", tmp_path / "dev.csv", _tok(tmp_path),
                                FinetuneConfig())
    assert job.labels == ("0", "1")
    assert job.train.targets["labels"].tolist() == [1, 0, 1, 0]
    out = tmp_path / "out"
    out.mkdir()
    job.evals[0].score({"logits": np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])}, out)
    gold = [json.loads(x)["label"] for x in
            (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert gold == ["1", "0", "1"]
