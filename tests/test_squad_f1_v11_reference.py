"""SQuAD token F1 against a re-implementation of the official evaluate-v1.1.py `f1_score`
(normalize_answer, then a Counter intersection: a repeated token counts as often as it occurs
on both sides).

(A mutation probe found no test failing when the Counter intersection became a set
intersection.)
"""

from __future__ import annotations

import re
import string
from collections import Counter

import pytest

from bertgpu.tasks import squad_eval


def _normalize_answer(s: str) -> str:
    """evaluate-v1.1.py's normalize_answer."""
    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _official_f1(prediction: str, ground_truth: str) -> float:
    """evaluate-v1.1.py's f1_score."""
    prediction_tokens = _normalize_answer(prediction).split()
    ground_truth_tokens = _normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


PAIRS = [
    ("cat cat", "cat cat dog"),            # repeated tokens: 2 shared, P 1, R 2/3 -> 0.8
    ("cat cat cat", "cat dog"),            # 1 shared, not 3
    ("the New York, New York", "New York"),
    ("a b a b", "b a b a c"),
    ("Denver Broncos", "the Denver Broncos!"),
    ("no overlap", "at all"),
    ("1 2 2 3 3 3", "3 3 2 1 1"),
]


@pytest.mark.parametrize(("prediction", "gold"), PAIRS)
def test_f1_matches_evaluate_v11(prediction: str, gold: str) -> None:
    want = _official_f1(prediction, gold)
    assert squad_eval.f1_score(prediction, gold, version_2=False) == pytest.approx(want)
    # non-empty answers: the v2 rule only differs when a side has no tokens
    assert squad_eval.f1_score(prediction, gold) == pytest.approx(want)


def test_repeated_tokens_count_with_multiplicity() -> None:
    assert squad_eval.f1_score("cat cat", "cat cat dog", version_2=False) == pytest.approx(0.8)
