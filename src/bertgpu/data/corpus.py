"""Raw-text readers: every corpus format becomes a stream of documents (lists of sentences).

    from bertgpu.data.corpus import iter_documents
    for doc in iter_documents(["wiki.xml.bz2", "books/", "web/*.jsonl"]):
        ...  # doc: list[str], one sentence (or line) per item, never empty

Formats (``fmt``; "auto" picks one per file from its name):

- ``sentences``: one sentence per line, blank lines between documents (the original BERT
  ``sample_text.txt`` format). The default for any name not listed below.
- ``text``: plain text; each paragraph (blank-line separated) is a document, split into
  sentences by a simple regex so that next-sentence prediction has sentences to pair.
- ``jsonl``: one JSON object per line, the document in a string field (``text`` by default).
  Auto for ``.jsonl`` / ``.json`` (optionally ``.bz2`` / ``.gz``).
- ``wiki``: a MediaWiki XML dump (``.xml``, ``.xml.bz2``, or any ``.bz2`` whose content starts
  like one). Articles only (namespace 0, no redirects), markup stripped with regexes.

Everything is streamed line by line (XML with ``iterparse`` and cleared elements), so memory
does not depend on file size. ``.bz2`` and ``.gz`` files are decompressed on the fly.

Two stages, so that a caller can run the expensive one on other cores (``bertgpu prepare`` does):

- `iter_raw_documents` (cheap, sequential): decompress, decode, parse; yields raw items: a
  document still to be split (``(kind, payload)``: a paragraph, a JSON text field, an article's
  wikitext, or an already final list of lines) and file events (``("end", path)``, ``("bad",
  (path, reason))``) that keep the per-file bookkeeping in order.
- `convert_items` (expensive, per document, independent): markup stripping and sentence
  splitting; turns each raw document into ``("doc", sentences)``, passes events through.
- `settle_documents` (cheap, in order): drops empty documents, counts, and turns a file that
  produced no document into the "no text" error (or a skipped file).

`iter_documents` chains the three in one process.

Bad input raises ``BertgpuError`` naming the file and line. With ``skip_bad=True`` reading of
that file stops at the first problem instead, the file is counted in ``CorpusStats.skipped``,
and the next file is read; documents that came before the problem were already yielded.
"""

from __future__ import annotations

import argparse
import bz2
import glob
import gzip
import html
import importlib.util
import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bertgpu.errors import BertgpuError

FORMATS = ("auto", "sentences", "text", "jsonl", "wiki")


@dataclass
class CorpusStats:
    """What a pass over the inputs read: filled in by `iter_documents` as it goes."""

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
    raise BertgpuError(f"gensim test data {name!r}: not found in {list(spec.submodule_search_locations)}")


# --------------------------------------------------------------------------- opening files


def _open_binary(path: Path) -> BinaryIO:
    """Open a file for streaming bytes, decompressing .bz2 / .gz on the fly."""
    name = path.name.lower()
    if name.endswith(".bz2"):
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


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
            with _open_binary(path) as f:
                head = f.read(4096)
        except (OSError, EOFError) as exc:
            raise BertgpuError(f"{path}: cannot decompress ({exc})") from exc
        if b"<mediawiki" in head:
            return "wiki"
    return "sentences"


def _decoded_lines(path: Path, f: BinaryIO) -> Iterator[tuple[int, str]]:
    """(line number, text without the newline) for each line; invalid UTF-8 names line and byte."""
    offset = 0
    total = 0
    for lineno, raw in enumerate(f, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BertgpuError(
                f"{path}:{lineno}: invalid UTF-8 byte 0x{raw[exc.start]:02x} at byte offset "
                f"{offset + exc.start}; expected UTF-8 text"
            ) from None
        if lineno == 1 and line.startswith("\ufeff"):
            line = line[1:]  # a byte-order mark is not text
        offset += len(raw)
        total += 1
        yield lineno, line.rstrip("\r\n")
    if total == 0:
        raise BertgpuError(f"{path}: empty file; expected text")


# --------------------------------------------------------------------------- sentence splitting

# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) and whitespace, when
# the next word does not start with a lower-case ASCII letter ("e.g. the" stays whole). CJK full
# stops end a sentence with no space after them.
_SENT_END = re.compile(r"(?<=[.!?][\"')\]’”])\s+(?=[^\sa-z])|(?<=[.!?])\s+(?=[^\sa-z])|(?<=[。！？])")


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences with a simple regex (good enough for NSP pairs)."""
    return [s for s in (part.strip() for part in _SENT_END.split(text)) if s]


# --------------------------------------------------------------------------- readers


RawItem = tuple  # (kind, payload): see the module docstring
DOC_KINDS = ("lines", "text", "jsonl", "wiki")  # raw documents; the rest are file events


def _blank_line_blocks(path: Path, f: BinaryIO) -> Iterator[list[str]]:
    """Groups of stripped non-empty lines separated by blank lines."""
    block: list[str] = []
    for _, line in _decoded_lines(path, f):
        line = line.strip()
        if line:
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def _read_sentences(path: Path, f: BinaryIO) -> Iterator[RawItem]:
    for doc in _blank_line_blocks(path, f):  # one sentence per line, a document per block
        yield "lines", doc


def _read_text(path: Path, f: BinaryIO) -> Iterator[RawItem]:
    for para in _blank_line_blocks(path, f):  # a paragraph per block, its lines joined
        yield "text", " ".join(para)


def _read_jsonl(path: Path, f: BinaryIO, text_field: str) -> Iterator[RawItem]:
    for lineno, line in _decoded_lines(path, f):
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
        yield "jsonl", obj[text_field]


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _read_wiki(path: Path, f: BinaryIO) -> Iterator[RawItem]:
    """Articles (raw wikitext) of a MediaWiki XML dump; elements are cleared as we go."""
    root = None
    ns = text = None
    redirect = False
    try:
        for event, elem in ET.iterparse(f, events=("start", "end")):
            tag = _local(elem.tag)
            if root is None:
                if tag != "mediawiki":
                    raise BertgpuError(
                        f"{path}: root element <{tag}> is not <mediawiki>; expected a MediaWiki XML dump"
                    )
                root = elem
                continue
            if event == "start":
                if tag == "page":
                    ns = text = None
                    redirect = False
                continue
            if tag == "ns":
                ns = (elem.text or "").strip()
            elif tag == "redirect":
                redirect = True
            elif tag == "text":
                text = elem.text or ""
            elif tag == "page":
                root.clear()  # drop finished pages so memory stays flat
                if ns not in (None, "0") or redirect or not text:
                    continue
                if text.lstrip()[:9].upper() == "#REDIRECT":
                    continue
                yield "wiki", text
    except ET.ParseError as exc:
        line, col = exc.position
        raise BertgpuError(f"{path}:{line}: XML error at column {col} ({exc}); expected a MediaWiki XML dump") from None
    if root is None:
        raise BertgpuError(f"{path}: empty file; expected a MediaWiki XML dump")


# --------------------------------------------------------------------------- wiki markup

_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_REF_SELF = re.compile(r"<ref\b[^>]*/\s*>", re.I)
_REF = re.compile(r"<ref\b[^>]*>.*?</ref\s*>", re.I | re.S)
_DROP_BLOCKS = re.compile(
    r"<(math|gallery|timeline|score|syntaxhighlight|source|code|pre|imagemap|chem|hiero|graph)\b[^>]*>.*?</\1\s*>",
    re.I | re.S,
)
_BREAK = re.compile(r"<br\s*/?\s*>", re.I)
_TAG = re.compile(r"</?[A-Za-z][^>\n]*>")
# A run of k "]" closes k // 2 links after k % 2 literal "]": "[[File:x|a [note]]]" or
# "[[File:x|by [[Someone]]]]".
_LINK_BRACKETS = re.compile(r"\[\[|\]{2,}")
# Links that are not running text: files, images, categories, interwiki / interlanguage.
_DROP_LINK = re.compile(
    r"^\s*:?\s*(file|image|media|category|wikipedia|wp|wikt|wiktionary|special|template|help|portal|[a-z]{2,3}(-[a-z]+)?)\s*:",
    re.I,
)
_EXT_LINK_LABEL = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]+\s+([^\]]*)\]")
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*\]")
_QUOTES = re.compile(r"'{2,}")
_HEADING = re.compile(r"^=+.*?=+\s*$", re.M)
_LIST_PREFIX = re.compile(r"^[*#:;]+\s*", re.M)
_TABLE_LINE = re.compile(r"^\s*[|!].*$", re.M)
_MAGIC = re.compile(r"__[A-Z]+__")
_MULTI_SPACE = re.compile(" {2,}")  # runs of [ \t\u00a0] -> one space, tabs/nbsp first


def _remove_nested(text: str, open_: str, close: str) -> str:
    """Remove balanced ``open_ ... close`` regions, nesting included, in one linear scan."""
    pattern = re.compile(re.escape(open_) + "|" + re.escape(close))
    out: list[str] = []
    depth = 0
    start = 0
    for m in pattern.finditer(text):
        if m.group() == open_:
            if depth == 0:
                out.append(text[start : m.start()])
            depth += 1
        elif depth > 0:
            depth -= 1
            if depth == 0:
                start = m.end()
    if depth == 0:
        out.append(text[start:])
    return "".join(out)


def _link_text(inner: str) -> str:
    if _DROP_LINK.match(inner):
        return ""
    return inner.rsplit("|", 1)[-1]  # [[target|label]] -> label, [[target]] -> target


def _replace_links(text: str) -> str:
    """Resolve [[...]] links, nested ones first, so [[File:x|a [[link]] caption]] goes whole.

    A scan with a stack of open links rather than a regex: captions may hold single brackets
    ("Bicyclo[1.1.0]butane") that defeat a ``[^\\[\\]]*`` pattern.
    """
    stack: list[list[str]] = [[]]
    pos = 0
    for m in _LINK_BRACKETS.finditer(text):
        stack[-1].append(text[pos : m.start()])
        pos = m.end()
        token = m.group()
        if token == "[[":
            stack.append([])
            continue
        if len(token) % 2:
            stack[-1].append("]")
        for _ in range(len(token) // 2):
            if len(stack) > 1:
                inner = "".join(stack.pop())
                stack[-1].append(_link_text(inner))
            # a stray "]]" outside any link is dropped
    stack[-1].append(text[pos:])
    while len(stack) > 1:  # unclosed "[[": keep its text, drop the brackets
        inner = "".join(stack.pop())
        stack[-1].append(inner)
    return "".join(stack[0])


def strip_wiki_markup(text: str) -> str:
    """Wikitext -> plain text with paragraph breaks (blank lines); headings become breaks."""
    text = _COMMENT.sub("", text)
    text = _REF_SELF.sub("", text)
    text = _REF.sub("", text)
    text = _DROP_BLOCKS.sub("", text)
    text = _remove_nested(text, "{{", "}}")  # templates, infoboxes (nested)
    text = _remove_nested(text, "{|", "|}")  # tables (nested)
    text = _replace_links(text)
    text = _EXT_LINK_LABEL.sub(r"\1", text)
    text = _EXT_LINK.sub("", text)
    text = _BREAK.sub(" ", text)
    text = _TAG.sub("", text)
    text = _QUOTES.sub("", text)
    text = _MAGIC.sub("", text)
    text = _HEADING.sub("\n", text)
    text = _TABLE_LINE.sub("", text)
    text = _LIST_PREFIX.sub("", text)
    text = html.unescape(text)  # &nbsp; &ndash; etc. survive the XML layer as entities
    # Same as re.sub("[ \t\u00a0]+", " ") but 2x faster: most runs are one space, left alone.
    if "\t" in text or "\u00a0" in text:
        text = text.replace("\t", " ").replace("\u00a0", " ")
    return _MULTI_SPACE.sub(" ", text)


def wiki_to_sentences(wikitext: str) -> list[str]:
    """An article's wikitext as a list of sentences (empty when nothing but markup)."""
    plain = strip_wiki_markup(wikitext)
    return [s for line in plain.split("\n") if line.strip() for s in split_sentences(line)]


# --------------------------------------------------------------------------- the stream


def iter_documents(
    paths: Iterable[str | os.PathLike],
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    stats: CorpusStats | None = None,
) -> Iterator[list[str]]:
    """Stream the documents of all inputs, in order: each a non-empty list of sentences.

    ``paths``: files, folders (read recursively) and glob patterns, see `resolve_inputs`.
    ``stats``: if given, counts files, documents and skipped files as the stream advances.
    A file that yields no document at all is an error ("no text"), like an empty file.
    """
    stats = stats if stats is not None else CorpusStats()
    raw = iter_raw_documents(paths, fmt=fmt, text_field=text_field, skip_bad=skip_bad, stats=stats)
    return settle_documents((convert_item(item) for item in raw), skip_bad=skip_bad, stats=stats)


def iter_raw_documents(
    paths: Iterable[str | os.PathLike],
    fmt: str = "auto",
    text_field: str = "text",
    skip_bad: bool = False,
    stats: CorpusStats | None = None,
) -> Iterator[RawItem]:
    """The cheap, sequential stage: raw documents and file events of all inputs, in order.

    Only ``stats.bytes`` is counted here; `settle_documents` counts the rest. A bad file raises
    `BertgpuError`, or with ``skip_bad`` ends with a ``("bad", (path, reason))`` event instead
    of ``("end", path)``.
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
            yield "bad", (str(path), str(exc))
        else:
            yield "end", str(path)


def raw_to_sentences(kind: str, payload) -> list[str]:
    """The expensive, per-document stage: a raw document as a list of sentences (maybe empty)."""
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
    """``(kind, payload)`` of a raw document -> ``("doc", sentences)``; file events unchanged."""
    kind, payload = item
    return ("doc", raw_to_sentences(kind, payload)) if kind in DOC_KINDS else item


def convert_items(items: list[RawItem]) -> list[RawItem]:
    """`convert_item` over a batch (the unit of work a worker process gets)."""
    return [convert_item(item) for item in items]


def needs_conversion(items: Iterable[RawItem]) -> bool:
    """Whether a batch holds work worth another process (anything but final lines and events)."""
    return any(kind in ("text", "jsonl", "wiki") for kind, _ in items)


def settle_documents(items: Iterable[RawItem], skip_bad: bool = False,
                     stats: CorpusStats | None = None) -> Iterator[list[str]]:
    """The in-order stage: non-empty documents out of converted items; counts files and documents."""
    stats = stats if stats is not None else CorpusStats()
    yielded = 0
    for kind, value in items:
        if kind == "doc":
            if value:
                yielded += 1
                stats.documents += 1
                yield value
        elif kind == "end":
            if yielded == 0:
                message = f"{value}: no text (only blank lines or markup); expected at least one document"
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


def _read_file(path: Path, fmt: str, text_field: str) -> Iterator[RawItem]:
    kind = detect_format(path) if fmt == "auto" else fmt
    try:
        with _open_binary(path) as f:
            if kind == "sentences":
                yield from _read_sentences(path, f)
            elif kind == "text":
                yield from _read_text(path, f)
            elif kind == "jsonl":
                yield from _read_jsonl(path, f, text_field)
            else:
                yield from _read_wiki(path, f)
    except (OSError, EOFError) as exc:  # unreadable or a truncated / corrupt .bz2 or .gz
        raise BertgpuError(f"{path}: cannot read ({exc})") from None


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The input flags `bertgpu tokenizer` and `bertgpu prepare` share."""
    parser.add_argument("--corpus", nargs="+", required=True, metavar="PATH",
                        help="files, folders (recursive) or glob patterns")
    parser.add_argument("--format", default="auto", choices=FORMATS, help="corpus format (default: by extension)")
    parser.add_argument("--text-field", default="text", help="JSONL field with the text (default 'text')")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable files instead of stopping")
