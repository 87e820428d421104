"""`Masker.from_shards` on a shard set `prepare` wrote: no special token of the manifest
([PAD], [UNK], [CLS], [SEP], [MASK]) is ever chosen for prediction or drawn as a random
replacement. The masking unit tests build a Masker from a hand-made special set; a mutation probe
found no test failing when from_shards left [UNK] out of the specials, which training on real
shards would then mask, predict and insert at random."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_prepare_short_sequences import word_corpus

from bertgpu.batch import IGNORE_INDEX
from bertgpu.data.masking import Masker, MaskingConfig
from bertgpu.data.shards import ShardSet


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> ShardSet:
    from bertgpu.data.prepare import prepare
    from bertgpu.data.tokenizer import train_tokenizer

    tmp = tmp_path_factory.mktemp("specials")
    corpus = word_corpus(tmp / "corpus.txt", docs=40, sentences=6, words=(4, 9))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small vocabulary: the tokenizer warns of it
        tok = train_tokenizer([corpus], tmp / "tok", vocab_size=80, min_frequency=1)
        prepare([corpus], tok, tmp / "data", seq_len=32, objective="mlm", fmt="text",
                workers=1, validation_fraction=0.0, short_seq_prob=0.0, seed=1)
    return ShardSet(tmp / "data")


@pytest.mark.parametrize("whole_word", [False, True])
def test_from_shards_never_masks_or_draws_a_special_token(shards, whole_word):
    special = shards.special_tokens
    assert set(special) == {"pad", "unk", "cls", "sep", "mask"}
    ids_special = np.array(sorted(special.values()))
    masker = Masker.from_shards(MaskingConfig(whole_word=whole_word), shards)
    n, T = 2000, shards.seq_len
    assert len(shards) >= 10
    rows = shards.get(np.arange(n) % 10)["input_ids"].astype(np.int64)  # (n, T)
    lengths = np.full(n, T)
    # Every special token sits inside every row's real length, and a tenth of the rows are
    # nothing but [UNK]s between [CLS] and [SEP] (a text the tokenizer did not know at all).
    rows[:, 1:6] = ids_special
    rows[::10, 1:-1] = special["unk"]
    rows[::10, 0], rows[::10, -1] = special["cls"], special["sep"]
    masked, labels = masker.mask_batch(rows, lengths, seed=7, epochs=np.zeros(n, np.int64),
                                       indices=np.arange(n))
    is_special = np.isin(rows, ids_special)
    assert (labels[is_special] == IGNORE_INDEX).all()  # never chosen for prediction
    assert (masked[is_special] == rows[is_special]).all()  # nor changed
    assert (labels[::10] == IGNORE_INDEX).all()  # a row of [UNK]s has nothing to predict
    replaced = (labels != IGNORE_INDEX) & (masked != special["mask"]) & (masked != rows)
    drawn = masked[replaced]
    # Enough random replacements that a special id among the candidates would be drawn
    # (here 1 in 57 per draw: about a dozen of 700), and they range over the vocabulary.
    assert replaced.sum() > 500
    assert len(set(drawn.tolist())) > shards.vocab_size // 2
    assert not np.isin(drawn, ids_special).any()
