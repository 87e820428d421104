"""results.json's "best": the epoch with the highest dev score, for a classification task and
for a regression task (STS-B: Pearson and Spearman, where higher is better too).

A whole fine-tuning run (tiny random BERT, 3 epochs) with each epoch's dev metrics replaced by
given values after the real scorer ran, so the best epoch is known and the rest of the path
(the job's primary score, the per-epoch history, results.json) is the code users run.
"""

from __future__ import annotations

import json
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.finetune import finetune
from bertgpu.tasks.finetuning import FinetuneTask

WORDS = "apple river stone cloud table green quiet music".split()
VOCAB = SPECIAL + ["good", "bad", "."] + WORDS
STSB_HEADER = "\t".join(["index", "genre", "filename", "year", "old_index", "source1", "source2",
                         "sentence1", "sentence2", "score"])
# 16 training rows, batch 8: two steps an epoch.
FAST = ["--epochs", "3", "--global_batch_size", "8", "--max_seq_len", "16"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _glue(root: Path) -> Path:
    sst = root / "SST-2"
    sst.mkdir(parents=True)
    for split, n in (("train", 16), ("dev", 4)):
        (sst / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(
            f"{WORDS[i % 8]} {'good' if i % 2 else 'bad'} .\t{i % 2}\n" for i in range(n)))
    sts = root / "STS-B"
    sts.mkdir()
    for split, n in (("train", 16), ("dev", 4)):
        (sts / f"{split}.tsv").write_text("\n".join([STSB_HEADER] + [
            f"{i}\tmain\tf\t2012\t{i:04d}\tnone\tnone\t{WORDS[i % 8]} good .\t"
            f"{WORDS[(i + 3) % 8]} bad .\t{i % 5}" for i in range(n)]) + "\n")
    return root


def _given_scores(monkeypatch: pytest.MonkeyPatch, by_epoch: dict[str, list[float]]) -> None:
    """Every dev metric of epoch k (1-based) becomes by_epoch[metric][k - 1]; the real scorer
    still runs first, so the metric names are the task's own."""
    real = FinetuneTask._score

    def score(self, ev, outputs, folder, step):  # noqa: ANN001, ANN202
        metrics = real(self, ev, outputs, folder, step)
        assert set(metrics) == set(by_epoch), metrics
        epoch = self.epoch_of(step - 1)
        return {m: float(by_epoch[m][epoch - 1]) for m in metrics}

    monkeypatch.setattr(FinetuneTask, "_score", score)


@pytest.mark.parametrize("task, by_epoch, scores", [
    ("sst2", {"accuracy": [70.0, 80.0, 75.0]}, [70.0, 80.0, 75.0]),
    # The best epoch by the mean of the two; each alone would pick epoch 1 (Pearson) or 2 and 3
    # tied (Spearman).
    ("stsb", {"pearson": [90.0, 80.0, 70.0], "spearman": [50.0, 80.0, 80.0]},
     [70.0, 80.0, 75.0]),
])
def test_best_is_the_epoch_with_the_highest_dev_score(tmp_path, monkeypatch, task, by_epoch,
                                                      scores):
    """The best epoch was taken with min: results.json named the worst epoch best (epoch 1 of
    70, 80, 75). Higher is better for every GLUE task, regression included."""
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    _given_scores(monkeypatch, by_epoch)
    out = tmp_path / "ft"
    res = finetune(task, _glue(tmp_path / "glue"), init, out, overrides=FAST)
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk == res
    assert [e["score"] for e in res["epochs"]] == pytest.approx(scores)
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3]
    best = res["best"]
    assert best["epoch"] == 2 and best["score"] == pytest.approx(80.0)
    assert best["metrics"] == {"dev": {m: v[1] for m, v in by_epoch.items()}}
    # the final metrics stay the last epoch's
    assert res["score"] == pytest.approx(75.0)
    assert res["metrics"] == {"dev": {m: v[2] for m, v in by_epoch.items()}}
