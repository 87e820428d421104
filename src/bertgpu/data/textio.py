"""Reading raw text: files opened with on-the-fly decompression, UTF-8 lines in bounded pieces,
the lines of a byte range of a large file, and the sentence splitter every corpus format shares.

    with open_binary(Path("news.txt.gz")) as f:
        for lineno, text, ends_line in decoded_lines(path, f, piece_bytes=1 << 20):
            ...  # a line longer than 1 MiB arrives in pieces; ends_line marks its last one

Compression (gzip, bzip2, zstd) is detected by the file's first bytes and its suffix (.gz, .bz2,
.zst): a compressed file named like a plain one is still read, and a file named .gz that is not
a gzip stream is an error. Bad bytes raise ``BertgpuError`` naming the file, the line and the
byte offset; a corrupt or truncated compressed stream names the file (`read_errors`).
"""

from __future__ import annotations

import bz2
import gzip
import io
import re
import sys
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from bertgpu.data.sources import Source, name_of, open_raw
from bertgpu.errors import BertgpuError

SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".zstd": "zstd"}
_BZ2_BLOCKS = (b"1AY&SY", b"\x17rE8P\x90")  # after "BZh1".."BZh9": a block, or the empty stream


def compression_suffix(name: str) -> str | None:
    """The compression suffix a file name ends with (".gz", ...), or None."""
    lower = name.lower()
    return next((s for s in SUFFIXES if lower.endswith(s)), None)


def sniff_compression(head: bytes) -> str | None:
    """"gzip", "bz2" or "zstd" from a stream's first 10 bytes, or None for anything else."""
    if head[:3] == b"\x1f\x8b\x08":
        return "gzip"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    if head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] in _BZ2_BLOCKS:
        return "bz2"
    return None


def compression_of(src: Source, head: bytes) -> str | None:
    """The file's compression from its first bytes, checked against its suffix."""
    found = sniff_compression(head)
    suffix = compression_suffix(name_of(src))
    if suffix is not None and found is None:
        raise BertgpuError(f"{src}: named {suffix} but not a {SUFFIXES[suffix]} stream (it starts "
                           f"with {head[:4]!r}); expected a {SUFFIXES[suffix]} file")
    return found


def _peek(raw: BinaryIO, n: int) -> bytes:
    if hasattr(raw, "peek"):
        return raw.peek(n)[:n]
    if raw.seekable():
        head = raw.read(n)
        raw.seek(0)
        return head
    return b""  # a stream that cannot look ahead: decided by the suffix alone


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged file raises: OS errors, truncated streams (EOFError), zlib's and
    zstandard's own errors (neither is an OSError)."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error)
    zstd = sys.modules.get("zstandard")
    return errors + (zstd.ZstdError,) if zstd is not None else errors


class _Decompressed(io.BufferedReader):
    """A decompressing reader that also closes the stored file under it."""

    def __init__(self, reader, raw: BinaryIO) -> None:
        super().__init__(reader, buffer_size=1 << 16)
        self._under = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._under.close()


def open_binary(src: Source) -> BinaryIO:
    """Open a file for streaming bytes, decompressing gzip / bzip2 / zstd on the fly."""
    raw = open_raw(src)
    try:
        kind = compression_of(src, _peek(raw, 10))
        if kind is None and compression_suffix(name_of(src)) is None:
            return raw
        kind = kind or SUFFIXES[compression_suffix(name_of(src))]  # type: ignore[index]
        if kind == "gzip":
            return _Decompressed(gzip.GzipFile(fileobj=raw, mode="rb"), raw)
        if kind == "bz2":
            return _Decompressed(bz2.BZ2File(raw, "rb"), raw)
        try:
            import zstandard
        except ImportError:
            raise BertgpuError(f"{src}: zstd-compressed; reading it needs zstandard, expected "
                               "`pip install 'bertgpu[zstd]'`") from None
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True,
                                                            closefd=False)
        return _Decompressed(reader, raw)
    except BaseException:
        raw.close()
        raise


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


def decoded_lines(path: Source | str, f: BinaryIO, piece_bytes: int | None = None,
                  first_offset: int = 0, part: bool = False) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, ends_line) for each line, newline removed; invalid UTF-8 names line
    and byte.

    With ``piece_bytes``, a line longer than that arrives as several pieces (cut by `_cut`) with
    ``ends_line`` False on all but the last, so memory never holds more than a piece of it.
    ``first_offset``: where ``f`` starts in the file, for the byte offsets in errors. ``part``:
    ``f`` is a `LineRange` of the file: line numbers count from its start, and it may be empty.
    """
    offset = first_offset
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
        if total == 0 and first_offset == 0 and text.startswith("\ufeff"):
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
    if total == 0 and not part:
        raise BertgpuError(f"{path}: empty file; expected text")


_PEEK = 4096  # a blank line is whitespace and ends within this many bytes


def _blank(head: bytes) -> bool:
    """Whether a line whose first `_PEEK` bytes are ``head`` is blank (ends a paragraph)."""
    return not head.strip() and (head.endswith(b"\n") or len(head) < _PEEK)


class LineRange:
    """The lines a byte range ``[start, stop)`` of a large uncompressed file owns, as a stream
    with ``readline`` (what `decoded_lines` reads), so that work units can read parts of one
    file independently and together read every document exactly once.

    One document per line (``paragraphs`` False): the lines that start in the range.
    Paragraphs (documents between blank lines): a part starts after the first blank line that
    starts at or after ``start`` (a line start) and ends before the first blank line that starts
    at or after ``stop``; the part before reads its last document to its end, past ``stop``. Only
    forward reads: a part never looks back at its neighbour's bytes. ``first`` is where the owned
    bytes start.
    """

    def __init__(self, f: BinaryIO, start: int, stop: int | None, paragraphs: bool) -> None:
        self.f, self.stop, self.paragraphs = f, stop, paragraphs
        self.pending = b""  # the head of the next line, read ahead to see whether it is blank
        self.done = False
        self.pos = start
        f.seek(max(start - 1, 0))
        if start > 0 and f.read(1) != b"\n":
            self._skip_line(b"")  # to the first line start at or after `start`
        if start > 0 and paragraphs:
            blank_at = self._skip_past_blank()
            self.done = blank_at is None or (stop is not None and stop <= blank_at)
        self.first = self.pos
        self.line_start = True

    def _skip_line(self, head: bytes) -> None:
        self.pos += len(head)
        while not head.endswith(b"\n"):
            head = self.f.readline(1 << 20)
            if not head:
                return
            self.pos += len(head)

    def _skip_past_blank(self) -> int | None:
        """Read past the next blank line; where it started (None: the file ended first)."""
        while True:
            at = self.pos
            head = self.f.readline(_PEEK)
            if not head:
                return None
            if _blank(head):
                self.pos += len(head)
                return at
            self._skip_line(head)

    def readline(self, limit: int = -1) -> bytes:
        if self.done:
            return b""
        if self.line_start and self.stop is not None and self.pos >= self.stop:
            if not self.paragraphs:
                self.done = True
                return b""
            if not self.pending:
                self.pending = self.f.readline(_PEEK)
            if _blank(self.pending):  # the blank line where the next part starts
                self.done = True
                return b""
        data, self.pending = self.pending, b""
        if not data.endswith(b"\n") and (limit < 0 or len(data) < limit):
            data += self.f.readline(-1 if limit < 0 else limit - len(data))
        if 0 <= limit < len(data):
            data, self.pending = data[:limit], data[limit:]
        if not data:
            self.done = True
        self.pos += len(data)
        self.line_start = data.endswith(b"\n")
        return data


# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) and whitespace, when
# the next word does not start with a lower-case ASCII letter ("e.g. the" stays whole). CJK full
# stops end a sentence with no space after them.
_SENT_END = re.compile(r"(?<=[.!?][\"')\]’”])\s+(?=[^\sa-z])|(?<=[.!?])\s+(?=[^\sa-z])"
                       r"|(?<=[。！？])")


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences with a simple regex (good enough for NSP pairs)."""
    return [s for s in (part.strip() for part in _SENT_END.split(text)) if s]
