"""Every row of the GLUE task table against the official conventions, written out here rather
than read from the code: label names in Hugging Face `nyu-mll/glue` ClassLabel order (the ids
the export's id2label carries), their spellings in the official TSV files, and the official
metrics (GLUE paper / leaderboard). And a run's MNLI score is the mean of matched and
mismatched, as metrics.py's "glue-score" convention says.

(A mutation probe found no test failing when SST-2's, MRPC's or QQP's labels were swapped, when
QQP lost its F1 or RTE was scored by F1, or when MNLI's run score used the matched split only.)
"""

from __future__ import annotations

import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.tasks.glue import TASKS, Example, get_task
from bertgpu.tasks.glue_job import examples_job

# (Hugging Face ClassLabel names in id order, TSV spellings in id order, official metrics);
# metric names as metrics.glue_metrics spells them, "mcc" = Matthews correlation.
OFFICIAL: dict[str, tuple[tuple[str, ...], tuple[str, ...], set[str]]] = {
    "cola": (("unacceptable", "acceptable"), ("0", "1"), {"mcc"}),
    "sst2": (("negative", "positive"), ("0", "1"), {"accuracy"}),
    "mrpc": (("not_equivalent", "equivalent"), ("0", "1"), {"accuracy", "f1"}),
    "stsb": ((), (), {"pearson", "spearman"}),
    "qqp": (("not_duplicate", "duplicate"), ("0", "1"), {"accuracy", "f1"}),
    "mnli": (("entailment", "neutral", "contradiction"),
             ("entailment", "neutral", "contradiction"), {"accuracy"}),
    "qnli": (("entailment", "not_entailment"), ("entailment", "not_entailment"), {"accuracy"}),
    "rte": (("entailment", "not_entailment"), ("entailment", "not_entailment"), {"accuracy"}),
    "wnli": (("not_entailment", "entailment"), ("0", "1"), {"accuracy"}),
}


def test_the_table_has_the_nine_tasks() -> None:
    assert set(TASKS) == set(OFFICIAL)


@pytest.mark.parametrize("key", sorted(OFFICIAL))
def test_row_matches_the_official_labels_and_metrics(key: str) -> None:
    labels, tsv_labels, metrics = OFFICIAL[key]
    task = get_task(key)
    assert task.labels == labels
    assert task.tsv_labels == tsv_labels
    assert set(task.metrics) == metrics and len(task.metrics) == len(metrics)
    assert task.kind == ("regression" if key == "stsb" else "classification")
    assert task.num_labels == (len(labels) or 1)


def _job(tmp_path, key: str, splits: tuple[str, ...]):
    """A GLUE job of two labelled pairs per split, on a word-level tokenizer."""
    tok = word_tokenizer(tmp_path / "tok", ["a", "b"])
    ex = [Example("0", "a", "b", 0), Example("1", "b", "a", 1)]
    return examples_job(get_task(key), ex, [(s, ex) for s in splits], tok, FinetuneConfig(),
                        "test")


def test_mnli_run_score_is_the_mean_of_matched_and_mismatched(tmp_path) -> None:
    job = _job(tmp_path, "mnli", ("dev_matched", "dev_mismatched"))
    assert [e.name for e in job.evals] == ["dev_matched", "dev_mismatched"]
    # the export's id2label: the Hugging Face order
    assert job.labels == ("entailment", "neutral", "contradiction")
    score = job.primary({"dev_matched": {"accuracy": 80.0}, "dev_mismatched": {"accuracy": 70.0}})
    assert score == pytest.approx(75.0)


@pytest.mark.parametrize("key", ["mrpc", "qqp"])
def test_pair_metric_run_score_is_the_mean_of_accuracy_and_f1(tmp_path, key: str) -> None:
    job = _job(tmp_path, key, ("dev",))
    assert job.primary({"dev": {"accuracy": 90.0, "f1": 60.0}}) == pytest.approx(75.0)
