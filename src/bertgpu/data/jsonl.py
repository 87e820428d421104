"""JSON Lines corpora: the text field of each line, and one-line errors that say what a file is
when it is not JSON Lines (a pretty-printed document, an array, a missing or non-string field,
a string with an unpaired surrogate escape, which is not text, and valid JSON that Python's json
does not decode: an integer of thousands of digits, arrays nested thousands deep).
A null text field is no document, like a null in a Parquet or Arrow column: it is passed on as
None, and `corpus` counts and skips it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

from bertgpu.data.sources import Source
from bertgpu.data.textio import is_json_object_line, line_label
from bertgpu.errors import BertgpuError

_JSON_TYPES = {type(None): "null", bool: "a boolean", int: "a number", float: "a number",
               str: "a string", list: "an array", dict: "an object"}


def read_jsonl(path: Source | str, text_field: str, lines: Iterator[tuple[int, str, bool]],
                whole: bool = True) -> Iterator[tuple[str, str | None, bool]]:
    """The text fields of JSON Lines (None for a null one); ``whole``: the lines start at the
    file's start (the first record tells a JSON document, pretty-printed or an array, from JSON
    Lines; else the lines are numbered by their byte offsets, `textio.decoded_lines`)."""
    first = whole
    for lineno, line, _ in lines:
        if not line.strip():
            continue
        where = line_label(path, lineno, by_byte=not whole)
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if first and exc.pos >= len(line.rstrip()) and line.lstrip()[:1] in ("{", "["):
                raise BertgpuError(
                    f"{where}: a JSON document spread over several lines, not JSON "
                    "Lines; expected one JSON object per line (e.g. `jq -c '.[]'` writes them)"
                ) from None
            # json's message may already end in "at" ("Unterminated string starting at")
            raise BertgpuError(
                f"{where}: not valid JSON ({exc.msg.removesuffix(' at')} at column "
                f"{exc.colno}); expected one JSON object per line"
            ) from None
        except RecursionError:  # valid JSON, nested deeper than Python's json follows
            raise BertgpuError(
                f"{where}: JSON nested too deep for Python's json; expected one JSON object per "
                f"line, nested less than {sys.getrecursionlimit()} levels deep"
            ) from None
        except ValueError as exc:  # valid JSON Python's json refuses: an int of 5000 digits
            raise BertgpuError(
                f"{where}: JSON that Python's json cannot decode ({' '.join(str(exc).split())}); "
                "expected one JSON object per line"
            ) from None
        if first and isinstance(obj, list):
            raise BertgpuError(f"{where}: a JSON array, not JSON Lines; expected one "
                               "JSON object per line (e.g. `jq -c '.[]'` writes them)")
        first = False
        if isinstance(obj, dict) and text_field in obj and obj[text_field] is None:
            yield "jsonl", None, True  # a missing value, as pandas and `datasets` write None
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
            if not isinstance(obj, dict):
                found = f"found {_JSON_TYPES.get(type(obj), type(obj).__name__)}, not an object"
            elif text_field in obj:
                found = f"its value is {_JSON_TYPES.get(type(obj[text_field]), 'not a string')}"
            else:
                found = f"found fields {sorted(obj)[:8]}"
            raise BertgpuError(
                f"{where}: no string field {text_field!r} ({found}); "
                "expected a JSON object with the text (choose the field with --text-field)"
            )
        text = obj[text_field]
        # json decodes a lone \ud800-\udfff escape into a str that is not Unicode text (no
        # UTF-8 encodes it); the tokenizer would crash on it. isascii() is O(1) and an ASCII
        # text has none; else an encode (~1 ms/MB) is cheaper than looking for the escape in
        # the line, where a backslash is common (measured on JSON Lines of English text).
        if not text.isascii() and not _encodes(text):
            bad = next(c for c in text if "\ud800" <= c <= "\udfff")
            raise BertgpuError(
                f"{where}: field {text_field!r} holds a string with an unpaired surrogate "
                f"\\u{ord(bad):04x} (not UTF-8 text); expected text whose \\ud800-\\udfff escapes "
                "come in high-low pairs")
        yield "jsonl", text, True


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def not_json_lines(src: Source, items: Iterator[tuple]) -> Iterator[tuple]:
    """``items`` of a file read as sentences by its name (``.txt``), unless its first line is a
    JSON object: JSON Lines named ``.txt`` went into the vocabulary and the shards as text,
    braces, keys and all, without a word."""
    for i, item in enumerate(items):
        if i == 0 and is_json_object_line(item[1][0].encode("utf-8")):
            raise BertgpuError(
                f"{src}: named as text (one sentence per line), but its first line is a JSON "
                "object; expected --format jsonl to read its --text-field (or a name ending in "
                ".jsonl), or --format sentences to read the lines as they are")
        yield item


def null_text_message(path: str, nulls: int) -> str:
    """The "no text" error of a file whose rows' text is all null (or empty)."""
    return (f"{path}: no text (every row's text is null or empty, {nulls} of them null); "
            "expected at least one row with text (choose the column or field with --text-field)")
