"""GLUE: one task table, readers for the official TSV layout and Hugging Face exports.

Every task is a row of `TASKS`; there is no per-task reader or loop. A row says where the text
and label live in each file format, the label order, the dev/test split names and the official
metrics. Readers return plain `Example`s (strings and a number), so the fine-tuning code never
looks at a file format.

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

    from bertgpu.tasks.glue import get_task, find_split_file, read_examples
    task = get_task("sst-2")
    dev = read_examples(task, find_split_file("glue_data", task, "dev"))

TSV files are read with quoting off: GLUE's files contain unbalanced `"` characters, and a
quote-aware reader silently glues many rows into one (the classic MNLI/QQP row-count bug).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bertgpu.errors import BertgpuError

log = logging.getLogger(__name__)

__all__ = [
    "Example",
    "GlueTask",
    "TASKS",
    "column_name",
    "find_split_file",
    "get_task",
    "read_examples",
    "read_examples_counted",
    "write_glue_submission",
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
    """Class id (int, Hugging Face order) for classification, float for STS-B, None when unlabeled."""


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
    """The task for an official name or alias: "SST-2", "sst2", "sst-2", "STS-B", "stsb", "MNLI-m"."""
    if isinstance(name, GlueTask):
        return name
    key = _ALIASES.get(_norm(name))
    if key is None:
        raise BertgpuError(
            f"unknown GLUE task {name!r} (expected one of {', '.join(t.name for t in TASKS.values())})"
        )
    return TASKS[key]


def column_name(task: GlueTask | str, split: str) -> str:
    """Results-table column and leaderboard file stem of a split: "MNLI-m", "MNLI-mm", else the name."""
    task = get_task(task)
    if task.key == "mnli":
        return "MNLI-mm" if "mismatched" in split else "MNLI-m"
    return task.name


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
    looked = ", ".join(str(d) for d in folders)
    raise BertgpuError(
        f"no {split} file for GLUE task {task.name}: looked in {looked} for "
        f"{', '.join(patterns)}"
    )


# --------------------------------------------------------------------------------------------
# Reading


def read_examples(task: GlueTask | str, path: str | os.PathLike[str], *,
                  skip_malformed: bool = False,
                  expect_labels: bool | None = None) -> list[Example]:
    """All examples of one file; see `read_examples_counted` (this logs the skipped-row count)."""
    examples, skipped = read_examples_counted(task, path, skip_malformed=skip_malformed,
                                              expect_labels=expect_labels)
    if skipped:
        log.warning("%s: skipped %d malformed rows (wrong column count)", path, skipped)
    return examples


def read_examples_counted(task: GlueTask | str, path: str | os.PathLike[str], *,
                          skip_malformed: bool = False,
                          expect_labels: bool | None = None) -> tuple[list[Example], int]:
    """Examples of a GLUE file (.tsv official, .parquet/.jsonl/.json/.csv Hugging Face) and the
    number of malformed rows skipped.

    `skip_malformed` skips TSV rows with the wrong number of columns (QQP's train.tsv has a few)
    instead of raising. `expect_labels` (default: True unless the file name starts with "test")
    makes a missing label column an error; unlabeled examples get `label=None`.
    """
    task = get_task(task)
    path = Path(path)
    if not path.is_file():
        raise BertgpuError(f"{path}: no such file (GLUE {task.name} split)")
    if expect_labels is None:
        expect_labels = not path.name.lower().startswith("test")
    if path.stat().st_size == 0:
        raise BertgpuError(f"{path}: empty file (expected GLUE {task.name} examples)")
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        examples, skipped = _read_tsv(task, path, skip_malformed, expect_labels)
    elif suffix in (".parquet", ".jsonl", ".json", ".csv"):
        examples, skipped = _read_hf(task, path, expect_labels), 0
    else:
        raise BertgpuError(
            f"{path}: unknown GLUE file type {suffix!r} (expected .tsv, .parquet, .jsonl, .json "
            "or .csv)"
        )
    if not examples:
        raise BertgpuError(f"{path}: no examples (only a header line?)")
    return examples, skipped


def _parse_label(task: GlueTask, value: Any, where: str) -> Label:
    """A label from a file as an id (classification) or float (regression); None = unlabeled.

    Accepts the TSV spelling ("0", "entailment"), the Hugging Face name ("acceptable") and ints;
    -1 is Hugging Face's "no label" marker on test splits.
    """
    if value is None:
        return None
    if task.kind == "regression":
        try:
            x = float(value)
        except (TypeError, ValueError):
            raise BertgpuError(
                f"{where}: {task.name} score {value!r} is not a number (expected 0 to 5)"
            ) from None
        if not math.isfinite(x):
            raise BertgpuError(f"{where}: {task.name} score {value!r} is not finite")
        return None if x == -1.0 else x
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int | float) and float(value).is_integer():
        i = int(value)
        if i == -1:
            return None
        if 0 <= i < len(task.labels):
            return i
    elif isinstance(value, str):
        s = value.strip()
        if s in task.tsv_labels:
            return task.tsv_labels.index(s)
        if s in task.labels:
            return task.labels.index(s)
        if s in ("", "-1"):
            return None  # CSV has no types: "" or "-1" is an unlabeled test row
        if s.isdigit() and int(s) < len(task.labels):
            return int(s)  # a class id written as text (Hugging Face CSV export)
    expected = ", ".join(repr(x) for x in dict.fromkeys(task.tsv_labels + task.labels))
    raise BertgpuError(f"{where}: unknown {task.name} label {value!r} (expected one of {expected})")


def _read_tsv(task: GlueTask, path: Path, skip_malformed: bool,
              expect_labels: bool) -> tuple[list[Example], int]:
    examples: list[Example] = []
    skipped = 0
    # utf-8-sig: MRPC's files, made by the GLUE download script, start with a byte-order mark.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        first = next(reader, None)
        if first is None:
            raise BertgpuError(f"{path}: empty file (expected GLUE {task.name} examples)")
        # CoLA's train/dev have no header; its test file has "index\tsentence".
        if task.tsv_headerless is not None and first[:1] != ["index"]:
            header = list(task.tsv_headerless)
            rows: Iterator[list[str]] = _chain_first(first, reader)
            header_line = 0
        else:
            header = [h.strip() for h in first]
            rows = reader
            header_line = 1
        col = {h: i for i, h in enumerate(header)}
        need = [task.tsv_text_a] + ([task.tsv_text_b] if task.tsv_text_b else [])
        missing = [c for c in need if c not in col]
        if missing:
            raise BertgpuError(
                f"{path}:{max(header_line, 1)}: missing column {missing[0]!r} for GLUE {task.name}"
                f" (header has {', '.join(repr(h) for h in header)})"
            )
        has_label = task.tsv_label in col
        if expect_labels and not has_label:
            raise BertgpuError(
                f"{path}:{max(header_line, 1)}: missing label column {task.tsv_label!r} for GLUE "
                f"{task.name} (header has {', '.join(repr(h) for h in header)})"
            )
        id_col = next((col[c] for c in ("index", "id") if c in col), None)
        ia, ib = col[task.tsv_text_a], col.get(task.tsv_text_b) if task.tsv_text_b else None
        il = col[task.tsv_label] if has_label else None
        for row in rows:
            line = reader.line_num
            if row == [] or row == [""]:
                continue  # a trailing blank line
            if len(row) != len(header):
                if skip_malformed:
                    skipped += 1
                    continue
                raise BertgpuError(
                    f"{path}:{line}: {len(row)} columns, expected {len(header)} for GLUE "
                    f"{task.name} (pass skip_malformed to skip such rows)"
                )
            where = f"{path}:{line}"
            if il is not None and not row[il].strip():
                raise BertgpuError(f"{where}: empty {task.name} label column {task.tsv_label!r}")
            examples.append(Example(
                guid=row[id_col] if id_col is not None else str(line),
                text_a=row[ia],
                text_b=row[ib] if ib is not None else None,
                label=_parse_label(task, row[il], where) if il is not None else None,
            ))
    return examples, skipped


def _chain_first(first: list[str], rest: Iterator[list[str]]) -> Iterator[list[str]]:
    yield first
    yield from rest


def _hf_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, record) pairs of a Hugging Face export; location is "row N" or "line N"."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq  # optional dependency: only for parquet exports
        except ImportError:
            raise BertgpuError(
                f"{path}: reading parquet needs pyarrow (pip install 'bertgpu[parquet]')"
            ) from None
        try:
            table = pq.read_table(path)
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise BertgpuError(f"{path}: not a readable parquet file ({e})") from None
        for i, rec in enumerate(table.to_pylist()):
            yield f"row {i}", rec
    elif suffix == ".csv":
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f)
            for rec in reader:
                yield f"line {reader.line_num}", rec
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if text.lstrip().startswith("["):  # a JSON array rather than JSON lines
            try:
                items = json.loads(text)
            except json.JSONDecodeError as e:
                raise BertgpuError(f"{path}: invalid JSON ({e})") from None
            for i, rec in enumerate(items):
                yield f"item {i}", rec
            return
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise BertgpuError(f"{path}: line {n}: invalid JSON ({e.msg})") from None
            yield f"line {n}", rec


def _read_hf(task: GlueTask, path: Path, expect_labels: bool) -> list[Example]:
    examples: list[Example] = []
    for n, (loc, rec) in enumerate(_hf_records(path)):
        where = f"{path}: {loc}"
        if not isinstance(rec, dict):
            raise BertgpuError(f"{where}: expected an object with columns, found {type(rec).__name__}")
        for c in (task.hf_text_a, task.hf_text_b):
            if c is not None and c not in rec:
                raise BertgpuError(
                    f"{where}: missing column {c!r} for GLUE {task.name} "
                    f"(found {', '.join(repr(k) for k in rec)})"
                )
        if "label" not in rec and expect_labels:
            raise BertgpuError(f"{where}: missing column 'label' for GLUE {task.name}")
        label = _parse_label(task, rec.get("label"), where)
        idx = rec.get("idx")
        examples.append(Example(
            guid=str(idx) if idx not in (None, "") else str(n),
            text_a=str(rec[task.hf_text_a]),
            text_b=str(rec[task.hf_text_b]) if task.hf_text_b else None,
            label=label,
        ))
    return examples


# --------------------------------------------------------------------------------------------
# Leaderboard submission


def write_glue_submission(task: GlueTask | str, predictions: Sequence[Any],
                          out_path: str | os.PathLike[str],
                          indices: Sequence[str | int] | None = None) -> Path:
    """Write the GLUE leaderboard file: header "index\\tprediction", one row per test example.

    `predictions` are class ids (or 2-D logits, argmax taken) for classification, written with the
    task's TSV label spelling ("entailment", "0"/"1"); floats for STS-B. `indices` default to
    0..N-1, the order of the official test files. Written to OUT.tmp and renamed into place.
    """
    task = get_task(task)
    import numpy as np  # numpy is a runtime dependency; imported here to keep import time low

    preds = np.asarray(predictions)
    if task.kind == "classification" and preds.ndim == 2:
        preds = preds.argmax(axis=-1)
    preds = preds.reshape(len(preds), -1)[:, 0] if preds.ndim > 1 else preds
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
