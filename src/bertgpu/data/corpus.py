"""Raw-text readers: every corpus format becomes a stream of documents, each a stream of parts.

    from bertgpu.data.corpus import iter_document_parts, iter_documents
    for sentences, new_doc in iter_document_parts(["wiki.xml.bz2", "books/", "web/*.jsonl"]):
        ...  # a bounded run of sentences; new_doc marks the first part of each document
    for doc in iter_documents(["small.txt"]):
        ...  # doc: list[str], a whole document (held in memory: for small corpora and tests)

Formats (``fmt``; "auto" picks one per file from its name):

- ``sentences``: one sentence per line, blank lines between documents (the original BERT
  ``sample_text.txt`` format). The default for any name not listed below.
- ``text``: plain text; each paragraph (blank-line separated) is a document, split into
  sentences by a simple regex so that next-sentence prediction has sentences to pair.
- ``lines``: one document per line (reviews, tweets, scraped paragraphs), split into sentences
  like ``text``; blank lines are ignored.
- ``jsonl``: one JSON object per line, the document in a string field (``text`` by default).
  Auto for ``.jsonl`` / ``.json`` (optionally ``.bz2`` / ``.gz``).
- ``wiki``: a MediaWiki XML dump (``.xml``, ``.xml.bz2``, or any ``.bz2`` whose content starts
  like one). Articles only (namespace 0, no redirects), markup stripped (`wikitext`).

Memory does not depend on the length of a document in the line-based formats (sentences, text,
lines): a document is read as parts of about PART_CHARS characters and a line longer than
LINE_PIECE_BYTES as pieces. A JSONL document (one JSON value) and a wiki article (one XML
element) are read whole. ``.bz2`` and ``.gz`` files are decompressed on the fly.

Stages, so that a caller can run the expensive one on other cores (``bertgpu prepare`` does):

- `iter_raw_documents` (cheap, sequential): decompress, decode, parse; yields raw items
  ``(kind, payload, first)``: a part of a document still to be split (a block of lines, a
  paragraph, a JSON text field, an article's wikitext), ``first`` on a document's first part;
  and file events (``("end", path, False)``, ``("bad", (path, reason), False)``) that keep the
  per-file bookkeeping in order.
- `convert_items` (expensive, per part, independent): markup stripping and sentence splitting;
  turns each raw part into ``("part", sentences, first)``, passes events through.
- `settle_parts` (cheap, in order): drops empty parts, counts documents, and turns a file that
  produced no text into the "no text" error (or a skipped file). It also takes parts that a
  later stage already processed (`prepare` tokenizes them first: a falsy payload is empty).

`iter_document_parts` chains the three in one process; `iter_documents` joins the parts.

Bad input raises ``BertgpuError`` naming the file and line. With ``skip_bad=True`` reading of
that file stops at the first problem instead, the file is counted in ``CorpusStats.skipped``,
and the next file is read; parts that came before the problem were already yielded.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bertgpu.data.textio import decoded_lines, open_binary, split_sentences
from bertgpu.data.wikitext import read_wiki, wiki_to_sentences
from bertgpu.errors import BertgpuError

FORMATS = ("auto", "sentences", "text", "lines", "jsonl", "wiki")
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
    """Bytes of the input files as stored on disk (compressed size for .bz2 / .gz)."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of each file abandoned because of bad input (only with skip_bad)."""

    def summary(self) -> str:
        text = f"{self.files} files, {self.documents} documents"
        if self.skipped:
            text += f", {len(self.skipped)} skipped (" + "; ".join(r for _, r in self.skipped) + ")"
        return text


# --------------------------------------------------------------------------- inputs


def resolve_inputs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files, folders (recursively) and glob patterns into a sorted, duplicate-free list.

    The order is deterministic (sorted within each argument, arguments in the order given) so
    that the same command always produces the same documents in the same order. Hidden files
    (names starting with ``.``) inside folders are ignored.
    """
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        text = os.fspath(raw)
        p = Path(text)
        if p.is_dir():
            found = sorted(_walk_files(p))
            if not found:
                raise BertgpuError(f"{text}: folder contains no files; expected corpus files")
        elif p.is_file():
            found = [p]
        elif glob.has_magic(text):
            found = sorted(Path(m) for m in glob.glob(text, recursive=True) if Path(m).is_file())
            if not found:
                raise BertgpuError(f"{text}: pattern matches no files")
        else:
            raise BertgpuError(f"{text}: no such file or folder")
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append(f)
    if not out:
        raise BertgpuError("no corpus files given; expected --corpus PATH...")
    return out


def _walk_files(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if not name.startswith("."):
                yield Path(dirpath) / name


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


def detect_format(path: Path) -> str:
    """The reader for a file, from its name (and for a bare ``.bz2``, its first bytes)."""
    name = path.name.lower()
    for suffix in (".bz2", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".xml"):
        return "wiki"
    if path.name.lower().endswith((".bz2", ".gz")):
        # Wikipedia's dump chunks are named like "...articles1.xml-p10p30302.bz2".
        try:
            with open_binary(path) as f:
                head = f.read(4096)
        except (OSError, EOFError) as exc:
            raise BertgpuError(f"{path}: cannot decompress ({exc})") from None
        if b"<mediawiki" in head:
            return "wiki"
    return "sentences"


# --------------------------------------------------------------------------- readers

RawItem = tuple  # (kind, payload, first): see the module docstring
DOC_KINDS = ("lines", "text", "jsonl", "wiki")  # parts of raw documents; the rest are file events


def _line_parts(path: Path, f: BinaryIO, per_line: bool) -> Iterator[tuple[list[str], bool]]:
    """(stripped non-empty lines, first) parts of documents of at most about PART_CHARS characters.

    A document ends at a blank line, or with ``per_line`` at the end of each line. The pieces
    of an over-long line count as lines of their own (they were cut at whitespace).
    """
    part: list[str] = []
    chars = 0
    first = True  # the next part starts a document
    line_has_text = False
    for _, piece, ends_line in decoded_lines(path, f, LINE_PIECE_BYTES):
        text = piece.strip()
        if text:
            part.append(text)
            chars += len(text)
            line_has_text = True
        if not ends_line:
            if chars >= PART_CHARS:
                yield part, first
                part, chars, first = [], 0, False
            continue
        doc_ends = line_has_text if per_line else not line_has_text
        line_has_text = False
        if doc_ends:
            if part:
                yield part, first
            part, chars, first = [], 0, True
        elif chars >= PART_CHARS:
            yield part, first
            part, chars, first = [], 0, False
    if part:
        yield part, first


def _read_jsonl(path: Path, f: BinaryIO, text_field: str) -> Iterator[RawItem]:
    for lineno, line, _ in decoded_lines(path, f):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BertgpuError(
                f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                "expected one JSON object per line"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
            found = f"fields {sorted(obj)[:8]}" if isinstance(obj, dict) else type(obj).__name__
            raise BertgpuError(
                f"{path}:{lineno}: no string field {text_field!r} (found {found}); "
                "expected a JSON object with the text (choose the field with --text-field)"
            )
        yield "jsonl", obj[text_field], True


def _read_file(path: Path, fmt: str, text_field: str) -> Iterator[RawItem]:
    kind = detect_format(path) if fmt == "auto" else fmt
    try:
        with open_binary(path) as f:
            if kind == "sentences":  # one sentence per line: final already
                for lines, first in _line_parts(path, f, per_line=False):
                    yield "lines", lines, first
            elif kind in ("text", "lines"):  # a paragraph (or a line) per document, lines joined
                for lines, first in _line_parts(path, f, per_line=kind == "lines"):
                    yield "text", " ".join(lines), first
            elif kind == "jsonl":
                yield from _read_jsonl(path, f, text_field)
            else:
                for article in read_wiki(path, f):
                    yield "wiki", article, True
    except (OSError, EOFError) as exc:  # unreadable or a truncated / corrupt .bz2 or .gz
        raise BertgpuError(f"{path}: cannot read ({exc})") from None


# --------------------------------------------------------------------------- the stream


def iter_raw_documents(
    paths: Iterable[str | os.PathLike],
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    stats: CorpusStats | None = None,
) -> Iterator[RawItem]:
    """The cheap, sequential stage: raw document parts and file events of all inputs, in order.

    Only ``stats.bytes`` is counted here; `settle_parts` counts the rest. A bad file raises
    `BertgpuError`, or with ``skip_bad`` ends with a ``("bad", (path, reason), False)`` event
    instead of ``("end", path, False)``.
    """
    if fmt not in FORMATS:
        raise BertgpuError(f"--format {fmt!r}: unknown; expected one of {', '.join(FORMATS)}")
    stats = stats if stats is not None else CorpusStats()
    for path in resolve_inputs(paths):
        stats.bytes += path.stat().st_size
        try:
            yield from _read_file(path, fmt, text_field)
        except BertgpuError as exc:
            if not skip_bad:
                raise
            yield "bad", (str(path), str(exc)), False
        else:
            yield "end", str(path), False


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
    for kind, value, first in items:
        if kind == "part":
            pending = pending or first
            if value:
                yielded += 1
                stats.documents += pending
                yield value, pending
                pending = False
        elif kind == "end":
            if yielded == 0:
                message = (f"{value}: no text (only blank lines or markup); expected at "
                           "least one document")
                if not skip_bad:
                    raise BertgpuError(message)
                stats.skipped.append((value, message))
            else:
                stats.files += 1
            yielded = 0
        elif kind == "bad":
            stats.skipped.append(value)
            yielded = 0
        else:
            raise ValueError(f"not a converted item: {kind!r} (convert raw documents first)")


def iter_document_parts(
    paths: Iterable[str | os.PathLike],
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    stats: CorpusStats | None = None,
) -> Iterator[tuple[list[str], bool]]:
    """Stream ``(sentences, new_doc)`` parts of all inputs in order, in one process (bounded
    memory).

    ``paths``: files, folders (read recursively) and glob patterns, see `resolve_inputs`.
    ``stats``: if given, counts files, documents and skipped files as the stream advances.
    A file that yields no text at all is an error ("no text"), like an empty file.
    """
    stats = stats if stats is not None else CorpusStats()
    raw = iter_raw_documents(paths, fmt=fmt, text_field=text_field, skip_bad=skip_bad, stats=stats)
    return settle_parts((convert_item(item) for item in raw), skip_bad=skip_bad, stats=stats)


def iter_documents(
    paths: Iterable[str | os.PathLike],
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    stats: CorpusStats | None = None,
) -> Iterator[list[str]]:
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
                        help="files, folders (recursive) or glob patterns")
    parser.add_argument("--format", default="auto", choices=FORMATS,
                        help="corpus format: sentences (one per line, blank line between "
                             "documents), text (paragraphs), lines (one document per line), jsonl, "
                             "wiki (default: by extension)")
    parser.add_argument("--text-field", default="text",
                        help="JSONL field with the text (default 'text')")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip unreadable files instead of stopping")
