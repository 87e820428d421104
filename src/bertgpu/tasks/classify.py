"""`bertgpu finetune classify`: sequence classification or regression on your own labelled files.

    bertgpu finetune classify --train-file train.csv --dev-file dev.csv --init runs/base \\
        --out ft/reviews
    bertgpu finetune classify --train-file train.jsonl --dev-file dev.jsonl --text-field premise \\
        --text-pair-field hypothesis --label-field gold --init hf/ --out ft/nli
    bertgpu finetune classify --train-file scores.tsv --dev-file dev.tsv --regression ...

Files, chosen by extension: `.csv` (comma-separated, a header line, RFC 4180 quoting as written
by spreadsheets and pandas), `.tsv` (tab-separated, a header line, quoting off as in GLUE: one
line is one row, a `"` is a character) and `.jsonl` / `.json` (JSON lines, one object per line).
Columns by flag: `--text-field` (default "text"), `--text-pair-field` (a second text: pair tasks
such as entailment) and `--label-field` (default "label").

Labels are names (any string; JSON numbers are read as their text). The classes are the distinct
labels of the training file, sorted (by value when every label is a number, else as text), and
written into the exported config.json so that `transformers.pipeline("text-classification")`
shows them. Regression is asked for with `--regression` and never guessed: labels "0" and "1" are
two classes unless you say otherwise. When every training label is a number, labels equal as
numbers are one class, named by its value ("1" for 1, 1.0 and "1.0", which pandas writes for a
column that held a NaN), in the dev file too. Metrics (0-100): accuracy and macro-F1, or Pearson and
Spearman for regression; a run's score is their mean.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.errors import BertgpuError
from bertgpu.tasks.finetune_output import json_text
from bertgpu.tasks.finetuning import EvalSet, Job, JobRequest, encode_pairs, gold_labels
from bertgpu.tasks.tables import (
    Fields,
    check_own_files,
    own_files,
    own_files_record,
    read_rows,
    request_fields,
    table_format,
)

if TYPE_CHECKING:
    from bertgpu.config.finetune import FinetuneConfig
    from bertgpu.tasks.glue import Example

DEFAULT_MAX_SEQ_LEN = 128
"""Tokens per sequence unless --max_seq_len (capped at the model's max_position_embeddings:
finetune.py)."""


# --------------------------------------------------------------------------------------------
# Values of a row (tasks/tables.py reads the rows; ner shares it)


def text_value(path: Path, line: int, value: Any, name: str) -> str:
    """A non-empty text (a JSON string, or any CSV cell)."""
    if not isinstance(value, str):
        raise BertgpuError(f"{path}:{line}: {name!r} is a JSON {type(value).__name__}, "
                           "expected a string")
    if not value.strip():
        raise BertgpuError(f"{path}:{line}: empty text in {name!r}")
    return value


def label_value(path: Path, line: int, value: Any, name: str) -> str:
    """A label as text: a string, or a JSON number or boolean spelled as JSON spells it (a whole
    float as an integer: 1.0 is the value 1, written by a float column)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (bool, int, float)):
        value = json.dumps(value)
    if value is None or not isinstance(value, str) or not value.strip():
        found = ("empty" if value is None or isinstance(value, str)
                 else f"a JSON {type(value).__name__}")
        raise BertgpuError(f"{path}:{line}: {found} label in {name!r}; expected a "
                           "label on every row")
    return value.strip()


# --------------------------------------------------------------------------------------------
# Labels and examples


def read_labelled(path: str | os.PathLike[str],
                  fields: Fields) -> list[tuple[int, str, str | None, str]]:
    """(line, text, text pair or None, label) for every row."""
    path = Path(path)
    columns = {fields.text: "--text-field", fields.label: "--label-field"}
    if fields.text_pair is not None:
        columns[fields.text_pair] = "--text-pair-field"
    out = []
    for line, row in read_rows(path, columns):
        text = text_value(path, line, row[fields.text], fields.text)
        pair = (text_value(path, line, row[fields.text_pair], fields.text_pair)
                if fields.text_pair else None)
        out.append((line, text, pair, label_value(path, line, row[fields.label], fields.label)))
    if not out:
        expected = (f"one JSON object per line with {fields.text!r} and {fields.label!r}"
                    if table_format(Path(path)) == "jsonl" else "a header line and labelled rows")
        raise BertgpuError(f"{path}: no rows (expected {expected})")
    return out


def _as_float(label: str) -> float | None:
    try:
        v = float(label)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


def _number_name(label: str) -> str | None:
    """A numeric label named by its value ("1.0", "01" -> "1"; "0.50" -> "0.5"); None for text.
    Integers are named exactly: through a float, 9007199254740993 and ...992 were one class."""
    if _INTEGER.fullmatch(label):
        return str(int(label))
    v = _as_float(label) if "_" not in label else None  # float() reads "1_0" as 10
    if v is None:
        return None
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def _numeric(classes: tuple[str, ...]) -> bool:
    return all(_number_name(c) == c for c in classes)


def class_key(label: str, numeric: bool) -> str:
    """The class name a label is looked up by: its value's name when the classes are numbers."""
    return (_number_name(label) or label) if numeric else label


def discover_labels(path: Path, labels: list[str]) -> tuple[str, ...]:
    """The classes of a training file: its distinct labels, sorted as text; or, when all are
    numbers, one class per value, named by it (`_number_name`) and sorted by it ("2" before
    "10"). Fewer than two is an error."""
    names = {label: _number_name(label) for label in labels}
    numeric = all(n is not None for n in names.values())
    distinct = {names[x] for x in labels} if numeric else set(labels)
    if len(distinct) < 2:
        raise BertgpuError(f"{path}: every row has the label {labels[0]!r}"
                           f"{' (as a number)' if numeric and len(set(labels)) > 1 else ''}; "
                           "expected two classes or more (or --regression for numeric scores)")
    if not numeric:
        return tuple(sorted(distinct))
    values = {name: _as_float(name) or 0.0 for name in distinct}
    ordered = tuple(sorted(distinct, key=lambda name: (values[name], name)))
    fraction = next((x for x in ordered if not values[x].is_integer()), None)
    if fraction is not None:
        warnings.warn(f"{path}: all {len(distinct)} labels are numbers, some not whole (e.g. "
                      f"{fraction!r}); each distinct value is read as a class. Pass --regression "
                      "to predict a score instead", stacklevel=2)
    return ordered


def to_examples(path: Path, rows: list[tuple[int, str, str | None, str]],
                classes: tuple[str, ...] | None, label_name: str,
                cut: tuple[int, set[str]] | None = None) -> list[Example]:
    """Rows -> `glue.Example`s with class ids (`classes` given) or float scores (regression).
    ``cut``: (--max_train_examples, every label of the whole training file), so that a label
    past the cut is named as such."""
    from bertgpu.tasks.glue import Example

    ids = {c: i for i, c in enumerate(classes or ())}
    numeric = classes is not None and _numeric(classes)
    out = []
    for line, text, pair, label in rows:
        if classes is not None:
            key = class_key(label, numeric)
            if key not in ids:
                shown = (", ".join(repr(c) for c in classes[:10])
                         + (", ..." if len(classes) > 10 else ""))
                where = "is not in the training file"
                if cut is not None and key in {class_key(x, numeric) for x in cut[1]}:
                    where = ("is in the training file but not in its first "
                             f"{f'{cut[0]} rows' if cut[0] != 1 else 'row'} "
                             f"(--max_train_examples {cut[0]})")
                raise BertgpuError(f"{path}:{line}: label {label!r} {where} "
                                   f"(expected one of {shown})")
            target: int | float = ids[key]
        else:
            score = _as_float(label)
            if score is None:
                raise BertgpuError(f"{path}:{line}: label {label!r} in {label_name!r} is not a "
                                   "finite number (expected a score with --regression)")
            target = score
        out.append(Example(f"{path.name}:{line}", text, pair, target))
    return out


# --------------------------------------------------------------------------------------------
# The job


def check_request(request: JobRequest) -> None:
    """Your two files named and present; no GLUE or SQuAD flags."""
    check_own_files(request)


def input_files(request: JobRequest) -> list[Path]:
    """The files `build_job` reads (finetune.py hashes them before anything is encoded)."""
    return own_files(request)


def build_job(request: JobRequest, tokenizer: Any,
              cfg: FinetuneConfig) -> tuple[Job, dict[str, Any]]:
    """The classify job and what results.json records about its data (files, kind, columns,
    label names)."""
    check_request(request)
    fields = request_fields(request, Fields())
    assert request.train_file is not None and request.dev_file is not None  # checked just above
    job = classify_job(request.train_file, request.dev_file, tokenizer, cfg, fields,
                       request.regression)
    kind = "regression" if request.regression else "classification"
    return job, own_files_record(request, fields, kind, job.labels)


def classify_job(train_file: str | os.PathLike[str], dev_file: str | os.PathLike[str],
                 tokenizer: Any, cfg: FinetuneConfig, fields: Fields | None = None,
                 regression: bool = False) -> Job:
    """Read, check and encode both files; the dev set is scored with `metrics.label_metrics`."""
    from bertgpu.tasks import metrics as eval_metrics

    fields = fields or Fields()
    train_path, dev_path = Path(train_file), Path(dev_file)
    train_rows = read_labelled(train_path, fields)
    dev_rows = read_labelled(dev_path, fields)
    cut = None
    if cfg.max_train_examples is not None:
        cut = (cfg.max_train_examples, {r[3] for r in train_rows})
        train_rows = train_rows[:cfg.max_train_examples]
    if cfg.max_eval_examples is not None:
        dev_rows = dev_rows[:cfg.max_eval_examples]
    classes = None if regression else discover_labels(train_path, [r[3] for r in train_rows])
    train = to_examples(train_path, train_rows, classes, fields.label)
    dev = to_examples(dev_path, dev_rows, classes, fields.label, cut)
    seq = cfg.max_seq_len or DEFAULT_MAX_SEQ_LEN
    dev_enc = encode_pairs(tokenizer, dev, seq, regression)
    dev_enc.targets.pop("labels")  # kept out of the forward pass: eval needs logits only
    gold = gold_labels(dev, regression)  # float64 scores as read, not the float32 targets
    if regression and len(gold) and np.ptp(gold) == 0:
        warnings.warn(f"{dev_path}: every dev score is {float(gold[0]):g}; Pearson and Spearman "
                      "are undefined for constant labels and are reported as 0", stacklevel=2)

    def score(outputs: dict[str, np.ndarray], folder: Path | None) -> dict[str, float]:
        logits = outputs["logits"]
        if folder is not None:
            _write_predictions(folder / "predictions.jsonl", dev, logits, classes)
        return eval_metrics.label_metrics(logits, gold, regression)

    return Job("classify", "classification", 1 if regression else len(classes or ()),
               encode_pairs(tokenizer, train, seq, regression),
               [EvalSet("dev", dev_enc, score, truth=np.ascontiguousarray(gold).tobytes()
                        + json.dumps(classes).encode())],  # corrected dev labels: another run
               lambda m: float(np.mean(list(m["dev"].values()))),
               labels=classes)


def _write_predictions(path: Path, dev: list[Example], logits: np.ndarray,
                       classes: tuple[str, ...] | None) -> None:
    """One JSON line per dev row: its id (file:line), the label and the prediction (names, or
    scores for regression); null where the model's output is not finite (NaN has no class)."""
    lines = []
    for ex, row in zip(dev, logits, strict=True):
        finite = bool(np.isfinite(row).all())
        gold: str | float | None
        pred: str | float | None
        if classes is None:
            gold, pred = ex.label, float(row.reshape(-1)[0]) if finite else None
        else:
            gold = classes[int(ex.label or 0)]
            pred = classes[int(np.argmax(row))] if finite else None
        lines.append(json_text({"id": ex.guid, "label": gold, "prediction": pred}))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)
