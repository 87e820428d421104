"""What a fine-tuning dev evaluation scores: a model whose outputs are not finite scores 0 on
every metric with a one-line warning (every task), regression is scored against the gold scores
as read (float64, checked against scipy), and an unlabeled dev row is an error naming the dev
file and its line."""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from pathlib import Path
from typing import Any

import _tiny_init
import numpy as np
import pytest
import torch
from _tiny_init import SPECIAL
from scipy import stats

from bertgpu.config.finetune import job_config, load_finetune_config
from bertgpu.data.tokenizer_folder import load_tokenizer
from bertgpu.errors import BertgpuError
from bertgpu.finetune import finetune
from bertgpu.tasks.finetuning import FinetuneTask, Job, JobRequest
from bertgpu.tasks.init_model import build_model
from bertgpu.train.distributed import DistInfo

FIX = Path(__file__).parent / "fixtures"
WORDS = "apple river stone cloud table green quiet music paper window".split()
VOCAB = SPECIAL + ["good", "bad", "is", "what", "the", ".", "?", "a", "an", "film"] + WORDS
STSB_HEADER = "\t".join(["index", "genre", "filename", "year", "old_index", "source1", "source2",
                          "sentence1", "sentence2", "score"])
DIVERGE = ["--epochs", "2", "--lr", "1e30", "--warmup_fraction", "0",
           "--global_batch_size", "64", "--micro_batch_size", "64"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _stsb_row(i: int, score: float) -> str:
    return (f"{i}\tmain\tf\t2012\t{i:04d}\tnone\tnone\t{WORDS[i % 10]} is good .\t"
            f"{WORDS[(i + 3) % 10]} is bad .\t{score}")


def _glue_folder(root: Path) -> Path:
    """STS-B with its dev rows sorted by gold score (Spearman of row order = 100) and SST-2 with
    four of six dev labels 0."""
    sts = root / "STS-B"
    sts.mkdir(parents=True)
    (sts / "train.tsv").write_text("\n".join([STSB_HEADER] + [_stsb_row(i, (i * 7) % 50 / 10)
                                                              for i in range(8)]) + "\n")
    (sts / "dev.tsv").write_text("\n".join([STSB_HEADER] + [_stsb_row(i, s) for i, s in
                                                           enumerate([0.4, 1.2, 2.0, 2.8, 3.6,
                                                                      4.4])]) + "\n")
    sst = root / "SST-2"
    sst.mkdir()
    (sst / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"{WORDS[i % 10]} is {'good' if i % 2 else 'bad'} .\t{i % 2}\n" for i in range(8)))
    (sst / "dev.tsv").write_text("sentence\tlabel\n" + "".join(
        f"a {WORDS[i]} film .\t{int(i >= 4)}\n" for i in range(6)))
    return root


@pytest.mark.parametrize("task", ["stsb", "sst2"])
def test_a_diverged_run_scores_zero_and_says_so(tmp_path: Path, task: str) -> None:
    """A learning rate that overflows the weights in one finite step leaves a model whose every
    dev output is NaN. It still scored: STS-B Spearman 100 on a dev file sorted by gold score
    (rankdata ranked NaNs in row order), SST-2 accuracy 66.67, the share of class 0 (argmax of
    NaN logits is 0), and nothing said that the outputs were not numbers."""
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    data = _glue_folder(tmp_path / "glue")
    with pytest.warns(UserWarning, match=r"step \d: the model's dev outputs are not finite \(NaN "
                                         r"or infinite\) for 6 of 6 sequences; every dev metric "
                                         r"is reported as 0"):
        res = finetune(task, data, init, tmp_path / "ft", overrides=DIVERGE)
    dev = res["metrics"]["dev"]
    assert set(dev) == ({"pearson", "spearman"} if task == "stsb" else {"accuracy"})
    assert set(dev.values()) == {0.0} and res["score"] == 0.0
    saved = json.loads((tmp_path / "ft" / "results.json").read_text(encoding="utf-8"))
    assert saved["metrics"]["dev"] == dev


class NotFinite(torch.nn.Module):
    """A task model whose outputs are NaN (row 0: infinite), as a diverged model's are."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **batch: Any) -> dict[str, torch.Tensor]:
        out = self.model(**batch)
        keys = [k for k in ("logits", "start_logits", "end_logits") if out.get(k) is not None]
        broken = {k: torch.full_like(out[k], float("nan")) for k in keys}
        for v in broken.values():
            v[0] = float("inf")
        return broken


def _job(kind: str, tmp_path: Path, tokenizer: Any, cfg: Any) -> tuple[Job, str]:
    """A job of each head: SQuAD (qa), NER (token classification), classify (sequences)."""
    if kind == "squad":
        from bertgpu.tasks.squad_job import squad_job

        squad = FIX / "squad" / "dev-v2.0-sample.json"
        return squad_job(True, squad, squad, tokenizer, job_config(cfg, 64)), "qa"
    if kind == "ner":
        from bertgpu.tasks.ner import ner_job

        ner = FIX / "ner"
        return ner_job(ner / "train.conll", ner / "dev.conll", tokenizer, cfg), \
            "token_classification"
    from bertgpu.tasks.classify import classify_job

    csv = tmp_path / "c.csv"
    csv.write_text("text,label\n" + "".join(f"a {w} film,{'xy'[i % 2]}\n"
                                            for i, w in enumerate(WORDS)), encoding="utf-8")
    return classify_job(csv, csv, tokenizer, cfg), "classification"


def _job_and_model(kind: str, tmp_path: Path) -> tuple[Any, torch.nn.Module]:
    """The `kind` job of a tiny random BERT and its task model (a fresh head)."""
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    cfg = load_finetune_config()
    job, head = _job(kind, tmp_path, load_tokenizer(init), cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fresh head
        return job, build_model(str(init), head, job.num_labels, cfg)


def _task(job: Any, model: torch.nn.Module, folder: Path) -> FinetuneTask:
    """One epoch of `job` on `model` in batches of 4, evaluated into `folder`."""
    folder.mkdir()
    return FinetuneTask(job, model, pad_id=0, seed=0, global_batch_size=4, micro_batch_size=4,
                        epochs=1, eval_batch_size=4, autocast=contextlib.nullcontext,
                        info=DistInfo(), work_dir=folder, export=lambda: folder)


@pytest.mark.parametrize("kind", ["squad", "ner", "classify"])
def test_every_task_scores_non_finite_outputs_zero(tmp_path: Path, kind: str) -> None:
    """Only GLUE's metrics looked at NaN at all (turning a nan metric into 0 after the fact):
    SQuAD decoded NaN logits into answers and scored them, NER and classify took argmax of NaN
    (class 0) and scored that, without a word."""
    job, model = _job_and_model(kind, tmp_path)
    task = _task(job, NotFinite(model), tmp_path / "out")
    n = len(job.evals[0].data)
    with pytest.warns(UserWarning, match=rf"step {task.total_steps}: the model's dev outputs are "
                                         rf"not finite \(NaN or infinite\) for {n} of {n} "
                                         r"sequences; every dev metric is reported as 0"):
        task.evaluate(task.total_steps, None)
    record = task.history[-1]
    assert record["metrics"]["dev"] and set(record["metrics"]["dev"].values()) == {0.0}
    assert record["score"] == 0.0


class NaNAtPadding(torch.nn.Module):
    """A task model whose outputs are its own at the real positions of each batch and NaN at the
    padded ones (`padded` counts those), as a model with a NaN-producing padding path gives."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.padded = model, 0

    def forward(self, **batch: Any) -> dict[str, torch.Tensor]:
        out = self.model(**batch)
        pad = batch["attention_mask"] == 0  # (B, T)
        self.padded += int(pad.sum())
        keys = [k for k in ("logits", "start_logits", "end_logits") if out.get(k) is not None]
        return {k: out[k].masked_fill(pad.view(*pad.shape, *(1,) * (out[k].dim() - 2)),
                                      float("nan")) for k in keys}


def test_non_finite_rows_count_only_the_positions_of_each_row():
    """With lengths, a row is bad only for a NaN or infinity inside its first lengths[i]
    positions (the rest is padding); without, anywhere."""
    from bertgpu.tasks.finetuning import nonfinite_rows

    start = np.zeros((3, 4))
    start[0, 3] = np.nan  # padding of a 3-token row
    start[1, 1] = np.inf  # a real position of a 4-token row
    start[2, 2:] = np.nan  # padding of a 2-token row
    tags = np.zeros((3, 4, 2))
    tags[2, 3, 1] = -np.inf  # padding
    assert nonfinite_rows({"start_logits": start, "logits": tags}, [3, 4, 2]) == 1
    assert nonfinite_rows({"start_logits": start, "logits": tags}) == 3
    tags[2, 1, 0] = np.nan  # a real position of the 2-token row
    assert nonfinite_rows({"logits": tags}, [3, 4, 2]) == 1
    assert nonfinite_rows({"start_logits": start, "logits": tags}, [3, 4, 2]) == 2


@pytest.mark.parametrize("kind", ["squad", "ner"])
def test_non_finite_outputs_at_the_padding_only_do_not_count(tmp_path: Path, kind: str) -> None:
    """Outputs with a position axis are padded per batch: NaN there is no output of any
    sequence, so the metrics are those of the same model without it and nothing is said (every
    metric 0 with a "not finite" warning was the rule without the lengths)."""
    job, model = _job_and_model(kind, tmp_path)
    records = []
    for m in (model, NaNAtPadding(model)):
        task = _task(job, m, tmp_path / f"out{len(records)}")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            task.evaluate(task.total_steps, None)
        assert not [w for w in seen if "not finite" in str(w.message)], kind
        records.append(task.history[-1]["metrics"]["dev"])
    assert m.padded > 0  # some batch did hold rows of different lengths
    assert records[1] == records[0]


def test_regression_is_scored_against_the_gold_scores_as_read(tmp_path: Path) -> None:
    """Regression gold scores were stored as float32 for the forward pass and the metrics were
    computed against those rounded values: Pearson differed from scipy's on the file's scores
    in the 8th digit (84.88431163 for 84.88431181)."""
    from bertgpu.tasks.classify import classify_job
    from bertgpu.tasks.glue import Example, get_task
    from bertgpu.tasks.glue_job import examples_job

    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    tokenizer = load_tokenizer(init)
    gold = [0.1, 1.3, 2.7, 3.3, 4.9, 0.7, 2.2, 3.1]
    predictions = np.random.default_rng(0).normal(2.5, 1.0, len(gold))
    expected = {"pearson": 100 * stats.pearsonr(predictions, gold)[0],
                "spearman": 100 * stats.spearmanr(predictions, gold)[0]}

    examples = [Example(str(i), f"{WORDS[i]} is good", "a film", g) for i, g in enumerate(gold)]
    glue = examples_job(get_task("stsb"), examples, [("dev", examples)], tokenizer,
                        load_finetune_config(), "in-memory")
    csv = tmp_path / "scores.csv"
    csv.write_text("text,label\n" + "".join(f"{WORDS[i]} is good,{g}\n"
                                            for i, g in enumerate(gold)), encoding="utf-8")
    classify = classify_job(csv, csv, tokenizer, load_finetune_config(), regression=True)
    for job in (glue, classify):
        got = job.evals[0].score({"logits": predictions[:, None]}, None)
        assert got == pytest.approx(expected, rel=1e-13, abs=0), job.name


def _sst2(root: Path, dev: str, name: str = "dev.tsv") -> Path:
    folder = root / "SST-2"
    folder.mkdir(parents=True)
    (folder / "train.tsv").write_text("sentence\tlabel\na good film .\t1\na bad film .\t0\n")
    (folder / name).write_text(dev, encoding="utf-8")
    return folder / name


def test_an_unlabeled_dev_row_is_named_by_the_dev_file_and_line(tmp_path: Path) -> None:
    """A dev row labelled -1 (GLUE's "no label") was reported against the training file and no
    line: "train.tsv: SST-2 dev split has unlabeled examples; cannot evaluate"."""
    from bertgpu.tasks.glue import Example, get_task
    from bertgpu.tasks.glue_job import build_job, examples_job

    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    tokenizer = load_tokenizer(init)
    cfg = load_finetune_config()
    tsv = _sst2(tmp_path / "tsv", "sentence\tlabel\na fine film .\t1\na dull film .\t-1\n")
    with pytest.raises(BertgpuError) as err:
        build_job(JobRequest("sst2", data=tmp_path / "tsv"), tokenizer, cfg)
    assert str(err.value) == (f"{tsv}:3: no SST-2 label (-1 or empty marks an unlabeled test "
                              "row); the dev split needs a label on every row")

    jsonl = _sst2(tmp_path / "hf", '{"sentence": "a fine film", "label": 1, "idx": 0}\n'
                                   '{"sentence": "a dull film", "label": -1, "idx": 1}\n',
                  "validation.jsonl")
    with pytest.raises(BertgpuError, match=rf"^{re.escape(str(jsonl))}: line 2: no SST-2 label"):
        build_job(JobRequest("sst2", data=tmp_path / "hf"), tokenizer, cfg)

    # In-memory examples have no file: the caller's name for them and the example's id.
    ok, unlabeled = Example("a", "a good film", None, 1), Example("b7", "a film", None, None)
    with pytest.raises(BertgpuError, match=r"^demo: dev example b7 has no label \(GLUE SST-2\)"):
        examples_job(get_task("sst2"), [ok], [("dev", [ok, unlabeled])], tokenizer, cfg, "demo")
