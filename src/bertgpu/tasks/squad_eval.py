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

Choosing the v2 no-answer threshold after the fact, as evaluate-v2.0.py does with --na-prob-file:
`null_odds` turns a run's n-best lists into the best span of every question and its null odds
(null score - best span score; "" is predicted when they exceed --null_threshold), and
`best_thresholds` reports the best EM and F1 over every threshold and the threshold giving each:
its best_exact, best_exact_thresh, best_f1, best_f1_thresh.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import re
import string
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

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
    em, f1, missing = _question_scores(examples, predictions, version_2)
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


def _question_scores(examples: Sequence[SquadExample], predictions: Mapping[str, str],
                     version_2: bool) -> tuple[dict[str, float], dict[str, float], int]:
    """Per question id its exact match and F1 (0-1, max over the gold answers), and how many
    questions have no prediction (scored 0)."""
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
    return em, f1, missing


def null_odds(nbest: Mapping[str, Sequence[Mapping[str, Any]]]
              ) -> tuple[dict[str, str], dict[str, float]]:
    """The best span text of every question of a v2 run, and its null odds, from
    `squad.postprocess`'s n-best lists (spans carry their start logit, the null entry None).

    The span is what the question predicts when the null answer does not win, kept even when it
    does ("" for a question without any span). The null odds are null score - best span score,
    the number postprocess compares with its threshold: "" is predicted exactly when they are
    greater. They are evaluate-v2.0.py's --na-prob-file (higher = more likely unanswerable;
    Hugging Face's run_qa writes the same as null_odds.json). A question without a span has
    +inf (always ""), one without a null entry (its null score is not finite: postprocess then
    keeps the span) -inf.
    """
    spans: dict[str, str] = {}
    odds: dict[str, float] = {}
    for qid, entries in nbest.items():
        best = next((d for d in entries if d["start_logit"] is not None), None)
        null = next((d for d in entries if d["start_logit"] is None), None)
        spans[qid] = best["text"] if best is not None else ""
        if null is None:
            odds[qid] = -math.inf
        else:
            odds[qid] = math.inf if best is None else float(null["score"] - best["score"])
    return spans, odds


def best_thresholds(examples: Sequence[SquadExample], span_predictions: Mapping[str, str],
                    na_probs: Mapping[str, float]) -> dict[str, float]:
    """evaluate-v2.0.py's best_exact, best_exact_thresh, best_f1, best_f1_thresh: the v2 EM and F1
    (0-100) with the no-answer threshold that maximises each, and that threshold.

    At threshold t a question predicts "" when its na_prob (`null_odds`) is greater than t, else
    its span from `span_predictions` (the best span, not a prediction already thresholded):
    exactly what --null_threshold t gives, so that a run with --null_threshold best_f1_thresh
    scores f1 = best_f1. As the official find_best_thresh, the questions are swept in na_prob
    order and, among equal scores, the lowest threshold is kept. Two differences, both so the
    threshold reported gives the score reported: questions with equal na_probs change together
    (the official sweep can stop inside such a group, at a score no threshold gives), and when
    "" for every question is best the threshold is just below the smallest na_prob (1 below it),
    not the official 0.0. A question without a span prediction scores 0 and counts in the total,
    as in `squad_evaluate`.
    """
    em_span, f1_span, _ = _question_scores(examples, span_predictions, True)
    blank = {e.id: "" for e in examples if e.id in span_predictions}
    em_null, f1_null, _ = _question_scores(examples, blank, True)
    missing = [q for q in blank if q not in na_probs]
    if missing:
        raise ValueError(f"{len(missing)} questions have a prediction but no na_prob (the first: "
                         f'"{missing[0]}")')
    # NaN compares false with every threshold: the span is kept, as for -inf.
    na = {q: -math.inf if math.isnan(na_probs[q]) else float(na_probs[q]) for q in blank}
    ids = sorted(blank, key=na.__getitem__)
    out: dict[str, float] = {}
    for name, span_score, null_score in (("exact", em_span, em_null), ("f1", f1_span, f1_null)):
        score, thresh = _sweep(ids, na, span_score, null_score)
        out[f"best_{name}"] = 100.0 * float(score) / len(examples) if examples else 0.0
        out[f"best_{name}_thresh"] = thresh
    return out


def _sweep(ids: list[str], na: Mapping[str, float], span_score: Mapping[str, float],
           null_score: Mapping[str, float]) -> tuple[Fraction, float]:
    """The best total score over thresholds and the lowest threshold giving it; `ids` sorted by
    `na`. Sums are exact (Fractions of the per-question floats) so that equal scores compare
    equal whatever order their questions were added in."""
    gain = {q: Fraction(span_score[q]) - Fraction(null_score[q]) for q in ids}
    # Below every finite na_prob: only the -inf questions keep their span.
    current = sum((Fraction(null_score[q]) for q in ids), Fraction(0))
    current += sum((gain[q] for q in ids if na[q] == -math.inf), Fraction(0))
    finite = [q for q in ids if math.isfinite(na[q])]
    thresh = 0.0
    if finite:
        lowest = na[finite[0]]
        thresh = lowest - 1.0 if lowest - 1.0 < lowest else math.nextafter(lowest, -math.inf)
    best = current
    for value, group in itertools.groupby(finite, key=na.__getitem__):
        current += sum((gain[q] for q in group), Fraction(0))
        if current > best:
            best, thresh = current, value
    return best, thresh
