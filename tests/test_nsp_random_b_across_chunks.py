"""Random next segments (NSP label 1) of long documents, whose chunks hold one or two of them:
B came only from the chunk's documents, so a book alone in its chunk took every random B from
itself, and the others from one neighbour (`nsp_candidates` carries earlier documents' runs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _text_fixtures import train_small_tokenizer, write_sentences

from bertgpu.data import pipeline, split
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer_folder import load_tokenizer

N_DOCS = 5


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 2000-4000 characters (read when the chunks are cut), pieces of 256 tokens: each
    document spans chunks, and a chunk holds one or two, as books do."""
    monkeypatch.setattr(pipeline, "CHUNK_CHARS", 2000)
    monkeypatch.setattr(pipeline, "MAX_CHUNK_CHARS", 4000)
    monkeypatch.setattr(split, "PIECE_TOKENS", 256)


def _words(tok) -> list[str]:
    """N_DOCS words that are one token each: document d's sentences are words[d] alone."""
    vocab = load_tokenizer(tok).get_vocab()
    return sorted(w for w in vocab if w.isalpha() and len(w) >= 5)[:N_DOCS]


def _books(tmp_path, tok):
    """N_DOCS documents of ~8000 characters."""
    docs = [[" ".join([w] * (3 + i % 5)) + " ." for i in range(220)] for w in _words(tok)]
    return write_sentences(tmp_path / "books.txt", docs)


def _random_pairs(out, tok):
    """(document of A, document of B) of each random row, in row order."""
    vocab = load_tokenizer(tok).get_vocab()
    marker = {vocab[w]: d for d, w in enumerate(_words(tok))}
    shards = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]

    def load(key):
        return np.concatenate([np.load(out / f"{s['name']}.{key}.npy") for s in shards])

    pairs = []
    for row, tt, n, label in zip(load("input_ids"), load("token_type_ids"), load("lengths"),
                                 load("nsp_labels"), strict=True):
        if label == 1:
            a = {marker[t] for t in row[:n][tt[:n] == 0].tolist() if t in marker}
            b = {marker[t] for t in row[:n][tt[:n] == 1].tolist() if t in marker}
            assert len(a) == 1 and len(b) == 1, (a, b)
            pairs.append((a.pop(), b.pop()))
    return pairs


def test_random_b_of_long_documents_comes_from_other_documents_of_the_unit(
        tok, tmp_path, small_chunks):
    """Only the first chunk (pieces of document 0 alone) may take B from A's own document, and
    the last document's Bs spread over earlier ones; it is alone in its chunks, and took every
    random B from itself."""
    corpus = _books(tmp_path, tok)
    prepare([corpus], tok, tmp_path / "out", seq_len=32, objective="mlm+nsp", workers=1,
            validation_fraction=0.0)
    pairs = _random_pairs(tmp_path / "out", tok)
    assert [a for a, _ in pairs] == sorted(a for a, _ in pairs)
    assert all(a != b for a, b in pairs if a > 0), [p for p in pairs if 0 < p[0] == p[1]]
    last = {b for a, b in pairs if a == N_DOCS - 1}
    assert len(last) >= 3 and N_DOCS - 1 not in last, last


def test_long_documents_give_the_same_rows_for_one_and_two_workers(tok, tmp_path, small_chunks):
    """The candidates are chosen in the main process, from the text alone."""
    corpus = _books(tmp_path, tok)
    kw = dict(seq_len=32, objective="mlm+nsp", validation_fraction=0.1)
    prepare([corpus], tok, tmp_path / "one", workers=1, **kw)
    prepare([corpus], tok, tmp_path / "two", workers=2, **kw)
    for path in sorted((tmp_path / "one").glob("*.npy")):
        assert path.read_bytes() == (tmp_path / "two" / path.name).read_bytes(), path.name



def test_the_same_document_warning_does_not_suggest_chunk_docs(tok, tmp_path):
    """A corpus of one document has no other for a random B, whatever --chunk-docs: the
    warning asked for more documents per chunk with --chunk-docs, which changed no byte."""
    corpus = write_sentences(tmp_path / "one.txt",
                             [[f"the value number {i} is here ." for i in range(300)]])
    with pytest.warns(UserWarning, match="labelled random with B from A's own document") as seen:
        prepare([corpus], tok, tmp_path / "out", seq_len=32, objective="mlm+nsp", workers=1,
                validation_fraction=0.0)
    (message,) = [str(w.message) for w in seen if "A's own document" in str(w.message)]
    assert "--chunk-docs" not in message and "more documents" in message
