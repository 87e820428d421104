"""Reading raw text: UTF-8 lines in bounded pieces, the lines of a byte range of a large file,
and the sentence splitter every corpus format shares.

    with open_binary(Path("news.txt.gz")) as f:
        for lineno, text, ends_line in decoded_lines(path, f, piece_bytes=1 << 20):
            ...  # a line longer than 1 MiB arrives in pieces; ends_line marks its last one

Bad bytes raise ``BertgpuError`` naming the file, the line and the byte offset. Files are
opened, and decompressed on the fly, by `compressed.open_binary`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from typing import BinaryIO

from bertgpu.data.sources import Source
from bertgpu.errors import BertgpuError

CJK_IDEOGRAPHS = ("\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002a6df"
                  "\U0002a700-\U0002b73f\U0002b740-\U0002b81f\U0002b920-\U0002ceaf"
                  "\U0002f800-\U0002fa1f")
"""CJK ideographs, which BERT's normaliser makes words of their own, as a regex character class
body: the ranges of the tokenizers library's BertNormalizer, which encodes our shards and
transformers' fast tokenizers (from U+2B920: Google's BERT and transformers' slow tokenizer
start at U+2B820)."""
LONG_WORD_CHARS = 1000
"""A word with more characters than this (counting those BERT's normaliser keeps) encodes as one
[UNK] with any BERT vocabulary (their max_input_chars_per_word is 100), whatever follows it."""
_WORD_END_CANDIDATE = re.compile(f"[\\W_{CJK_IDEOGRAPHS}]")  # a superset of `_ends_word`'s chars
_CJK_CHAR = re.compile(f"[{CJK_IDEOGRAPHS}]")
_WINDOW = 8192  # bytes of a piece's end that `_cut` looks at first


def _ends_word(ch: str) -> bool:
    """Whether BERT's normaliser and pre-tokenizer end a word at ``ch``, whatever surrounds it:
    whitespace, punctuation or a CJK ideograph (tokenize_chinese_chars, true in BERT's folders
    and in every folder `bertgpu tokenizer` writes). Control and format characters are removed,
    so a word goes on across them."""
    if ch in "\t\n\r":
        return True
    category = unicodedata.category(ch)
    if category[0] == "C":
        return False
    return (ch.isspace() or category[0] == "P" or "!" <= ch <= "~" and not ch.isalnum()
            or _CJK_CHAR.match(ch) is not None)


def _counts_in_word(ch: str) -> bool:
    """Whether ``ch`` stays a character of its word through BERT's normaliser (control, format
    and replacement characters are removed; marks are, with accent stripping)."""
    return unicodedata.category(ch)[0] not in "CM" and ch != "\ufffd"


def _whole_chars(raw: bytes) -> int:
    """Bytes of ``raw`` up to an incomplete UTF-8 sequence at its end (all of it if none)."""
    i = len(raw) - 1
    while i > 0 and i > len(raw) - 4 and raw[i] & 0xC0 == 0x80:  # continuation bytes 10xxxxxx
        i -= 1
    lead = raw[i] if raw else 0
    need = 2 if 0xC0 <= lead < 0xE0 else 3 if 0xE0 <= lead < 0xF0 else 4 if lead >= 0xF0 else 1
    return i if raw and i + need > len(raw) else len(raw)


def _cut(raw: bytes) -> tuple[int, bool]:
    """Where to end a piece of an over-long line, and whether it ends inside an over-long word.

    The piece ends after the last character where BERT's normaliser and pre-tokenizer end a word
    (`_ends_word`), so the pieces give the tokens of the whole line. When the piece's last
    LONG_WORD_CHARS characters hold none, it ends inside a word that encodes as one [UNK]: it
    keeps its whole characters, and True says that the rest of the word is to be skipped
    (`_word_rest`), which keeps the one [UNK] the whole line gives. A piece too short for either
    (a tiny ``piece_bytes``) ends after its whole characters.
    """
    whole = _whole_chars(raw)
    start = max(0, whole - _WINDOW)
    while True:
        while 0 < start < len(raw) and raw[start] & 0xC0 == 0x80:
            start += 1  # a character's first byte
        text = raw[start:whole].decode("utf-8", "surrogateescape")  # bad bytes: errors later
        kept = 0
        for i in range(len(text) - 1, -1, -1):
            if _ends_word(text[i]):
                return start + len(text[: i + 1].encode("utf-8", "surrogateescape")), False
            kept += _counts_in_word(text[i])
            if kept > LONG_WORD_CHARS:
                return whole, True
        if start == 0:
            return whole or len(raw), False
        start = 0  # a window of removed characters only: look at the whole piece


def _word_rest(raw: bytes, ends: bool) -> tuple[int, bool]:
    """(bytes at the start of ``raw`` that continue an over-long word, whether it goes on after
    them); ``ends``: ``raw`` ends its line. Invalid UTF-8 raises UnicodeDecodeError."""
    whole = len(raw) if ends else _whole_chars(raw)
    text = raw[:whole].decode("utf-8")
    for match in _WORD_END_CANDIDATE.finditer(text):
        if _ends_word(match.group()):
            return len(text[: match.start()].encode("utf-8")), False
    return whole, not ends


def line_label(path: Source | str, line: int, by_byte: bool = False) -> str:
    """Where a line is, for messages: ``path:line``, or for the line numbers `decoded_lines`
    gives a part of a file that starts after its first byte, the byte offset where it starts."""
    return f"{path} (the line at byte {line})" if by_byte else f"{path}:{line}"


def decoded_lines(path: Source | str, f: BinaryIO, piece_bytes: int | None = None,
                  first_offset: int = 0, part: bool = False, a_file: bool = True,
                  whole_chars: bool = False) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, ends_line) for each line, newline removed; invalid UTF-8 names line
    and byte.

    With ``piece_bytes``, a line longer than that arrives as several pieces (cut by `_cut`) with
    ``ends_line`` False on all but the last, so memory never holds more than a piece of it. The
    pieces give BERT's tokens of the whole line: they end where a word ends, or inside a word
    of more than LONG_WORD_CHARS characters (one [UNK]), whose rest is then left out.
    ``first_offset``: where ``f`` starts in the file, for the byte offsets in errors. ``part``:
    ``f`` is a `LineRange` of the file, and may be empty; when it starts after the file's first
    byte the lines before it are not counted, so each line's "number" is the byte offset in the
    file where it starts (`line_label` with ``by_byte``). ``a_file`` False: ``f`` holds a
    record's text (a JSONL string, a table cell), whose CRs say nothing of its file's line ends.
    ``whole_chars``: a piece ends after its whole characters, nothing is left out (for a reader
    that joins the pieces again and cuts the text itself, `document_parts.RunningText`).
    """
    by_byte = part and first_offset > 0
    offset = first_offset
    line_start = first_offset
    lineno = 0
    total = 0
    carry = b""
    open_line = False  # the last piece did not end its line
    skipping = False  # ... and ended inside an over-long word, whose rest is skipped
    while True:
        want = -1 if piece_bytes is None else piece_bytes - len(carry)
        chunk = f.readline(want)
        raw = carry + chunk if carry else chunk
        if not raw:
            break
        carry = b""
        ends = want < 0 or chunk.endswith(b"\n") or len(chunk) < want
        number = line_start if by_byte else lineno + 1
        try:
            if skipping:  # its [UNK] came with the piece before: the rest gives no token
                skip, skipping = _word_rest(raw, ends)
                raw, offset = raw[skip:], offset + skip
                if skipping:
                    carry = raw  # an incomplete character at most
                    continue
            if not ends:
                cut, skipping = (_whole_chars(raw) or len(raw), False) if whole_chars else _cut(raw)
                raw, carry = raw[:cut], raw[cut:]
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BertgpuError(
                f"{line_label(path, number, by_byte)}: invalid UTF-8 byte 0x{raw[exc.start]:02x} "
                f"at byte offset {offset + exc.start}; expected UTF-8 text"
            ) from None
        if total == 0 and first_offset == 0:
            text = text.removeprefix("\ufeff")  # a byte-order mark is not text
            # the whole file one line, one document (a first line that ends in LF is a line)
            if a_file and not raw.endswith(b"\n") and text.count("\r") > 1:
                raise BertgpuError(f"{path}: lines end in CR alone (classic Mac OS); expected LF "
                                   "or CRLF line ends (convert: tr '\\r' '\\n')")
        offset += len(raw)
        total += 1
        open_line = not ends
        if ends:
            lineno += 1
            line_start = offset
            yield number, text.rstrip("\r\n"), True
        else:
            yield number, text, False
    if open_line:  # the file ended exactly at a piece boundary
        yield (line_start if by_byte else lineno + 1), "", True
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


_SNIFF_LINE = 1 << 20  # a JSON Lines record longer than this is taken on its first bytes


def first_line(head: bytes, f: BinaryIO) -> bytes:
    """The first non-blank line of a stream whose first bytes are ``head`` (at most
    `_SNIFF_LINE` bytes of it; read on from ``f`` when ``head`` does not hold it)."""
    text = head.lstrip()
    if text.startswith(b"\xef\xbb\xbf"):  # a byte-order mark
        text = text[3:].lstrip()
    while b"\n" not in text and len(text) < _SNIFF_LINE:
        more = f.read(1 << 16)
        if not more:
            break
        text = (text + more).lstrip()
    return text.split(b"\n", 1)[0][:_SNIFF_LINE]


def is_json_object_line(line: bytes) -> bool:
    """Whether a line is a JSON object: one record of JSON Lines (a line cut at `_SNIFF_LINE`
    counts when it starts like one, ``{"``)."""
    if not line.startswith(b"{"):
        return False
    if len(line) >= _SNIFF_LINE:
        return line[1:].lstrip().startswith(b'"')
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return False
    except RecursionError:  # nested deeper than Python's json follows: judged as a cut line is
        return line[1:].lstrip().startswith(b'"')


# A sentence ends at . ! ? (also the Devanagari danda, the Arabic question mark and full stop,
# the Armenian full stop and the Ethiopic full stop and question mark: scripts that space their
# words), optionally followed by a closing quote or bracket, and whitespace, when the next word
# does not start with a lower-case ASCII letter ("e.g. the" stays whole). The full stops of
# scripts that do not space their words (CJK's, full- and half-width; Burmese; Tibetan's shad),
# and ! ? after an ideograph, end a sentence with no space after them: after their closing quote
# ("你好。”然后" kept its ” out of the first sentence) and after a run of them ("！！", "།།").
_ENDS = ".!?\u0964\u0965\u061f\u06d4\u0589\u1362\u1367"
_CLOSING = "\"')\\]’”」』）》"
_CJK_ENDS = "。！？\uff61\u104b\u0f0d\u0f0e"
# The full-width full stop also writes decimals and abbreviations ("１．５倍", "Ｕ．Ｓ．"): it
# ends a sentence only between two characters that are not letters or digits of either width.
_ALNUM = "0-9A-Za-z\uff10-\uff19\uff21-\uff3a\uff41-\uff5a"
_SENT_END = re.compile(
    rf"(?<=[{_ENDS}][{_CLOSING}])\s+(?=[^\sa-z])|(?<=[{_ENDS}])\s+(?=[^\sa-z])"
    rf"|(?<=[{_CJK_ENDS}])(?![{_CJK_ENDS}!?{_CLOSING}]|\s+[\u0f0d\u0f0e])"  # Tibetan's "། །"
    rf"|(?<=[^{_ALNUM}\uff0e]\uff0e)(?![{_ALNUM}{_CJK_ENDS}!?{_CLOSING}\uff0e])"
    rf"|(?<=[{_CJK_ENDS}][{_CLOSING}])(?![{_CLOSING}])"
    rf"|(?<=[{_CJK_ENDS}][{_CLOSING}][{_CLOSING}])(?![{_CLOSING}])"  # 「…。」』
    rf"|(?<=[{CJK_IDEOGRAPHS}][!?])(?![{_CJK_ENDS}!?{_CLOSING}\s])"
    rf"|(?<=[{CJK_IDEOGRAPHS}][!?][!?])(?![{_CJK_ENDS}!?{_CLOSING}\s])")


# A part ending in a title, an abbreviation or an initial ("Dr.", "St.", "William B.", "U.S.")
# goes on into the next: 3.3% of the shipped Wikipedia sample's "sentences" were such fragments.
_ABBREVIATION_END = re.compile(
    r"(?:^|[\s(\[\"'])(?:Mr|Mrs|Ms|Dr|Prof|Rev|Hon|St|Mt|Ft|Jr|Sr|Gen|Col|Lt|Maj|Sgt|"
    r"Capt|Cmdr|Adm|Gov|Sen|Rep|Pres|Supt|vs|Inc|Ltd|Co|Corp|Bros|Jan|Feb|Mar|Apr|Jun|Jul|Aug|"
    r"Sep|Sept|Oct|Nov|Dec|approx|ca|cf|al|Fig|Vol|pp|e\.g|i\.e)\.$"
    r"|(?:^|[\s(\[\"'.])[A-Z]\.$")
_NUMBER_MARK = re.compile(r"(?:^|[\s(\[\"'])Nos?\.$")  # "No. 5": goes on before a number only
_NUMBER_START = re.compile(r"(?:\d|#|[IVXLCDM]+\b)")  # 5, #5, IX


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences with a simple regex (good enough for NSP pairs): at an
    end mark followed by a space and no lower-case word, not after a common abbreviation or an
    initial."""
    sentences: list[list[str]] = []  # the parts of each sentence, joined at the end (a chain of
    for part in _SENT_END.split(text):  # merges was quadratic when joined as it grew)
        part = part.strip()
        if not part:
            continue
        last = sentences[-1][-1][-12:] if sentences else ""
        if last.endswith(".") and (_ABBREVIATION_END.search(last) or (
                _NUMBER_START.match(part) and _NUMBER_MARK.search(last))):
            sentences[-1].append(part)
        else:
            sentences.append([part])
    return [" ".join(parts) for parts in sentences]
