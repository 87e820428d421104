"""Your own labelled files, as `classify` and `ner` read them: rows of CSV, TSV or JSONL with
the columns the flags name, and the checks of those flags that both tasks share.

`.csv`: comma-separated, a header line, RFC 4180 quoting as written by spreadsheets and pandas;
`.tsv`: tab-separated, a header line, quoting off as in GLUE (one line is one row, a `"` is a
character); `.jsonl` / `.json` / `.ndjson`: JSON lines, one object per line. tasks/classify.py and
tasks/ner.py say what their columns hold.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import not_utf8
from bertgpu.tasks.glue_files import json_lines

if TYPE_CHECKING:
    from bertgpu.tasks.finetuning import JobRequest


TABLE_SUFFIXES = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl",
                  ".ndjson": "jsonl"}


@dataclass(frozen=True)
class Fields:
    """Column (CSV/TSV) or key (JSONL) names of the inputs; None = not used."""

    text: str = "text"
    text_pair: str | None = None
    label: str = "label"

    def __post_init__(self) -> None:
        """One column per role: a label column that is the text column trained every text as
        a class of its own (accuracy 10.00 and an id2label of reviews), without a word."""
        seen: dict[str, str] = {}  # column -> the flag that named it first
        for flag, name in (("--text-field", self.text), ("--text-pair-field", self.text_pair),
                           ("--label-field", self.label)):
            if name in seen:
                raise BertgpuError(f"{flag} {name}: the same column as {seen[name]}; expected "
                                   "another column")
            if name is not None:
                seen[name] = flag


# --------------------------------------------------------------------------------------------
# Reading rows


def table_format(path: Path) -> str:
    """"csv", "tsv" or "jsonl" from the file name; BertgpuError for anything else."""
    kind = TABLE_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise BertgpuError(f"{path}: unknown file type {path.suffix or '(no extension)'!r} "
                           f"(expected {', '.join(TABLE_SUFFIXES)})")
    return kind


def read_rows(path: str | os.PathLike[str],
              columns: Mapping[str, str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, {column: value}) for every row of a CSV, TSV or JSONL file, a row named by
    its first line. `columns` maps each column to read to the flag that names it, for the error
    when it is missing. Values are strings from CSV/TSV and JSON values from JSONL; blank lines
    are skipped."""
    path = Path(path)
    kind = table_format(path)
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: spreadsheets write a BOM
            if kind == "jsonl":
                yield from _jsonl_rows(path, f, columns)
            else:
                yield from _delimited_rows(path, f, columns, kind)
    except FileNotFoundError:
        raise BertgpuError(f"{path}: not found") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except csv.Error as e:
        raise BertgpuError(f"{path}: not readable as {kind.upper()} ({e})") from None


def _missing(path: Path, line: int, what: str, name: str, flag: str,
             found: list[str]) -> BertgpuError:
    shown = ", ".join(repr(c) for c in found[:12]) + (", ..." if len(found) > 12 else "")
    return BertgpuError(f"{path}:{line}: no {what} {name!r} (found {shown or 'none'}); "
                        f"expected {flag} to name one")


_SENTENCE_MARKS = frozenset(",!?;，。！？；：、")


def _data_cell(header: list[str]) -> str | None:
    """A cell of a first line that reads as a row of data, not column names: a number (a
    label: "1"), or text with spaces or sentence punctuation, or over 40 characters (a
    sentence: "喜欢打篮球的男生喜欢什么样的女生？"). Column names are short words ("text",
    "sentence1", "标签"); asked only when a named column is missing, so a guess wrong either way
    changes only which hint the error gives."""
    for cell in header:
        try:
            float(cell)
            return f"{cell!r} is a number"
        except ValueError:
            pass
        if (len(cell) > 40 or any(c.isspace() for c in cell)
                or any(c in _SENTENCE_MARKS for c in cell)):
            return f"{cell[:40] + ('...' if len(cell) > 40 else '')!r} reads as a text"
    return None


def _headerless(path: Path, name: str, data: str, columns: Mapping[str, str], width: int,
                kind: str) -> BertgpuError:
    """The error of a first line that looks like data (`_data_cell`): the file needs a header
    line, e.g. one of the columns asked for (with a pair column for a three-column file asked
    for a text and a label: a sentence pair per row)."""
    roles = ("--text-field", "--text-pair-field", "--label-field")  # the example's order
    names = sorted(columns, key=lambda n: roles.index(columns[n]) if columns[n] in roles else 3)
    pair = (width == 3 and len(names) == 2
            and set(columns.values()) == {"--text-field", "--label-field"})
    if pair:
        names.insert(1, "text_b")
    sep = "<TAB>" if kind == "tsv" else ","
    return BertgpuError(
        f"{path}:1: no column {name!r}: the first line is read as the header naming the "
        f"columns, and it looks like data ({data}); expected a header line first, e.g. "
        f"'{sep.join(names)}'" + (" with --text-pair-field text_b (a sentence pair per row)"
                                  if pair else "" if width == len(names)
                                  else f" (one name per column, {width} here)"))


def _delimited_rows(path: Path, f: Any, columns: Mapping[str, str], kind: str
                    ) -> Iterator[tuple[int, dict[str, Any]]]:
    if kind == "tsv":  # quoting off, as GLUE's files: a stray quote must not glue rows together
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    else:  # strict: a stray quote is an error, not rows glued into one text up to the next
        reader = csv.reader(f, strict=True)
    # a long document in one cell is a text like any other (csv's default limit is 128 KiB)
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    header = next(reader, None)
    if header is None:
        raise BertgpuError(f"{path}: empty (expected a header line naming the columns)")
    header = [h.strip() for h in header]
    for name, flag in columns.items():
        if name not in header:
            data = _data_cell(header)
            if data is not None:  # a file without a header line (CLUE's LCQMC and AFQMC)
                raise _headerless(path, name, data, columns, len(header), kind)
            raise _missing(path, 1, "column", name, flag, header)
        if header.count(name) > 1:
            raise BertgpuError(f"{path}:1: the header names column {name!r} "
                               f"{header.count(name)} times; expected each name once ({flag})")
    where = {name: header.index(name) for name in columns}
    # reader.line_num is the last line a record ended on; a row is named by its first line (where
    # an editor shows it), which differs when a quoted field spans lines
    start = reader.line_num + 1
    rows = iter(reader)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as e:
            raise BertgpuError(f"{path}:{start}: not readable as {kind.upper()} ({e}); expected "
                               "a field that starts with a quote to end with one (a quote "
                               "inside it doubled)") from None
        line, start = start, reader.line_num + 1
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            raise BertgpuError(f"{path}:{line}: {len(row)} fields, expected "
                               f"{len(header)} as in the "
                               f"header{' (a tab inside a text?)' if kind == 'tsv' else ''}")
        yield line, {name: row[i] for name, i in where.items()}


def _jsonl_rows(path: Path, f: Any,
                columns: Mapping[str, str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, obj in json_lines(path, f):
        for name, flag in columns.items():
            if name not in obj:
                raise _missing(path, n, "field", name, flag, list(obj))
        yield n, {name: obj[name] for name in columns}


# --------------------------------------------------------------------------------------------
# The flags of your own files


def check_own_files(request: JobRequest) -> None:
    """--train-file and --dev-file name existing files, and --data / --predict-test (GLUE's and
    SQuAD's) are not given. Checked once before workers start, so a typo fails one time."""
    if request.data is not None or request.predict_test:
        raise BertgpuError(f"finetune {request.key}: takes --train-file and --dev-file "
                           "(not --data or --predict-test)")
    files = (("--train-file", request.train_file), ("--dev-file", request.dev_file))
    missing = [flag for flag, path in files if path is None]
    if missing:
        verb = "are" if len(missing) > 1 else "is"
        raise BertgpuError(f"finetune {request.key}: {' and '.join(missing)} {verb} required "
                           "(your labelled files)")
    for flag, path in files:
        if path is not None and Path(path).is_dir():
            raise BertgpuError(f"{path}: is a folder, expected a file ({flag})")
        if path is not None and not Path(path).is_file():
            raise BertgpuError(f"{path}: not found ({flag})")


def own_files(request: JobRequest) -> list[Path]:
    """--train-file and --dev-file (`check_own_files` has seen them given)."""
    return [Path(f) for f in (request.train_file, request.dev_file) if f is not None]


def request_fields(request: JobRequest, default: Fields) -> Fields:
    """The columns the flags name, `default`'s where a flag is not given."""
    return Fields(request.text_field or default.text, request.text_pair_field,
                  request.label_field or default.label)


def own_files_record(request: JobRequest, fields: Fields, kind: str,
                     labels: tuple[str, ...] | None) -> dict[str, Any]:
    """What results.json records about the data of a classify or ner run."""
    return {"data": [str(request.train_file), str(request.dev_file)], "task_key": request.key,
            "kind": kind,
            "fields": {"text": fields.text, "text_pair": fields.text_pair, "label": fields.label},
            "labels": list(labels or ())}
