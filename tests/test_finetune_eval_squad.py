"""SQuAD dev predictions depend on the model only: the dev evaluation of `finetune squad | squad2`
with --eval_batch_size 1 (no padding) and 64 (short questions padded to a long context's length
in their evaluation batch) writes the same predictions.json and reports the same EM/F1."""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path
from typing import Any

import _tiny_init
import pytest
import torch
from _tiny_init import SPECIAL

from bertgpu.config.finetune import job_config, load_finetune_config
from bertgpu.data.tokenizer_folder import load_tokenizer
from bertgpu.tasks.finetuning import FinetuneTask, Job
from bertgpu.tasks.init_model import build_model
from bertgpu.tasks.squad_job import squad_job
from bertgpu.train.distributed import DistInfo

WORDS = ("apple river stone cloud table green quiet music paper window garden silver bright lamp "
         "horse ocean red blue gold pink").split()
VOCAB = SPECIAL + ["is", "what", "the", ".", "?"] + WORDS

pytestmark = pytest.mark.usefixtures("one_thread")


def _qa(qid: str, context: str, answer: str, version_2: bool) -> dict[str, Any]:
    qa = {"id": qid, "question": "what is the " + answer + " ?",
          "answers": [{"text": answer, "answer_start": context.index(answer)}]}
    return {**qa, "is_impossible": False} if version_2 else qa


def _squad_file(path: Path, version_2: bool) -> Path:
    """One long context (about 100 tokens) and six short ones (5 tokens): in one evaluation batch
    the short features get some 100 padding positions."""
    long_ctx = " ".join(WORDS[i % 16] for i in range(100)) + " is red ."
    shorts = [f"{WORDS[i]} is {WORDS[16 + i % 4]} {WORDS[i + 1]} ." for i in range(6)]
    paragraphs = [{"context": long_ctx, "qas": [_qa("long", long_ctx, "red", version_2)]}]
    paragraphs += [{"context": c, "qas": [_qa(f"short{i}", c, WORDS[16 + i % 4], version_2)]}
                   for i, c in enumerate(shorts)]
    doc = {"version": "v2.0" if version_2 else "1.1",
           "data": [{"title": "t", "paragraphs": paragraphs}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


class PaddingFavoured(torch.nn.Module):
    """A tiny BERT QA model whose start and end logits at [PAD] positions are 20 higher than its
    own: a model fine-tuned from a real pretraining run can rate padding that high (the probe's
    did), and a random tiny one does so only now and then."""

    def __init__(self, model: torch.nn.Module, pad_id: int) -> None:
        super().__init__()
        self.model, self.pad_id = model, pad_id

    def forward(self, input_ids: torch.Tensor, **kw: Any) -> dict[str, torch.Tensor]:
        out = self.model(input_ids=input_ids, **kw)
        lift = 20.0 * (input_ids == self.pad_id).float()
        return {"start_logits": out["start_logits"] + lift, "end_logits": out["end_logits"] + lift}


def _dev_evaluation(job: Job, model: torch.nn.Module, eval_batch_size: int,
                    folder: Path) -> tuple[dict[str, str], dict[str, float]]:
    """predictions.json and the dev metrics of the last epoch's evaluation, as a run does it."""
    folder.mkdir()
    task = FinetuneTask(job, model, pad_id=0, seed=0, global_batch_size=4, micro_batch_size=4,
                        epochs=1, eval_batch_size=eval_batch_size,
                        autocast=contextlib.nullcontext, info=DistInfo(), work_dir=folder,
                        export=lambda: folder)
    task.evaluate(task.total_steps, None)
    preds = json.loads((folder / "predictions.json").read_text(encoding="utf-8"))
    return preds, task.history[-1]["metrics"]["dev"]


@pytest.mark.parametrize("version_2", [False, True], ids=["v1.1", "v2.0"])
def test_predictions_do_not_depend_on_the_eval_batch(tmp_path: Path, version_2: bool) -> None:
    """The n-best search took the top start/end logits over every position of a feature, padding
    included, and only then kept the context tokens. With --eval_batch_size 64 the short
    questions were padded to the long context's length, the logits at that padding filled the
    top n, and their answers became "" where batch 1 (no padding) predicted a span: the same
    weights gave two predictions.json and two EM/F1."""
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    tokenizer = load_tokenizer(init)
    # v2: a span, when there is one, beats the null answer, so that a lost span shows.
    cfg = job_config(load_finetune_config(None, ["--doc_stride", "32",
                                                 "--null_threshold", "1000"]), 128)
    squad = _squad_file(tmp_path / "squad.json", version_2)
    job = squad_job(version_2, squad, squad, tokenizer, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fresh QA head
        model = PaddingFavoured(build_model(str(init), "qa", None, cfg), pad_id=0)
    preds_1, metrics_1 = _dev_evaluation(job, model, 1, tmp_path / "eb1")
    preds_64, metrics_64 = _dev_evaluation(job, model, 64, tmp_path / "eb64")
    assert len(preds_1) == 7 and all(preds_1.values())  # no padding: a span for every question
    assert preds_64 == preds_1
    assert metrics_64 == pytest.approx(metrics_1)
