"""Text sizes in UTF-8 bytes, what ``bertgpu tokenizer --sample-bytes N`` counts, and cutting a
raw document part (`corpus.RawItem`) to a budget of them.

    text_bytes(("text", "北京", True))          # 6: a CJK character is 3 bytes
    cut_part(("text", "one two three", True), 9)  # (("text", "one two", True), 7)

Bytes, not characters: N is what the user can compare with the corpus's size on disk (a
Chinese or Japanese text has 3 bytes a character, so a character count read about 3N bytes).
"""

from __future__ import annotations


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def text_bytes(item: tuple) -> int:
    """UTF-8 bytes of the text of a raw part ``(kind, payload, first)``: a string, or a list of
    lines (the "lines" kind)."""
    payload = item[1]
    return _size(payload) if isinstance(payload, str) else sum(map(_size, payload))


def cut_part(item: tuple, budget: int) -> tuple[tuple, int]:
    """A raw part cut to about ``budget`` bytes of text, and its bytes after the cut.

    Why: a sample of a corpus of long documents would otherwise take a whole part (up to
    `corpus.PART_CHARS` characters: a long JSON text or table row is cut so too) wherever it
    needs a few kilobytes: 100 kB asked of 50 kB documents read 337 kB. The cut falls between
    words where the text has spaces, never inside a character, and keeps at least one
    character. A wiki article is kept whole (its markup is stripped later and must not be cut
    open).
    """
    kind, payload, first = item
    if kind == "wiki":
        return item, text_bytes(item)
    if isinstance(payload, str):
        text = _cut_text(payload, budget)
        return (kind, text, first), _size(text)
    lines: list[str] = []  # "lines": sentences kept whole up to the one the budget cuts
    used = 0
    for line in payload:
        n = _size(line)
        if used + n > budget:
            if used < budget:
                cut = _cut_text(line, budget - used)
                lines.append(cut)
                used += _size(cut)
            break
        lines.append(line)
        used += n
    return (kind, lines, first), used


def _cut_text(text: str, budget: int) -> str:
    """The start of ``text`` in at most about ``budget`` UTF-8 bytes, ending at a word's end
    where the text has spaces."""
    raw = text.encode("utf-8")
    if len(raw) <= budget:
        return text
    head = raw[: max(budget, 0)].decode("utf-8", "ignore")  # a character cut open is dropped
    if not text[len(head)].isspace():  # a word cut open: end at the word before, if any
        words = head.rsplit(None, 1)
        if len(words) == 2:
            head = words[0]
    return head.rstrip() or text.lstrip()[:1]
