"""Word boundaries for whole-word masking where WordPiece has none: Chinese, segmented by jieba.

    bertgpu prepare --corpus news.txt --format lines --tokenizer tok/ --out data/ \\
        --whole-word-segmenter jieba

BERT's tokenizer splits every CJK character into a token of its own, so the "##" rule of
whole-word masking sees one word per character. With a segmenter, `prepare` stores a word-start
flag per token next to the shards (``*.word_starts.npy``, uint8, 1 where a word begins) and the
masker chooses whole words by those flags (Cui et al. 2019, "Pre-Training with Whole Word Masking
for Chinese BERT"). A token starts a word when it is not a "##" continuation and a segmenter word
starts at its first character: the segmenter only joins tokens (the characters of 北京 into one
word), it never splits a WordPiece word (jieba cuts "café" after "caf").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from bertgpu.errors import BertgpuError

SEGMENTERS = ("jieba",)


def check_segmenter(name: str) -> None:
    """Fail early, in one line, on an unknown segmenter or a missing optional dependency."""
    if name not in SEGMENTERS:
        raise BertgpuError(f"--whole-word-segmenter {name!r}: unknown; expected one of "
                           f"{', '.join(SEGMENTERS)}")
    try:
        import jieba  # noqa: F401
    except ImportError:
        raise BertgpuError(
            "--whole-word-segmenter jieba: the jieba package is not installed; "
            "expected `pip install 'bertgpu[zh]'` (or `pip install jieba`)"
        ) from None


def load_segmenter(name: str) -> Callable[[str], np.ndarray]:
    """A function ``text -> (n_words,) int64`` of the character offsets where words start."""
    check_segmenter(name)
    import jieba

    jieba.setLogLevel(logging.WARNING)  # no "Building prefix dict..." chatter on every worker
    cutter = jieba.Tokenizer()
    cutter.initialize()

    def word_starts(text: str) -> np.ndarray:
        lengths = np.fromiter((len(w) for w in cutter.cut(text, HMM=True)), np.int64)
        return np.concatenate([[0], np.cumsum(lengths)[:-1]]) if lengths.size else lengths

    return word_starts


def word_start_flags(ids: list[int], starts: list[int], continuation: np.ndarray,
                     word_starts: np.ndarray) -> np.ndarray:
    """(n_tokens,) uint8: 1 where a token begins a word (see the module docstring).

    ``ids`` and ``starts`` (each token's first character) come from one encoding of the text
    whose segmenter ``word_starts`` are given; ``continuation`` flags the "##" vocabulary entries.
    """
    if not ids:
        return np.zeros(0, np.uint8)
    is_piece = continuation[np.asarray(ids, np.int64)]
    return (~is_piece & np.isin(np.asarray(starts, np.int64), word_starts)).astype(np.uint8)
