"""prepare's validation line for mlm+nsp: the share of the shards' tokens is not the share of
the corpus's tokens that the split holds out (sentence pairs add [CLS], [SEP] and random next
sentences, in other proportions in a small split), and the line says which is which."""

from __future__ import annotations

from bertgpu.data.prepare import split_summary


def _manifest(objective: str) -> dict:
    return {"splits": {"validation": {"sequences": 87, "tokens": 9556}}, "objective": objective,
            "validation_share": 0.01175, "split_unit": "whole", "validation_docs": None,
            "validation_fraction": 0.01, "counts": {"documents": 106}}


def test_the_nsp_line_names_the_shards_tokens_and_the_corpus_tokens_asked():
    line = split_summary(_manifest("mlm+nsp"))
    assert line.startswith("validation: 87 sequences, 1.18% of the shards' tokens (asked 1.00% "
                           "of the corpus's: sentence pairs add [CLS], [SEP] and random next "
                           "sentences"), line


def test_the_mlm_line_is_unchanged():
    assert split_summary(_manifest("mlm")) == ("validation: 87 sequences, 1.18% of the tokens "
                                               "(asked 1.00%); split by whole documents")
