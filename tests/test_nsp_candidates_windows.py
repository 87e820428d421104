"""The random-B reservoir samples windows of all the text read, not one window per document: a
review found a unit of six books offered a handful of candidates, so each was drawn as B dozens
of times (a start reused up to 79 times, 4,298 rows with a start used 10 times or more; with
windows, none used 10 times)."""

from __future__ import annotations

import numpy as np
from test_nsp_candidates import _piece

from bertgpu.data.nsp_candidates import CANDIDATES, Candidates


def test_a_long_document_offers_a_window_per_stretch_of_its_text():
    carried = Candidates(seed=1, work_unit=0, max_tokens=29, long_chars=125, min_docs=4)
    chunks = [(0, [_piece(0, 4000, 20_000)]), (1, [_piece(1, 400, 20_000)])]
    given = [g for _, _, g in carried.attach(chunks)]
    windows = given[1][False]
    assert len(windows) == 72  # 4,000 tokens in windows of 14 sentences of 4: 71 and a rest
    starts = [int(t[0]) for t, *_ in windows]
    assert starts == sorted(starts) and starts[0] == 0 and starts[-1] == 3976
    assert all(len(t) <= 58 and bounds[-1] == len(t) for t, bounds, *_ in windows)


def test_the_reservoir_is_a_sample_of_all_the_text_read():
    carried = Candidates(seed=1, work_unit=0, max_tokens=29, long_chars=125, min_docs=4)
    chunks = [(k, [_piece(k, 900, 5_000) for _ in range(20)]) for k in range(4)]  # a book each
    given = [g for _, _, g in carried.attach(chunks)]
    assert len(given[3][False]) == CANDIDATES
    counts = np.bincount([int(t[0]) // 1000 for t, *_ in given[3][False]], minlength=3)
    assert len(counts) == 3 and counts.min() > CANDIDATES // 5  # each earlier book about a third


def test_a_chunk_of_a_dozen_long_articles_keeps_its_own_pool():
    """Papers of ~45k characters: a chunk holds a dozen, enough other documents; the review
    measured that candidates there halved the distinct random Bs (and changed every shard)."""
    from bertgpu.data import pipeline

    carried = Candidates(seed=1, work_unit=0, max_tokens=125,
                         long_chars=pipeline.CHUNK_CHARS // pipeline.FEW_DOCS,
                         min_docs=pipeline.FEW_DOCS)
    papers = [(0, [_piece(d, 400, 45_000) for d in range(12)]),
              (1, [_piece(d, 400, 45_000) for d in range(12, 24)])]
    books = [(2, [_piece(24, 400, 300_000), _piece(25, 400, 300_000)])]
    given = [g for _, _, g in carried.attach(papers + books)]
    assert given[0][False] is None and given[1][False] is None
    assert given[2][False]  # two books in a chunk: the earlier documents' windows


def test_a_random_b_is_drawn_over_documents_then_over_their_windows():
    """With candidates a chunk's neighbour document (a few pseudo-documents) and an earlier book
    (hundreds of windows) are drawn alike, as BERT draws its random document; drawn window by
    window the book had outweighed the neighbour a hundred times."""
    from bertgpu.data.prepare_worker import _from_other_document

    by_document = {7: [0, 1], 8: [2, 3, 4], 3: list(range(5, 505))}  # 3: an earlier book
    rng = np.random.default_rng(0)
    picks = [_from_other_document(by_document, 7, rng) for _ in range(4000)]
    from_book = sum(p >= 5 for p in picks)
    assert 1800 < from_book < 2200 and not {0, 1} & set(picks)
