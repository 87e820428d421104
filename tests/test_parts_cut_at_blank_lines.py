"""A paragraph-format file cut into parts at any bytes, and in particular where a blank line
starts exactly at a part's stop: the parts together read every document exactly once (a part
whose first blank line starts at its stop owns no document; it once read the next part's first
document too)."""

from __future__ import annotations

import pytest

from bertgpu.data.corpus import Piece, convert_item, iter_document_parts, settle_parts
from bertgpu.data.corpus import iter_piece_items as items

# Documents between blank lines: runs of blank lines, a whitespace-only one, CRLF, one-line
# documents, and no final newline.
TEXT = ("One a.\nOne b.\n\nTwo.\n\n\nThree a.\nThree b.\n \nFour.\r\n\r\nFive.\n\t\n\nSix a.\n"
        "Six b.\n\nSeven.")


def _read(path, fmt, cuts):
    bounds = [0, *cuts, None]
    parts = []
    for k in range(len(bounds) - 1):  # each part on its own, as separate work units read them
        piece = Piece(path, fmt, bounds[k], bounds[k + 1], k, len(bounds) - 1)
        parts += settle_parts(convert_item(i) for i in items([piece], fmt=fmt))
    return parts


@pytest.mark.parametrize("fmt", ["sentences", "text"])
def test_three_parts_cut_at_every_pair_of_bytes_read_each_document_once(tmp_path, fmt):
    path = tmp_path / "corpus.txt"
    path.write_bytes(TEXT.encode())
    whole = list(iter_document_parts([path], fmt=fmt))
    assert sum(new for _, new in whole) == 7
    size = len(TEXT)
    # every (a, b) includes a middle part [a, b) whose stop is a blank line's start (8 of them)
    assert sum(TEXT[i - 1] == "\n" and TEXT[i] in "\r\n \t" for i in range(1, size)) == 8
    for a in range(1, size):
        for b in range(a + 1, size):
            assert _read(path, fmt, [a, b]) == whole, (a, b)
