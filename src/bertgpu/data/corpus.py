"""Raw-text readers: every corpus format becomes a stream of documents, each a stream of parts.

    from bertgpu.data.corpus import iter_document_parts, iter_documents
    for sentences, new_doc in iter_document_parts(["wiki.xml.bz2", "books/", "web/*.jsonl"]):
        ...  # a bounded run of sentences; new_doc marks the first part of each document
    for doc in iter_documents(["small.txt"]):
        ...  # doc: list[str], a whole document (held in memory: for small corpora and tests)

Formats (``fmt``; "auto" picks one per file from its name):

- ``sentences``: one sentence per line, blank lines between documents (the original BERT
  ``sample_text.txt`` format). The default for any name not listed below; under auto, a file
  whose first line is a JSON object is refused (JSON Lines named ``.txt``).
- ``text``: plain text; each paragraph (blank-line separated) is a document, split into
  sentences by a simple regex so that next-sentence prediction has sentences to pair.
- ``lines``: one document per line (reviews, tweets, scraped paragraphs), split into sentences
  like ``text``; blank lines are ignored.
- ``jsonl``: one JSON object per line, the document in a string field (``text`` by default).
  Auto for ``.jsonl`` / ``.json`` (optionally ``.bz2`` / ``.gz``), and for a file of another
  name whose first non-blank line is a JSON object (Spark's ``part-00000``). A JSON document
  (pretty-printed, or an array) is refused as such.
- ``wiki``: a MediaWiki XML dump (``.xml``, ``.xml.bz2``, or a file of another name whose
  content starts like one). Articles only (namespace 0, no redirects), markup stripped
  (`wikitext`).
- ``parquet`` / ``arrow``: the ``--text-field`` column (``text`` by default) of each row is a
  document, read by row groups in batches (`columnar`); Arrow: an IPC file or stream (Hugging
  Face ``datasets``' save_to_disk). Auto for ``.parquet``, ``.pq``, ``.arrow`` and the magics.

Memory does not depend on the length of a document, a wiki article (one XML element) aside: a
document is read as parts of about PART_CHARS characters and a line longer than LINE_PIECE_BYTES
as pieces; a JSONL record (one JSON value) or a row's text is read whole, then cut the same way.
For a tokenizer whose tokens depend on whitespace (byte-level BPE, Metaspace), `prepare` reads
each document as written instead (``as_written``): lines joined by their line breaks, indentation
kept, cut only where that changes no token (`document_parts`).
gzip, bzip2 and zstd files are decompressed on the fly (`textio`); paths may be URLs (`sources`).

What is read is a list of `Piece`s: a whole file, or a part of a large one (a byte range of an
uncompressed line-based file, `textio.LineRange`; a range of a Parquet file's row groups), the
work units of `bertgpu prepare` (`units`).

Stages, so that a caller can run the expensive one on other cores (``bertgpu prepare`` does):

- `iter_raw_documents` (cheap, sequential): decompress, decode, parse; yields raw items
  ``(kind, payload, first)``: a part of a document still to be split (a block of lines, a
  paragraph, a JSON text field, an article's wikitext), ``first`` on a document's first part;
  and file events (``("end", path, False)``, for a part of a file ``("slice", path, False)``,
  ``("bad", (path, reason), False)``) that keep the per-file bookkeeping in order.
- `convert_items` (expensive, per part, independent): markup stripping and sentence splitting;
  turns each raw part into ``("part", sentences, first)``, passes events through.
- `settle_parts` (cheap, in order): drops empty parts, counts documents, and turns a file that
  produced no text into the "no text" error (or a skipped file). It also takes parts that a
  later stage already processed (`prepare` tokenizes them first: a falsy payload is empty, and
  a ``("no_tokens", None, first)`` part had only text that gave no token).

`iter_document_parts` chains the three in one process; `iter_documents` joins the parts.

Bad input raises ``BertgpuError`` naming the file and line. With ``skip_bad=True`` reading of
that file stops at the first problem instead, the file is counted in ``CorpusStats.skipped``,
and the next file is read; parts that came before the problem were already yielded (the file
is then in ``CorpusStats.partial``: `bertgpu prepare` reads such a unit again without it).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bertgpu.data.columnar import read_arrow, read_parquet
from bertgpu.data.compressed import check_rest, compression_suffix, open_binary, read_errors
from bertgpu.data.document_parts import line_parts, running_line_parts, running_record_parts
from bertgpu.data.jsonl import not_json_lines, null_text_message, read_jsonl
from bertgpu.data.sources import Source, file_size, name_of, open_raw, resolve_inputs
from bertgpu.data.textio import (
    LineRange,
    decoded_lines,
    first_line,
    is_json_object_line,
    split_sentences,
)
from bertgpu.data.textsize import cut_part, text_bytes
from bertgpu.data.wikitext import read_wiki, wiki_to_sentences
from bertgpu.errors import BertgpuError, from_network

__all__ = ["FORMATS", "CorpusStats", "Piece", "detect_format", "iter_documents",
           "iter_document_parts", "iter_piece_items", "iter_raw_documents", "null_text_message",
           "resolve_inputs", "settle_parts"]

FORMATS = ("auto", "sentences", "text", "lines", "jsonl", "wiki", "parquet", "arrow")
LINE_FORMATS = ("sentences", "text", "lines", "jsonl")  # a file of these may be read in parts
TABLE_FORMATS = ("parquet", "arrow")
PART_CHARS = 1 << 16  # a document of the line-based formats travels in parts of about this size
LINE_PIECE_BYTES = 1 << 20  # ... and a longer line in pieces of at most this many bytes


@dataclass
class CorpusStats:
    """What a pass over the inputs read: filled in by the stream as it goes."""

    files: int = 0
    """Files read to the end without a problem."""
    documents: int = 0
    """Documents yielded (from all files, skipped ones included)."""
    bytes: int = 0
    """Bytes of the inputs as stored (compressed size for .bz2 / .gz / .zst), counted as each
    file (or part of a file) starts."""
    read: int = 0
    """Stored bytes read so far, as the readers go (for the progress line)."""
    slices: dict[str, int] = field(default_factory=dict)
    """Parts of a file read in parts (work units): path -> parts of text found, so that whoever
    sees every part can tell a file without text."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of each file abandoned because of bad input (only with skip_bad)."""
    partial: list[str] = field(default_factory=list)
    """The skipped files that had yielded text before their problem (a caller that must leave
    them out whole reads the others again)."""
    nulls: dict[str, int] = field(default_factory=dict)
    """path -> rows whose text is null (a Parquet or Arrow null, a JSON null), skipped: a
    missing value is no document, in every format alike."""

    def summary(self, documents: bool = True) -> str:
        """"3 files, 120 documents, 2 null texts skipped, 1 skipped" (the reasons: ``skipped``;
        ``documents`` False: without the count, which a sample read by lines does not know)."""
        text = _plural(self.files, "file") + (f", {_plural(self.documents, 'document')}"
                                               if documents else "")
        if self.nulls:
            text += f", {_plural(sum(self.nulls.values()), 'null text')} skipped"
        return text + (f", {len(self.skipped)} skipped" if self.skipped else "")


WIKI_SAMPLE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
"""The 106 English Wikipedia articles (a MediaWiki .xml.bz2 dump) in gensim's test data."""


def gensim_test_data(name: str) -> Path:
    """Path of a file shipped in gensim's test data (real text for the demo and the tests).

    gensim is never imported (that takes seconds and pulls scipy); only its folder is located.
    """
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise BertgpuError(
            f"gensim test data {name!r}: gensim is not installed; "
            "expected `pip install bertgpu[demo]` (it ships a real Wikipedia sample)"
        )
    for base in spec.submodule_search_locations:
        path = Path(base) / "test" / "test_data" / name
        if path.is_file():
            return path
    raise BertgpuError(f"gensim test data {name!r}: not found in "
                       f"{list(spec.submodule_search_locations)}")


@dataclass(frozen=True)
class Piece:
    """What one reader reads: a whole file, or part ``part`` of ``parts`` of a large one.

    A part is ``[start, stop)`` in bytes (a line-based format, uncompressed: `textio.LineRange`)
    or in row groups (Parquet); ``stop`` None runs to the end. ``kind`` is the reader when the
    planner already detected it (None: detect when read). ``span`` is the stored bytes the piece
    accounts for (its share of the file's size and checksum; None: the whole file).
    """

    src: Source
    kind: str | None = None
    start: int = 0
    stop: int | None = None
    part: int = 0
    parts: int = 1
    span: tuple[int, int] | None = None

    @property
    def whole(self) -> bool:
        return self.parts == 1


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


_KNOWN = {".jsonl": "jsonl", ".json": "jsonl", ".xml": "wiki", ".parquet": "parquet",
          ".pq": "parquet", ".arrow": "arrow", ".txt": "sentences", ".text": "sentences"}


def detect_format(src: Source) -> str:
    """The reader for a file, from its name; a name without a known extension (after any
    compression suffix) is sniffed: Parquet or Arrow magic, a MediaWiki dump, JSON Lines (the
    first non-blank line is a JSON object), else sentences."""
    name = name_of(src).lower()
    suffix = compression_suffix(name)
    base = name[: -len(suffix)] if suffix else name
    ext = os.path.splitext(base)[1]
    if ext in _KNOWN:
        return _KNOWN[ext]
    # Wikipedia's dump chunks are named like "...articles1.xml-p10p30302.bz2"; Spark writes
    # "part-00000" files: the content says what they are.
    try:
        with open_raw(src) as raw:
            magic = raw.read(6)
        if magic[:4] == b"PAR1":
            return "parquet"
        if magic == b"ARROW1":
            return "arrow"
        with open_binary(src, check=False) as f:  # a tar, an xz: refused when read
            head = f.read(4096)
            first = first_line(head, f)
    except read_errors() as exc:
        raise BertgpuError(f"{src}: cannot read ({' '.join(str(exc).split())})") from None
    if b"<mediawiki" in head:
        return "wiki"
    return "jsonl" if is_json_object_line(first) else "sentences"


# --------------------------------------------------------------------------- readers

RawItem = tuple  # (kind, payload, first): see the module docstring
DOC_KINDS = ("lines", "text", "jsonl", "wiki")  # parts of raw documents; the rest are file events


def _text_items(label: Source | str, f: BinaryIO, kind: str, text_field: str,
                part: LineRange | None = None, as_written: bool = False) -> Iterator[RawItem]:
    """The raw items of a line-based or wiki stream (``part``: ``f`` is a part of a file;
    ``as_written``: see `iter_piece_items`)."""
    if kind == "wiki":
        yield from (("wiki", article, True) for article in read_wiki(label, f))
        return
    pieces = None if kind == "jsonl" else LINE_PIECE_BYTES
    lines = decoded_lines(label, f, pieces, first_offset=part.first if part else 0,
                          part=part is not None, whole_chars=as_written)
    if as_written and kind != "jsonl":  # one "sentence": the text, line breaks and all
        for text, first in running_line_parts(lines, kind == "lines", PART_CHARS,
                                              LINE_PIECE_BYTES):
            yield "lines", [text], first
    elif kind == "sentences":  # one sentence per line: final already
        yield from (("lines", block, first) for block, first in line_parts(lines, False,
                                                                            PART_CHARS))
    elif kind in ("text", "lines"):  # a paragraph (or a line) per document, lines joined
        for block, first in line_parts(lines, kind == "lines", PART_CHARS):
            yield "text", " ".join(block), first
    else:
        yield from read_jsonl(label, text_field, lines, whole=part is None or part.first == 0)


def _read_piece(piece: Piece, fmt: str, text_field: str, stats: CorpusStats,
                as_written: bool = False) -> Iterator[RawItem]:
    """The raw items of a piece; ``stats.read`` follows the stored bytes read so far."""
    src = piece.src
    kind = piece.kind or (detect_format(src) if fmt == "auto" else fmt)
    # a misnamed .jsonl (auto finds no "lines": those are a sample's lines of "sentences")
    json_check = fmt == "auto" and kind in ("sentences", "lines") and piece.part == 0
    base = stats.read
    try:
        if kind in TABLE_FORMATS:  # a row's text is a document, like a JSONL line's
            rows = (read_parquet(src, text_field, piece.start, piece.stop) if kind == "parquet"
                    else read_arrow(src, text_field))
            yield from _records(src, (("jsonl", text, True) for text in rows), stats, as_written)
        elif not piece.whole:
            if kind not in LINE_FORMATS:
                raise ValueError(f"{src}: a {kind} file is not read in parts")
            with open_binary(src) as raw:  # uncompressed (`units`): the stored bytes
                part = LineRange(raw, piece.start, piece.stop, kind in ("sentences", "text"))
                items = _text_items(src, part, kind, text_field, part,  # type: ignore[arg-type]
                                    as_written)
                items = _not_json_lines(src, items) if json_check else items
                for item in _records(src, items, stats, as_written):
                    yield item
                    stats.read = base + part.pos - piece.start
        else:
            with open_binary(src) as f:
                stored = getattr(f, "_under", f)  # under a decompressor: the compressed bytes
                items = _text_items(src, f, kind, text_field, None, as_written)
                items = _not_json_lines(src, items) if json_check else items
                try:
                    for item in _records(src, items, stats, as_written):
                        yield item
                        stats.read = base + stored.tell()
                except BertgpuError as exc:  # damage to a compressed stream shows as bad text
                    raise check_rest(src, f, exc) from None
    except read_errors() as exc:  # unreadable, or a truncated / corrupt compressed stream
        raise BertgpuError(f"{src}: cannot read ({' '.join(str(exc).split())})") from None


def _not_json_lines(src: Source, items: Iterator[RawItem]) -> Iterator[RawItem]:
    """`jsonl.not_json_lines` on the first line of the first part (one as written holds lines)."""
    for i, item in enumerate(items):
        if i == 0:  # (a sample's windows read paragraphs a line at a time: a "text" item)
            text = item[1] if isinstance(item[1], str) else item[1][0]
            first = text.lstrip().split("\n", 1)[0].rstrip()
            next(not_json_lines(src, iter([(item[0], [first], item[2])])))
        yield item


def _records(src: Source, items: Iterator[RawItem], stats: CorpusStats,
             as_written: bool = False) -> Iterator[RawItem]:
    """``items`` without the rows whose text is null (counted in ``stats.nulls``), and a JSONL
    record's or a row's text over PART_CHARS characters in parts, cut like a document's lines
    (`document_parts`; a blank line ends no document here): else every later stage held it
    whole (a record of 20 MB took `prepare` 2.3 GB, the same text as lines 0.2 GB). As written
    (`iter_piece_items`), a text is a part of ``("lines", [text], first)``."""
    for kind, text, first in items:
        if text is None:
            stats.nulls[str(src)] = stats.nulls.get(str(src), 0) + 1
        elif as_written and kind == "jsonl":
            for k, part in enumerate(running_record_parts(text, PART_CHARS, LINE_PIECE_BYTES)):
                yield "lines", [part], first and k == 0
        elif kind != "jsonl" or len(text) <= PART_CHARS:
            yield kind, text, first
        else:
            f = io.BytesIO(text.encode("utf-8"))
            lines = (line for line in decoded_lines(src, f, LINE_PIECE_BYTES, a_file=False)
                     if line[1].strip())
            for block, first_part in line_parts(lines, False, PART_CHARS):
                yield kind, "\n".join(block), first and first_part


# --------------------------------------------------------------------------- the stream


def iter_piece_items(pieces: Iterable[Piece], fmt: str = "auto", text_field: str = "text",
                     skip_bad: bool = False, stats: CorpusStats | None = None,
                     quota: Callable[[Piece], int | None] | None = None,
                     as_written: bool = False) -> Iterator[RawItem]:
    """The cheap, sequential stage: raw document parts and file events of the pieces, in order.

    Only ``stats.bytes`` is counted here; `settle_parts` counts the rest. A bad file raises
    `BertgpuError`, or with ``skip_bad`` ends with a ``("bad", (path, reason), False)`` event
    instead of ``("end", path, False)`` (``("slice", ...)`` for a part of a file).
    ``quota(piece)``: read about that many bytes of text (UTF-8) of the piece (a sample); the
    part that reaches it is cut there (`textsize.cut_part`). ``as_written``: for a tokenizer
    whose tokens depend on whitespace (`document_parts.whitespace_sensitive`), each part of a
    document of the line formats, JSON Lines, Parquet and Arrow is ``("lines", [text], first)``,
    its text as written (its parts joined give the document's text) and cut only where no token
    changes (`document_parts.last_cut`); a wiki article is still its sentences.
    """
    if fmt not in FORMATS:
        raise BertgpuError(f"--format {fmt!r}: unknown; expected one of {', '.join(FORMATS)}")
    stats = stats if stats is not None else CorpusStats()
    for piece in pieces:
        span = piece.span
        stats.bytes += span[1] - span[0] if span else file_size(piece.src)
        limit = quota(piece) if quota is not None else None
        base = stats.read
        try:
            size = 0
            for item in _read_piece(piece, fmt, text_field, stats, as_written):
                n = text_bytes(item) if limit is not None else 0
                cut = limit is not None and size + n > limit
                if cut:  # the part would go past the quota: its start, then stop
                    item, n = cut_part(item, limit - size)
                yield item
                size += n
                if cut or (limit is not None and size >= limit):
                    break
        except BertgpuError as exc:
            if not skip_bad or from_network(exc):  # a store's failure is no bad file
                raise
            yield "bad", (str(piece.src), str(exc)), False
        else:
            yield ("end" if piece.whole else "slice"), str(piece.src), False
        stats.read = base + (span[1] - span[0] if span else 0)


def iter_raw_documents(
    paths: Iterable[str | os.PathLike],
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    stats: CorpusStats | None = None,
) -> Iterator[RawItem]:
    """`iter_piece_items` over the whole files of ``paths`` (files, folders, globs, URLs)."""
    if fmt not in FORMATS:
        raise BertgpuError(f"--format {fmt!r}: unknown; expected one of {', '.join(FORMATS)}")
    stats = stats if stats is not None else CorpusStats()
    inputs = resolve_inputs(paths, stats.skipped if skip_bad else None)
    return iter_piece_items((Piece(src) for src in inputs), fmt, text_field, skip_bad, stats)


def raw_to_sentences(kind: str, payload) -> list[str]:
    """The expensive, per-part stage: a raw part as a list of sentences (maybe empty)."""
    if kind == "lines":
        return payload
    if kind == "text":
        return split_sentences(payload)
    if kind == "jsonl":
        return [s for para in payload.split("\n") for s in split_sentences(para)]
    if kind == "wiki":
        return wiki_to_sentences(payload)
    raise ValueError(f"not a raw document kind: {kind!r}")


def convert_item(item: RawItem) -> RawItem:
    """``(kind, payload, first)`` of a raw part -> ``("part", sentences, first)``; events
    unchanged."""
    kind, payload, first = item
    return ("part", raw_to_sentences(kind, payload), first) if kind in DOC_KINDS else item


def convert_items(items: list[RawItem]) -> list[RawItem]:
    """`convert_item` over a batch (the unit of work a worker process gets)."""
    return [convert_item(item) for item in items]


def settle_parts(items: Iterable[RawItem], skip_bad: bool = False,
                 stats: CorpusStats | None = None) -> Iterator[tuple[list[str], bool]]:
    """The in-order stage: ``(sentences, new_doc)`` for each non-empty part (``sentences``: or the
    payload a later stage made of them); counts files and documents.

    ``new_doc`` is True on the first non-empty part of each document, so a document whose text
    starts in a later part (the first was only markup) still begins where its text does.
    """
    stats = stats if stats is not None else CorpusStats()
    yielded = 0  # parts of the current file
    pending = False  # a document started and has produced no text yet
    untokenized = False  # the current file had text that gave no token
    for kind, value, first in items:
        if kind in ("part", "no_tokens"):
            pending = pending or first
            untokenized = untokenized or kind == "no_tokens"
            if value:
                yielded += 1
                stats.documents += pending
                yield value, pending
                pending = False
        elif kind == "end":
            if yielded == 0:
                what = ("control or format characters, which the tokenizer removes"
                        if untokenized else "blank lines or markup")
                message = (null_text_message(value, stats.nulls[value]) if stats.nulls.get(value)
                           else f"{value}: no text (only {what}); expected at least one document")
                if not skip_bad:
                    raise BertgpuError(message)
                stats.skipped.append((value, message))
            else:
                stats.files += 1
            yielded, untokenized = 0, False
        elif kind == "slice":  # whether the file had text is known once every part is read
            stats.slices[value] = stats.slices.get(value, 0) + yielded
            yielded, untokenized = 0, False
        elif kind == "bad":
            stats.skipped.append(value)
            if yielded:
                stats.partial.append(value[0])
            yielded, untokenized = 0, False
        else:
            raise ValueError(f"not a converted item: {kind!r} (convert raw documents first)")


def iter_document_parts(paths: Iterable[str | os.PathLike], fmt: str = "auto",
                        text_field: str = "text", skip_bad: bool = False,
                        stats: CorpusStats | None = None) -> Iterator[tuple[list[str], bool]]:
    """Stream ``(sentences, new_doc)`` parts of all inputs in order, in one process (bounded
    memory).

    ``paths``: files, folders (read recursively) and glob patterns, see `resolve_inputs`.
    ``stats``: if given, counts files, documents and skipped files as the stream advances.
    A file that yields no text at all is an error ("no text"), like an empty file.
    """
    stats = stats if stats is not None else CorpusStats()
    raw = iter_raw_documents(paths, fmt=fmt, text_field=text_field, skip_bad=skip_bad, stats=stats)
    return settle_parts((convert_item(item) for item in raw), skip_bad=skip_bad, stats=stats)


def iter_documents(paths: Iterable[str | os.PathLike], fmt: str = "auto",
                   text_field: str = "text", skip_bad: bool = False,
                   stats: CorpusStats | None = None) -> Iterator[list[str]]:
    """Whole documents (each a non-empty list of sentences), in order: `iter_document_parts` joined.

    A document is held in memory whole here; stream the parts for corpora of unbounded documents.
    """
    doc: list[str] = []
    for sentences, new_doc in iter_document_parts(paths, fmt, text_field, skip_bad, stats):
        if new_doc and doc:
            yield doc
            doc = []
        doc.extend(sentences)
    if doc:
        yield doc


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The input flags `bertgpu tokenizer` and `bertgpu prepare` share."""
    parser.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                        help="files, folders (recursive), glob patterns or URLs (s3://, gs://, "
                             "hf://, https://: needs bertgpu[remote] and the protocol's package)")
    parser.add_argument("--format", default="auto", choices=FORMATS,
                        help="corpus format: sentences (one per line, blank line between "
                             "documents), text (paragraphs), lines (one document per line), jsonl, "
                             "wiki, parquet, arrow (default: by extension and content)")
    parser.add_argument("--text-field", default="text",
                        help="JSONL field or Parquet/Arrow column with the text (default 'text')")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip unreadable files instead of stopping")
