"""Work units of `bertgpu prepare`: the corpus cut into pieces that any engine (this machine's
processes, a Ray cluster) prepares independently and that together give the same shard set.

    units = plan_units(inputs, fmt="auto", unit_bytes=64 << 20)
    units[3].pieces        # (Piece(src, ...), ...): whole small files, or one part of a large one
    plan_record(units)     # what a re-run compares before it keeps finished units

A unit holds consecutive whole files until it reaches ``unit_bytes`` of stored bytes, or one
part of a file larger than that: a range of row groups of a Parquet file, or a byte range of an
uncompressed line-based file (`textio.LineRange` gives every document to exactly one part).
Compressed streams, wiki dumps and Arrow files cannot be cut and are one piece whatever their
size. The plan depends on the inputs (names, sizes, Parquet footers), the format and
``unit_bytes`` alone, never on the engine or the number of workers, so the output does not either.

`sample_quota` spreads a sample of the corpus (`bertgpu tokenizer --sample-bytes`) over the same
pieces in proportion to their size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

from bertgpu.data.columnar import parquet_row_groups
from bertgpu.data.compressed import compression_of
from bertgpu.data.corpus import LINE_FORMATS, Piece, detect_format
from bertgpu.data.sources import Source, file_size, file_version, open_raw
from bertgpu.errors import BertgpuError

UNIT_BYTES = 64 << 20
"""Default stored bytes per unit: about 15 M tokens of text, tens of seconds on one core; a
cluster gets enough units to balance, a re-run redoes little."""
MIN_UNIT_BYTES = 16 << 10
"""The smallest --unit-bytes: each unit costs a record, its own shards and a start-up; below a
few KiB a corpus becomes tens of thousands of them (the tests cut tiny corpora at 20 KB)."""


@dataclass(frozen=True)
class Unit:
    """Work unit ``index``: its pieces, read in order as one stream."""

    index: int
    pieces: tuple[Piece, ...]

    @property
    def bytes(self) -> int:
        return sum(p.span[1] - p.span[0] for p in self.pieces if p.span is not None)

    def describe(self) -> str:
        """The unit in a few words, for messages: its first file and how many more."""
        first = self.pieces[0]
        what = str(first.src) if first.whole else f"{first.src} part {first.part + 1}"
        more = len(self.pieces) - 1
        return f"unit {self.index} ({what}{f' and {more} more files' if more else ''})"


def _compressed(src: Source) -> bool:
    with open_raw(src) as raw:
        return compression_of(src, raw.read(10)) is not None


def split_file(src: Source, size: int, fmt: str, part_bytes: int) -> list[Piece]:
    """The pieces of one file: itself, or parts of about ``part_bytes`` when it is larger and can
    be cut."""
    whole = [Piece(src, span=(0, size))]
    if size <= part_bytes:
        return whole
    kind = detect_format(src) if fmt == "auto" else fmt
    if kind == "parquet":
        groups = parquet_row_groups(src)
        cuts, acc = [0], 0  # the first row group of each part
        for g, (_, stored, _) in enumerate(groups):
            if acc >= part_bytes:
                cuts.append(g)
                acc = 0
            acc += stored
        if len(cuts) == 1:
            return whole
        starts = [0] + [groups[g][2] for g in cuts[1:]] + [size]  # the bytes each part accounts
        ends = cuts[1:] + [None]
        return [Piece(src, kind, cuts[k], ends[k], k, len(cuts), (starts[k], starts[k + 1]))
                for k in range(len(cuts))]
    if kind in LINE_FORMATS and not _compressed(src):
        n = math.ceil(size / part_bytes)
        bounds = [size * k // n for k in range(n + 1)]
        return [Piece(src, kind, bounds[k], bounds[k + 1] if k < n - 1 else None, k, n,
                      (bounds[k], bounds[k + 1])) for k in range(n)]
    return whole


def plan_units(inputs: list[Source], fmt: str, unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """The work units of the resolved inputs, in corpus order."""
    if unit_bytes < MIN_UNIT_BYTES:
        raise BertgpuError(f"--unit-bytes {unit_bytes}: too small; expected {MIN_UNIT_BYTES} "
                           f"(16 KiB) or more (default {UNIT_BYTES >> 20} MiB)")
    units: list[Unit] = []
    group: list[Piece] = []
    stored = 0

    def close() -> None:
        nonlocal group, stored
        if group:
            units.append(Unit(len(units), tuple(group)))
        group, stored = [], 0

    for src in inputs:
        size = file_size(src)
        pieces = split_file(src, size, fmt, unit_bytes)
        if len(pieces) > 1:
            close()
            for piece in pieces:
                group = [piece]
                close()
            continue
        group.append(pieces[0])
        stored += size
        if stored >= unit_bytes:
            close()
    close()
    return units


def plan_record(units: list[Unit]) -> dict:
    """The plan as JSON data, with each file's version: equal records mean the same work."""
    versions: dict[str, str] = {}
    out = []
    for unit in units:
        pieces = []
        for piece in unit.pieces:
            key = str(piece.src)
            if key not in versions:
                versions[key] = file_version(piece.src)
            record = asdict(piece)
            record["src"] = key
            record["span"] = list(piece.span) if piece.span else None
            pieces.append(record)
        out.append(pieces)
    return {"units": out, "versions": versions}


def sample_quota(pieces: list[Piece], sample_bytes: int) -> Callable[[Piece], int]:
    """Characters of text to read from each piece so that a sample of about ``sample_bytes``
    is spread over the whole corpus in proportion to the pieces' stored sizes."""
    total = sum(p.span[1] - p.span[0] for p in pieces if p.span) or 1

    def quota(piece: Piece) -> int:
        size = piece.span[1] - piece.span[0] if piece.span else 0
        return max(1, math.ceil(sample_bytes * size / total))

    return quota
