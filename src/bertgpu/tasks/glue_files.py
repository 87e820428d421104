"""Reading GLUE files: the official TSV layout (quoting off) and Hugging Face exports
(parquet, JSONL, JSON, CSV with the `datasets` column names), into plain `Example`s.

TSV files are read with quoting off: GLUE's files contain unbalanced `"` characters, and a
quote-aware reader silently glues many rows into one (the classic MNLI/QQP row-count bug).
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import not_utf8
from bertgpu.tasks.glue import Example, GlueTask, Label, get_task


def read_examples(task: GlueTask | str, path: str | os.PathLike[str], *,
                  skip_malformed: bool = False,
                  expect_labels: bool | None = None) -> list[Example]:
    """All examples of one file; see `read_examples_counted` (this warns with the skipped-row
    count, in one line)."""
    examples, skipped = read_examples_counted(task, path, skip_malformed=skip_malformed,
                                              expect_labels=expect_labels)
    if skipped:
        warnings.warn(f"{path}: skipped {skipped} malformed rows (wrong number of columns, or "
                      f"a null text; skip_malformed), read {len(examples)}", stacklevel=2)
    return examples


def read_examples_counted(task: GlueTask | str, path: str | os.PathLike[str], *,
                          skip_malformed: bool = False,
                          expect_labels: bool | None = None) -> tuple[list[Example], int]:
    """Examples of a GLUE file (.tsv official, .parquet/.jsonl/.json/.csv Hugging Face) and the
    number of malformed rows skipped.

    `skip_malformed` (`--skip_malformed true`) skips TSV rows with the wrong number of columns
    (QQP's train.tsv has a few), and Hugging Face rows whose text is null or not a string (a
    short row of a CSV, or of the TSV the export was made from), instead of raising.
    `expect_labels` (default: True unless the file name starts with "test") makes a missing
    label column an error; unlabeled examples get `label=None`.
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
    if suffix in (".tsv", ".parquet", ".jsonl", ".json", ".csv"):
        try:
            examples, skipped = (_read_tsv if suffix == ".tsv" else _read_hf)(
                task, path, skip_malformed, expect_labels)
        except UnicodeDecodeError:
            raise not_utf8(path) from None
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
    -1 is Hugging Face's "no label" marker on test splits. A score (STS-B) lies in [0, 5].
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
        if x == -1.0:
            return None
        if not 0.0 <= x <= 5.0:  # a typo or another scale (0-1, 1-10) would train silently
            raise BertgpuError(f"{where}: {task.name} score {value!r} is out of range (expected "
                               "0 to 5; -1 marks an unlabeled test row)")
        return x
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
                # A test file keeps every row: the leaderboard wants a prediction for each.
                hint = ("pass --skip_malformed true to skip such rows" if expect_labels
                        else "a test file must keep every row for the leaderboard")
                raise BertgpuError(
                    f"{path}:{line}: {len(row)} columns, expected {len(header)} for GLUE "
                    f"{task.name} ({hint})"
                )
            where = f"{path}:{line}"
            if il is not None and not row[il].strip():
                raise BertgpuError(f"{where}: empty {task.name} label column {task.tsv_label!r}")
            examples.append(Example(
                guid=row[id_col] if id_col is not None else str(line),
                text_a=row[ia],
                text_b=row[ib] if ib is not None else None,
                label=_parse_label(task, row[il], where) if il is not None else None,
                location=where,
            ))
    return examples, skipped


def _chain_first(first: list[str], rest: Iterator[list[str]]) -> Iterator[list[str]]:
    yield first
    yield from rest


def json_lines(path: Path, lines: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSON-lines file, blank lines skipped; a line that is not one
    JSON object is a one-line error naming the file and line."""
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise BertgpuError(f"{path}:{n}: not JSON ({e.msg}); expected one JSON "
                               "object per line") from None
        if not isinstance(obj, dict):
            raise BertgpuError(f"{path}:{n}: found a JSON {type(obj).__name__}, expected an "
                               "object per line")
        yield n, obj


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
    else:  # utf-8-sig: a BOM is no JSON error; lines end at \n only (JSON strings hold U+2028)
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
        if text.lstrip().startswith("["):  # a JSON array rather than JSON lines
            try:
                items = json.loads(text)
            except json.JSONDecodeError as e:
                raise BertgpuError(f"{path}: invalid JSON ({e})") from None
            for i, rec in enumerate(items):
                yield f"item {i}", rec
            return
        for n, rec in json_lines(path, text.split("\n")):
            yield f"line {n}", rec


def _read_hf(task: GlueTask, path: Path, skip_malformed: bool,
             expect_labels: bool) -> tuple[list[Example], int]:
    examples: list[Example] = []
    skipped = 0
    for n, (loc, rec) in enumerate(_hf_records(path)):
        where = f"{path}: {loc}"
        if not isinstance(rec, dict):
            raise BertgpuError(f"{where}: expected an object with columns, found "
                               f"{type(rec).__name__}")
        for c in (task.hf_text_a, task.hf_text_b):
            if c is not None and c not in rec:
                raise BertgpuError(
                    f"{where}: missing column {c!r} for GLUE {task.name} "
                    f"(found {', '.join(repr(k) for k in rec)})"
                )
        if "label" not in rec and expect_labels:
            raise BertgpuError(f"{where}: missing column 'label' for GLUE {task.name}")
        # A null text is a malformed row, as a short TSV row is (str() made it the text "None")
        bad = next((c for c in (task.hf_text_a, task.hf_text_b)
                    if c is not None and not isinstance(rec[c], str)), None)
        if bad is not None:
            if skip_malformed:
                skipped += 1
                continue
            found = "null" if rec[bad] is None else f"a {type(rec[bad]).__name__}"
            hint = ("pass --skip_malformed true to skip such rows" if expect_labels
                    else "a test file must keep every row for the leaderboard")
            raise BertgpuError(f"{where}: {found} in text column {bad!r}, expected a string for "
                               f"GLUE {task.name} ({hint})")
        label = _parse_label(task, rec.get("label"), where)
        idx = rec.get("idx")
        examples.append(Example(
            guid=str(idx) if idx not in (None, "") else str(n),
            text_a=rec[task.hf_text_a],
            text_b=rec[task.hf_text_b] if task.hf_text_b else None,
            label=label,
            location=where,
        ))
    return examples, skipped


