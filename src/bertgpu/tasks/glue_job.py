"""`bertgpu finetune TASK` for the nine GLUE tasks (any alias): the job from the task's files.

    bertgpu finetune sst2 --data glue_data --init runs/base --out ft/sst2
    bertgpu finetune mnli --data glue_data/MNLI --init hf/ --out ft/mnli --predict-test

The task table, where its files are and the submission format are glue.py's; the readers are
glue_files.py's; the official metrics metrics.py's. This module joins them into a `Job`: the
training examples encoded as sentence (pairs), every dev split scored with the task's metrics
(MNLI: matched and mismatched), and with `--predict-test` the test splits written in leaderboard
format. It is a module of its own because glue_files.py and metrics.py import glue.py's table.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import file_sha256
from bertgpu.tasks import glue, glue_files
from bertgpu.tasks import metrics as eval_metrics
from bertgpu.tasks.finetuning import (
    EvalSet,
    Job,
    JobRequest,
    encode_pairs,
    gold_labels,
    nonfinite_rows,
)

if TYPE_CHECKING:
    from bertgpu.config.finetune import FinetuneConfig
    from bertgpu.tasks.glue import Example, GlueTask

DEFAULT_MAX_SEQ_LEN = 128
"""Tokens per sequence unless --max_seq_len (capped at the model's max_position_embeddings:
finetune.py)."""


def check_request(request: JobRequest) -> None:
    """A GLUE name, --data given and holding the task's train and dev files, no own-file
    flags: --train-file and --dev-file too would be read by nothing (results.json named --data's
    train file)."""
    request.check_no_columns()
    files = [flag for flag, v in (("--train-file", request.train_file),
                                  ("--dev-file", request.dev_file)) if v is not None]
    if files:
        raise BertgpuError(f"{', '.join(files)}: only for finetune squad, classify and ner; "
                           f"finetune {request.task} reads its files under --data")
    task, data = glue.get_task(request.task), _data_dir(request)
    for split in ("train", *task.dev_splits):
        glue.find_split_file(data, task, split)


def build_job(request: JobRequest, tokenizer: Any,
              cfg: FinetuneConfig) -> tuple[Job, dict[str, Any]]:
    """The job of the task's files under --data, and what results.json records about them."""
    check_request(request)
    task, data = glue.get_task(request.task), _data_dir(request)
    train_path = glue.find_split_file(data, task, "train")
    skip = cfg.skip_malformed  # labelled files only: a test file keeps every row
    devs = [(s, glue_files.read_examples(task, glue.find_split_file(data, task, s),
                                         skip_malformed=skip))
            for s in task.dev_splits]
    tests = read_test_splits(task, data) if request.predict_test else []
    job = examples_job(task, glue_files.read_examples(task, train_path, skip_malformed=skip),
                       devs, tokenizer, cfg, str(train_path), tests)
    # absolute: `glue` compares a finished run's data with its own --data-dir, from any folder
    return job, {"data": str(Path(data).resolve()), "task_key": task.key, "kind": task.kind,
                 "data_files": data_files(data, task)}


def input_files(request: JobRequest) -> list[Path]:
    """The files `build_job` reads (finetune.py hashes them before anything is encoded): the
    task's train and dev files, and with --predict-test the test files there are."""
    task, data = glue.get_task(request.task), _data_dir(request)
    files = [glue.find_split_file(data, task, split) for split in ("train", *task.dev_splits)]
    if request.predict_test:
        for split in task.test_splits:
            try:
                files.append(glue.find_split_file(data, task, split))
            except BertgpuError:  # read_test_splits warns of it when the job is built
                pass
        if task.key == "mnli" and (path := glue.find_diagnostic_file(data, task)) is not None:
            files.append(path)
    return files


def data_files(data: str | os.PathLike[str], task: GlueTask | str) -> dict[str, dict[str, str]]:
    """{split: {"file", "sha256"}} of the task's train and dev files: `glue` compares them with a
    finished run's, so that a table never scores seeds on two versions of a dev set."""
    task = glue.get_task(task)
    found = {}
    for split in ("train", *task.dev_splits):
        path = glue.find_split_file(data, task, split)
        found[split] = {"file": str(path.resolve()), "sha256": file_sha256(path)}
    return found


def _data_dir(request: JobRequest) -> str | os.PathLike[str]:
    if request.data is None:
        raise BertgpuError(f"finetune {request.task}: --data is required (the GLUE folder)")
    return request.data


def read_test_splits(task: GlueTask, data: str | os.PathLike[str]
                     ) -> list[tuple[str, list[Example]]]:
    """The unlabeled test splits that have a file (MNLI has two, the others one)."""
    tests = []
    for split in task.test_splits:
        try:
            path = glue.find_split_file(data, task, split)
        except BertgpuError:
            warnings.warn(f"--predict-test: no {split} file for GLUE {task.name} in {data}; "
                          f"no {glue.column_name(task, split)} predictions are written",
                          stacklevel=2)
            continue
        tests.append((split, glue_files.read_examples(task, path, expect_labels=False)))
    if task.key == "mnli":  # the leaderboard scores the diagnostic set with the MNLI model
        path = glue.find_diagnostic_file(data, task)  # in the GLUE root, or beside MNLI/
        if path is None:
            warnings.warn(f"--predict-test: no GLUE diagnostic (AX) file in {data} or, when it "
                          "is the MNLI folder, beside it (looked for diagnostic/diagnostic.tsv "
                          "and ax/test.*); no AX predictions are written, and the leaderboard "
                          "asks for them", stacklevel=2)
        else:
            tests.append((glue.DIAGNOSTIC,
                          glue_files.read_examples(task, path, expect_labels=False)))
    return tests


def examples_job(task: GlueTask, train: list[Example], devs: list[tuple[str, list[Example]]],
                 tokenizer: Any, cfg: FinetuneConfig, where: str,
                 tests: Sequence[tuple[str, list[Example]]] = ()) -> Job:
    """The job of in-memory examples scored like `task` (its kind, labels and official metrics):
    GLUE's files, or the demo's sets. An unlabeled training or dev example is an error naming
    its file and line (`Example.location`); `where` names in-memory examples, which have none."""
    seq = cfg.max_seq_len or DEFAULT_MAX_SEQ_LEN
    regression = task.kind == "regression"
    train = train[:cfg.max_train_examples]
    _check_labelled(task, "train", train, where)
    devs = [(split, examples[:cfg.max_eval_examples]) for split, examples in devs]
    for split, examples in devs:
        _check_labelled(task, split, examples, where)
    evals = [_eval_set(task, split, examples, tokenizer, seq) for split, examples in devs]

    def primary(metrics: dict[str, dict[str, float]]) -> float:
        return float(np.mean([eval_metrics.task_score(task, m) for m in metrics.values()]))

    test_sets = [(split, encode_pairs(tokenizer, examples, seq, regression),
                  _submission_writer(task, split, examples))
                 for split, examples in tests]
    # The export's id2label / label2id: this task's class names, never the init's.
    return Job(task.name, "classification", task.num_labels,
               encode_pairs(tokenizer, train, seq, regression), evals, primary, test_sets,
               labels=task.labels if task.kind == "classification" else None)


def _check_labelled(task: GlueTask, split: str, examples: list[Example], where: str) -> None:
    """Every example of a training or dev split has a label; the first that has none is a
    one-line error naming its file and line (-1, or an empty label in a Hugging Face export,
    marks an unlabeled test row), or `where` and its id for an in-memory example."""
    missing = next((e for e in examples if e.label is None), None)
    if missing is None:
        return
    if missing.location is None:
        raise BertgpuError(f"{where}: {split} example {missing.guid} has no label (GLUE "
                           f"{task.name}); the {split} split needs a label on every example")
    raise BertgpuError(f"{missing.location}: no {task.name} label (-1 or empty marks an "
                       f"unlabeled test row); the {split} split needs a label on every row")


def _eval_set(task: GlueTask, split: str, examples: list[Example], tokenizer: Any,
              seq: int) -> EvalSet:
    """A dev split scored with the task's metrics against the labels as read (float64 scores:
    the encoded float32 training targets would round them)."""
    enc = encode_pairs(tokenizer, examples, seq, task.kind == "regression")
    enc.targets.pop("labels", None)  # kept out of the forward pass: eval needs logits only
    labels = gold_labels(examples, task.kind == "regression")
    if task.kind == "regression" and len(labels) and np.ptp(labels) == 0:
        warnings.warn(f"GLUE {task.name} {split} split: every score is {float(labels[0]):g}; "
                      "Pearson and Spearman are undefined for constant labels and are reported "
                      "as 0", stacklevel=2)

    def score(outputs: dict[str, np.ndarray], _folder: Path | None) -> dict[str, float]:
        return eval_metrics.glue_metrics(task, outputs["logits"], labels)

    return EvalSet(split, enc, score, glue.column_name(task, split),
                   truth=np.ascontiguousarray(labels).tobytes())


def _submission_writer(task: GlueTask, split: str, examples: list[Example]
                       ) -> Callable[[dict[str, np.ndarray], Path], None]:
    guids = [e.guid for e in examples]

    def write(outputs: dict[str, np.ndarray], folder: Path) -> None:
        path = folder / "submission" / f"{glue.column_name(task, split)}.tsv"
        bad = nonfinite_rows(outputs)
        if bad:
            warnings.warn(f"{path}: the model's {split} outputs are not finite (NaN or infinite) "
                          f"for {bad} of {len(guids)} rows; their predictions are meaningless",
                          stacklevel=2)
        glue.write_glue_submission(task, outputs["logits"], path, indices=guids)

    return write
