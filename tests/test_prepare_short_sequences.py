"""``--short-seq-prob`` and BERT's truncate_seq_pair in mlm+nsp preparation.

BERT's create_pretraining_data gives a document, with probability short_seq_prob (0.1), a target
length drawn uniformly from [2, max] instead of the maximum, so pretraining also sees the short
sequences fine-tuning will; and truncate_seq_pair trims a token at a time from the front or the
back of the longer side at random. A mutation probe found no test failing when every target was
the maximum (the option did nothing) or when every trim took the back: every test prepared with
short_seq_prob 0 or ignored row lengths, and no test looked at which end a trim took.
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from bertgpu.data.prepare_worker import _document_pairs, _truncate_pair

SEQ_LEN = 64
MAX_TOKENS = SEQ_LEN - 3  # [CLS] A [SEP] B [SEP]


def _row_lengths(out: Path) -> np.ndarray:
    from bertgpu.data.shards import ShardSet

    shards = ShardSet(out)
    return np.concatenate([np.load(out / f"{name}.lengths.npy") for name in shards.shard_names])


def word_corpus(path: Path, docs: int, sentences: int, words: tuple[int, int]) -> Path:
    """A generated corpus at `path`: `docs` documents of `sentences` sentences, each of
    `words` (low, high exclusive) words drawn from 36 ("waa" ... "wff"), a blank line between
    documents (seeded: the same text every time)."""
    rng = np.random.default_rng(0)
    vocabulary = [f"w{a}{b}" for a in "abcdef" for b in "abcdef"]
    text = [" ".join(" ".join(rng.choice(vocabulary, int(rng.integers(*words)))).capitalize()
                     + "." for _ in range(sentences)) for _ in range(docs)]
    path.write_text("".join(d + "\n\n" for d in text))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[float, np.ndarray]:
    """Row lengths of one generated corpus (600 documents of 30 sentences of 6 to 11 words)
    prepared as mlm+nsp at seq_len 64 with short_seq_prob 0 and 0.1 (one seed)."""
    from bertgpu.data.prepare import prepare
    from bertgpu.data.tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("short")
    corpus = word_corpus(tmp / "corpus.txt", docs=600, sentences=30, words=(6, 12))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small vocabulary: the tokenizer warns of it
        tok = train_tokenizer([corpus], tmp / "tok", vocab_size=100, min_frequency=1)
        lengths = {}
        for p in (0.0, 0.1):
            out = tmp / f"data{p}"
            prepare([corpus], tok, out, seq_len=SEQ_LEN, objective="mlm+nsp", fmt="text",
                    workers=1, validation_fraction=0.0, short_seq_prob=p, seed=3)
            lengths[p] = _row_lengths(out)
    return lengths


def test_short_seq_prob_gives_short_rows(prepared):
    """Without short sequences only a document's last row is short (about 6% of rows here);
    with 0.1, a tenth of the documents have a short target and cut into more, shorter rows
    (measured over eight seeds: 16% to 21% of rows under 40 tokens, against 5.5% to 6.2%)."""
    full, short = prepared[0.0], prepared[0.1]
    assert (full <= SEQ_LEN).all() and (short <= SEQ_LEN).all()
    share_full, share_short = (full < 40).mean(), (short < 40).mean()
    assert share_full < 0.09, share_full
    assert 0.11 < share_short < 0.35, share_short
    assert share_short - share_full > 0.05
    assert len(short) > len(full)  # shorter targets: more rows from the same text
    # The short targets are spread over [2, max], not one length: rows of every size show up.
    counts = np.histogram(short, bins=[0, 24, 32, 40, 48])[0]
    assert (counts > 0.01 * len(short)).all(), counts


def test_short_targets_are_uniform_over_two_to_max():
    """With one-token sentences a pair whose B is the actual next text holds exactly the
    document's target: a tenth of the documents get a short one, uniform over [2, max]."""
    docs = [[[1000 * d + k] for k in range(200)] for d in range(50)]
    rng = np.random.default_rng(5)
    targets = []
    for k in range(8000):
        d = k % len(docs)
        a, b, label = _document_pairs(docs, d, (d, d + 1), rng, MAX_TOKENS, 0.1, Counter())[0]
        if label == 0:  # B follows A: the chunk was cut at the target
            targets.append(len(a) + len(b))
    targets = np.array(targets)
    assert len(targets) > 3000
    short = targets[targets < MAX_TOKENS]
    assert 0.07 < len(short) / len(targets) < 0.13, len(short) / len(targets)  # sd 0.005
    assert targets.min() >= 2 and targets.max() == MAX_TOKENS
    # Uniform over 2..max: each third of the range holds about a third of the short targets
    # (each target in [2, max - 1] here; max itself counts as full).
    thirds = np.histogram(short, bins=[2, 22, 42, MAX_TOKENS])[0] / len(short)
    assert (np.abs(thirds - 1 / 3) < 0.1).all(), thirds


def test_truncation_trims_the_front_or_the_back_at_random():
    """truncate_seq_pair removes each token from the front or the back with a fair coin: over
    many pairs about half the removed tokens are the front's, on both sides of the pair, and
    what is kept is one contiguous stretch."""
    rng = np.random.default_rng(11)
    front = {"a": 0, "b": 0}
    removed = {"a": 0, "b": 0}
    for _ in range(300):
        a, b = _truncate_pair(list(range(100)), list(range(100, 180)), 100, rng)
        assert len(a) + len(b) == 100
        for name, kept, first, full in (("a", a, 0, 100), ("b", b, 100, 80)):
            assert kept == list(range(kept[0], kept[0] + len(kept)))
            front[name] += kept[0] - first
            removed[name] += full - len(kept)
    assert removed["a"] == 300 * 50 and removed["b"] == 300 * 30  # the longer side first
    for name in "ab":
        share = front[name] / removed[name]
        assert 0.45 < share < 0.55, (name, share)  # sd under 0.005
