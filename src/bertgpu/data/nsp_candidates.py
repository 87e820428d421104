"""Random next segments carried from earlier chunks of a work unit to a chunk of few documents.

    carried = Candidates(seed, work_unit, max_tokens, long_chars=CHUNK_CHARS // FEW_DOCS,
                         min_docs=min(FEW_DOCS, chunk_docs))
    for index, pieces, candidates in carried.attach(work_chunks(...)): ...   # main process

`prepare_worker.nsp_chunk` takes a random B from the chunk's other documents. A chunk closes at
`pipeline.MAX_CHUNK_CHARS`, so a chunk of books (BookCorpus: ~700k characters each) holds one to
three of them: every random B of a book came from one neighbour, or from the book itself when it
was alone in its split of the chunk. BERT's create_pretraining_data draws the random document
over its whole input. Here the main process, which builds the chunks in order, keeps per split a
reservoir of B candidates from the documents already read in the unit: up to CANDIDATES windows
of whole sentences (at most ``2 * max_tokens`` tokens each, the text read so far cut into
consecutive windows), reservoir-sampled over all those windows, so memory is bounded in tokens
whatever the unit holds. A chunk gets, per split, the candidates not from any of its own
documents when it holds pieces of one document, or few documents because they are long: fewer
than ``min_docs`` (`pipeline.FEW_DOCS`, 4, or a smaller --chunk-docs), of ``long_chars`` (a
quarter of `pipeline.CHUNK_CHARS`) or more on average (read so far; the last chunk of a unit of
books holds few too, while a unit's last few short documents keep their pool). Chunks of a dozen
long articles (papers, ~45k characters) keep their own pool: a review measured that the
candidates, each weighed as a whole document, halved their distinct random Bs. The worker draws
B uniformly over the chunk's other documents of the split and the candidates.

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

CANDIDATES = 512  # per split: B draws spread over this many windows of earlier text
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
        return {split: [c for c in self.kept[split] if c[3] not in own]
                if few and any(is_val == split for is_val, _, _ in runs) else None
                for split in (False, True)}

    def _offer(self, runs: list[tuple]) -> None:
        """Each run of the chunk, cut into windows of whole sentences of at most ``cap`` tokens,
        offers its windows to its split's reservoir (Algorithm R: the kept windows are a
        uniform sample of all the text read so far, not one window per document: a unit of six
        books had offered a handful, each drawn as B dozens of times)."""
        for split, doc, pieces in runs:
            tokens = np.concatenate([p[0] for p in pieces])
            flags = None if pieces[0][2] is None else np.concatenate([p[2] for p in pieces])
            offsets = np.cumsum([0] + [len(p[0]) for p in pieces[:-1]])
            ends = np.concatenate([p[1] + o for p, o in zip(pieces, offsets, strict=True)])
            for lo, hi, bounds in self._windows(ends):
                self.offers[split] += 1
                kept = self.kept[split]
                slot = len(kept) if len(kept) < CANDIDATES else \
                    int(self.rng.integers(0, self.offers[split]))
                if slot >= CANDIDATES:
                    continue
                window = (tokens[lo:hi].copy(), bounds,  # copies: the chunk's arrays go
                          None if flags is None else flags[lo:hi].copy(), doc)
                if slot == len(kept):
                    kept.append(window)
                else:
                    kept[slot] = window

    def _windows(self, ends: np.ndarray) -> Iterator[tuple[int, int, np.ndarray]]:
        """(start, end, sentence ends within) of consecutive windows of whole sentences of at
        most ``cap`` tokens (a longer sentence is a window of its first ``cap``)."""
        starts = np.concatenate([[0], ends[:-1]])
        s = 0
        while s < len(ends):
            lo = int(starts[s])
            within = int(np.searchsorted(ends[s:], lo + self.cap, side="right"))
            if within == 0:  # one sentence longer than a window
                yield lo, lo + self.cap, np.array([self.cap], dtype=np.int64)
                s += 1
                continue
            bounds = np.unique(ends[s : s + within]) - lo
            yield lo, int(ends[s + within - 1]), bounds[bounds > 0].astype(np.int64)
            s += within
