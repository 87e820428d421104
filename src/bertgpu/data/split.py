"""The train/validation split of a tokenized document stream, with the share the user asked for.

    plan = SplitPlan(seed=12345, fraction=0.01, validation_docs=None, corpus_tokens=13_000_000)
    for is_val, tokens, word_starts, joins in mlm_units(parts, plan): ...    # objective mlm
    for piece in nsp_pieces(parts, plan): ...                                # objective mlm+nsp
    plan.split_unit, plan.cut_documents, plan.documents

``parts`` are ``(Encoded, new_doc)`` from the pipeline's first stage (`packing.encode_items`):
the tokens of a bounded part of a document. The stream is cut into *units*: a document, or,
when a document is larger than the unit size, consecutive chunks of it (anywhere for mlm,
between sentences for mlm+nsp). Each unit goes to train or validation, in corpus order, by error
diffusion with a random threshold: with ``H`` tokens held out of ``T`` read (this unit's ``s``
included), unit ``u`` is held out when ``F * T - H >= s * r_u``, ``r_u`` uniform in [0, 1) from
blake2b(seed, u). The shortfall ``F * T - H`` always stays within one unit, so the held-out
share of the tokens is ``F`` up to one unit's size, whatever the number of documents; which
units go is random, not every k-th.

The unit size is UNIT_SHARE of the validation target, ``UNIT_SHARE * F * corpus tokens`` (the
corpus estimated from the input files' sizes until more has been read), within [``min_unit``,
MAX_UNIT_TOKENS]: the share of the tokens is F within UNIT_SHARE * F, or ``min_unit`` tokens
for a corpus too small for that (mlm+nsp asks for units of a few rows, so that their sentence
pairs are not all cut short). A corpus of many small documents is
therefore split by whole documents; a few large documents are split by chunks, and the plan
reports how many documents ended up on both sides (``cut_documents``; ``split_unit`` "chunk").
The first unit always trains, so that a tiny corpus keeps a training split.
``validation_docs=N`` holds out the first N documents instead.

`bertgpu prepare` runs one plan per work unit (`units`), so that units are independent: the
estimate is the unit's stored bytes, the random thresholds are drawn from (seed, unit, index)
(``unit`` 0 draws exactly what a single stream did), only unit 0's first unit is sure to train,
and a unit is told how many of the first N documents are still to hold out. Each work unit's
share is F within UNIT_SHARE * F, hence the corpus's too.

Every decision is made in the main process from the tokens alone, so the split does not depend
on the number of workers. A unit is held until its size is known (at most MAX_UNIT_TOKENS);
for mlm+nsp it then travels to the workers in pieces of about PIECE_TOKENS.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import numpy as np

UNIT_SHARE = 0.1  # a unit is at most this share of the validation target: the share's tolerance
MIN_UNIT_TOKENS = 64
MAX_UNIT_TOKENS = 1 << 20
PIECE_TOKENS = 1 << 15
CHARS_PER_TOKEN = 4  # for the first estimate of the corpus size from its files


def _uniform(seed: int, index: int, unit: int = 0) -> float:
    key = f"{seed}:{index}" if unit == 0 else f"{seed}:{unit}:{index}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


class SplitPlan:
    """Assigns units of a document stream to train or validation, and counts what it did."""

    def __init__(self, seed: int, fraction: float, validation_docs: int | None, corpus_bytes: int,
                 min_unit: int = MIN_UNIT_TOKENS, work_unit: int = 0) -> None:
        self.seed, self.fraction, self.validation_docs = seed, fraction, validation_docs
        self.work_unit = work_unit  # which work unit of the corpus this plan splits
        self.min_unit = min_unit
        self.estimate = max(0, corpus_bytes) // CHARS_PER_TOKEN
        self.read = 0  # tokens of all units so far
        self.held = 0  # ... of the validation units
        self.units = 0
        self.documents = {"train": 0, "validation": 0}  # by the split of a document's first unit
        self.cut_documents = 0  # documents with units on both sides
        self._doc = -1
        self._sides: set[bool] = set()
        self._starts_doc = False
        self._previous: bool | None = None  # the split of the previous unit
        self.limit = self._unit_limit()

    @property
    def balancing(self) -> bool:
        return self.validation_docs is None and self.fraction > 0

    def _unit_limit(self) -> int:
        if not self.balancing:
            return MAX_UNIT_TOKENS  # nothing to balance: a unit only bounds memory
        target = UNIT_SHARE * self.fraction * max(self.estimate, self.read)
        return int(min(MAX_UNIT_TOKENS, max(self.min_unit, target)))

    def new_document(self) -> None:
        """The previous document ended (a document without tokens trains);
        the next unit starts one."""
        if self._starts_doc and self._doc >= 0:
            self.documents["train"] += 1
        self.cut_documents += len(self._sides) == 2
        self._sides = set()
        self._doc += 1
        self._starts_doc = True

    def assign(self, size: int) -> tuple[bool, bool]:
        """(is_validation, joins) of the next unit, of ``size`` tokens; ``joins``: it continues the
        previous unit (same document, same split), so a packed stream needs no [SEP] between."""
        self.read += size
        if self.validation_docs is not None:
            is_val = self._doc < self.validation_docs
        elif self.fraction <= 0 or (self.units == 0 and self.work_unit == 0):
            # the first unit trains: a corpus of one small document keeps a train split
            is_val = False
        else:
            shortfall = self.fraction * self.read - self.held  # self.read includes this unit
            is_val = shortfall >= size * _uniform(self.seed, self.units, self.work_unit)
        self.units += 1
        self.held += size * is_val
        joins = not self._starts_doc and self._previous == is_val
        if self._starts_doc:
            self.documents["validation" if is_val else "train"] += 1
        self._starts_doc = False
        self._previous = is_val
        self._sides.add(is_val)
        self.limit = self._unit_limit()
        return is_val, joins

    @property
    def split_unit(self) -> str:
        """"none" (no validation asked), "document", or "chunk" (some document is on both sides)."""
        if not self.balancing and not self.validation_docs:
            return "none"
        return "chunk" if self.cut_documents else "document"


class _Run:
    """Token arrays (and word-start flags) gathered for the unit being built."""

    def __init__(self) -> None:
        self.tokens: list[np.ndarray] = []
        self.flags: list[np.ndarray] = []
        self.size = 0

    def _clear(self) -> None:
        self.tokens, self.flags, self.size = [], [], 0

    def add(self, tokens: np.ndarray, flags: np.ndarray | None) -> None:
        self.tokens.append(tokens)
        if flags is not None:
            self.flags.append(flags)
        self.size += len(tokens)

    def take(self) -> tuple[np.ndarray, np.ndarray | None]:
        tokens = np.concatenate(self.tokens) if len(self.tokens) > 1 else self.tokens[0]
        flags = ((np.concatenate(self.flags) if len(self.flags) > 1 else self.flags[0])
                 if self.flags else None)
        self._clear()
        return tokens, flags


def mlm_units(parts: Iterable[tuple],
              plan: SplitPlan) -> Iterator[tuple[bool, np.ndarray, np.ndarray | None, bool]]:
    """``(is_validation, tokens, word_starts, joins)`` of each unit, in order
    (mlm: cut anywhere)."""
    run = _Run()
    for enc, new_doc in parts:
        if new_doc:
            if run.size:
                yield _decided(plan, run)
            plan.new_document()
        pos, n = 0, len(enc.tokens)
        while pos < n:
            take = min(plan.limit - run.size, n - pos)
            run.add(enc.tokens[pos : pos + take],
                    None if enc.word_starts is None else enc.word_starts[pos : pos + take])
            pos += take
            if run.size >= plan.limit:
                yield _decided(plan, run)
    if run.size:
        yield _decided(plan, run)
    plan.new_document()


def _decided(plan: SplitPlan, run: _Run) -> tuple[bool, np.ndarray, np.ndarray | None, bool]:
    is_val, joins = plan.assign(run.size)
    tokens, flags = run.take()
    return is_val, tokens, flags, joins


def nsp_pieces(parts: Iterable[tuple], plan: SplitPlan) -> Iterator[tuple]:
    """Pieces ``(tokens, bounds, word_starts, chars, joins, is_validation, document)`` of each
    unit, in order.

    mlm+nsp units are cut between sentences; ``bounds`` holds each sentence's end in ``tokens``
    and ``chars`` the piece's characters. A piece after the first of a unit ``joins`` it.
    ``document`` numbers the documents of the stream: the sides of a document cut by the split
    are separate runs of sentences (a next sentence never spans a held-out chunk) but still one
    document, which a random next segment must not come from (`prepare_worker`).
    """
    unit: list[tuple] = []  # (tokens, word_starts, chars) per sentence
    size = 0
    doc = -1
    for enc, new_doc in parts:
        if new_doc:
            if unit:
                yield from _nsp_unit(plan, unit, size, doc)
                unit, size = [], 0
            plan.new_document()
            doc += 1
        start = 0
        for end, chars in zip(enc.bounds.tolist(), enc.chars.tolist(), strict=True):
            flags = None if enc.word_starts is None else enc.word_starts[start:end]
            unit.append((enc.tokens[start:end], flags, chars))
            size += end - start
            start = end
            if size >= plan.limit:
                yield from _nsp_unit(plan, unit, size, doc)
                unit, size = [], 0
    if unit:
        yield from _nsp_unit(plan, unit, size, doc)
    plan.new_document()


def _nsp_unit(plan: SplitPlan, sentences: list[tuple], size: int, doc: int) -> Iterator[tuple]:
    is_val, joins = plan.assign(size)
    piece: list[tuple] = []
    tokens = 0
    for k, sentence in enumerate(sentences):
        piece.append(sentence)
        tokens += len(sentence[0])
        if tokens >= PIECE_TOKENS or k == len(sentences) - 1:
            lengths = [len(s[0]) for s in piece]
            flags = np.concatenate([s[1] for s in piece]) if piece[0][1] is not None else None
            yield (np.concatenate([s[0] for s in piece]), np.cumsum(lengths, dtype=np.int64), flags,
                   sum(s[2] for s in piece), joins, is_val, doc)
            piece, tokens, joins = [], 0, True
