"""Evaluation metrics in plain numpy: GLUE's, your own labels' and named entities', and the GLUE
score convention.

The low-level metrics (`accuracy`, `f1`, `macro_f1`, `matthews_corrcoef`, `pearson`, `spearman`)
return the raw value (0-1, or -1..1 for correlations) and match scikit-learn / scipy (tested
against them; neither is a runtime dependency), NaN included: a correlation with a NaN input is
nan, a class id that is NaN is a ValueError (as scikit-learn's "Input contains NaN").
`glue_metrics` returns the official metrics of a task on the 0-100 scale that papers and the GLUE
leaderboard report; `label_metrics` the same scale for `bertgpu finetune classify`. Both report
an undefined value (nan) as 0, and every metric as 0 when a prediction is not finite: a model
whose outputs are NaN or infinite is broken, and no part of its output is scored (the
fine-tuning evaluation says so in a warning: finetuning.py). `entity_scores` is entity-level
precision/recall/F1 of BIO tag sequences with conlleval's span rules (seqeval's default mode;
tested against seqeval):

    entities(["B-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]

GLUE score convention ("glue-score", the GLUE leaderboard's): a task's score is the unweighted
mean of its official metrics (MRPC: (F1 + acc) / 2, QQP: (acc + F1) / 2, STS-B: (Pearson +
Spearman) / 2, the others their single metric); MNLI's score is the mean of its matched and
mismatched accuracy, so MNLI counts once; the GLUE average is the unweighted mean of the task
scores over the tasks given (WNLI included when present). Note that the BERT paper's Table 1
differs: one metric per task (F1 for MRPC/QQP, Spearman for STS-B), MNLI-m and MNLI-mm as two
columns, WNLI left out. `glue_average` implements ours only, and the table should say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from bertgpu.errors import BertgpuError
from bertgpu.tasks.glue import GlueTask, get_task

__all__ = [
    "accuracy",
    "all_finite",
    "entities",
    "entity_scores",
    "f1",
    "glue_average",
    "glue_metrics",
    "label_metrics",
    "macro_f1",
    "matthews_corrcoef",
    "pearson",
    "rankdata",
    "spearman",
    "task_score",
]


def _pair(predictions: npt.ArrayLike, labels: npt.ArrayLike,
          dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    p_in, y_in = np.asarray(predictions).reshape(-1), np.asarray(labels).reshape(-1)
    if np.issubdtype(dtype, np.integer):
        for name, a in (("predictions", p_in), ("labels", y_in)):
            if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
                raise ValueError(f"{name} are not finite: no class ids to score")
    p, y = p_in.astype(dtype), y_in.astype(dtype)
    if p.shape != y.shape:
        raise ValueError(f"{p.shape[0]} predictions for {y.shape[0]} labels")
    if p.size == 0:
        raise ValueError("no predictions to score")
    return p, y


def accuracy(predictions: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Fraction of predictions equal to the label."""
    p, y = _pair(predictions, labels)
    return float(np.mean(p == y))


def f1(predictions: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Binary F1 of the positive class 1; 0 when there are no true positives (sklearn's
    zero_division=0 behaviour)."""
    p, y = _pair(predictions, labels)
    tp = int(np.sum((p == 1) & (y == 1)))
    fp = int(np.sum((p == 1) & (y != 1)))
    fn = int(np.sum((p != 1) & (y == 1)))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def macro_f1(predictions: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Unweighted mean of the per-class F1 over the classes that occur in the labels or the
    predictions (scikit-learn's f1_score(average="macro") with its default label set); a class
    with no true positive scores 0."""
    p, y = _pair(predictions, labels)
    scores = []
    for c in np.union1d(p, y):
        tp = int(np.sum((p == c) & (y == c)))
        fp = int(np.sum((p == c) & (y != c)))
        fn = int(np.sum((p != c) & (y == c)))
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def matthews_corrcoef(predictions: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Matthews correlation (multi-class form, as sklearn); 0 when either side is constant."""
    p, y = _pair(predictions, labels)
    classes, inv = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = len(classes)
    yi, pi = inv[: len(y)], inv[len(y):]
    c = np.zeros((k, k), dtype=np.float64)  # confusion matrix, rows = true, cols = predicted
    np.add.at(c, (yi, pi), 1.0)
    t = c.sum(axis=1)  # times each class truly occurred
    q = c.sum(axis=0)  # times each class was predicted
    n = c.sum()
    cov_yp = np.trace(c) * n - t @ q
    cov_pp = n * n - q @ q
    cov_yy = n * n - t @ t
    denom = np.sqrt(cov_pp * cov_yy)
    return 0.0 if denom == 0 else float(cov_yp / denom)


def pearson(predictions: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Pearson correlation; nan when either side is constant (as scipy)."""
    x, y = _pair(predictions, labels, np.float64)
    xc, yc = x - x.mean(), y - y.mean()
    denom = np.sqrt((xc @ xc) * (yc @ yc))
    if denom == 0:
        return float("nan")
    return float(np.clip((xc @ yc) / denom, -1.0, 1.0))


def rankdata(a: npt.ArrayLike) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (scipy.stats.rankdata, method="average");
    all nan when any value is nan (scipy's nan_policy="propagate")."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    if np.isnan(x).any():
        return np.full(len(x), np.nan)
    order = np.argsort(x, kind="mergesort")
    sx = x[order]
    # Start of each run of equal values; a tie group spanning sorted positions i..j gets
    # rank (i + j) / 2 + 1.
    starts = np.concatenate([[True], sx[1:] != sx[:-1]])
    group = np.cumsum(starts) - 1
    first = np.flatnonzero(starts)
    last = np.concatenate([first[1:], [len(x)]]) - 1
    avg = (first + last) / 2.0 + 1.0
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = avg[group]
    return ranks


def spearman(predictions: npt.ArrayLike, labels: npt.ArrayLike) -> float:
    """Spearman rank correlation: Pearson of the average ranks (ties handled as scipy); nan when
    either side is constant or holds a nan (as scipy)."""
    x, y = _pair(predictions, labels, np.float64)
    return pearson(rankdata(x), rankdata(y))


def _class_ids(predictions: npt.ArrayLike) -> np.ndarray:
    """(N, C) logits or probabilities -> class ids; (N,) already ids. NaN logits have no argmax
    (numpy's would be class 0): a ValueError."""
    p = np.asarray(predictions)
    if p.ndim != 2:
        return p.reshape(-1)
    if np.issubdtype(p.dtype, np.inexact) and not np.isfinite(p).all():
        raise ValueError("logits are not finite: no class ids")
    return p.argmax(axis=-1)


def all_finite(predictions: npt.ArrayLike) -> bool:
    """Whether every value of a model's predictions is a finite number."""
    p = np.asarray(predictions)
    return not np.issubdtype(p.dtype, np.inexact) or bool(np.isfinite(p).all())


def glue_metrics(task: GlueTask | str, predictions: npt.ArrayLike,
                 labels: npt.ArrayLike) -> dict[str, float]:
    """The task's official metrics on the 0-100 scale, e.g. {"f1": 88.9, "accuracy": 84.1}.

    `predictions`: class ids (N,) or logits (N, C) for classification; scores (N,) or (N, 1) for
    STS-B. `labels`: ids or scores. For MNLI call once per dev split (matched, mismatched).
    A correlation of a constant prediction is undefined; it is reported as 0 so a collapsed
    run scores 0 rather than poisoning the average with nan. Predictions that are not all finite
    score 0 on every metric (module docstring).
    """
    task = get_task(task)
    if not all_finite(predictions):
        return dict.fromkeys(task.metrics, 0.0)
    if task.kind == "classification":
        p = _class_ids(predictions)
    else:
        p = np.asarray(predictions, dtype=np.float64).reshape(-1)
    fns = {"accuracy": accuracy, "f1": f1, "mcc": matthews_corrcoef,
           "pearson": pearson, "spearman": spearman}
    out: dict[str, float] = {}
    for name in task.metrics:
        v = fns[name](p, labels)
        out[name] = 0.0 if np.isnan(v) else 100.0 * v
    return out


def label_metrics(predictions: npt.ArrayLike, labels: npt.ArrayLike,
                  regression: bool) -> dict[str, float]:
    """`bertgpu finetune classify` on the 0-100 scale: accuracy and macro-F1 of class ids (logits
    (N, C) or ids (N,)), or Pearson and Spearman of scores (N,) / (N, 1) for regression (an
    undefined correlation, from a constant prediction, reported as 0 as in `glue_metrics`; every
    metric 0 when a prediction is not finite)."""
    if not all_finite(predictions):
        return dict.fromkeys(("pearson", "spearman") if regression
                             else ("accuracy", "macro_f1"), 0.0)
    if regression:
        p = np.asarray(predictions, dtype=np.float64).reshape(-1)
        pairs = {"pearson": pearson(p, labels), "spearman": spearman(p, labels)}
    else:
        ids = _class_ids(predictions)
        pairs = {"accuracy": accuracy(ids, labels), "macro_f1": macro_f1(ids, labels)}
    return {k: 0.0 if np.isnan(v) else 100.0 * v for k, v in pairs.items()}


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entity spans (type, start, end exclusive) of one sentence's BIO tags, by conlleval's rules:
    B-X starts an entity; I-X continues an open X entity and starts a new one after O, at the
    sentence start or after another type; O or the sentence end closes the open entity."""
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate(tags):
        prefix, _, tag_type = tag.partition("-")
        if kind is not None and (prefix != "I" or tag_type != kind):
            spans.append((kind, start, i))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = tag_type, i
    if kind is not None:
        spans.append((kind, start, len(tags)))
    return spans


def entity_scores(gold: Sequence[Sequence[str]],
                  predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro-averaged entity precision, recall and F1 (an entity counts when its type and both
    ends match) and word accuracy, on the 0-100 scale; seqeval's default-mode precision_score /
    recall_score / f1_score / accuracy_score. No predicted (or gold) entity gives precision
    (recall) 0, as seqeval does."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(predicted)} predicted sentences for {len(gold)} gold ones")
    true_set: set[tuple[int, str, int, int]] = set()
    pred_set: set[tuple[int, str, int, int]] = set()
    words = correct = 0
    for n, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(p)} predicted tags for {len(g)} words")
        true_set.update((n, *e) for e in entities(g))
        pred_set.update((n, *e) for e in entities(p))
        words += len(g)
        correct += sum(a == b for a, b in zip(g, p, strict=True))
    tp = len(true_set & pred_set)
    precision = tp / len(pred_set) if pred_set else 0.0
    recall = tp / len(true_set) if true_set else 0.0
    f = 2 * precision * recall / (precision + recall) if tp else 0.0
    return {"precision": 100.0 * precision, "recall": 100.0 * recall, "f1": 100.0 * f,
            "accuracy": 100.0 * correct / words if words else 0.0}


def task_score(task: GlueTask | str, metrics: Mapping[str, float]) -> float:
    """A task's single score: the mean of its official metrics (same scale as `metrics`)."""
    task = get_task(task)
    missing = [m for m in task.metrics if m not in metrics]
    if missing:
        raise BertgpuError(
            f"{task.name}: metrics lack {', '.join(missing)} (expected {', '.join(task.metrics)})"
        )
    return float(np.mean([metrics[m] for m in task.metrics]))


def glue_average(scores: Mapping[str, float]) -> float:
    """The GLUE average ("glue-score" convention, module docstring) of per-column task scores.

    Keys are task names or results-table columns ("CoLA", "sst2", "MNLI-m", "MNLI-mm"); columns of
    the same task (MNLI's matched and mismatched) are averaged first so the task counts once.
    """
    if not scores:
        raise BertgpuError("GLUE average of no tasks")
    per_task: dict[str, list[float]] = {}
    for name, v in scores.items():
        per_task.setdefault(get_task(name).key, []).append(float(v))
    return float(np.mean([np.mean(v) for v in per_task.values()]))
