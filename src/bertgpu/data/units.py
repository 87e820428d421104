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

`sample_plan` and `sample_quota` spread a sample of the corpus (`bertgpu tokenizer
--sample-bytes`) over it: each file gets a share in proportion to its size, read as evenly
spaced windows (byte ranges of an uncompressed line-based file, ranges of a Parquet file's row
groups) or, for a file that cannot be cut (compressed, wiki, Arrow), read through keeping every
k-th document (`every_kth_document`; a URL's from its start, not downloaded whole). The sample
is the same on every run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from bertgpu.data.columnar import parquet_row_groups
from bertgpu.data.compressed import compression_of
from bertgpu.data.corpus import DOC_KINDS, LINE_FORMATS, Piece, RawItem, detect_format
from bertgpu.data.sources import Source, file_size, file_version, is_url, local_path, open_raw
from bertgpu.data.textsize import text_bytes
from bertgpu.errors import BertgpuError

UNIT_BYTES = 64 << 20
"""Default stored bytes per unit: about 15 M tokens of text, tens of seconds on one core; a
cluster gets enough units to balance, a re-run redoes little."""
MIN_UNIT_BYTES = 16 << 10
"""The smallest --unit-bytes: each unit costs a record, its own shards and a start-up; below a
few KiB a corpus becomes tens of thousands of them (the tests cut tiny corpora at 20 KB)."""
SAMPLE_WINDOW_BYTES = 16 << 10
"""--sample-bytes reads a file's share as windows of about this many bytes of text (UTF-8) each,
evenly spaced over the file: a file sorted by date, topic or language gives some text of every
stretch."""
SAMPLE_WINDOW_URL_BYTES = 1 << 20
"""... of a URL: each window is a request, so fewer and larger windows."""
MAX_SAMPLE_WINDOWS = 1024
"""At most this many windows per file (a large share gets larger windows)."""


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


def is_compressed(src: Source) -> bool:
    """Whether the file is a gzip, bzip2 or zstd stream (by its first bytes). A read that
    fails (a URL's reset connection) is one line naming the file, as `corpus.detect_format`
    says it: it raised out of the planning as a traceback. (Raised from what the read raised,
    `errors.from_network` tells a store's failure from bad input.)"""
    try:
        with open_raw(src) as raw:
            head = raw.read(10)
    except OSError as exc:
        raise BertgpuError(f"{src}: cannot read ({' '.join(str(exc).split())})") from exc
    return compression_of(src, head) is not None


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
    if kind in LINE_FORMATS and not is_compressed(src):
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


def _remote(src: Source) -> bool:
    """A URL whose bytes come over a network (a file:// URL is a local file)."""
    return is_url(local_path(str(src)))


def sample_plan(src: Source, size: int, fmt: str, share: float) -> tuple[list[Piece], bool]:
    """The pieces that a sample reads of one file whose share of the sample is ``share``
    bytes of text, and whether they must be read through (`every_kth_document`) rather than from
    their start up to their `sample_quota`.

    A share as large as an uncompressed file reads it all. Otherwise a line-based file is cut
    into ``share / SAMPLE_WINDOW_BYTES`` evenly spaced byte ranges (each starts at a line or
    document start, `textio.LineRange`), a Parquet file into ranges of row groups; a file that
    cannot seek (compressed, a wiki dump, Arrow) is one piece, read through (a URL's from its
    start: through, it would be downloaded whole).
    """
    kind = detect_format(src) if fmt == "auto" else fmt
    if share >= size and kind in LINE_FORMATS and not is_compressed(src):
        return split_file(src, size, kind, UNIT_BYTES), False
    # A sample takes its text a line at a time: a window of paragraphs (sentences, text) would
    # start only after a blank line, and a corpus of one sentence per line without blank lines,
    # one document, gave 16 kB of its start for a 1 MB sample. (Words are all a vocabulary
    # needs of the text; no document is asked for whole.)
    kind = "lines" if kind in ("sentences", "text") else kind
    if kind != "parquet" and (kind not in LINE_FORMATS or is_compressed(src)):
        # read through even for a share larger than the file: stored bytes are compressed. A
        # URL's is read from its start instead: reading it through would download it whole (a
        # corpus of many compressed shards is spread over its files all the same)
        return [Piece(src, kind, span=(0, size))], not _remote(src)
    window = SAMPLE_WINDOW_URL_BYTES if _remote(src) else SAMPLE_WINDOW_BYTES
    windows = min(MAX_SAMPLE_WINDOWS, math.ceil(share / window))
    return split_file(src, size, kind, math.ceil(size / windows)), False


def every_kth_document(items: Iterator[RawItem], limit: int) -> Iterator[RawItem]:
    """The raw items of one piece read through, keeping the parts of every k-th document (the
    k-th, 2k-th, ...): k starts at 1 and doubles whenever the kept text passes ``limit``
    bytes (UTF-8), so the kept documents are spread over the whole stream, the same on every
    run, and memory holds about ``limit`` bytes of text (the piece's share of the sample) and
    one part. A document kept alone is cut at ``limit`` (no part of it after that). The kept
    parts come out with the piece's closing event (end or bad)."""
    kept: list[tuple[int, RawItem]] = []
    size, k, doc = 0, 1, 0
    for item in items:
        if item[0] not in DOC_KINDS:  # the piece's end: what was kept, then the event
            yield from (it for _, it in kept)
            yield item
            kept, size = [], 0
            continue
        doc += item[2]  # documents 1, 2, ...: none stays kept for every k
        if doc % k or (size >= limit and kept[0][0] == doc):
            continue
        kept.append((doc, item))
        size += text_bytes(item)
        while size > limit and kept[0][0] != kept[-1][0]:
            k *= 2
            kept = [(d, it) for d, it in kept if d % k == 0]
            size = sum(text_bytes(it) for _, it in kept)
    yield from (it for _, it in kept)


def sample_quota(pieces: list[Piece], sample_bytes: int) -> Callable[[Piece], int]:
    """Bytes of text (UTF-8) to read from each piece so that a sample of about
    ``sample_bytes`` bytes is spread over the whole corpus in proportion to the pieces' stored
    sizes (a Chinese or Japanese text takes 3 bytes a character, as --sample-bytes counts it)."""
    total = sum(p.span[1] - p.span[0] for p in pieces if p.span) or 1

    def quota(piece: Piece) -> int:
        size = piece.span[1] - piece.span[0] if piece.span else 0
        return max(1, math.ceil(sample_bytes * size / total))

    return quota
