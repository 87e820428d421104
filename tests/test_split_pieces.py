"""mlm+nsp pieces of a split unit: a unit larger than PIECE_TOKENS travels in several pieces, and
every piece after a unit's first continues ("joins") it, whatever the unit's own joins was."""

from __future__ import annotations

import numpy as np
import pytest

import bertgpu.data.split as split
from bertgpu.data.prepare_worker import Encoded
from bertgpu.data.split import SplitPlan, nsp_pieces


def _doc(sentences: list[list[int]]) -> Encoded:
    tokens = np.concatenate([np.array(s, np.int32) for s in sentences])
    bounds = np.cumsum([len(s) for s in sentences], dtype=np.int64)
    chars = np.array([3 * len(s) for s in sentences], np.int64)
    return Encoded(tokens, None, bounds, chars)


def test_later_pieces_of_a_unit_join_it_even_when_the_unit_starts_a_document(monkeypatch):
    """Catches `_nsp_unit` not setting joins=True after its first piece: the later pieces of a
    unit that starts a document (joins False from plan.assign) would each start a new
    pseudo-document in prepare_worker.nsp_chunk, splitting the document's sentence pairs."""
    monkeypatch.setattr(split, "PIECE_TOKENS", 4)
    docs = [
        [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10, 11], [12, 13]],  # pieces: 5 | 6 | 2 tokens
        [[20, 21], [22, 23, 24], [25]],                         # pieces: 5 | 1
    ]
    plan = SplitPlan(seed=0, fraction=0.0, validation_docs=None, corpus_bytes=0)
    pieces = list(nsp_pieces([(_doc(d), True) for d in docs], plan))
    by_doc = [[p for p in pieces if p[6] == i] for i in range(len(docs))]
    assert [len(ps) for ps in by_doc] == [3, 2]
    for i, (sentences, ps) in enumerate(zip(docs, by_doc, strict=True)):
        joins = [p[4] for p in ps]
        assert joins[0] is False, f"document {i}: its first piece starts a document"
        assert all(j is True for j in joins[1:]), f"document {i}: later pieces join: {joins}"
        assert all(p[5] is False for p in ps)  # fraction 0: everything trains
        # the pieces put the document back together, sentence by sentence
        assert np.concatenate([p[0] for p in ps]).tolist() == sum(sentences, [])
        got = [s.tolist() for p in ps for s in np.split(p[0], p[1][:-1])]
        assert got == sentences
        for p in ps:
            assert p[1][-1] == len(p[0])  # bounds end at the piece's end
            assert p[2] is None  # no segmenter: no word-start flags
        assert sum(p[3] for p in ps) == sum(3 * len(s) for s in sentences)


@pytest.mark.parametrize("piece_tokens", [1, 3, 100])
def test_pieces_of_one_unit_cover_it_in_order(monkeypatch, piece_tokens):
    """Whatever the piece size, one document is one unit whose pieces rebuild it, the first
    starting the document and the rest joining (one piece when the unit is small)."""
    monkeypatch.setattr(split, "PIECE_TOKENS", piece_tokens)
    sentences = [[1, 2], [3], [4, 5, 6], [7]]
    plan = SplitPlan(seed=0, fraction=0.0, validation_docs=None, corpus_bytes=0)
    pieces = list(nsp_pieces([(_doc(sentences), True)], plan))
    assert [p[4] for p in pieces] == [False] + [True] * (len(pieces) - 1)
    assert [s.tolist() for p in pieces for s in np.split(p[0], p[1][:-1])] == sentences
    assert len(pieces) == {1: 4, 3: 3, 100: 1}[piece_tokens]


def test_a_document_in_several_pieces_stays_one_document_for_sentence_pairs(monkeypatch):
    """End to end through prepare_worker.nsp_chunk (which merges a piece into its predecessor when
    ``joins and k > 0``): catches `_nsp_unit` leaving later pieces of a document's first unit with
    joins False, which turned each one-sentence piece into a one-sentence document (random-B rows
    counted as "one_sentence_document") instead of one document of four sentences."""
    import bertgpu.data.prepare_worker as pw

    monkeypatch.setattr(split, "PIECE_TOKENS", 1)  # one sentence per piece
    monkeypatch.setattr(pw, "_STATE", {"seed": 0, "seq_len": 64, "short_seq_prob": 0.0,
                                       "cls": 101, "sep": 102})
    sentences = [[10, 11], [12, 13], [14, 15], [16, 17]]
    plan = SplitPlan(seed=0, fraction=0.0, validation_docs=None, corpus_bytes=0)
    pieces = list(nsp_pieces([(_doc(sentences), True)], plan))
    assert len(pieces) == 4
    rows = pw.nsp_chunk((0, pieces))["train"]
    assert rows["one_sentence_document"] == 0
    assert len(rows["ids"]) >= 1
