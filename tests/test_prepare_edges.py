"""Edge cases of corpus preparation: NSP pairing and truncation, input readers (MediaWiki, JSON
Lines, compressed names), whole-word tables and flags, and work-unit planning."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _shards import write_synthetic_shards

from bertgpu.data.compressed import compression_suffix, open_binary
from bertgpu.data.jsonl import read_jsonl
from bertgpu.data.masking import _MASK_DOMAIN, Masker, MaskingConfig, _philox
from bertgpu.data.prepare_worker import _document_pairs, _truncate_pair
from bertgpu.data.segment import word_start_flags
from bertgpu.data.shards import ShardSet
from bertgpu.data.units import MIN_UNIT_BYTES, plan_units
from bertgpu.data.wikitext import read_wiki
from bertgpu.errors import BertgpuError


def test_nsp_random_next_sentence_rate_is_one_half():
    """Half of the sentence pairs get a random B (BERT's 50/50 NSP task); a biased coin, e.g.
    60/40, would silently skew the next-sentence labels."""
    docs = [[[10 * d + 1, 10 * d + 2], [10 * d + 3], [10 * d + 4, 10 * d + 5]]
            for d in range(50)]
    rng = np.random.default_rng(1234)
    n = 4000
    random_next = 0
    for k in range(n):
        d = k % len(docs)
        pairs = _document_pairs(docs, d, (d, d + 1), rng, 64, 0.0, Counter())
        # The first pair of a multi-sentence document is the one coin flip: later pairs of a
        # random-B document reuse its unused sentences, alone (random B by necessity).
        random_next += pairs[0][2]
    share = random_next / n
    assert abs(share - 0.5) < 0.04, share  # sd is 0.008: 5 sd wide, excludes 0.4 and 0.6


def test_truncate_pair_trims_b_on_a_tie():
    """BERT's truncate_seq_pair trims B when A and B are equally long; trimming A instead
    changes which tokens every tied pair keeps."""
    a, b = _truncate_pair(list(range(5)), list(range(5, 10)), 9, np.random.default_rng(0))
    assert (len(a), len(b)) == (5, 4)
    assert a == list(range(5))
    assert set(b) <= set(range(5, 10))


def test_wiki_page_without_ns_element_is_an_article():
    """A page without <ns> (older dumps, Special:Export) is an article, not dropped as another
    namespace; a page of another namespace still is."""
    xml = (b"<mediawiki>"
           b"<page><title>A</title><revision><text>Alpha.</text></revision></page>"
           b"<page><title>Talk:B</title><ns>1</ns><revision><text>Beta.</text></revision></page>"
           b"</mediawiki>")
    assert list(read_wiki(Path("dump.xml"), io.BytesIO(xml))) == ["Alpha."]


def test_jsonl_whitespace_only_line_is_skipped():
    """A JSON Lines file with a line of only spaces, a tab or a stray carriage return is read
    past that line instead of failing as "not valid JSON"."""
    lines = iter([(1, '{"text": "a"}', True), (2, "  \t\r", True), (3, '{"text": "b"}', True)])
    assert [t for _, t, _ in read_jsonl("c.jsonl", "text", lines)] == ["a", "b"]


def test_upper_case_compression_suffix_is_recognised(tmp_path):
    """CORPUS.TXT.GZ is a gzip name like corpus.txt.gz: the suffix is matched regardless of case,
    so a plain-text file named x.GZ is refused rather than read as text."""
    assert compression_suffix("A.TXT.GZ") == ".gz"
    assert compression_suffix("B.JSONL.BZ2") == ".bz2"
    plain = tmp_path / "x.GZ"
    plain.write_text("just text\n")
    with pytest.raises(BertgpuError, match=r"named \.gz but not a gzip stream"):
        open_binary(plain).close()


def test_whole_word_masking_refuses_a_vocab_longer_than_the_manifest(tmp_path):
    """With whole-word masking, a tokenizer vocab.txt with more entries than the manifest's
    vocab_size is a mismatched tokenizer and is refused, not used."""
    shards = ShardSet(write_synthetic_shards(tmp_path / "data"))
    Masker.from_shards(MaskingConfig(whole_word=True), shards)  # matching: accepted
    vocab = shards.tokenizer_dir / "vocab.txt"
    text = vocab.read_text(encoding="utf-8")
    vocab.write_text(text + ("" if text.endswith("\n") else "\n") + "##extra\n", encoding="utf-8")
    with pytest.raises(BertgpuError, match=rf"{shards.vocab_size + 1} entries, expected "
                                           rf"vocab_size {shards.vocab_size}"):
        Masker.from_shards(MaskingConfig(whole_word=True), ShardSet(shards.data_dir))


def test_whole_word_fallback_takes_the_word_with_the_smallest_key():
    """When every word is longer than the row's budget, the one word masked is the one whose
    first piece has the smallest Philox key, so a resumed run reproduces the same masks."""
    vocab_size, specials, mask_id = 20, [0, 1, 2, 3], 3
    continuation = np.arange(vocab_size) >= 10  # ids 10..19 are "##" pieces
    #              0  1   2   3  4   5   6  7   8   9  10
    row = np.array([1, 4, 10, 11, 5, 12, 13, 6, 14, 15, 2])
    starts = np.array([1, 4, 7])  # three words of 3 pieces; 9 candidates -> budget 1
    masker = Masker(MaskingConfig(whole_word=True), vocab_size, specials, mask_id,
                    continuation=continuation)
    B, L, seed, epoch = 24, len(row), 7, 2
    _, labels = masker.mask_batch(np.tile(row, (B, 1)), np.full(B, L), seed, np.full(B, epoch),
                                  np.arange(B))
    for i in range(B):
        keys = _philox(seed, _MASK_DOMAIN, epoch, i).random((3, L))[0]
        first = int(starts[np.argmin(keys[starts])])
        got = np.flatnonzero(labels[i] != -100).tolist()
        assert got == [first, first + 1, first + 2], (i, keys[starts])


def test_continuation_piece_at_a_segmenter_word_start_is_not_a_word_start():
    """A "##" piece stays inside its WordPiece word even where the segmenter starts a word at its
    first character (jieba cuts inside "café"): its word-start flag is 0."""
    continuation = np.zeros(10, dtype=bool)
    continuation[7] = True  # id 7 is a "##" piece
    flags = word_start_flags([5, 7, 6], [0, 3, 4], continuation, np.array([0, 3, 4]))
    assert flags.tolist() == [1, 0, 1]
    assert flags.dtype == np.uint8


def test_files_of_exactly_unit_bytes_are_units_of_their_own(tmp_path):
    """A file whose size is exactly the unit size fills a unit: it is not merged with the next
    file into a unit twice as large."""
    files = []
    for name in ("a.txt", "b.txt"):
        path = tmp_path / name
        path.write_bytes((b"x" * 63 + b"\n") * (MIN_UNIT_BYTES // 64))
        assert path.stat().st_size == MIN_UNIT_BYTES
        files.append(path)
    units = plan_units(files, "lines", MIN_UNIT_BYTES)
    assert [[p.src for p in u.pieces] for u in units] == [[files[0]], [files[1]]]
