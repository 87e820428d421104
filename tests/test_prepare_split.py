"""prepare on corpora of any shape (issue 12): the validation share asked for whatever the number
of documents, one document per line, and bounded memory for a corpus that is one huge document."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _text_fixtures import pydoc_documents, train_small_tokenizer, write_sentences

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer import load_tokenizer
from bertgpu.errors import BertgpuError

CLS, SEP = 2, 3


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The pydoc text (~150k tokens) as 1, 2, 3 documents (no blank lines inside) or 79 topics."""
    folder = tmp_path_factory.mktemp("corpora")
    docs = pydoc_documents()
    flat = [s for d in docs for s in d]
    out = {"many": write_sentences(folder / "many.txt", docs)}
    for n in (1, 2, 3):
        k = len(flat) // n
        out[n] = write_sentences(folder / f"{n}.txt", [flat[i * k : (i + 1) * k if i < n - 1 else None] for i in range(n)])
    return out


def _load(out, split, key):
    shards = json.loads((out / "manifest.json").read_text())["splits"][split]["shards"]
    if not shards:
        return np.zeros(0)
    return np.concatenate([np.load(out / f"{s['name']}.{key}.npy") for s in shards])


def _share_ok(m, fraction, rel, seq_len):
    """The validation share of the tokens is the fraction asked, within rel * fraction plus the
    rounding of two rows."""
    total = m["counts"]["tokens"]
    share = m["splits"]["validation"]["tokens"] / total
    assert share == pytest.approx(m["validation_share"], abs=1e-6)
    return abs(share - fraction) <= rel * fraction + 2 * seq_len / total


@pytest.mark.parametrize("n_docs", [1, 2, 3, "many"])
def test_validation_share_is_what_was_asked_whatever_the_number_of_documents(tok, corpora, tmp_path, n_docs):
    corpus = corpora[n_docs]
    for fraction in (0.1, 0.02):
        m = prepare([corpus], tok, tmp_path / f"mlm{fraction}", seq_len=64, workers=1, validation_fraction=fraction)
        assert _share_ok(m, fraction, 0.1, 64), (fraction, m["validation_share"])
        assert m["split_unit"] == "chunk" and m["cut_documents"] >= 1  # pydoc topics are too big to go whole
        docs = m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"]
        assert docs == m["counts"]["documents"] == (79 if n_docs == "many" else n_docs)
    nsp = prepare([corpus], tok, tmp_path / "nsp", seq_len=64, objective="mlm+nsp", workers=1, validation_fraction=0.1)
    assert _share_ok(nsp, 0.1, 0.2, 64), nsp["validation_share"]  # pairs move tokens: a looser bound
    two = prepare([corpus], tok, tmp_path / "two", seq_len=64, workers=2, validation_fraction=0.1)
    assert {k: v for k, v in two.items()} == json.loads((tmp_path / "mlm0.1" / "manifest.json").read_text())
    for name in sorted(p.name for p in (tmp_path / "two").glob("*.npy")):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "mlm0.1" / name).read_bytes(), name


def test_many_small_documents_are_held_out_whole(tok, tmp_path):
    sentences = [s for d in pydoc_documents() for s in d if len(s) < 400]  # no code listings
    docs = [sentences[i : i + 5] for i in range(0, len(sentences), 5)]  # ~700 documents of ~150 tokens
    corpus = write_sentences(tmp_path / "small.txt", docs)
    m = prepare([corpus], tok, tmp_path / "out", seq_len=64, workers=1, validation_fraction=0.1)
    assert m["split_unit"] == "document" and m["cut_documents"] == 0
    assert _share_ok(m, 0.1, 0.1, 64)
    val_docs = m["splits"]["validation"]["documents"]
    assert 0.07 * len(docs) < val_docs < 0.13 * len(docs)
    assert val_docs + m["splits"]["train"]["documents"] == len(docs)


def test_validation_fraction_zero_holds_out_nothing_and_summary_says_how(tok, corpora, tmp_path, capsys):
    base = ["prepare", "--corpus", str(corpora[1]), "--tokenizer", str(tok), "--seq-len", "64", "--workers", "1"]
    assert cli_main([*base, "--out", str(tmp_path / "none"), "--validation-fraction", "0"]) == 0
    out = capsys.readouterr().out
    assert "no validation split (--validation-fraction 0)" in out
    m = json.loads((tmp_path / "none" / "manifest.json").read_text())
    assert m["split_unit"] == "none" and m["splits"]["validation"]["sequences"] == 0 and m["validation_share"] == 0
    assert cli_main([*base, "--out", str(tmp_path / "one"), "--validation-fraction", "0.05"]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert f"{m['validation_share']:.2%} of the tokens (asked 5.00%)" in out
    assert "split by chunks of documents: 1 of 1 documents have chunks on both sides" in out


def test_lines_format_for_tokenizer_and_prepare(tmp_path, capsys):
    short = [s for d in pydoc_documents() for s in d if len(s) < 200]
    reviews = [" ".join(short[i : i + 2]) for i in range(0, len(short), 2)]  # one per line, no blank lines
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(reviews) + "\n", encoding="utf-8")
    assert cli_main(["tokenizer", "--corpus", str(corpus), "--format", "lines", "--vocab-size", "600",
                     "--out", str(tmp_path / "tok")]) == 0
    assert f"{len(reviews)} documents" in capsys.readouterr().out
    assert cli_main(["prepare", "--corpus", str(corpus), "--format", "lines", "--tokenizer", str(tmp_path / "tok"),
                     "--out", str(tmp_path / "data"), "--seq-len", "32", "--workers", "1",
                     "--validation-fraction", "0.05"]) == 0
    m = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert m["counts"]["documents"] == len(reviews)
    assert m["split_unit"] == "document"  # ~1,300 short reviews: 5% goes by whole reviews
    assert 0.03 * len(reviews) < m["splits"]["validation"]["documents"] < 0.07 * len(reviews)
    ids = np.concatenate([_load(tmp_path / "data", s, "input_ids") for s in ("train", "validation")])
    lengths = np.concatenate([_load(tmp_path / "data", s, "lengths") for s in ("train", "validation")])
    separators = sum(int((row[1 : n - 1] == SEP).sum()) for row, n in zip(ids, lengths, strict=True))
    assert separators >= len(reviews) - 3  # a [SEP] between documents (fewer: the split's starts)


def test_bad_lines_input_is_one_line_error_naming_file_and_line(tok, tmp_path, capsys):
    bad = tmp_path / "reviews.txt"
    bad.write_bytes(b"Good product.\nBad \xfe product.\n")
    code = cli_main(["prepare", "--corpus", str(bad), "--format", "lines", "--tokenizer", str(tok),
                     "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "reviews.txt:2: invalid UTF-8 byte 0xfe" in err
    assert not (tmp_path / "d").exists() and not (tmp_path / "d.tmp").exists()
    with pytest.raises(BertgpuError, match="--format 'line'"):
        prepare([bad], tok, tmp_path / "d", fmt="line")


_CHILD = r"""
import json, resource, sys
import bertgpu.data.corpus as corpus, bertgpu.data.pipeline as pipeline, bertgpu.data.split as split
from bertgpu.data.prepare import prepare
# A small memory budget: parts, pieces, units and work batches of a few thousand characters.
corpus.PART_CHARS, corpus.LINE_PIECE_BYTES = 4096, 4096
split.MAX_UNIT_TOKENS, split.PIECE_TOKENS = 4096, 1024
pipeline.RAW_BATCH_CHARS, pipeline.RAW_BATCH_ITEMS = 16384, 64
corpus_path, tok, out = sys.argv[1:4]
m = prepare([corpus_path], tok, out, seq_len=128, workers=2)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB: the largest pool worker
print(json.dumps({"main_kb": hwm, "worker_kb": workers, "tokens": m["counts"]["tokens"]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_one_huge_document_in_flat_memory_with_the_same_rows(tok, tmp_path):
    """A corpus with no blank line is one document: its peak memory must not grow with it (the
    whole document was held before: 91 -> 647 MB of worker RSS from 1x to 10x of this text),
    and the mlm rows are the document's tokens packed, as before."""
    lines = [s for d in pydoc_documents() for s in d]
    one = tmp_path / "one.txt"
    one.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    ten = tmp_path / "ten.txt"
    ten.write_text(one.read_text(encoding="utf-8") * 10, encoding="utf-8")
    peaks = {}
    for name, path in (("1x", one), ("10x", ten)):
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tok), str(tmp_path / name)],
                              capture_output=True, text=True, check=True)
        peaks[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert peaks["10x"]["tokens"] > 9 * peaks["1x"]["tokens"]
    for key in ("main_kb", "worker_kb"):
        assert peaks["10x"][key] - peaks["1x"][key] < 25_000, (key, peaks)  # kB: flat, not 10x
    m = prepare([one], tok, tmp_path / "rows", seq_len=128, workers=1, validation_fraction=0.0)
    ids, lengths = _load(tmp_path / "rows", "train", "input_ids"), _load(tmp_path / "rows", "train", "lengths")
    expected = load_tokenizer(tok).encode(" ".join(lines), add_special_tokens=False).ids
    assert m["counts"]["documents"] == 1 and (lengths[:-1] == 128).all()
    assert (ids[:, 0] == CLS).all() and (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
    assert np.concatenate([row[1 : n - 1] for row, n in zip(ids, lengths, strict=True)]).tolist() == expected
