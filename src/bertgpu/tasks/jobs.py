"""The fine-tuning jobs: GLUE classification, STS-B-style regression, SQuAD spans, and your own
files (`classify`, `ner`: tasks/classify.py, tasks/ner.py), encoded.

Each builder returns a `finetuning.Job`: the encoded training sequences (unpadded, padded per batch
later) and the evaluation sets with their scorers. What differs between the tasks is only here
and in the task modules; the training loop and the fine-tuning task object are shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.errors import BertgpuError
from bertgpu.tasks.finetuning import EvalSet, Job, encode_pairs, pad_to, strip_padding

if TYPE_CHECKING:
    from bertgpu.tasks.glue import Example, GlueTask
    from bertgpu.tasks.tables import Fields
    from bertgpu.train.finetune_config import FinetuneConfig

SQUAD_TASKS = {"squad": False, "squad1": False, "squad2": True, "squadv2": True}  # name -> version_2
OWN_FILE_TASKS = ("classify", "ner")


def _limit(items: list[Any], n: int | None) -> list[Any]:
    return items[:n] if n is not None else items


def glue_job(task: GlueTask, train: list[Example], devs: list[tuple[str, list[Example]]],
             tokenizer: Any, cfg: FinetuneConfig, where: str,
             tests: Sequence[tuple[str, list[Example]]] = ()) -> Job:
    from bertgpu.tasks import glue as tasks
    from bertgpu.tasks import metrics as eval_metrics

    seq = cfg.max_seq_len or 128
    regression = task.kind == "regression"
    train = _limit(train, cfg.max_train_examples)
    unlabeled = [e.guid for e in train if e.label is None]
    if unlabeled:
        raise BertgpuError(f"{where}: training example {unlabeled[0]} has no label (GLUE {task.name})")
    evals = []
    for split, examples in devs:
        examples = _limit(examples, cfg.max_eval_examples)
        enc = encode_pairs(tokenizer, examples, seq, regression)
        if "labels" not in enc.targets:
            raise BertgpuError(f"{where}: {task.name} {split} split has unlabeled examples; cannot evaluate")
        labels = enc.targets.pop("labels")  # kept out of the forward pass: eval needs logits only

        def score(outputs: dict[str, np.ndarray], _folder: Path | None, labels: np.ndarray = labels
                  ) -> dict[str, float]:
            return eval_metrics.glue_metrics(task, outputs["logits"], labels)

        evals.append(EvalSet(split, enc, score, tasks.column_name(task, split)))

    def primary(metrics: dict[str, dict[str, float]]) -> float:
        return float(np.mean([eval_metrics.task_score(task, m) for m in metrics.values()]))

    test_sets = []
    for split, examples in tests:
        def write(outputs: dict[str, np.ndarray], folder: Path, split: str = split,
                  guids: list[str] = [e.guid for e in examples]) -> None:  # noqa: B006
            tasks.write_glue_submission(task, outputs["logits"], folder / "submission" /
                                        f"{tasks.column_name(task, split)}.tsv", indices=guids)

        test_sets.append((split, encode_pairs(tokenizer, examples, seq, regression), write))
    return Job(task.name, "classification", task.num_labels,
                encode_pairs(tokenizer, train, seq, regression), evals, primary, test_sets)


def squad_job(version_2: bool, train_file: Path, dev_file: Path, tokenizer: Any,
              cfg: FinetuneConfig) -> Job:
    from bertgpu.tasks import squad, squad_eval

    seq = cfg.max_seq_len or 384
    tokenizer.no_truncation()
    tokenizer.no_padding()
    kw = {"max_seq_len": seq, "doc_stride": cfg.doc_stride, "max_query_len": cfg.max_query_len}
    train_ex = _limit(squad.read_squad(train_file), cfg.max_train_examples)
    dev_ex = _limit(squad.read_squad(dev_file), cfg.max_eval_examples)
    train_feats = squad.featurize(train_ex, tokenizer, is_training=True, **kw)
    if len(train_feats) == 0:
        raise BertgpuError(f"{train_file}: no training features (every answer outside its context?)")
    dev_feats = squad.featurize(dev_ex, tokenizer, **kw)

    def score(outputs: dict[str, np.ndarray], folder: Path | None) -> dict[str, float]:
        # Logits come back padded per batch; postprocess expects (F, max_seq_len). Pad positions
        # are never context tokens, so any value works there.
        start, end = (pad_to(outputs[k], seq) for k in ("start_logits", "end_logits"))
        preds, _ = squad.postprocess(dev_ex, dev_feats, start, end, n_best=cfg.n_best,
                                     max_answer_len=cfg.max_answer_len, version_2=version_2,
                                     null_threshold=cfg.null_threshold)
        if folder is not None:
            squad.write_predictions(preds, folder / "predictions.json")
        return squad_eval.squad_evaluate(dev_ex, preds, version_2=version_2)

    name = "SQuAD v2.0" if version_2 else "SQuAD v1.1"
    return Job(name, "qa", None, strip_padding(train_feats),
                [EvalSet("dev", strip_padding(dev_feats), score)],
                lambda m: float(m["dev"]["f1"]))




def own_file_fields(key: str, text_field: str | None, text_pair_field: str | None,
                    label_field: str | None, regression: bool) -> Fields | None:
    """The column names of `classify` / `ner` (their defaults where not given); None for the
    GLUE and SQuAD tasks, which take none of these flags."""
    from bertgpu.tasks.ner import NER_FIELDS
    from bertgpu.tasks.tables import Fields

    given = [flag for flag, v in (("--text-field", text_field), ("--text-pair-field", text_pair_field),
                                  ("--label-field", label_field), ("--regression", regression)) if v]
    if key not in OWN_FILE_TASKS:
        if given:
            raise BertgpuError(f"{', '.join(given)}: only for finetune classify and ner (your own files)")
        return None
    if key == "ner" and (text_pair_field or regression):
        raise BertgpuError("finetune ner: --text-pair-field and --regression are for classify")
    base = NER_FIELDS if key == "ner" else Fields()
    return Fields(text_field or base.text, text_pair_field, label_field or base.label)


def own_files_job(key: str, train_file: str | Path, dev_file: str | Path, tokenizer: Any,
                  cfg: FinetuneConfig, fields: Fields, regression: bool = False) -> tuple[Job, dict[str, Any]]:
    """The `classify` or `ner` job and what results.json records about its data (files, kind,
    columns, label names)."""
    from bertgpu.tasks import classify, ner

    if key == "ner":
        job = ner.ner_job(train_file, dev_file, tokenizer, cfg, fields)
    else:
        job = classify.classify_job(train_file, dev_file, tokenizer, cfg, fields, regression)
    kind = "token_classification" if key == "ner" else "regression" if regression else "classification"
    return job, {"data": [str(train_file), str(dev_file)], "task_key": key, "kind": kind,
                 "fields": {"text": fields.text, "text_pair": fields.text_pair, "label": fields.label},
                 "labels": list(job.labels or ())}
