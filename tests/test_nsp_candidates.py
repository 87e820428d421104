"""`nsp_candidates.Candidates`: which chunks get random-B candidates of earlier documents, and
that the candidates are bounded, deterministic and never from the chunk's own documents."""

from __future__ import annotations

import numpy as np

from bertgpu.data.nsp_candidates import CANDIDATES, Candidates


def _piece(doc: int, tokens: int, chars: int, is_val: bool = False, flags: bool = False) -> tuple:
    """A piece of ``doc`` of sentences of 4 tokens whose ids tell the document (1000 * doc + k)."""
    ids = np.arange(tokens, dtype=np.int32) + 1000 * doc
    starts = (ids % 4 == 0).astype(np.uint8) if flags else None
    return (ids, np.arange(4, tokens + 1, 4, dtype=np.int64), starts, chars, False, is_val, doc)


def test_which_chunks_get_candidates():
    """Chunks of short documents keep their own pool (their rows stay as they were), however few
    (a unit's last chunk); a chunk of few long documents, or of one document's pieces, gets the
    runs of the unit's earlier documents of its split, never of its own documents."""
    carried = Candidates(seed=1, work_unit=0, max_tokens=29, long_chars=125, min_docs=16)
    chunks = [(0, [_piece(d, 40, 100) for d in range(20)]),  # short documents
              (1, [_piece(20, 40, 100), _piece(21, 40, 100, is_val=True), _piece(22, 40, 100)]),
              (2, [_piece(22, 40, 200), _piece(23, 40, 300, is_val=True)]),  # long, on average
              (3, [_piece(23, 40, 100), _piece(23, 40, 100, is_val=True)]),  # one document
              (4, [_piece(23, 40, 100)])]
    given = [g for _, _, g in carried.attach(chunks)]
    assert given[0] == given[1] == {False: None, True: None}
    assert len(given[2][False]) == 21 and len(given[2][True]) == 1  # 0-20 (21: held out); 21
    assert len(given[3][False]) == 23 and len(given[3][True]) == 1 and given[4][True] is None
    ids = {d for g in given[2:] for split in g.values() for t, *_ in split or () for d in
           set((t // 1000).tolist())}
    assert ids <= set(range(23)) and 23 not in ids


def test_the_candidates_are_bounded_in_tokens_and_exclude_the_chunks_documents():
    carried = Candidates(seed=1, work_unit=3, max_tokens=29, long_chars=125, min_docs=16)
    chunks = [(k, [_piece(k, 400, 20_000, flags=True)]) for k in range(3 * CANDIDATES)]
    tasks = list(carried.attach(chunks))
    assert tasks[0][2][False] == []
    for index, _, given in tasks[1:]:
        assert 0 < len(given[False]) <= min(8 * index, CANDIDATES)  # 8 windows a chunk
        assert all(len(t) <= 58 and (t // 1000 != index).all() and bounds[-1] == len(t)
                   and np.array_equal(flags, (t % 4 == 0)) for t, bounds, flags, _ in given[False])
    again = list(Candidates(seed=1, work_unit=3, max_tokens=29, long_chars=125,
                            min_docs=16).attach(chunks))
    assert all(np.array_equal(x[0], y[0]) for (_, _, g), (_, _, h) in zip(tasks, again,
                                                                        strict=True)
               for x, y in zip(g[False], h[False], strict=True))
