"""A document's text in bounded parts, in the two forms the tokenizers need.

    for lines, first in line_parts(decoded, per_line=False, size=1 << 16): ...     # BERT's
    for text, first in running_line_parts(decoded, per_line=False, size=1 << 16): ...  # as written
    whitespace_sensitive(tokenizer.to_str())   # "its ByteLevel pre-tokenizer", or None (BERT's)

BERT's pre-tokenizer splits at whitespace and drops it, so a document may travel as stripped
lines, cut anywhere between words, and be encoded as its sentences joined by one space: the
tokens are the text's. A byte-level BPE (GPT-2, RoBERTa, ModernBERT) or Metaspace
(SentencePiece) tokenizer encodes the whitespace itself: a line break is a token, a word after a
space is another token than the same word after a line break or at the start of a text, so such
a document must keep its text as written (lines joined by their line breaks, indentation kept)
and be cut only where the cut changes no token (`last_cut`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

_INVARIANT_PRE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
"""Pre-tokenizers that split at every whitespace and drop it: the text's tokens do not depend on
which whitespace separates its words, or how much."""
_NEUTRAL_PRE = {"Punctuation", "Digits", "UnicodeScripts"}  # split further; keep no whitespace
_INVARIANT_NORMALIZERS = {"BertNormalizer", "Lowercase", "StripAccents", "NFC", "NFD", "NFKC",
                          "NFKD", "Strip"}
"""Normalisers that leave whitespace whitespace (BERT's maps each to a space)."""


def whitespace_sensitive(tokenizer_json: str) -> str | None:
    """What makes a tokenizer's tokens depend on the whitespace of the text (its pre-tokenizer
    or normaliser, in words), or None when it splits at whitespace and drops it, as BERT's does
    (then a text's lines may be stripped and joined by spaces without changing a token)."""
    state = json.loads(tokenizer_json)
    pre, norm = state.get("pre_tokenizer"), state.get("normalizer")
    if not isinstance(pre, dict):
        return "no pre-tokenizer (its model sees the whitespace)"
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") if isinstance(s, dict) else None for s in steps]
    odd = [k for k in kinds if k not in _INVARIANT_PRE | _NEUTRAL_PRE]
    if odd or not _INVARIANT_PRE.intersection(kinds):
        return f"its {odd[0] if odd else ' + '.join(map(str, kinds))} pre-tokenizer"
    nsteps = (norm.get("normalizers", []) if isinstance(norm, dict)
              and norm.get("type") == "Sequence" else [norm] if norm else [])
    for step in nsteps:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind not in _INVARIANT_NORMALIZERS:
            return f"its {kind} normaliser"
    return None


def line_parts(lines: Iterable[tuple[int, str, bool]], per_line: bool,
               size: int) -> Iterator[tuple[list[str], bool]]:
    """(stripped non-empty lines, first) parts of documents of at most about ``size`` characters,
    for BERT's tokenizers.

    A document ends at a blank line, or with ``per_line`` at the end of each line. The pieces
    of an over-long line count as lines of their own (they were cut at whitespace).
    """
    part: list[str] = []
    chars = 0
    first = True  # the next part starts a document
    line_has_text = False
    for _, piece, ends_line in lines:
        text = piece.strip()
        if text:
            part.append(text)
            chars += len(text)
            line_has_text = True
        if not ends_line:
            if chars >= size:
                yield part, first
                part, chars, first = [], 0, False
            continue
        doc_ends = line_has_text if per_line else not line_has_text
        line_has_text = False
        if doc_ends:
            if part:
                yield part, first
            part, chars, first = [], 0, True
        elif chars >= size:
            yield part, first
            part, chars, first = [], 0, False
    if part:
        yield part, first


def last_cut(text: str, lo: int = 0) -> int:
    """The last place after ``lo`` where ``text`` can be cut without changing a token: before a
    space that follows a character other than whitespace; -1 when there is none.

    There a byte-level pre-tokenizer (GPT-2's regex) ends the word before and starts " word"
    (with or without add_prefix_space: the second text starts with its space), and Metaspace
    starts "▁word". Between two lines is no such place: Metaspace keeps "a\\nb" one piece, and a
    text that starts with its line break gets a prefix space.
    """
    i = len(text)
    while (i := text.rfind(" ", lo + 1, i)) > 0:
        if not text[i - 1].isspace():
            return i
    return -1


class RunningText:
    """One document's text as written, handed on in parts of at least ``size`` characters, each
    ending at a `last_cut` place; without one, at ``most`` characters (the one cut that may
    change tokens: a run of that many characters with no space in it)."""

    def __init__(self, size: int, most: int) -> None:
        self.size, self.most = size, max(most, size)
        self.chunks: list[str] = []
        self.length = 0
        self.cut = -1  # the last cut place in the held text
        self.last = ""  # the held text's last character (a cut place needs the one before)

    def add(self, text: str) -> Iterator[str]:
        """Add the next stretch of text; yield the parts it completes."""
        if not text:
            return
        at = last_cut(self.last + text)
        if at > 0:
            self.cut = self.length + at - len(self.last)
        self.chunks.append(text)
        self.length += len(text)
        self.last = text[-1]
        if self.length >= self.size and (self.cut > 0 or self.length >= self.most):
            held = "".join(self.chunks)
            at = self.cut if self.cut > 0 else len(held)
            rest = held[at:]  # holds no cut place: ``at`` was the last
            self.chunks, self.length, self.cut = [rest] if rest else [], len(rest), -1
            yield held[:at]

    def end(self) -> str:
        """The rest of the text; the next `add` starts a new document."""
        rest = "".join(self.chunks)
        self.chunks, self.length, self.cut, self.last = [], 0, -1, ""
        return rest


def running_line_parts(lines: Iterable[tuple[int, str, bool]], per_line: bool, size: int,
                       most: int) -> Iterator[tuple[str, bool]]:
    """(text, first) parts of the documents of decoded lines (`textio.decoded_lines`), as
    written: a document's lines joined by line breaks, not stripped, cut by `RunningText`.

    A document ends at a blank line (only whitespace), or with ``per_line`` at the end of each
    line (blank lines are then no document). Pieces of an over-long line are one line.
    """
    running = RunningText(size, most)
    started = False  # the document has text
    first = True  # the next part starts a document
    blank: list[str] = []  # the line so far while it is whitespace (a blank line, or indentation)
    held = 0
    has_text = False  # the line so far has text
    for _, piece, ends_line in lines:
        if has_text:
            stretch = piece
        elif piece.strip():
            has_text = True
            stretch = ("\n" if started else "") + "".join(blank) + piece
            started, blank, held = True, [], 0
        else:
            stretch = ""
            if held < most:  # a line of whitespace is held up to what a part holds
                blank.append(piece)
                held += len(piece)
        for part in running.add(stretch):
            yield part, first
            first = False
        if not ends_line:
            continue
        doc_ends = has_text if per_line else not has_text
        blank, held, has_text = [], 0, False
        if doc_ends and started:
            rest = running.end()
            if rest:
                yield rest, first
            started, first = False, True
    if started:
        rest = running.end()
        if rest:
            yield rest, first


def running_record_parts(text: str, size: int, most: int) -> Iterator[str]:
    """A record's text (a JSON string, a table cell) as written, in `RunningText` parts; nothing
    when it is only whitespace (no document, as for BERT's tokenizers)."""
    if not text.strip():
        return
    running = RunningText(size, most)
    for start in range(0, len(text), size):
        yield from running.add(text[start : start + size])
    rest = running.end()
    if rest:
        yield rest
