"""GLUE / classify encoding against transformers' own BERT tokenizer: `[CLS] a [SEP] b [SEP]`,
token types, longest-first truncation to max_seq_len counting the specials, and no padding even
when the tokenizer arrives with a padding setting (a Hugging Face tokenizer.json may carry one).

A mutation probe found no test failing when encode_pairs stopped clearing the tokenizer's
padding: every sequence then came back padded to the batch's longest, its [PAD]s counted as
tokens (attended to, since the attention mask is built from the lengths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _tiny_init import word_tokenizer

from bertgpu.tasks.finetuning import encode_pairs
from bertgpu.tasks.glue import Example

WORDS = [f"w{i}" for i in range(40)] + ["alpha", "beta", "gamma"]

EXAMPLES = [
    Example("0", " ".join(f"w{i}" for i in range(30)), "alpha beta gamma", 0),  # long first
    Example("1", "alpha", " ".join(f"w{i}" for i in range(25)), 1),  # long second
    Example("2", "w1 w2 w3 w4 w5 w6 w7 w8 w9", "w10 w11 w12 w13 w14 w15 w16 w17", 0),  # both
    Example("3", "beta gamma", "w3", 1),  # fits
    Example("4", "w5 w6 w7", None, 0),  # a single sentence
    Example("5", " ".join(f"w{i}" for i in range(40)), None, 1),  # a long single sentence
]


@pytest.mark.parametrize("max_seq_len", [8, 13, 16])
def test_pairs_encode_as_transformers_bert_tokenizer(tmp_path: Path, max_seq_len: int) -> None:
    """ids and token types of every example equal transformers' tokenizer(a, b,
    truncation="longest_first", max_length=max_seq_len), though the tokenizer we pass pads."""
    transformers = pytest.importorskip("transformers")
    tok = word_tokenizer(tmp_path / "tok", WORDS)
    tok.enable_padding()  # as a tokenizer.json with "padding": BatchLongest arrives
    ref = transformers.BertTokenizer.from_pretrained(str(tmp_path / "tok"))
    enc = encode_pairs(tok, EXAMPLES, max_seq_len, regression=False)
    for i, ex in enumerate(EXAMPLES):
        want = (ref(ex.text_a, ex.text_b, truncation="longest_first", max_length=max_seq_len)
                if ex.text_b is not None
                else ref(ex.text_a, truncation="longest_first", max_length=max_seq_len))
        assert enc.ids[i].tolist() == want["input_ids"], (max_seq_len, ex.guid)
        assert enc.types[i].tolist() == want["token_type_ids"], (max_seq_len, ex.guid)
        assert len(enc.ids[i]) <= max_seq_len
