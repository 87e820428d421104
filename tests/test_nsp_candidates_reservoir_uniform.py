"""The random-B reservoir keeps a uniform sample of every window offered in the unit, not the
latest text. Algorithm R keeps the n-th window with probability CANDIDATES / n; a mutation probe
found no test failing when a full reservoir replaced a kept window with every new one, which
leaves candidates only from the last few documents read (the earlier test offered too few
windows past the first CANDIDATES to tell)."""

from __future__ import annotations

import numpy as np
from test_nsp_candidates import _piece

from bertgpu.data.nsp_candidates import CANDIDATES, Candidates


def test_the_kept_windows_are_spread_over_all_the_documents_offered():
    carried = Candidates(seed=2, work_unit=5, max_tokens=29, long_chars=125, min_docs=4)
    # 200 books of 1,000 tokens, one a chunk: 18 windows each, 3,600 in all, 7 times CANDIDATES.
    chunks = [(k, [_piece(k, 1000, 20_000)]) for k in range(201)]
    given = [g for _, _, g in carried.attach(chunks)]
    kept = given[-1][False]  # what the 201st chunk gets: all of books 0-199's windows sampled
    assert len(kept) == CANDIDATES
    docs = np.array([doc for *_, doc in kept])
    assert all((t // 1000 == doc).all() for t, *_, doc in kept)
    quarters = np.bincount(docs // 50, minlength=4) / CANDIDATES
    # Uniform: a quarter each (sd 0.02); replacing on every offer leaves the first quarter
    # about 512 * exp(-2,700 / 512): 3 windows.
    assert len(quarters) == 4 and (np.abs(quarters - 0.25) < 0.08).all(), quarters
    assert len(set(docs.tolist())) > 150  # most books have a window
