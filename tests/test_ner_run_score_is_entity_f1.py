"""The NER run's single score (the one that picks the best epoch and is results.json's "score")
is the entity-level F1 of `metrics.entity_scores`, not the word accuracy it also reports.

(A mutation probe found no test failing when the run score read "accuracy" instead of "f1".)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.tasks import metrics, ner


def test_run_score_is_entity_f1_where_word_accuracy_differs(tmp_path: Path) -> None:
    # The first gold PER spans two words and is predicted one word long: the entity is wrong,
    # 4 of 5 words are right. Entities: gold {PER 0-2, LOC}, predicted {PER 0-1, LOC}: 1 of 2
    # either way, F1 50; word accuracy 80.
    gold = [["B-PER", "I-PER", "O"], ["B-LOC", "O"]]
    predicted = [["B-PER", "O", "O"], ["B-LOC", "O"]]
    scores = metrics.entity_scores(gold, predicted)
    assert scores["f1"] == pytest.approx(50.0) and scores["accuracy"] == pytest.approx(80.0)

    conll = "Emma B-PER\nWatson I-PER\nvisited O\n\nBoston B-LOC\nyesterday O\n\n"
    (tmp_path / "train.conll").write_text(conll, encoding="utf-8")
    (tmp_path / "dev.conll").write_text(conll, encoding="utf-8")
    tok = word_tokenizer(tmp_path / "tok", ["emma", "watson", "visited", "boston", "yesterday"])
    job = ner.ner_job(tmp_path / "train.conll", tmp_path / "dev.conll", tok, FinetuneConfig())
    assert job.primary({"dev": scores}) == pytest.approx(50.0)
