"""zstd frames of the shapes zstandard writes for everyday inputs, read whole by the frame walk
that finds truncation (`compressed.ZstdFrames`): an RLE block (a long run of one byte: the block
stores one byte, not its size) and a one-shot frame of under 256 bytes (single-segment, a
1-byte content size field). Both were refused as truncated by walks that got them wrong."""

from __future__ import annotations

import pytest

from bertgpu.data.compressed import open_binary
from bertgpu.data.corpus import iter_documents

zstandard = pytest.importorskip("zstandard")  # (the dev extras install it)

SMALL = b"A short document. It has two sentences.\n"
RUN = b"First document.\n\n" + b"\n" * 300_000 + b"Second document, after a long run.\n"


def _descriptor(frame: bytes) -> tuple[int, int]:
    """(single-segment flag, content size flag) of a zstd frame (RFC 8878 3.1.1.1.1)."""
    d = frame[4]
    return d >> 5 & 1, d >> 6


def _block_types(frame: bytes) -> list[int]:
    """The block types of a frame (0 raw, 1 RLE, 2 compressed), from its block headers."""
    single, fcs = _descriptor(frame)
    i = 4 + 1 + (1 - single) + (0, 1, 2, 4)[frame[4] & 3] + (single, 2, 4, 8)[fcs]
    types = []
    while True:
        header = int.from_bytes(frame[i : i + 3], "little")
        kind, size = header >> 1 & 3, header >> 3
        types.append(kind)
        i += 3 + (1 if kind == 1 else size)
        if header & 1:
            return types


def _round_trip(tmp_path, name: str, data: bytes, stored: bytes) -> None:
    plain, packed = tmp_path / f"{name}.txt", tmp_path / f"{name}.txt.zst"
    plain.write_bytes(data)
    packed.write_bytes(stored)
    with open_binary(packed) as f:
        assert f.read() == data
    assert list(iter_documents([packed])) == list(iter_documents([plain]))


def test_a_frame_with_rle_blocks(tmp_path):
    frame = zstandard.ZstdCompressor().compress(RUN)
    assert 1 in _block_types(frame)  # (zstandard stores the run's full blocks as RLE)
    _round_trip(tmp_path, "run", RUN, frame)
    data = b"x" * 300_000  # one byte throughout
    frame = zstandard.ZstdCompressor().compress(data)
    assert 1 in _block_types(frame)
    path = tmp_path / "x.zst"
    path.write_bytes(frame)
    with open_binary(path) as f:
        assert f.read() == data


def test_a_one_shot_frame_of_under_256_bytes(tmp_path):
    frame = zstandard.ZstdCompressor().compress(SMALL)
    assert _descriptor(frame) == (1, 0)  # single segment: a 1-byte content size
    _round_trip(tmp_path, "small", SMALL, frame)


def test_frames_of_both_shapes_in_one_file(tmp_path):
    parts = [SMALL, RUN, SMALL, b"x" * 200_000 + b"\n", SMALL]
    stored = b"".join(zstandard.ZstdCompressor().compress(p) for p in parts)
    _round_trip(tmp_path, "mixed", b"".join(parts), stored)
