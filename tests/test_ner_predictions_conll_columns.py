"""ner's predictions.conll is conlleval's input: token, gold tag, predicted tag, one word per
line, a blank line after each sentence, in the dev file's order.

A mutation probe found no test failing when the gold and predicted columns were swapped: the
file then scored the gold tags against the model's and conlleval's precision and recall traded
places without a word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.tasks import ner


def test_predictions_conll_is_token_gold_predicted(tmp_path: Path) -> None:
    (tmp_path / "train.conll").write_text(
        "-DOCSTART- -X- -X- O\n\nemma B-PER\nvisited O\nparis B-LOC\n\nsee O\nyork B-LOC\n",
        encoding="utf-8")
    (tmp_path / "dev.conll").write_text(
        "emma NNP B-NP B-PER\nvisited VBD B-VP O\n\nparis NNP B-NP B-LOC\nyork NNP I-NP I-LOC\n",
        encoding="utf-8")
    tok = word_tokenizer(tmp_path / "tok", ["emma", "visited", "paris", "see", "york"])
    job = ner.ner_job(tmp_path / "train.conll", tmp_path / "dev.conll", tok, FinetuneConfig())
    assert job.labels == ("O", "B-LOC", "I-LOC", "B-PER", "I-PER")
    ids = {t: i for i, t in enumerate(job.labels)}
    # [CLS] w1 w2 [SEP]: one piece per word, a word's logits at position 1 + its index
    predicted = [["B-PER", "B-LOC"], ["B-LOC", "O"]]
    logits = np.zeros((2, 4, len(job.labels)), dtype=np.float32)
    for i, tags in enumerate(predicted):
        for w, tag in enumerate(tags):
            logits[i, 1 + w, ids[tag]] = 5.0
    out = tmp_path / "out"
    out.mkdir()
    metrics = job.evals[0].score({"logits": logits}, out)
    text = (out / "predictions.conll").read_text(encoding="utf-8")
    assert text.split("\n") == ["emma B-PER B-PER", "visited O B-LOC", "",
                                "paris B-LOC B-LOC", "york I-LOC O", ""]
    # gold: PER emma, LOC paris york; predicted: PER emma, LOC visited, LOC paris: 1 of 3 right,
    # 1 of 2 found
    assert metrics["precision"] == pytest.approx(100 / 3)
    assert metrics["recall"] == pytest.approx(50.0)
