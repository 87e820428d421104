"""Chinese whole-word masking (issue 12): `prepare --whole-word-segmenter jieba` stores a word
start per token, and the masker then masks whole jieba words instead of single characters."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
from _text_fixtures import CHINESE_NEWS

from bertgpu.batch import IGNORE_INDEX
from bertgpu.cli import main as cli_main
from bertgpu.data.masking import Masker, MaskingConfig
from bertgpu.data.prepare import prepare
from bertgpu.data.shards import ShardSet
from bertgpu.data.tokenizer import train_tokenizer
from bertgpu.errors import BertgpuError

pytestmark = pytest.mark.skipif(importlib.util.find_spec("jieba") is None,
                                reason="jieba not installed")


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    """(corpus, tokenizer): the news lines, each a document, and a tokenizer trained on them."""
    folder = tmp_path_factory.mktemp("zh")
    corpus = folder / "news.txt"
    corpus.write_text("\n".join(CHINESE_NEWS * 8) + "\n", encoding="utf-8")
    tok = train_tokenizer([corpus], folder / "tok", vocab_size=400, fmt="lines", min_frequency=1)
    return corpus, tok


def _rows(out, split="train"):
    shards = ShardSet(out, split)
    return shards, shards.get(np.arange(len(shards)))


def _words(word_starts, n):
    """Word number of positions 1 .. n-2 of a row ([CLS] ... [SEP]); a row may begin mid-word."""
    starts = word_starts[1 : n - 1].copy()
    starts[0] = True
    return np.cumsum(starts) - 1


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp"])
def test_word_starts_follow_jieba_and_leave_the_tokens_alone(zh, tmp_path, objective):
    import jieba

    corpus, tok = zh
    kw = dict(fmt="lines", seq_len=64, objective=objective, workers=1, validation_fraction=0.0)
    seg = prepare([corpus], tok, tmp_path / "seg", segmenter="jieba", **kw)
    plain = prepare([corpus], tok, tmp_path / "plain", **kw)
    assert seg["whole_word_segmenter"] == "jieba" and plain["whole_word_segmenter"] is None
    shards, rows = _rows(tmp_path / "seg")
    _, plain_rows = _rows(tmp_path / "plain")
    assert shards.has_word_starts and "word_starts" not in plain_rows
    # same tokens, same pairs
    np.testing.assert_array_equal(rows["input_ids"], plain_rows["input_ids"])
    assert rows["word_starts"].shape == rows["input_ids"].shape
    if objective == "mlm":
        # Every character of this text is one token, so the first row's flags are jieba's word
        # starts of the first line, character by character ([CLS] starts a word too).
        line = CHINESE_NEWS[0]
        starts = np.zeros(len(line), bool)
        starts[np.cumsum([0] + [len(w) for w in jieba.lcut(line)])[:-1]] = True
        assert rows["word_starts"][0, 1 : len(line) + 1].tolist() == starts.tolist()
        assert rows["word_starts"][0, 0] and starts.sum() < len(line)  # multi-character words exist
    lengths = rows["lengths"]
    inside = np.arange(rows["input_ids"].shape[1])[None, :] < lengths[:, None]
    assert not rows["word_starts"][~inside].any()  # padding is no word


def test_masking_takes_whole_jieba_words(zh, tmp_path):
    corpus, tok = zh
    prepare([corpus], tok, tmp_path / "d", fmt="lines", seq_len=64, workers=1, segmenter="jieba",
            validation_fraction=0.0)
    shards, rows = _rows(tmp_path / "d")
    B = len(shards)
    masker = Masker.from_shards(MaskingConfig(whole_word=True, mask_rate=0.2), shards)
    args = (rows["input_ids"], rows["lengths"], 7, np.zeros(B, np.int64), np.arange(B))
    _, labels = masker.mask_batch(*args, word_starts=rows["word_starts"])
    chosen = labels != IGNORE_INDEX
    whole = 0
    for b in range(B):
        n = int(rows["lengths"][b])
        word_of = _words(rows["word_starts"][b], n)
        for w in np.unique(word_of):
            span = chosen[b, 1 : n - 1][word_of == w]
            assert span.all() or not span.any(), (b, w)
            whole += int(span.all() and span.size > 1)
    assert whole > 10  # multi-character words were masked whole
    # Without the flags (the vocabulary rule: no "##" pieces in Chinese) every character is a word.
    _, by_char = masker.mask_batch(*args)
    split_words = 0
    for b in range(B):
        n = int(rows["lengths"][b])
        word_of = _words(rows["word_starts"][b], n)
        for w in np.unique(word_of):
            span = (by_char[b, 1 : n - 1] != IGNORE_INDEX)[word_of == w]
            split_words += int(span.any() and not span.all())
    assert split_words > 10


def test_missing_jieba_is_a_one_line_error(zh, tmp_path, monkeypatch, capsys):
    corpus, tok = zh
    monkeypatch.setitem(sys.modules, "jieba", None)  # import jieba now raises ImportError
    with pytest.raises(BertgpuError, match=r"jieba package is not installed; expected "
                                           r"`pip install 'bertgpu\[zh\]'`"):
        prepare([corpus], tok, tmp_path / "d", segmenter="jieba")
    code = cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok),
                     "--out", str(tmp_path / "d"), "--whole-word-segmenter", "jieba"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--whole-word-segmenter jieba" in err
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.tmp").exists()
    with pytest.raises(BertgpuError, match="--whole-word-segmenter 'ltp': unknown"):
        prepare([corpus], tok, tmp_path / "d", segmenter="ltp")
    assert json.loads((tok / "tokenizer_config.json").read_text())["tokenize_chinese_chars"] is True
