"""The train/validation split of a document stream, with the held-out share the user asked for.

    plan = SplitPlan(seed=12345, fraction=0.01, validation_docs=None, corpus_chars=54_000_000)
    for sentences, joins, is_validation, chars in plan.pieces(parts):
        ...  # parts: (sentences, new_doc) from `corpus.iter_document_parts`
    plan.manifest_fields()  # {"split_unit": "document" | "chunk" | "none", "cut_documents": ...}

The stream is cut into *units*: a document, or, when a document is larger than the unit size,
consecutive chunks of it (cut between sentences). Each unit goes to train or validation, in
corpus order, by error diffusion with a random threshold: with ``H`` characters held out of
``T`` read (this unit's ``s`` included), unit ``u`` is held out when ``F * T - H >= s * r_u``,
``r_u`` uniform in [0, 1) from blake2b(seed, u). The shortfall ``F * T - H`` then always stays
within one unit, so the held-out share is ``F`` up to one unit's size, whatever the number of
documents; and which units go is random, not every k-th.

The unit size is UNIT_SHARE of the validation target, ``UNIT_SHARE * F * corpus size`` (the
corpus size estimated from the input files until more has been read), within [MIN_UNIT_CHARS,
MAX_UNIT_CHARS]. A corpus of many small documents is therefore split by whole documents; a few
large documents are split by chunks, and the plan reports how many documents ended up on both
sides (``cut_documents``, ``split_unit`` "chunk"). The first unit always trains, so that a tiny
corpus keeps a training split. ``validation_docs=N`` holds out the first N documents instead.

Every decision is made here, in the main process, from the text alone: the split does not
depend on the number of workers. Downstream a unit travels as pieces of at most PIECE_CHARS
(plus one sentence), the memory bound of the workers; a piece after the first ``joins`` it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

UNIT_SHARE = 0.1  # a unit is at most this share of the validation target: the share's tolerance
MIN_UNIT_CHARS = 256
MAX_UNIT_CHARS = 1 << 22  # a unit is held here until its size is known: bounds memory
PIECE_CHARS = 1 << 16  # units travel on in pieces of at most this size (plus a sentence)

Piece = tuple  # (sentences, joins, is_validation, chars)


def _uniform(seed: int, index: int) -> float:
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class SplitPlan:
    """Cuts ``(sentences, new_doc)`` parts into units and assigns each to train or validation.

    ``joins`` on a piece: it continues the previous piece of the stream (same document, same
    split), so a packed token stream needs no [SEP] between them.
    """

    def __init__(self, seed: int, fraction: float, validation_docs: int | None, corpus_chars: int) -> None:
        self.seed, self.fraction, self.validation_docs = seed, fraction, validation_docs
        self.corpus_chars = max(0, corpus_chars)
        self.read = 0  # characters of all units so far
        self.held = 0  # ... of the validation units
        self.units_made = 0
        self.documents = {"train": 0, "validation": 0}  # by the split of a document's first unit
        self.cut_documents = 0  # documents with units on both sides
        self._doc = -1
        self._doc_sides: set[bool] = set()
        self._previous: bool | None = None  # the split of the previous unit
        self._limit = self._unit_limit()

    def _unit_limit(self) -> int:
        if self.validation_docs is not None or self.fraction <= 0:
            return PIECE_CHARS  # nothing to balance: a unit is a piece
        target = UNIT_SHARE * self.fraction * max(self.corpus_chars, self.read)
        return int(min(MAX_UNIT_CHARS, max(MIN_UNIT_CHARS, target)))

    def _assign(self, chars: int) -> bool:
        if self.validation_docs is not None:
            return self._doc < self.validation_docs
        if self.fraction <= 0:
            return False
        u = self.units_made
        if u == 0:
            return False  # the first unit trains: a corpus of one small document keeps a train split
        shortfall = self.fraction * self.read - self.held  # self.read includes this unit
        return shortfall >= chars * _uniform(self.seed, u)

    def _close(self, sentences: list[str], chars: int, starts_doc: bool) -> Iterator[Piece]:
        """Decide a unit and yield it as pieces."""
        self.read += chars
        is_val = self._assign(chars)
        self.units_made += 1
        if is_val:
            self.held += chars
        joins = not starts_doc and self._previous == is_val
        self._previous = is_val
        self._doc_sides.add(is_val)
        if starts_doc:
            self.documents["validation" if is_val else "train"] += 1
        self._limit = self._unit_limit()
        if chars <= PIECE_CHARS:
            yield sentences, joins, is_val, chars
            return
        piece: list[str] = []
        size = 0
        for s in sentences:
            piece.append(s)
            size += len(s)
            if size >= PIECE_CHARS:
                yield piece, joins, is_val, size
                piece, size, joins = [], 0, True
        if piece:
            yield piece, joins, is_val, size

    def _end_document(self) -> None:
        self.cut_documents += len(self._doc_sides) == 2
        self._doc_sides = set()

    def pieces(self, parts: Iterable[tuple[list[str], bool]]) -> Iterator[Piece]:
        """The units of the stream in order, each as pieces once its size is known and it is decided."""
        buf: list[str] = []
        chars = 0
        starts_doc = False
        for sentences, new_doc in parts:
            if new_doc:
                if buf:
                    yield from self._close(buf, chars, starts_doc)
                self._end_document()
                self._doc += 1
                buf, chars, starts_doc = [], 0, True
            size = sum(map(len, sentences))
            if chars + size < self._limit:  # the usual case: the whole part fits
                buf.extend(sentences)
                chars += size
                continue
            for s in sentences:
                buf.append(s)
                chars += len(s)
                if chars >= self._limit:
                    yield from self._close(buf, chars, starts_doc)
                    buf, chars, starts_doc = [], 0, False
        if buf:
            yield from self._close(buf, chars, starts_doc)
        self._end_document()

    @property
    def split_unit(self) -> str:
        """"none" (no validation asked), "document", or "chunk" (some document is on both sides)."""
        if self.validation_docs is None and self.fraction <= 0 or self.validation_docs == 0:
            return "none"
        return "chunk" if self.cut_documents else "document"
