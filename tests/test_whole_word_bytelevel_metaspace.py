"""Whole-word masking with tokenizers that mark word starts, not continuations: byte-level BPE
(RoBERTa, ModernBERT: "Ġword") and Metaspace (SentencePiece: "▁word").

Word continuation was read from a "##" prefix alone, which such vocabularies do not have: every
token counted as a word of its own and `data.whole_word_masking = true` silently masked single
tokens (the probe: "156 of 1470 words only partly masked"). A tokenizer whose words cannot be
told is now refused in one line instead."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertgpu.batch import IGNORE_INDEX
from bertgpu.data.masking import (
    Masker,
    MaskingConfig,
    continuation_table,
    continuation_table_from_vocab,
)
from bertgpu.data.prepare import prepare
from bertgpu.data.shards import ShardSet
from bertgpu.errors import BertgpuError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = ["The quick brown fox jumps over the lazy dog, then it ran far away.",
         "Tokenizers split uncommon words into several pieces: unbelievably, remarkably.",
         "Whole-word masking hides every piece of a word together, never just a part."]


def _save(tok, folder):
    """`tok` saved as transformers saves a fast tokenizer, with BERT's special tokens."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", pad_token="[PAD]",
                            mask_token="[MASK]").save_pretrained(folder)
    return folder


def _byte_level(folder):
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()  # few merges: most words take several tokens
    trainer.train_from_iterator(TEXTS, vocab_size=300, min_frequency=1, show_progress=False,
                                special_tokens=SPECIALS)
    return _save(trainer._tokenizer, folder)


def _metaspace(folder):
    from tokenizers import SentencePieceBPETokenizer

    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(TEXTS, vocab_size=120, min_frequency=1, show_progress=False,
                                special_tokens=SPECIALS)
    return _save(trainer._tokenizer, folder)


def _shards(tok, tmp_path) -> ShardSet:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 8))
    prepare([corpus], tok, tmp_path / "d", seq_len=32, workers=1, validation_fraction=0.0)
    return ShardSet(tmp_path / "d")


def _words(tokens: list[str], marker: str) -> np.ndarray:
    """Word number of each position: a word is a token starting with `marker` and the tokens
    that follow it without one; a special token is a word of its own."""
    starts = [t in SPECIALS or t.startswith(marker) or (i > 0 and tokens[i - 1] in SPECIALS)
              for i, t in enumerate(tokens)]
    return np.cumsum(starts)


@pytest.mark.parametrize(("make", "marker"), [(_byte_level, "Ġ"), (_metaspace, "\u2581")])
def test_whole_words_are_masked_all_or_nothing(tmp_path, make, marker):
    from tokenizers import Tokenizer

    tok = make(tmp_path / "tok")
    shards = _shards(tok, tmp_path)
    vocab = Tokenizer.from_file(str(tok / "tokenizer.json"))
    masker = Masker.from_shards(MaskingConfig(whole_word=True, mask_rate=0.3), shards)
    rows = shards.get(range(len(shards)))
    B = len(shards)
    partly, whole = 0, 0
    for epoch in range(20):
        _, labels = masker.mask_batch(rows["input_ids"], rows["lengths"], 3,
                                      np.full(B, epoch), np.arange(B))
        for b in range(B):
            n = int(rows["lengths"][b])
            tokens = [vocab.id_to_token(int(i)) for i in rows["input_ids"][b, :n]]
            word_of = _words(tokens, marker)
            chosen = labels[b, :n] != IGNORE_INDEX
            for w in np.unique(word_of):
                span = chosen[word_of == w]
                partly += int(span.any() and not span.all())
                whole += int(span.all() and span.size > 1)
    assert partly == 0, f"{partly} words only partly masked"
    assert whole > 50  # words of several tokens were masked, whole


def test_a_byte_level_words_punctuation_and_special_tokens(tmp_path):
    """The marker rule: "dog," is one word ("," has no "Ġ": whitespace-delimited words, as
    fairseq's RoBERTa masks them); a line break starts a word as a space does; added tokens
    never continue one."""
    from tokenizers import Tokenizer

    tok = _byte_level(tmp_path / "tok")
    table = continuation_table(tok)
    vocab = Tokenizer.from_file(str(tok / "tokenizer.json")).get_vocab()
    assert not table[[vocab[t] for t in SPECIALS]].any()
    assert table[vocab[","]] and table[vocab["o"]]
    assert not table[vocab["Ġ"]] and not table[vocab["Ċ"]]
    assert not table[[i for t, i in vocab.items() if t.startswith("Ġ")]].any()


def test_a_custom_metaspace_replacement_marks_the_word_starts(tmp_path):
    from tokenizers import pre_tokenizers

    from bertgpu.data.word_rule import rule_of_state

    state = json.loads(pre_tokenizers.Metaspace(replacement="_").__getstate__())
    rule = rule_of_state({"model": {"type": "Unigram"}, "pre_tokenizer": state})
    assert rule is not None and not rule.continues("_word") and rule.continues("ing")
    # Llama's layout: the normaliser writes "▁", only the decoder says what it means.
    llama = {"model": {"type": "BPE"}, "pre_tokenizer": None,
             "decoder": {"type": "Sequence", "decoders": [
                 {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                 {"type": "ByteFallback"}, {"type": "Fuse"}]}}
    rule = rule_of_state(llama)
    assert rule is not None and not rule.continues("\u2581the") and rule.continues("re")


def test_a_tokenizer_whose_words_cannot_be_told_is_refused(tmp_path):
    """A BPE behind a Whitespace pre-tokenizer marks no word boundary in its tokens: refused in
    one line naming the option and the folder, not masked token by token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=150, special_tokens=SPECIALS,
                                                       show_progress=False))
    shards = _shards(_save(tok, tmp_path / "tok"), tmp_path)
    with pytest.raises(BertgpuError) as e:
        Masker.from_shards(MaskingConfig(whole_word=True), shards)
    message = str(e.value)
    assert "\n" not in message and message.startswith("data.whole_word_masking: ")
    assert str(shards.tokenizer_dir) in message and "BPE model" in message
    assert "Whitespace pre-tokenizer" in message and "expected a WordPiece" in message
    Masker.from_shards(MaskingConfig(whole_word=False), shards)  # single tokens: no rule needed


def test_segmented_shards_need_no_rule_of_the_tokenizer(tmp_path):
    """Shards with a segmenter's word starts (`prepare --whole-word-segmenter jieba`) decide
    their words themselves: a tokenizer of no known kind is no error there."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate([*SPECIALS, "a"])}, merges=[],
                               unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = _save(tok, tmp_path / "tok")
    shards = SimpleNamespace(tokenizer_dir=folder, vocab_size=6, has_word_starts=True,
                             special_tokens={k: i for i, k in enumerate(
                                 ["pad", "unk", "cls", "sep", "mask"])})
    masker = Masker.from_shards(MaskingConfig(whole_word=True), shards)
    ids = np.array([[2, 5, 5, 5, 3]])
    _, labels = masker.mask_batch(ids, np.array([5]), 0, np.zeros(1), np.zeros(1),
                                  word_starts=np.array([[0, 1, 0, 0, 0]], bool))
    assert (labels[0, 1:4] != IGNORE_INDEX).all()  # one word of three tokens, masked whole
    shards.has_word_starts = False
    with pytest.raises(BertgpuError, match="data.whole_word_masking"):
        Masker.from_shards(MaskingConfig(whole_word=True), shards)


def test_wordpiece_continuations_are_still_the_double_hash_pieces(tmp_path):
    """A WordPiece folder (vocab.txt and tokenizer.json, or tokenizer.json alone) keeps its
    "##" table."""
    from tokenizers import BertWordPieceTokenizer

    trainer = BertWordPieceTokenizer(lowercase=True)
    trainer.train_from_iterator(TEXTS, vocab_size=150, min_frequency=1, show_progress=False,
                                special_tokens=SPECIALS)
    folder = tmp_path / "wp"
    folder.mkdir()
    trainer.save_model(str(folder))  # vocab.txt
    trainer.save(str(folder / "tokenizer.json"))
    expected = continuation_table_from_vocab(folder / "vocab.txt")
    assert expected.sum() > 10 and not expected[:5].any()
    np.testing.assert_array_equal(continuation_table(folder), expected)
    (folder / "vocab.txt").unlink()
    np.testing.assert_array_equal(continuation_table(folder), expected)


def test_the_start_up_table_says_where_words_start(tmp_path):
    """`bertgpu pretrain` said "whole words" whatever its tokenizer made of them."""
    from types import SimpleNamespace

    import torch

    from bertgpu.config.schema import load_config
    from bertgpu.train import distributed
    from bertgpu.train.pretrain_startup import startup_rows

    shards = _shards(_byte_level(tmp_path / "tok"), tmp_path)
    cfg = load_config(None, ["--data.whole_word_masking", "true"])
    info = distributed.DistInfo(0, 1, 0, "cpu", "gloo", 1)
    rows = dict(startup_rows(cfg, SimpleNamespace(dir=tmp_path / "d", train=shards),
                             torch.nn.Linear(2, 2), 1e-4, micro=4, accumulation=1, info=info))
    assert rows["masking"] == ("15% of the tokens, whole words by byte-level BPE's \"Ġ\" word "
                               "starts (validation 15% of single tokens)")
