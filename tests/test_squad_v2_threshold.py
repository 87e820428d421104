"""SQuAD v2.0's no-answer threshold chosen after training, as evaluate-v2.0.py does with
--na-prob-file: a v2 run writes null_odds.json (null score - best span score per question) and
span_predictions.json (the best span, kept where the null answer won) beside predictions.json, and
reports best_exact / best_exact_thresh / best_f1 / best_f1_thresh; --null_threshold applies a
threshold, predicting "" exactly where the null odds exceed it. Before, a v2 run had one fixed
threshold and nothing to choose a better one with short of training again."""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.config.finetune import job_config, load_finetune_config
from bertgpu.data.tokenizer_folder import load_tokenizer
from bertgpu.finetune import finetune
from bertgpu.tasks import squad
from bertgpu.tasks.finetuning import FinetuneTask
from bertgpu.tasks.init_model import build_model
from bertgpu.tasks.squad import SquadExample
from bertgpu.tasks.squad_eval import best_thresholds, squad_evaluate
from bertgpu.tasks.squad_job import squad_job
from bertgpu.train.distributed import DistInfo

SQUAD_V2 = Path(__file__).parent / "fixtures" / "squad" / "dev-v2.0-sample.json"
VOCAB = SPECIAL + "the of a is in what who and to , . ? normans france normandy".split()

pytestmark = pytest.mark.usefixtures("one_thread")

# id, gold answers (none: unanswerable), best span ("" = no span at all), null odds. Ties in the
# null odds at -1.0 (an answerable question before an unanswerable one), 0.5 and 2.0.
QUESTIONS = [
    ("q01", ("Denver Broncos",), "Denver Broncos", -3.0),
    ("q02", ("Levi's Stadium",), "Stadium", -1.0),  # F1 2/3
    ("q03", (), "Santa Clara", -1.0),
    ("q04", (), "", -2.0),
    ("q05", ("gold",), "gold", 0.5),
    ("q06", (), "Beyonce", 0.5),
    ("q07", ("February 7, 2016",), "February 7", 1.0),  # F1 0.8
    ("q08", (), "the 50th", 2.0),
    ("q09", ("Carolina Panthers",), "Panthers team", 2.0),  # F1 0.5
    ("q10", (), "Super Bowl", 3.5),
    ("q11", ("Santa Clara, California",), "California", 4.0),  # F1 2/3
]


def _examples() -> list[SquadExample]:
    return [SquadExample(q, "t", "?", "context", gold, (0,) * len(gold), not gold)
            for q, gold, _, _ in QUESTIONS]


def _brute_force(examples: list[SquadExample], spans: dict[str, str],
                 na: dict[str, float]) -> dict[str, float]:
    """Every threshold that gives a different set of "" (each na value, and one below them all),
    scored with squad_evaluate; the best score of each metric and the lowest threshold giving
    it."""
    out: dict[str, float] = {}
    candidates = sorted({*na.values(), min(na.values()) - 1.0})
    for metric in ("exact", "f1"):
        scored = [(squad_evaluate(examples, _apply(spans, na, t), version_2=True)[metric], t)
                  for t in candidates]
        top = max(s for s, _ in scored)
        out[f"best_{metric}"] = top
        out[f"best_{metric}_thresh"] = min(t for s, t in scored if s > top - 1e-9)
    return out


def _apply(spans: dict[str, str], na: dict[str, float], thresh: float) -> dict[str, str]:
    return {q: "" if na[q] > thresh else s for q, s in spans.items()}


def _official_sweep(examples: list[SquadExample], spans: dict[str, str],
                    na: dict[str, float], metric: str) -> tuple[float, float]:
    """evaluate-v2.0.py's find_best_thresh, one question at a time in na order."""
    has = {e.id: bool(e.answers) for e in examples}
    raw = {e.id: squad_evaluate([e], {e.id: spans[e.id]}, version_2=True)[metric] / 100
           for e in examples}
    score = best = sum(not h for h in has.values())
    thresh = 0.0
    for q in sorted(na, key=na.__getitem__):
        score += raw[q] if has[q] else -1 if spans[q] else 0
        if score > best:
            best, thresh = score, na[q]
    return 100.0 * best / len(examples), thresh


def test_best_thresholds_match_a_brute_force_over_every_threshold() -> None:
    examples = _examples()
    spans = {q: s for q, _, s, _ in QUESTIONS}
    na = {q: n for q, _, _, n in QUESTIONS}
    got = best_thresholds(examples, spans, na)
    assert got == pytest.approx(_brute_force(examples, spans, na))
    # The threshold reported gives the score reported when applied (null odds > it -> "").
    for metric in ("exact", "f1"):
        applied = squad_evaluate(examples, _apply(spans, na, got[f"best_{metric}_thresh"]),
                                 version_2=True)
        assert applied[metric] == pytest.approx(got[f"best_{metric}"])
    # The official sweep stops between q02 and q03 (equal null odds), at an F1 no threshold gives:
    # here the tie group moves as one.
    official_f1, official_thresh = _official_sweep(examples, spans, na, "f1")
    assert official_thresh == -1.0 and official_f1 > got["best_f1"] + 1.0
    assert got["best_f1_thresh"] == 1.0
    # q01-q07 answered (q03, q06 wrong; q04 has no span: "" either way), q08-q11 "" (q09, q11 lost)
    assert got["best_f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 1 + 0.8 + 1 + 1) / 11)
    # Without ties (and with the best not "" everywhere) the official sweep agrees exactly.
    untied = {q: n + 0.01 * i for i, (q, n) in enumerate(na.items())}
    got_untied = best_thresholds(examples, spans, untied)
    for metric in ("exact", "f1"):
        score, thresh = _official_sweep(examples, spans, untied, metric)
        assert got_untied[f"best_{metric}"] == pytest.approx(score)
        assert got_untied[f"best_{metric}_thresh"] == thresh
    # Every span wrong: "" everywhere is best, and the threshold is below every null odds value
    # (the official 0.0 would answer q01-q04 and lose two no-answers).
    wrong = {q: "nothing like it" for q in spans}
    got_wrong = best_thresholds(examples, wrong, na)
    assert got_wrong == pytest.approx(_brute_force(examples, wrong, na))
    assert got_wrong["best_exact"] == pytest.approx(100 * 5 / 11)
    assert got_wrong["best_f1_thresh"] < min(na.values())


def _run_outputs(out: Path) -> tuple[dict, dict[str, str], dict[str, float], dict[str, str]]:
    read = lambda name: json.loads((out / name).read_text(encoding="utf-8"))  # noqa: E731
    return (read("results.json"), read("predictions.json"), read("null_odds.json"),
            read("span_predictions.json"))


def test_squad2_run_writes_null_odds_and_the_best_thresholds(tmp_path: Path) -> None:
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    out = tmp_path / "sq2"
    res = finetune("squad2", None, init, out, train_file=SQUAD_V2, dev_file=SQUAD_V2,
                   overrides=["--epochs", "1", "--lr", "1e-3", "--global_batch_size", "2"])
    results, preds, odds, spans = _run_outputs(out)
    examples = squad.read_squad(SQUAD_V2, version_2=True)
    ids = {e.id for e in examples}
    assert set(odds) == set(spans) == set(preds) == ids and len(ids) == 4
    assert all(isinstance(v, float) and math.isfinite(v) for v in odds.values())
    dev = res["metrics"]["dev"]
    assert dev == results["metrics"]["dev"]
    keys = ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")
    assert set(keys) <= set(dev)
    # predictions.json is the span where the null odds are at most --null_threshold (0), "" else
    assert preds == {q: "" if odds[q] > 0.0 else spans[q] for q in ids}
    # the best_* recomputed from the files, and no worse than the run's own threshold
    assert {k: dev[k] for k in keys} == pytest.approx(_brute_force(examples, spans, odds))
    assert dev["best_exact"] >= dev["exact"] and dev["best_f1"] >= dev["f1"]


def _evaluate(tmp_path: Path, name: str, null_threshold: float
              ) -> tuple[dict[str, float], dict[str, str], dict[str, float]]:
    """The dev evaluation of the last epoch, as a run does it, of one fixed (untrained) model
    with --null_threshold: its metrics, predictions.json and null_odds.json."""
    init = tmp_path / "init"
    if not init.exists():
        _tiny_init.tiny_init(tmp_path, VOCAB)
    cfg = job_config(load_finetune_config(None, ["--null_threshold", repr(null_threshold)]), 128)
    assert cfg.null_threshold == null_threshold
    job = squad_job(True, SQUAD_V2, SQUAD_V2, load_tokenizer(init), cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fresh QA head
        model = build_model(str(init), "qa", None, cfg)
    folder = tmp_path / name
    folder.mkdir()
    task = FinetuneTask(job, model, pad_id=0, seed=0, global_batch_size=4, micro_batch_size=4,
                        epochs=1, eval_batch_size=4, autocast=contextlib.nullcontext,
                        info=DistInfo(), work_dir=folder, export=lambda: folder)
    task.evaluate(task.total_steps, None)
    read = lambda f: json.loads((folder / f).read_text(encoding="utf-8"))  # noqa: E731
    return task.history[-1]["metrics"]["dev"], read("predictions.json"), read("null_odds.json")


def test_null_threshold_decides_which_questions_are_empty(tmp_path: Path) -> None:
    """--null_threshold T predicts "" for exactly the questions whose null odds exceed T; with
    T = best_f1_thresh the run's F1 is the best_f1 an earlier evaluation reported."""
    dev, _, odds = _evaluate(tmp_path, "default", 0.0)
    values = sorted(odds.values())
    middle = values[len(values) // 2]
    empties = {}
    for name, t in (("low", values[0] - 1.0), ("middle", middle), ("high", values[-1] + 1.0),
                    ("best", dev["best_f1_thresh"])):
        metrics, preds, odds_t = _evaluate(tmp_path, name, t)
        assert odds_t == odds  # the null odds do not depend on the threshold
        empties[name] = {q for q, p in preds.items() if p == ""}
        assert empties[name] == {q for q, v in odds.items() if v > t}, name
        if name == "best":
            assert metrics["f1"] == pytest.approx(dev["best_f1"])
    assert empties["low"] == set(odds)
    assert empties["low"] > empties["middle"] > empties["high"]
