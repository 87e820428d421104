"""MediaWiki XML dumps: the articles of a dump, and their wikitext as plain sentences.

    from bertgpu.data.wikitext import strip_wiki_markup, wiki_to_sentences
    wiki_to_sentences("'''Alpha''' is a [[Greek alphabet|letter]]. {{Infobox}}")
    # -> ['Alpha is a letter.']

`read_wiki` streams a dump with ``iterparse`` and clears every finished page, so memory does not
depend on the dump's size (an article is held whole: it is one XML element). Markup is stripped
with regexes and two linear scans (nested templates and tables, nested links): good enough for
pretraining text, not a MediaWiki parser.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bertgpu.data.textio import split_sentences
from bertgpu.errors import BertgpuError


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def read_wiki(path: Path, f: BinaryIO) -> Iterator[str]:
    """The raw wikitext of each article (namespace 0, no redirects) of a MediaWiki XML dump."""
    root = None
    ns = text = None
    redirect = False
    try:
        for event, elem in ET.iterparse(f, events=("start", "end")):
            tag = _local(elem.tag)
            if root is None:
                if tag != "mediawiki":
                    raise BertgpuError(
                        f"{path}: root element <{tag}> is not <mediawiki>; expected a MediaWiki "
                        "XML dump"
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
                yield text
    except ET.ParseError as exc:
        line, col = exc.position
        raise BertgpuError(f"{path}:{line}: XML error at column {col} ({exc}); expected a "
                           "MediaWiki XML dump") from None
    if root is None:
        raise BertgpuError(f"{path}: empty file; expected a MediaWiki XML dump")


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


_TEMPLATE_BRACES = re.compile(r"\{\{+|\}\}+")  # runs: {{template}}, {{{parameter}}}, {{a|{{b}}}}
_TABLE_MARKS = re.compile(r"\{\||\|\}")


def _remove_nested(text: str, marks: re.Pattern[str]) -> str:
    """Remove balanced regions between the opening and closing ``marks`` (a mark starting with
    ``{`` opens), nesting included, in one linear scan when every opener closes. A run of braces
    counts brace by brace, so a template parameter ``{{{1}}}`` and ``{{a|{{{b}}}}}`` close whole
    (a pair at a time left a stray "}"). An opener never closed is literal text, as MediaWiki
    shows it: the scan starts again after it, so the rest of the article is kept (it was
    dropped)."""
    out: list[str] = []
    while True:
        depth = start = outer = 0
        for m in marks.finditer(text):
            token = m.group()
            weight = len(token) if token[0] == token[-1] else 1  # a brace run, or a table mark
            if token[0] == "{":
                if depth == 0:
                    out.append(text[start : m.start()])
                    outer = m.end()
                depth += weight
            elif depth > 0:
                depth = max(0, depth - weight)
                if depth == 0:
                    start = m.end()
        if depth == 0:
            out.append(text[start:])
            return "".join(out)
        text = text[outer:]  # the outermost unclosed opener: the scan goes on after it


# Language-variant markup of the Chinese (and Serbian, Kazakh...) Wikipedias: -{...}-, with
# optional flags before a "|" and "code:text" variants separated by ";" (MediaWiki's
# LanguageConverter). Most zhwiki articles hold it; it went into the shards as markup.
# Never across another "-{" (an inner block goes first; an unclosed one then costs a scan to
# the next, not to the article's end), never from "-{{" (a hyphen before a template,
# "2-{{frac|1|2}}-story", is no variant markup); across lines (a block may wrap a list).
_VARIANT_BLOCK = re.compile(r"-\{(?!\{)((?:(?!-\{).)*?)\}-", re.S)
_VARIANT_CODE = r"(?:zh|[a-z]{2,3}-[a-z]+)"
_VARIANT_SPLIT = re.compile(rf";(?=\s*(?:[^;:=|]*=>)?\s*{_VARIANT_CODE}\s*:)")
_VARIANT = re.compile(rf"\s*(?:[^;:=|]*=>)?\s*{_VARIANT_CODE}\s*:(.*)", re.S)
_VARIANT_FLAGS = re.compile(r"[A-Za-z\- ;]+")


def _variant_text(m: re.Match[str]) -> str:
    """The text a -{...}- block shows: its first variant ("-{zh-hans:计算机;zh-hant:電腦}-" ->
    计算机), its text when it holds none ("-{C++}-", a raw -{R|...}-), nothing for a rule that
    shows nothing (H, T and - flags)."""
    body = m.group(1)
    flags, bar, rest = body.partition("|")
    if bar and _VARIANT_FLAGS.fullmatch(flags):
        names = {f.strip() for f in flags.split(";")}
        if names & {"H", "T", "-"}:
            return ""
        if "R" in names:
            return rest
        body = rest
    for part in _VARIANT_SPLIT.split(body):
        variant = _VARIANT.match(part)
        if variant is None:
            return body  # no variants: the text itself
        if variant.group(1).strip():
            return variant.group(1).strip()
    return ""


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
    for _ in range(8):  # nested blocks, the innermost first
        if "-{" not in text:
            break
        text, found = _VARIANT_BLOCK.subn(_variant_text, text)
        if not found:
            break
    text = _remove_nested(text, _TEMPLATE_BRACES)  # templates, infoboxes (nested)
    text = _remove_nested(text, _TABLE_MARKS)  # tables (nested)
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
