"""Fonts of the report's plots: text that matplotlib's default font cannot draw (a run named
``运行``: DejaVu Sans has no CJK glyphs) gets an installed font that can, as a fallback family
(matplotlib >= 3.6 draws each glyph with the first family of the list that has it); without one,
the report says so once, instead of matplotlib's warning per glyph and drawing (two per character
and figure: the layout pass and the file).

The fallback is found by coverage, not by a list of names: any installed font (Noto Sans CJK,
WenQuanYi, Source Han, SimHei, ...) that has the missing characters.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from typing import Any

_GLYPH_WARNING = r"Glyph \d+ .*missing from font"
"""matplotlib's warning per glyph its font lacks: replaced by `glyph_notice`'s one line."""

_missing: set[str] | None = None
"""The characters that no installed font has, collected for one report (`glyph_notice`)."""

@functools.cache
def _charmap(path: str) -> frozenset[int]:
    """The code points a font file has glyphs for (its first face), read once."""
    from matplotlib import font_manager

    try:
        return frozenset(font_manager.get_font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):  # an unreadable font: covers nothing
        return frozenset()


@functools.lru_cache(maxsize=256)
def fallback_family(chars: frozenset[str]) -> tuple[str, frozenset[str]] | None:
    """The installed font family that has most of ``chars`` (upright, regular weight first) and
    the characters it has; None when none has any."""
    from matplotlib import font_manager

    best: tuple[tuple[int, int, int], str, frozenset[str]] | None = None
    for entry in font_manager.fontManager.ttflist:
        if entry.name.startswith("Last Resort"):  # matplotlib's own: a box for every character
            continue
        covered = frozenset(c for c in chars if ord(c) in _charmap(str(entry.fname)))
        if not covered:
            continue
        rank = (len(covered), entry.style == "normal", -abs(int(entry.weight) - 400)
                if str(entry.weight).isdigit() else -1000)
        if best is None or rank > best[0]:
            best = (rank, entry.name, covered)
    return None if best is None else (best[1], best[2])


def fit_fonts(fig: Any) -> None:
    """Give each text of ``fig`` with characters its font lacks a fallback family that has
    them; the characters no installed font has are kept for `glyph_notice`'s line (or said at
    once when drawn outside one: a bench command's plots)."""
    from matplotlib import font_manager
    from matplotlib.text import Text

    lacking: set[str] = set()
    for text in fig.findobj(Text):
        s = text.get_text()
        if not s or s.isascii():
            continue
        primary = _charmap(str(font_manager.findfont(text.get_fontproperties())))
        missing = frozenset(c for c in s if c.isprintable() and not c.isspace()
                            and ord(c) not in primary)
        if not missing:
            continue
        found = fallback_family(missing)
        if found is not None:
            name, covered = found
            families = list(text.get_fontfamily())
            if name not in families:
                text.set_fontfamily([*families, name])
            missing = missing - covered
        lacking |= missing
    if _missing is not None:
        _missing.update(lacking)
    elif lacking:
        warnings.warn(_notice(lacking), stacklevel=2)


@contextlib.contextmanager
def quiet_glyphs() -> Iterator[None]:
    """matplotlib's per-glyph warnings left out while a figure is laid out and saved (what they
    would say is `fit_fonts`' and `glyph_notice`'s)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_GLYPH_WARNING)
        yield


@contextlib.contextmanager
def glyph_notice() -> Iterator[None]:
    """While one report draws its plots, the characters that no installed font has are
    collected; after it, one warning names them and the remedy."""
    global _missing
    outer, _missing = _missing, set()
    try:
        yield
        lacking = _missing
    finally:
        _missing = outer
    if lacking:
        warnings.warn(_notice(lacking), stacklevel=1)


def _notice(lacking: set[str]) -> str:
    import matplotlib

    shown = "".join(sorted(lacking)[:10]) + ("..." if len(lacking) > 10 else "")
    return (f"labels in the plots have characters that no installed font has ({shown}): they "
            "show as boxes; names with CJK characters need a font with those glyphs (e.g. Noto "
            "Sans CJK: `apt install fonts-noto-cjk`), then matplotlib's font list made anew "
            f"(remove {matplotlib.get_cachedir()}/fontlist-*.json)")
