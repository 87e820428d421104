"""Reading raw text: files opened with on-the-fly decompression, UTF-8 lines in bounded pieces,
and the sentence splitter that every corpus format shares.

    with open_binary(Path("news.txt.gz")) as f:
        for lineno, text, ends_line in decoded_lines(path, f, piece_bytes=1 << 20):
            ...  # a line longer than 1 MiB arrives in pieces; ends_line marks its last one

Bad bytes raise ``BertgpuError`` naming the file, the line and the byte offset.
"""

from __future__ import annotations

import bz2
import gzip
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bertgpu.errors import BertgpuError


def open_binary(path: Path) -> BinaryIO:
    """Open a file for streaming bytes, decompressing .bz2 / .gz on the fly."""
    name = path.name.lower()
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _cut(raw: bytes) -> int:
    """Where to end a piece of an over-long line: after its last space or tab when that keeps at
    least half of it, else before its last character (never inside a UTF-8 sequence).

    Either cut leaves the tokens unchanged for BERT's pre-tokenizer, which splits on whitespace
    and isolates every CJK character; only a single "word" longer than a piece is cut inside.
    """
    space = max(raw.rfind(b" "), raw.rfind(b"\t"))
    if space >= len(raw) // 2:
        return space + 1
    j = len(raw) - 1
    while j > 0 and raw[j] & 0xC0 == 0x80:  # continuation bytes 10xxxxxx
        j -= 1
    return j if j > 0 else len(raw)


def decoded_lines(path: Path, f: BinaryIO,
                  piece_bytes: int | None = None) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, ends_line) for each line, newline removed; invalid UTF-8 names line
    and byte.

    With ``piece_bytes``, a line longer than that arrives as several pieces (cut by `_cut`) with
    ``ends_line`` False on all but the last, so memory never holds more than a piece of it.
    """
    offset = 0
    lineno = 0
    total = 0
    carry = b""
    open_line = False  # the last piece did not end its line
    while True:
        want = -1 if piece_bytes is None else piece_bytes - len(carry)
        chunk = f.readline(want)
        raw = carry + chunk if carry else chunk
        if not raw:
            break
        carry = b""
        ends = want < 0 or chunk.endswith(b"\n") or len(chunk) < want
        if not ends:
            cut = _cut(raw)
            raw, carry = raw[:cut], raw[cut:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BertgpuError(
                f"{path}:{lineno + 1}: invalid UTF-8 byte 0x{raw[exc.start]:02x} at byte offset "
                f"{offset + exc.start}; expected UTF-8 text"
            ) from None
        if total == 0 and text.startswith("\ufeff"):
            text = text[1:]  # a byte-order mark is not text
        offset += len(raw)
        total += 1
        open_line = not ends
        if ends:
            lineno += 1
            yield lineno, text.rstrip("\r\n"), True
        else:
            yield lineno + 1, text, False
    if open_line:  # the file ended exactly at a piece boundary
        yield lineno + 1, "", True
    if total == 0:
        raise BertgpuError(f"{path}: empty file; expected text")


# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) and whitespace, when
# the next word does not start with a lower-case ASCII letter ("e.g. the" stays whole). CJK full
# stops end a sentence with no space after them.
_SENT_END = re.compile(r"(?<=[.!?][\"')\]’”])\s+(?=[^\sa-z])|(?<=[.!?])\s+(?=[^\sa-z])"
                       r"|(?<=[。！？])")


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences with a simple regex (good enough for NSP pairs)."""
    return [s for s in (part.strip() for part in _SENT_END.split(text)) if s]
