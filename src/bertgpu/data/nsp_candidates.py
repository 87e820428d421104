"""Random next segments carried from earlier chunks of a work unit to a chunk of few documents.

    carried = Candidates(seed, work_unit, max_tokens, long_chars=CHUNK_CHARS // MIN_CHUNK_DOCS,
                         min_docs=min(MIN_CHUNK_DOCS, chunk_docs))
    for index, pieces, candidates in carried.attach(work_chunks(...)): ...   # main process

`prepare_worker.nsp_chunk` takes a random B from the chunk's other documents. A chunk closes at
`pipeline.MAX_CHUNK_CHARS`, so a chunk of books (BookCorpus: ~700k characters each) holds one
to three of them: every random B of a book came from one neighbour, or from the book itself
when it was alone in its split of the chunk. BERT's create_pretraining_data draws the random
document over its whole input. Here the main process, which builds the chunks in order, keeps
per split a reservoir of B candidates from the documents already read in the unit: up to
CANDIDATES runs of whole sentences (at most ``2 * max_tokens`` tokens each, from a random start
of a document's run in a chunk), reservoir-sampled over those runs, so memory is bounded in
tokens whatever the unit holds. A chunk gets, per split, the candidates not from any of its
own documents when it holds pieces of one document, or few documents because they are long:
fewer than ``min_docs`` (`pipeline.MIN_CHUNK_DOCS`, or a smaller --chunk-docs), of
``long_chars`` or more on average (read so far: a chunk closes on its characters before it
holds ``min_docs`` of those; the last chunk of a unit of books holds few too, while a unit's
last few short documents keep their pool). The worker then draws B uniformly over the chunk's
other documents of the split and the candidates.

Other chunks get none: the rows of a corpus of short documents are what they were, but for a
chunk of one document, whose random Bs all came from it (a held-out side of a chunk of short
documents that is one of them still falls back to it). Train candidates come from train text
alone, so no held-out text is ever put into a train row. The generator is seeded from (seed,
unit) and the candidates depend on the unit's text alone: the rows do not depend on the number
of workers, and a resumed run (which redoes whole units) gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

CANDIDATES = 128  # per split: B draws spread over this many runs of earlier documents
STREAM = 0x6E7370  # the candidates' random stream of a unit, apart from its chunks' ("nsp")


class Candidates:
    """The B candidates of one work unit's splits, updated chunk after chunk."""

    def __init__(self, seed: int, work_unit: int, max_tokens: int, long_chars: int,
                 min_docs: int) -> None:
        self.rng = np.random.default_rng([seed, work_unit, STREAM])
        self.cap = 2 * max_tokens  # a candidate's tokens: a whole B from any start in its half
        self.long_chars, self.min_docs = long_chars, min_docs
        self.kept: dict[bool, list[tuple]] = {False: [], True: []}  # (tokens, bounds, flags, doc)
        self.offers = {False: 0, True: 0}  # runs offered so far, per split (reservoir sampling)
        self.doc, self.doc_chars = -1, 0  # the last document read and its characters so far
        self.read: dict[int, int] = {}  # characters read of each document of the chunk

    def attach(self, chunks: Iterable[tuple[int, list[tuple]]]) -> Iterator[tuple]:
        """``(index, pieces, {is_validation: candidates or None})`` for each chunk of
        `pipeline.work_chunks`; the chunk's runs are offered to the reservoir after."""
        for index, pieces in chunks:
            runs = self._runs(pieces)
            task = (index, pieces, self._for_chunk(runs))
            self._offer(runs)
            yield task

    def _runs(self, pieces: list[tuple]) -> list[tuple[bool, int, list[tuple]]]:
        """``(is_validation, document, pieces)`` per run of a document's pieces in one split;
        the document's characters read so far are kept across chunks (they come in order)."""
        runs: list[tuple[bool, int, list[tuple]]] = []
        self.read = {}
        for piece in pieces:
            is_val, doc = piece[5], piece[6]
            if doc != self.doc:
                self.doc, self.doc_chars = doc, 0
            self.doc_chars += piece[3]
            self.read[doc] = self.doc_chars
            if runs and runs[-1][:2] == (is_val, doc):
                runs[-1][2].append(piece)
            else:
                runs.append((is_val, doc, [piece]))
        return runs

    def _for_chunk(self, runs: list[tuple]) -> dict[bool, list[tuple] | None]:
        """Per split of the chunk, the candidates of documents other than the chunk's when it
        holds one document, or fewer than ``min_docs``, long ones on average; else None."""
        own = self.read
        few = len(own) == 1 or (len(own) < self.min_docs
                                and sum(own.values()) >= self.long_chars * len(own))
        return {split: [c[:3] for c in self.kept[split] if c[3] not in own]
                if few and any(is_val == split for is_val, _, _ in runs) else None
                for split in (False, True)}

    def _offer(self, runs: list[tuple]) -> None:
        """Each run of the chunk is offered to its split's reservoir (Algorithm R: the kept
        runs are a uniform sample of all offered so far)."""
        for split, doc, pieces in runs:
            self.offers[split] += 1
            kept = self.kept[split]
            if len(kept) < CANDIDATES:
                kept.append(self._candidate(pieces, doc))
                continue
            slot = int(self.rng.integers(0, self.offers[split]))
            if slot < CANDIDATES:
                kept[slot] = self._candidate(pieces, doc)

    def _candidate(self, pieces: list[tuple], doc: int) -> tuple:
        """Whole sentences of a run from a random start (one from which ``cap`` tokens follow,
        where there is one), up to ``cap`` tokens (a longer first sentence is cut there);
        copies, so that the chunk's arrays are not kept."""
        tokens = np.concatenate([p[0] for p in pieces])
        flags = None if pieces[0][2] is None else np.concatenate([p[2] for p in pieces])
        offsets = np.cumsum([0] + [len(p[0]) for p in pieces[:-1]])
        ends = np.concatenate([p[1] + o for p, o in zip(pieces, offsets, strict=True)])
        starts = np.concatenate([[0], ends[:-1]])
        room = int(np.searchsorted(starts, len(tokens) - self.cap, side="right"))
        s = int(self.rng.integers(0, max(1, room)))
        lo = int(starts[s])
        within = int(np.searchsorted(ends[s:], lo + self.cap, side="right"))
        hi = int(ends[s + within - 1]) if within else min(lo + self.cap, int(ends[s]))
        bounds = np.unique(ends[s : s + within]) - lo if within else np.array([hi - lo])
        bounds = bounds[bounds > 0]  # without empty sentences: at most a bound per token
        return (tokens[lo:hi].copy(), bounds.astype(np.int64),
                None if flags is None else flags[lo:hi].copy(), doc)
