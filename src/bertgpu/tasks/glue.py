"""GLUE: one task table, where its files are, and the leaderboard submission (its files' format,
and OUT/submission/ of `bertgpu glue`).

Every task is a row of `TASKS`; there is no per-task reader or loop. A row says where the text
and label live in each file format, the label order, the dev/test split names and the official
metrics. The readers (`glue_files.py`) return plain `Example`s (strings and a number), so the
fine-tuning code never looks at a file format.

Label ids follow Hugging Face `datasets` (`nyu-mll/glue`), so a model fine-tuned here predicts the
same ids as one fine-tuned with `transformers`' run_glue.py:

    mnli: entailment=0, neutral=1, contradiction=2     qnli, rte: entailment=0, not_entailment=1
    cola: unacceptable=0, acceptable=1                 sst2: negative=0, positive=1
    mrpc: not_equivalent=0, equivalent=1               qqp: not_duplicate=0, duplicate=1
    wnli: not_entailment=0, entailment=1               stsb: a float score in [0, 5]

Layouts accepted by `find_split_file` (DATA/ is what the user passes):

    DATA/CoLA/train.tsv, dev.tsv, test.tsv             official GLUE download (MNLI:
    DATA/MNLI/dev_matched.tsv, dev_mismatched.tsv      dev_matched/dev_mismatched/test_matched/...)
    DATA/cola/train-00000-of-00001.parquet             Hugging Face hub export (nyu-mll/glue)
    DATA/sst2/validation.parquet | .jsonl | .csv       `datasets` to_parquet / to_json / to_csv

Usage::

    from bertgpu.tasks.glue import get_task, find_split_file
    from bertgpu.tasks.glue_files import read_examples
    task = get_task("sst-2")
    dev = read_examples(task, find_split_file("glue_data", task, "dev"))

TSV files are read with quoting off: GLUE's files contain unbalanced `"` characters, and a
quote-aware reader silently glues many rows into one (the classic MNLI/QQP row-count bug).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bertgpu.errors import BertgpuError

log = logging.getLogger(__name__)

__all__ = [
    "Example",
    "GlueTask",
    "LEADERBOARD_FILES",
    "TASKS",
    "column_name",
    "find_diagnostic_file",
    "find_split_file",
    "get_task",
    "names",
    "remove_stale_submission",
    "unknown_task",
    "write_glue_submission",
    "write_submission",
]

Label = int | float | None


@dataclass(frozen=True)
class Example:
    """One GLUE example, independent of the file it came from."""

    guid: str
    """The file's own id (`index`/`id`/`idx` column) where it has one, else the line/row number."""
    text_a: str
    text_b: str | None
    """The second sentence of a pair task; None for CoLA and SST-2."""
    label: Label
    """Class id (int, Hugging Face order) for classification,
    float for STS-B, None when unlabeled."""
    location: str | None = field(default=None, compare=False)
    """Where the example was read, for error messages: "FILE:LINE" (TSV, CSV and JSON lines) or
    "FILE: row N" / "FILE: item N" (parquet, a JSON array); None for in-memory examples."""


@dataclass(frozen=True)
class GlueTask:
    """One row of the task table: everything task-specific the readers and metrics need."""

    name: str
    """Official directory name, also the GLUE leaderboard column: "CoLA", "SST-2", "STS-B", ..."""
    key: str
    """Lower-case id used by Hugging Face and in configs: "cola", "sst2", "stsb", ..."""
    kind: Literal["classification", "regression"]
    labels: tuple[str, ...]
    """Label names in id order (Hugging Face `ClassLabel` names); empty for regression."""
    tsv_labels: tuple[str, ...]
    """How each label id is spelled in the official TSV files and in leaderboard submissions."""
    tsv_text_a: str
    tsv_text_b: str | None
    tsv_label: str
    """Header names of the text and label columns in the official TSV files."""
    hf_text_a: str
    hf_text_b: str | None
    """Column names in Hugging Face exports; the label is always "label", the id "idx"."""
    metrics: tuple[str, ...]
    """Official metrics, names as returned by `eval_metrics.glue_metrics`."""
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)
    tsv_headerless: tuple[str, ...] | None = None
    """Column names for train/dev files that have no header line (CoLA only)."""
    aliases: tuple[str, ...] = field(default=())

    @property
    def num_labels(self) -> int:
        """Output size of the model head: the number of classes, 1 for regression."""
        return len(self.labels) if self.kind == "classification" else 1

    @property
    def is_pair(self) -> bool:
        return self.tsv_text_b is not None


def _binary(name: str, key: str, labels: tuple[str, str], text_a: str, text_b: str | None,
            label: str, hf_a: str, hf_b: str | None, metrics: tuple[str, ...],
            **kw: Any) -> GlueTask:
    # The binary tasks spell their labels "0"/"1" in the TSV files and the submissions.
    return GlueTask(name, key, "classification", labels, ("0", "1"), text_a, text_b, label,
                    hf_a, hf_b, metrics, **kw)


_NLI2 = ("entailment", "not_entailment")

TASKS: dict[str, GlueTask] = {t.key: t for t in (
    _binary("CoLA", "cola", ("unacceptable", "acceptable"), "sentence", None, "label",
            "sentence", None, ("mcc",),
            tsv_headerless=("source", "label", "original_label", "sentence")),
    _binary("SST-2", "sst2", ("negative", "positive"), "sentence", None, "label",
            "sentence", None, ("accuracy",), aliases=("sst",)),
    _binary("MRPC", "mrpc", ("not_equivalent", "equivalent"), "#1 String", "#2 String", "Quality",
            "sentence1", "sentence2", ("f1", "accuracy")),
    GlueTask("STS-B", "stsb", "regression", (), (), "sentence1", "sentence2", "score",
             "sentence1", "sentence2", ("pearson", "spearman"), aliases=("sts",)),
    _binary("QQP", "qqp", ("not_duplicate", "duplicate"), "question1", "question2",
            "is_duplicate", "question1", "question2", ("accuracy", "f1")),
    GlueTask("MNLI", "mnli", "classification", ("entailment", "neutral", "contradiction"),
             ("entailment", "neutral", "contradiction"), "sentence1", "sentence2", "gold_label",
             "premise", "hypothesis", ("accuracy",),
             dev_splits=("dev_matched", "dev_mismatched"),
             test_splits=("test_matched", "test_mismatched"),
             aliases=("mnli-m", "mnli-mm", "mnli_matched", "mnli_mismatched")),
    GlueTask("QNLI", "qnli", "classification", _NLI2, _NLI2, "question", "sentence", "label",
             "question", "sentence", ("accuracy",)),
    GlueTask("RTE", "rte", "classification", _NLI2, _NLI2, "sentence1", "sentence2", "label",
             "sentence1", "sentence2", ("accuracy",)),
    _binary("WNLI", "wnli", ("not_entailment", "entailment"), "sentence1", "sentence2", "label",
            "sentence1", "sentence2", ("accuracy",)),
)}


def _norm(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


_ALIASES: dict[str, str] = {}
for _t in TASKS.values():
    for _a in (_t.key, _t.name, *_t.aliases):
        _ALIASES[_norm(_a)] = _t.key


def get_task(name: str | GlueTask) -> GlueTask:
    """The task for an official name or alias: "SST-2", "sst2", "sst-2", "STS-B", "stsb",
    "MNLI-m"."""
    if isinstance(name, GlueTask):
        return name
    key = _ALIASES.get(_norm(name))
    if key is None:
        raise unknown_task(name)
    return TASKS[key]


def names() -> tuple[str, ...]:
    """Every name and alias `get_task` accepts, lower case without "-" or "_" ("sst2", "mnlim")."""
    return tuple(_ALIASES)


def unknown_task(name: str) -> BertgpuError:
    """The error for a task name that no table knows (tasks/registry.py raises it too)."""
    return BertgpuError(f"unknown GLUE task {name!r} (expected one of "
                        f"{', '.join(t.name for t in TASKS.values())})")


def column_name(task: GlueTask | str, split: str) -> str:
    """Results-table column and leaderboard file stem of a split: "MNLI-m", "MNLI-mm", else the
    name."""
    task = get_task(task)
    if task.key == "mnli":
        return "AX" if split == DIAGNOSTIC else "MNLI-mm" if "mismatched" in split else "MNLI-m"
    return task.name


DIAGNOSTIC = "ax"
"""GLUE's diagnostic set (AX): unlabeled MNLI-style pairs that the leaderboard scores with the
MNLI model's predictions (AX.tsv in a submission)."""
_DIAGNOSTIC_FILES = ("diagnostic/diagnostic.tsv", "diagnostic/AX.tsv", "AX/AX.tsv", "AX/test.tsv",
                     "ax/test.tsv", "ax/test.parquet", "ax/test-*.parquet", "ax/test.jsonl",
                     "ax/test.json", "ax/test.csv")
"""Where the diagnostic set lies under DATA: the official download (diagnostic/diagnostic.tsv,
columns index, sentence1, sentence2) or a Hugging Face export of the `ax` config (premise,
hypothesis, idx)."""


def find_diagnostic_file(data_dir: str | os.PathLike[str],
                         task: GlueTask | str | None = None) -> Path | None:
    """The diagnostic set's file under `data_dir` (GLUE root), or None. With `task` (MNLI), a
    `data_dir` that is the task's own folder (GLUE/MNLI, or an export's mnli/) is looked beside
    as well: the diagnostic set lies in the GLUE root, one level up."""
    roots = [Path(data_dir)]
    if task is not None and _is_task_folder(data_dir, get_task(task)):
        roots.append(Path(data_dir).resolve().parent)
    for root in roots:
        for pattern in _DIAGNOSTIC_FILES:
            hits = sorted(root.glob(pattern))
            if hits:
                return hits[0]
    return None


def _is_task_folder(data_dir: str | os.PathLike[str], task: GlueTask) -> bool:
    """Whether `data_dir` holds `task`'s training file itself rather than in a subfolder."""
    try:
        train = find_split_file(data_dir, task, "train")
    except BertgpuError:
        return False
    return train.parent.resolve() == Path(data_dir).resolve()


# --------------------------------------------------------------------------------------------
# Finding files


_HF_SPLIT = {"dev": "validation", "dev_matched": "validation_matched",
             "dev_mismatched": "validation_mismatched"}


def _canonical_split(task: GlueTask, split: str) -> str:
    """Official split name ("train", "dev", "dev_matched", "test_mismatched", ...)."""
    s = split.lower().replace("validation", "dev").replace("-", "_")
    valid = ("train", *task.dev_splits, *task.test_splits)
    if s in valid:
        return s
    raise BertgpuError(
        f"GLUE task {task.name} has no split {split!r} (expected one of {', '.join(valid)})"
    )


def find_split_file(data_dir: str | os.PathLike[str], task: GlueTask | str, split: str) -> Path:
    """The file holding `split` of `task` under `data_dir` (official TSV or Hugging Face export).

    Looks in DATA/<official name>, DATA/<hf key>, DATA/<lower-case name>, then DATA itself, and in
    each for `<split>.tsv`, `<hf split>.parquet`, `<hf split>-*.parquet`, `.jsonl`, `.json`, `.csv`.
    """
    task = get_task(task)
    split = _canonical_split(task, split)
    hf = _HF_SPLIT.get(split, split)
    root = Path(data_dir)
    folders: list[Path] = []
    for sub in (task.name, task.key, task.name.lower(), *task.aliases, None):
        d = root / sub if sub is not None else root
        if d not in folders:
            folders.append(d)
    patterns = [f"{split}.tsv"]
    for stem in dict.fromkeys((hf, split)):
        patterns += [f"{stem}.parquet", f"{stem}-*.parquet", f"{stem}.jsonl", f"{stem}.json",
                     f"{stem}.csv"]
    for d in folders:
        if not d.is_dir():
            continue
        for pat in patterns:
            hits = sorted(d.glob(pat))
            if len(hits) > 1:
                raise BertgpuError(
                    f"{d}: several files match {pat} ({', '.join(h.name for h in hits[:3])}, ...);"
                    " expected one file per split (merge the shards into one)"
                )
            if hits:
                return hits[0]
    if not root.exists():
        raise BertgpuError(f"{root}: does not exist (expected the GLUE data folder, with "
                           f"{task.name}/{split}.tsv in it)")
    looked = ", ".join(str(d) for d in folders)
    raise BertgpuError(
        f"no {split} file for GLUE task {task.name}: looked in {looked} for "
        f"{', '.join(patterns)}"
    )


# --------------------------------------------------------------------------------------------
# Leaderboard submission


def write_glue_submission(task: GlueTask | str, predictions: Sequence[Any],
                          out_path: str | os.PathLike[str],
                          indices: Sequence[str | int] | None = None) -> Path:
    """Write the GLUE leaderboard file: header "index\\tprediction", one row per test example.

    `predictions` are class ids (or 2-D logits, argmax taken) for classification, written with the
    task's TSV label spelling ("entailment", "0"/"1"); floats for STS-B, clipped to its [0, 5]
    range. `indices` default to 0..N-1, the order of the official test files. Written to
    OUT.tmp and renamed into place.
    """
    task = get_task(task)
    import numpy as np  # numpy is a runtime dependency; imported here to keep import time low

    preds = np.asarray(predictions)
    if task.kind == "classification" and preds.ndim == 2:
        preds = preds.argmax(axis=-1)
    preds = preds.reshape(len(preds), -1)[:, 0] if preds.ndim > 1 else preds
    if task.kind == "regression":  # STS-B's scores lie in [0, 5]; a regression head's need not
        preds = np.clip(preds.astype(np.float64), 0.0, 5.0)
    if indices is None:
        indices = range(len(preds))
    if len(indices) != len(preds):
        raise BertgpuError(
            f"{out_path}: {len(preds)} predictions for {len(indices)} indices ({task.name})"
        )
    lines = ["index\tprediction"]
    for i, p in zip(indices, preds, strict=True):
        if task.kind == "classification":
            k = int(p)
            if not 0 <= k < len(task.tsv_labels):
                raise BertgpuError(
                    f"{out_path}: prediction {p!r} for index {i} is not a {task.name} class id "
                    f"(expected 0..{len(task.tsv_labels) - 1})"
                )
            lines.append(f"{i}\t{task.tsv_labels[k]}")
        else:
            lines.append(f"{i}\t{float(p):.6g}")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


LEADERBOARD_FILES = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI-m", "MNLI-mm", "QNLI", "RTE",
                     "WNLI", "AX")
"""The files a GLUE leaderboard submission holds (FILE.tsv each, zipped at the top level)."""


def write_submission(out: Path, runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """OUT/submission/ and OUT/submission.zip from each task's seed with the best dev score (the
    final epoch's, as the table's; the lowest seed on a tie): the leaderboard scores one model
    per task. Returns what glue_results.json records; a file the leaderboard asks for that no run
    wrote is named in one warning."""
    import shutil
    import warnings
    import zipfile

    from bertgpu.fsutil import make_scratch, replace_dir

    folder, chosen, sources = out / "submission", {}, []
    tmp = make_scratch(out / "submission.tmp", folder)
    for name, per_seed in runs.items():
        seed = max(sorted(per_seed), key=lambda s: per_seed[s]["score"])
        chosen[name] = seed
        files = sorted((out / name / f"seed_{seed}" / "submission").glob("*.tsv"))
        for path in files:
            shutil.copyfile(path, tmp / path.name)
        if files:  # a task without a test file wrote none: not a source of the submission
            sources.append(f"{name} seed {seed}")
    written = sorted(p.stem for p in tmp.glob("*.tsv"))
    missing = [f for f in LEADERBOARD_FILES if f not in written]
    replace_dir(tmp, folder, replaces=lambda p: True)
    zipped = out / "submission.zip"
    with zipfile.ZipFile(zipped.with_name(zipped.name + ".tmp"), "w", zipfile.ZIP_DEFLATED) as z:
        for stem in written:
            z.write(folder / f"{stem}.tsv", f"{stem}.tsv")
    os.replace(zipped.with_name(zipped.name + ".tmp"), zipped)
    if missing:
        warnings.warn(f"{zipped}: the GLUE leaderboard asks for {', '.join(missing)} as well "
                      "(no run of this command wrote them: a task not run, or its test file "
                      "missing)", stacklevel=2)
    print(f"GLUE submission: {len(written)} files ({', '.join(sources) or 'no task'}) -> "
          f"{zipped}", flush=True)
    return {"folder": str(folder), "zip": str(zipped), "seeds": chosen, "files": written,
            "missing": missing}


def remove_stale_submission(out: Path) -> None:
    """OUT/submission/ and .zip of an earlier `glue --predict-test` go with a table that has no
    test predictions: they would stand beside a table they do not match (other tasks or runs)."""
    import shutil

    stale = [p for p in (out / "submission.zip", out / "submission") if p.exists()]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    if stale:
        print(f"{out}: removed the earlier {' and '.join(p.name for p in stale)} (this table "
              "has no test predictions; pass --predict-test for new ones)", flush=True)
