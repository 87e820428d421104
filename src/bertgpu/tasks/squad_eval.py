"""The official SQuAD v1.1 / v2.0 evaluation: answer normalisation, exact match and token F1.

Follows evaluate-v1.1.py / evaluate-v2.0.py: the same answer normalisation, token-overlap F1, max
over gold answers, 0-100 scale. For v2, a question with no answer is right only when the
prediction is "" (both empty -> 1, otherwise 0). One deliberate difference: a question without a
prediction scores 0 and counts in the total (the v2 script would crash on it).

Which v2 questions have an answer: as evaluate-v2.0.py decides, `bool(qa["answers"])`, whatever
"is_impossible" says. Official files always give an is_impossible question `"answers": []`;
converted or home-made files sometimes keep annotators' spans there too. Such a question is
scored against those answers and counted under HasAns, exactly as the official script scores the
same file, so the numbers here can be checked with it. (Training follows "is_impossible": its
target is the [CLS] "no answer" position, squad.py.)
"""

from __future__ import annotations

import collections
import logging
import re
import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bertgpu.tasks.squad import SquadExample

log = logging.getLogger(__name__)


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, version_2: bool = True) -> float:
    """Token-overlap F1 of the normalised answers.

    v2 rule (default): when either side has no tokens, 1.0 if both have none else 0.0. The v1.1
    script returns 0.0 whenever nothing overlaps, even for two empty strings.
    """
    p = normalize_answer(prediction).split()
    g = normalize_answer(gold).split()
    if version_2 and (not p or not g):
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def squad_evaluate(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                   version_2: bool | None = None) -> dict[str, float]:
    """Official SQuAD scores on the 0-100 scale: exact, f1 and the question count total (an int);
    for v2 also HasAns_/NoAns_ exact, f1 and total, split by whether the question's answers list
    is empty (module docstring). `version_2` defaults to "any example is unanswerable"."""
    if version_2 is None:
        version_2 = any(e.is_impossible for e in examples)
    em: dict[str, float] = {}
    f1: dict[str, float] = {}
    missing = 0
    for ex in examples:
        if version_2:
            # evaluate-v2.0.py: golds that normalise to nothing are dropped; none left = no answer.
            golds = [a for a in ex.answers if normalize_answer(a)] or [""]
        else:
            golds = list(ex.answers)
        pred = predictions.get(ex.id)
        if pred is None:
            missing += 1
            em[ex.id] = f1[ex.id] = 0.0
            continue
        em[ex.id] = max(exact_match(pred, g) for g in golds)
        f1[ex.id] = max(f1_score(pred, g, version_2) for g in golds)
    if missing:
        log.warning("%d of %d questions have no prediction (scored 0)", missing, len(examples))

    def block(ids: list[str], prefix: str = "") -> dict[str, float]:
        n = len(ids)
        return {
            f"{prefix}exact": 100.0 * sum(em[k] for k in ids) / n if n else 0.0,
            f"{prefix}f1": 100.0 * sum(f1[k] for k in ids) / n if n else 0.0,
            f"{prefix}total": n,
        }

    out = block([e.id for e in examples])
    if version_2:
        # evaluate-v2.0.py: "has answer" means a non-empty answers list, before normalisation,
        # whatever is_impossible says.
        has = [e.id for e in examples if e.answers]
        has_set = set(has)
        no = [e.id for e in examples if e.id not in has_set]
        if has:
            out.update(block(has, "HasAns_"))
        if no:
            out.update(block(no, "NoAns_"))
    return out
