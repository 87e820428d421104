"""prepare with a vocabulary past uint16: the shards' ids are uint32 from 65536 tokens on (added
tokens counted), so ids 65536 and up are stored as they are, not wrapped (70000 -> 4464); and the
writer refuses an id its dtype cannot hold rather than wrap it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from _text_fixtures import write_sentences

from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer_folder import SPECIAL_TOKENS, load_tokenizer
from bertgpu.data.writer import Packer, ShardWriter
from bertgpu.errors import BertgpuError

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "."]
ADDED = [f"zyxadded{i}" for i in range(12)]  # added tokens, past the WordPiece vocabulary
WORD_DOCS = [[f"{WORDS[j]} {WORDS[j + 1]} {WORDS[j + 2]}." for j in range(i, len(WORDS) - 3)]
             for i in range(8)]
ADDED_DOCS = [[*doc, f"alpha {ADDED[i]} beta {ADDED[-1 - i]}."] for i, doc in enumerate(WORD_DOCS)]


def _vocab_folder(folder, size):
    """A vocab.txt-only tokenizer of ``size`` tokens whose real words are its last ids."""
    folder.mkdir()
    fillers = [f"filler{i}" for i in range(size - len(SPECIAL_TOKENS) - len(WORDS))]
    tokens = [*SPECIAL_TOKENS, *fillers, *WORDS]
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in tokens), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_sentences(tmp_path_factory.mktemp("corpus") / "docs.txt", WORD_DOCS)


@pytest.fixture(scope="module")
def added_corpus(tmp_path_factory):
    return write_sentences(tmp_path_factory.mktemp("corpus") / "docs.txt", ADDED_DOCS)


def _rows(out, split="train"):
    m = json.loads((out / "manifest.json").read_text())
    shards = m["splits"][split]["shards"]
    ids = np.concatenate([np.load(out / f"{s['name']}.input_ids.npy") for s in shards])
    lengths = np.concatenate([np.load(out / f"{s['name']}.lengths.npy") for s in shards])
    return m, ids, lengths


def _expected(tok_dir, docs):
    t = load_tokenizer(tok_dir)
    sep = t.token_to_id("[SEP]")
    expected: list[int] = []
    for doc in docs:
        if expected:
            expected.append(sep)
        expected += t.encode(" ".join(doc), add_special_tokens=False).ids
    return expected


def _stream(ids, lengths):
    return np.concatenate([row[1 : n - 1] for row, n in zip(ids, lengths, strict=True)]).tolist()


def test_added_tokens_past_65535_make_uint32_shards_that_hold_every_id(added_corpus, tmp_path):
    """65539 WordPiece tokens + 12 added ones: vocab_size counts the added tokens (65551), the ids
    are uint32 and ids 65536 and up (the words and the added tokens) come back exactly."""
    base = _vocab_folder(tmp_path / "base", 65539)
    tok = load_tokenizer(base)
    assert tok.add_tokens(ADDED) == len(ADDED)
    assert tok.get_vocab_size(with_added_tokens=False) == 65539
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))  # (no vocab.txt: the added tokens are in the file)
    expected = _expected(folder, ADDED_DOCS)
    assert max(expected) == 65550 and min(i for i in expected if i > 3) == 65528

    out = tmp_path / "data"
    m = prepare([added_corpus], folder, out, seq_len=16, workers=1, validation_fraction=0.0)
    assert m["vocab_size"] == 65539 + len(ADDED) and m["dtype"] == "uint32"
    _, ids, lengths = _rows(out)
    assert ids.dtype == np.uint32
    assert _stream(ids, lengths) == expected
    assert sum(i >= 65536 for i in expected) > 20  # ids that uint16 would have wrapped


@pytest.mark.parametrize(("size", "dtype"), [(65535, np.uint16), (65536, np.uint32),
                                             (65547, np.uint32)])
def test_the_id_dtype_follows_the_vocabulary_size(corpus, tmp_path, size, dtype):
    """uint16 up to 65535 tokens, uint32 from 65536 (ARCHITECTURE: "uint32 if vocab > 65535");
    the words sit at the last ids, so each set holds its vocabulary's largest ids."""
    tok = _vocab_folder(tmp_path / "tok", size)
    out = tmp_path / "data"
    m = prepare([corpus], tok, out, seq_len=16, workers=1, validation_fraction=0.0)
    assert m["vocab_size"] == size and m["dtype"] == np.dtype(dtype).name
    _, ids, lengths = _rows(out)
    assert ids.dtype == dtype
    expected = _expected(tok, WORD_DOCS)
    assert max(expected) == size - 1
    assert _stream(ids, lengths) == expected


def test_the_writer_refuses_an_id_its_dtype_cannot_hold(tmp_path):
    """A uint16 writer given id 70000 (through the packer or as rows) raises in one line instead
    of storing 4464; 65535 is stored."""
    writer = ShardWriter(tmp_path, "train", 8, np.uint16, 100, nsp=False)
    packer = Packer(writer, 8, cls=2, sep=3)
    packer.add(np.array([65535, 7, 9, 11, 13, 15], np.int32), None, joins=False)
    with pytest.raises(BertgpuError, match=r"token id 70000 does not fit the shards' uint16"):
        packer.add(np.array([5, 70000], np.int32), None, joins=True)
    rows = np.full((1, 8), 70000, np.int64)
    with pytest.raises(BertgpuError, match=r"token id 70000 does not fit the shards' uint16"):
        writer.add({"input_ids": rows, "lengths": np.array([8], np.int32)})
    writer.flush()
    stored = np.load(tmp_path / "train-00000.input_ids.npy")
    assert stored.dtype == np.uint16 and stored[0, 1:7].tolist() == [65535, 7, 9, 11, 13, 15]
