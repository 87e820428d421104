"""GLUE metrics against independent references (scikit-learn, scipy) on random inputs and on the
edge cases that trip hand-written versions: constant predictions, ties, no positives."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from bertgpu.errors import BertgpuError
from bertgpu.tasks import metrics as em


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 300))
    y = rng.integers(0, 2, n)
    p = np.where(rng.random(n) < 0.7, y, 1 - y)
    assert em.accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p))
    assert em.f1(p, y) == pytest.approx(skm.f1_score(y, p))
    assert em.matthews_corrcoef(p, y) == pytest.approx(skm.matthews_corrcoef(y, p))
    y3, p3 = rng.integers(0, 3, n), rng.integers(0, 3, n)
    assert em.matthews_corrcoef(p3, y3) == pytest.approx(skm.matthews_corrcoef(y3, p3))
    assert em.accuracy(p3, y3) == pytest.approx(skm.accuracy_score(y3, p3))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 200))
    x = rng.normal(size=n)
    y = 0.5 * x + rng.normal(size=n)
    assert em.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0])
    assert em.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])
    # Heavy ties: STS-B gold scores are multiples of 0.2, rounded predictions tie too.
    xt = np.round(rng.uniform(0, 5, n) * 5) / 5
    yt = np.round(xt + rng.normal(scale=1.0, size=n))
    np.testing.assert_allclose(em.rankdata(xt), stats.rankdata(xt))
    assert em.spearman(xt, yt) == pytest.approx(stats.spearmanr(xt, yt)[0])


def test_edge_cases() -> None:
    y = np.array([0, 1, 1, 0, 1])
    const = np.ones(5, dtype=int)
    assert em.matthews_corrcoef(const, y) == 0.0 == skm.matthews_corrcoef(y, const)
    assert em.matthews_corrcoef(np.zeros(5), np.zeros(5)) == 0.0
    assert em.f1(np.zeros(5), y) == 0.0 == skm.f1_score(y, np.zeros(5), zero_division=0)
    assert em.matthews_corrcoef(y, y) == pytest.approx(1.0)
    assert em.matthews_corrcoef(1 - y, y) == pytest.approx(-1.0)
    assert np.isnan(em.pearson(np.ones(4), np.arange(4)))
    assert np.isnan(em.spearman(np.ones(4), np.arange(4)))
    np.testing.assert_allclose(em.rankdata([3, 1, 3, 3, 2]), [4, 1, 4, 4, 2])
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        em.accuracy([1, 0, 1], [1, 0])


def test_glue_metrics_per_task_on_0_100_scale() -> None:
    y = np.array([1, 0, 1, 1, 0, 0, 1, 0])
    p = np.array([1, 0, 0, 1, 0, 1, 1, 0])
    assert (em.glue_metrics("cola", p, y)
            == {"mcc": pytest.approx(100 * skm.matthews_corrcoef(y, p))})
    mrpc = em.glue_metrics("MRPC", p, y)
    assert list(mrpc) == ["f1", "accuracy"]
    assert mrpc["accuracy"] == pytest.approx(75.0) and mrpc["f1"] == pytest.approx(75.0)
    # logits (N, C) are reduced with argmax
    logits = np.eye(3)[[0, 2, 1, 1]] * 3.0 - 1.0
    assert em.glue_metrics("mnli", logits, [0, 2, 1, 0]) == {"accuracy": pytest.approx(75.0)}
    s = em.glue_metrics("stsb", np.array([[1.0], [2.0], [3.5], [3.0]]), [1.2, 2.0, 4.0, 3.6])
    assert set(s) == {"pearson", "spearman"} and s["spearman"] == pytest.approx(100.0)
    # a collapsed regressor scores 0, not nan
    assert em.glue_metrics("stsb", np.full(4, 2.5), [1.0, 2.0, 3.0, 4.0]) == {
        "pearson": 0.0, "spearman": 0.0}


def test_task_score_and_glue_average() -> None:
    assert em.task_score("mrpc", {"f1": 90.0, "accuracy": 86.0}) == pytest.approx(88.0)
    assert em.task_score("cola", {"mcc": 52.1}) == pytest.approx(52.1)
    with pytest.raises(BertgpuError, match="STS-B: metrics lack spearman"):
        em.task_score("stsb", {"pearson": 80.0})
    # MNLI-m and MNLI-mm are averaged first, so MNLI counts once among the tasks.
    avg = em.glue_average({"MNLI-m": 84.0, "MNLI-mm": 83.0, "CoLA": 50.0, "sst2": 92.0})
    assert avg == pytest.approx((83.5 + 50.0 + 92.0) / 3)
    with pytest.raises(BertgpuError):
        em.glue_average({})


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # sklearn's
def test_nan_predictions_are_nan_like_scipy_and_never_score() -> None:
    """rankdata gave NaNs distinct ranks in input order, so Spearman of an all-NaN prediction was
    never nan: 100 on a dev set sorted by gold score (the Spearman of row order otherwise), and
    argmax of NaN logits is class 0, so a diverged classifier scored the share of class 0."""
    gold = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
    nan5 = np.full(5, np.nan)
    np.testing.assert_array_equal(em.rankdata(nan5), stats.rankdata(nan5))
    part = np.array([1.0, np.nan, 3.0, 0.5, 2.0])
    np.testing.assert_array_equal(em.rankdata(part), stats.rankdata(part))
    for p in (nan5, part):
        assert np.isnan(em.spearman(p, gold)) and np.isnan(stats.spearmanr(p, gold)[0])
        assert np.isnan(em.pearson(p, gold)) and np.isnan(stats.pearsonr(p, gold)[0])
    # Class ids that are NaN: an error, as scikit-learn's, never a class.
    ids = np.array([0.0, np.nan, 1.0])
    with pytest.raises(ValueError):
        skm.accuracy_score([0, 1, 1], ids)
    with pytest.raises(ValueError, match="not finite"):
        em.accuracy(ids, [0, 1, 1])
    # Through the 0-100 reports, which show an undefined value as 0: a broken model scores 0.
    assert em.glue_metrics("stsb", nan5, gold) == {"pearson": 0.0, "spearman": 0.0}
    assert em.glue_metrics("stsb", part, gold) == {"pearson": 0.0, "spearman": 0.0}
    assert em.label_metrics(nan5, gold, regression=True) == {"pearson": 0.0, "spearman": 0.0}
    nan_logits = np.full((4, 2), np.nan)
    assert em.glue_metrics("sst2", nan_logits, [0, 0, 1, 0]) == {"accuracy": 0.0}
    assert em.glue_metrics("mrpc", nan_logits, [0, 0, 1, 0]) == {"f1": 0.0, "accuracy": 0.0}
    assert em.label_metrics(nan_logits, [0, 0, 1, 0], regression=False) == {
        "accuracy": 0.0, "macro_f1": 0.0}
    # One non-finite row is enough: the other rows' logits are not scored either.
    one_bad = np.array([[2.0, 0.0], [2.0, 0.0], [0.0, np.inf], [2.0, 0.0]])
    assert em.glue_metrics("sst2", one_bad, [0, 0, 1, 0]) == {"accuracy": 0.0}
