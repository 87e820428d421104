"""prepare: shard layout and manifest, MLM packing, NSP pairs, determinism, failures; corpora of
any shape (issue 12): the validation share asked for whatever the number of documents, one
document per line, and bounded memory for a corpus that is one huge document."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from _text_fixtures import pydoc_documents, train_small_tokenizer, write_sentences

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer_folder import load_tokenizer, tokenizer_hash
from bertgpu.errors import BertgpuError

CLS, SEP = 2, 3


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two sentence files: 30 + 49 real documents (Python's reference topics)."""
    folder = tmp_path_factory.mktemp("corpus")
    docs = pydoc_documents()
    write_sentences(folder / "a.txt", docs[:30])
    write_sentences(folder / "b.txt", docs[30:])
    return folder


def _load(out, split, key):
    shards = json.loads((out / "manifest.json").read_text())["splits"][split]["shards"]
    return np.concatenate([np.load(out / f"{s['name']}.{key}.npy", mmap_mode="r") for s in shards])


def test_mlm_manifest_and_shards(tok, corpus, tmp_path):
    out = tmp_path / "data"
    m = prepare([corpus], tok, out, seq_len=64, shard_size=500, workers=1, validation_fraction=0.1)
    assert not (tmp_path / "data.tmp").exists()
    assert json.loads((out / "manifest.json").read_text()) == m
    assert m["format_version"] == 1 and m["objective"] == "mlm" and m["seq_len"] == 64
    assert m["dtype"] == "uint16" and m["vocab_size"] == 1000 and m["do_lower_case"] is True
    assert m["tokenizer_hash"] == tokenizer_hash(tok) == tokenizer_hash(out / "tokenizer")
    assert m["special_tokens"] == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert m["seed"] == 12345 and m["validation_fraction"] == 0.1
    assert [i["path"] for i in m["inputs"]] == [str(corpus / "a.txt"), str(corpus / "b.txt")]
    assert all(len(i["sha256"]) == 64 and i["bytes"] > 0 for i in m["inputs"])
    assert m["skipped_inputs"] == [] and m["created_by"].startswith("bertgpu ")
    assert m["counts"]["documents"] == 79
    train, val = m["splits"]["train"], m["splits"]["validation"]
    assert len(train["shards"]) >= 2 and len(val["shards"]) >= 1  # shard_size 500 splits train
    assert train["documents"] + val["documents"] == 79 and val["documents"] >= 1
    assert m["counts"]["sequences"] == train["sequences"] + val["sequences"]
    assert m["counts"]["tokens"] == train["tokens"] + val["tokens"]
    for split, info in m["splits"].items():
        ids = _load(out, split, "input_ids")
        lengths = _load(out, split, "lengths")
        assert (ids.dtype == np.uint16 and ids.shape == (info["sequences"], 64)
                and lengths.dtype == np.int32)
        assert int(lengths.sum()) == info["tokens"]
        assert (ids[:, 0] == CLS).all()
        assert (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
        assert (lengths[:-1] == 64).all() and 3 <= lengths[-1] <= 64  # only the last row is short
        assert (ids[-1, lengths[-1]:] == 0).all()
        for s in info["shards"]:
            assert np.load(out / f"{s['name']}.input_ids.npy").shape[0] == s["sequences"]
    assert not any(out.glob("*token_type_ids*")) and not any(out.glob("*nsp_labels*"))


def test_mlm_rows_hold_every_token_in_order(tok, corpus, tmp_path):
    """Row contents, concatenated, are the documents' tokens with [SEP] between documents."""
    out = tmp_path / "data"
    prepare([corpus], tok, out, seq_len=32, workers=1, validation_fraction=0.0, chunk_docs=7)
    ids, lengths = _load(out, "train", "input_ids"), _load(out, "train", "lengths")
    stream = np.concatenate([row[1 : n - 1] for row, n in zip(ids, lengths, strict=True)])
    t = load_tokenizer(tok)
    expected: list[int] = []
    for doc in pydoc_documents():
        if expected:
            expected.append(SEP)
        expected += t.encode(" ".join(doc), add_special_tokens=False).ids
    assert stream.tolist() == expected


def test_nsp_pairs(tok, corpus, tmp_path):
    out = tmp_path / "nsp"
    m = prepare([corpus], tok, out, seq_len=128, objective="mlm+nsp", workers=1, validation_docs=3)
    assert (m["objective"] == "mlm+nsp" and m["validation_fraction"] is None
            and m["validation_docs"] == 3)
    assert m["splits"]["validation"]["documents"] == 3
    ids, tts = _load(out, "train", "input_ids"), _load(out, "train", "token_type_ids")
    lengths, labels = _load(out, "train", "lengths"), _load(out, "train", "nsp_labels")
    assert tts.dtype == np.uint8 and labels.dtype == np.uint8 and ids.shape == tts.shape
    assert len(ids) > 300
    for row, tt, n in zip(ids, tts, lengths, strict=True):
        seps = np.flatnonzero(row[:n] == SEP)
        assert row[0] == CLS and len(seps) == 2 and seps[1] == n - 1
        a_len, b_len = seps[0] - 1, n - seps[0] - 2
        assert a_len >= 1 and b_len >= 1 and n <= 128
        assert ((tt[: seps[0] + 1] == 0).all() and (tt[seps[0] + 1 : n] == 1).all()
                and (tt[n:] == 0).all())
        assert (row[n:] == 0).all()
    # Half the B segments are random, plus (as in BERT) every single-sentence segment: 0.54 here.
    assert 0.45 < labels.mean() < 0.6
    assert (lengths > 100).mean() > 0.7  # most rows are filled towards the target length
    assert set(np.unique(labels)) == {0, 1}


MARKERS = ("class", "module", "object", "function")  # one token each in the pydoc vocabulary


def _marked_documents(n_docs: int, sentences: int = 400) -> list[list[str]]:
    """Documents whose every sentence names its document by a marker word."""
    return [[f"the {w} {w} number {i} is here ." for i in range(sentences)]
            for w in MARKERS[:n_docs]]


def test_nsp_random_segment_is_from_another_document_when_the_split_cuts_documents(
        tok, tmp_path):
    """With a validation split that cut documents into chunks, 20 of 118 random Bs in train and
    5 of 38 in validation came from A's own document (the other train side of its cut document,
    or another of its held-out chunks): the pieces of a cut document were "other documents"."""
    corpus = write_sentences(tmp_path / "four.txt", _marked_documents(4))
    report: dict = {}
    m = prepare([corpus], tok, tmp_path / "out", seq_len=64, objective="mlm+nsp", workers=1,
                validation_fraction=0.2, report=report)
    assert m["split_unit"] == "chunk" and m["cut_documents"] == 4
    t = load_tokenizer(tok)
    marker = {}
    for w in MARKERS:
        ids = t.encode(w, add_special_tokens=False).ids
        assert len(ids) == 1, (w, ids)
        marker[ids[0]] = w
    for split in ("train", "validation"):
        ids, lengths = _load(tmp_path / "out", split, "input_ids"), _load(tmp_path / "out", split,
                                                                         "lengths")
        labels = _load(tmp_path / "out", split, "nsp_labels")
        checked = 0
        for row, n, label in zip(ids, lengths, labels, strict=True):
            sep = int(np.flatnonzero(row[:n] == SEP)[0])
            a = {marker[x] for x in row[1:sep].tolist() if x in marker}
            b = {marker[x] for x in row[sep + 1 : n - 1].tolist() if x in marker}
            assert len(a) == 1 and len(b) <= 1, (split, a, b)  # one document per segment
            if label == 1 and b:
                assert a != b, f"{split}: a random B from A's own document {a}"
                checked += 1
        assert checked >= 20, (split, checked)
    # every random B could come from another document: none counted as from A's own
    assert [r["nsp_same_document"] for r in report["units"]] == [0]


def test_nsp_random_segments_of_a_single_cut_document_are_counted_and_warned_about(
        tok, tmp_path):
    """A corpus of one document cut by the validation split has no other document: its random
    Bs come from it (BERT's fallback), and the rows are counted and warned about; the sides of
    the cut document were counted as other documents, and nothing was said."""
    corpus = write_sentences(tmp_path / "one.txt", _marked_documents(1, 1600))
    report: dict = {}
    with pytest.warns(UserWarning, match=r"NSP rows are labelled random with B from A's own "
                                          r"document: their chunk held pieces of a single"):
        m = prepare([corpus], tok, tmp_path / "out", seq_len=64, objective="mlm+nsp",
                    workers=1, validation_fraction=0.2, report=report)
    assert m["split_unit"] == "chunk" and m["splits"]["validation"]["sequences"] > 0
    (unit,) = report["units"]
    assert unit["nsp_same_document"] == unit["nsp_random"] > 0


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp"])
def test_output_identical_for_one_and_two_workers(tok, corpus, tmp_path, objective):
    kw = dict(seq_len=48, objective=objective, shard_size=300, chunk_docs=10,
              validation_fraction=0.05)
    one = prepare([corpus], tok, tmp_path / "w1", workers=1, **kw)
    two = prepare([corpus], tok, tmp_path / "w2", workers=2, **kw)
    assert one == two
    files = sorted(p.name for p in (tmp_path / "w1").glob("*.npy"))
    assert files == sorted(p.name for p in (tmp_path / "w2").glob("*.npy")) and len(files) >= 4
    for name in files:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name


def test_refuses_existing_output_unless_overwrite(tok, corpus, tmp_path):
    out = tmp_path / "data"
    prepare([corpus], tok, out, workers=1, seq_len=64)
    with pytest.raises(BertgpuError, match=r"holds a shard set prepared with --seq-len 64 \(asked "
                                           r"128\); expected a new folder, or --overwrite"):
        prepare([corpus], tok, out, workers=1)
    assert json.loads((out / "manifest.json").read_text())["seq_len"] == 64
    prepare([corpus], tok, out, workers=1, overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["seq_len"] == 128


def test_overwrite_replaces_only_a_shard_set(tok, corpus, tmp_path):
    """--overwrite replaces an earlier shard set, never a folder of the user's (it once deleted a
    project folder, corpus included, given as --out)."""
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(BertgpuError, match=r"project: a folder that is not a shard set"):
            prepare([corpus], tok, out, workers=1, overwrite=overwrite)
        assert (out / "notes.md").read_text() == "mine"


def test_failure_midway_leaves_nothing_behind(tok, corpus, tmp_path):
    bad = tmp_path / "in" / "z_bad.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"A good line.\n\nAnother.\n\xc3\x28 broken\n")
    out = tmp_path / "data"
    for workers in (1, 2):
        with pytest.raises(BertgpuError, match=r"z_bad.txt:4: invalid UTF-8"):
            prepare([corpus, bad], tok, out, workers=workers, chunk_docs=5)
        assert not out.exists() and not (tmp_path / "data.tmp").exists()
    m = prepare([corpus, bad], tok, out, workers=1, skip_bad=True)
    assert [s["path"] for s in m["skipped_inputs"]] == [str(bad)]
    assert "invalid UTF-8" in m["skipped_inputs"][0]["reason"]
    assert [i["path"] for i in m["inputs"]] == [str(corpus / "a.txt"), str(corpus / "b.txt")]


def test_bad_arguments(tok, corpus, tmp_path):
    with pytest.raises(BertgpuError, match="--objective"):
        prepare([corpus], tok, tmp_path / "o", objective="clm")
    with pytest.raises(BertgpuError, match="--seq-len"):
        prepare([corpus], tok, tmp_path / "o", seq_len=4)
    with pytest.raises(BertgpuError, match="no such tokenizer folder"):
        prepare([corpus], tmp_path / "no_tok", tmp_path / "o")
    with pytest.raises(BertgpuError, match="missing.txt: no such file"):
        prepare([tmp_path / "missing.txt"], tok, tmp_path / "o")
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()


def test_cli_prepare_and_bad_file_exit_code(tok, corpus, tmp_path, capsys):
    out = tmp_path / "data"
    code = cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out", str(out),
                     "--seq-len", "64", "--objective", "mlm+nsp", "--workers", "1"])
    assert code == 0
    text = capsys.readouterr().out
    assert "79 documents" in text and "tokens/s" in text
    assert json.loads((out / "manifest.json").read_text())["objective"] == "mlm+nsp"
    bad = tmp_path / "empty.txt"
    bad.write_bytes(b"")
    code = cli_main(["prepare", "--corpus", str(bad), "--tokenizer", str(tok),
                     "--out", str(tmp_path / "d2")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("bertgpu prepare: error:") and "empty.txt: empty file" in err
    assert not (tmp_path / "d2").exists() and not (tmp_path / "d2.tmp").exists()


def _wiki_dump(path, docs):
    """A MediaWiki dump of the given documents with markup around them, plus a markup-only page."""
    from xml.sax.saxutils import escape

    pages = []
    for i, doc in enumerate(docs):
        body = (f"{{{{Infobox|n={i}}}}}\n"
                f"'''{doc[0]}''' [[Link{i}|{' '.join(doc[1:3])}]]<ref>cite {i}</ref>\n")
        body += "== Section ==\n* " + "\n\n".join(doc[3:]) + f"\n[[Category:C{i}]]"
        if i == 5:
            body = "{{Only a template}}\n[[Category:Empty]]"  # strips to nothing: no document
        pages.append(f"<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><text>{escape(body)}</text>"
                     "</revision></page>")
    path.write_text("<mediawiki>" + "".join(pages) + "</mediawiki>", encoding="utf-8")
    return path


@pytest.mark.parametrize("objective", ["mlm", "mlm+nsp"])
def test_wiki_and_text_output_identical_for_one_and_two_workers(tok, corpus, tmp_path, objective,
                                                                monkeypatch):
    """Markup stripping runs on the workers (in small batches here): same bytes as in-process."""
    import bertgpu.data.pipeline as prep
    from bertgpu.data.corpus import iter_documents

    monkeypatch.setattr(prep, "RAW_BATCH_ITEMS", 7)  # many conversion tasks in flight
    docs = pydoc_documents()
    (tmp_path / "in").mkdir()
    dump = _wiki_dump(tmp_path / "in" / "dump.xml", docs[:40])
    web = tmp_path / "in" / "web.jsonl"  # split into sentences on the workers too
    web.write_text("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in docs[40:]),
                   encoding="utf-8")
    paths = [dump, corpus / "a.txt", web]
    kw = dict(seq_len=48, objective=objective, shard_size=200, chunk_docs=6,
              validation_fraction=0.1, fmt="auto")
    one = prepare(paths, tok, tmp_path / "w1", workers=1, **kw)
    two = prepare(paths, tok, tmp_path / "w2", workers=2, **kw)
    assert one == two
    assert one["counts"]["documents"] == len(list(iter_documents(paths))) == 39 + 30 + 39
    files = sorted(p.name for p in (tmp_path / "w1").glob("*.npy"))
    assert files == sorted(p.name for p in (tmp_path / "w2").glob("*.npy")) and len(files) >= 4
    for name in files:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name


def test_wiki_file_of_markup_only_is_no_text_error_with_workers(tok, tmp_path):
    dump = tmp_path / "empty.xml"
    dump.write_text("<mediawiki><page><ns>0</ns><revision><text>{{Only a "
                    "template}}</text></revision></page></mediawiki>")
    good = tmp_path / "good.txt"
    good.write_text("A fine sentence.\n\nAnother document here.\n")
    for workers in (1, 2):
        with pytest.raises(BertgpuError, match="empty.xml: no text"):
            prepare([dump, good], tok, tmp_path / f"o{workers}", workers=workers)
        m = prepare([dump, good], tok, tmp_path / f"s{workers}", workers=workers, skip_bad=True)
        assert ([s["path"] for s in m["skipped_inputs"]] == [str(dump)]
                and m["counts"]["documents"] == 2)


# ----------------------------------------------------------------------------- corpora of any shape


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """The pydoc text (~150k tokens) as 1, 2, 3 documents (no blank lines inside) or 79 topics."""
    folder = tmp_path_factory.mktemp("corpora")
    docs = pydoc_documents()
    flat = [s for d in docs for s in d]
    out = {"many": write_sentences(folder / "many.txt", docs)}
    for n in (1, 2, 3):
        k = len(flat) // n
        out[n] = write_sentences(folder / f"{n}.txt",
                                 [flat[i * k : (i + 1) * k if i < n - 1 else None]
                                  for i in range(n)])
    return out


def _share_ok(m, fraction, rel, seq_len):
    """The validation share of the tokens is the fraction asked, within rel * fraction plus the
    rounding of two rows."""
    total = m["counts"]["tokens"]
    share = m["splits"]["validation"]["tokens"] / total
    assert share == pytest.approx(m["validation_share"], abs=1e-6)
    return abs(share - fraction) <= rel * fraction + 2 * seq_len / total


@pytest.mark.parametrize("n_docs", [1, 2, 3, "many"])
def test_validation_share_is_what_was_asked_whatever_the_number_of_documents(
        tok, corpora, tmp_path, n_docs):
    corpus = corpora[n_docs]
    for fraction in (0.1, 0.02):
        m = prepare([corpus], tok, tmp_path / f"mlm{fraction}", seq_len=64, workers=1,
                    validation_fraction=fraction)
        assert _share_ok(m, fraction, 0.1, 64), (fraction, m["validation_share"])
        # pydoc topics are too big to go whole
        assert m["split_unit"] == "chunk" and m["cut_documents"] >= 1
        docs = m["splits"]["train"]["documents"] + m["splits"]["validation"]["documents"]
        assert docs == m["counts"]["documents"] == (79 if n_docs == "many" else n_docs)
    nsp = prepare([corpus], tok, tmp_path / "nsp", seq_len=64, objective="mlm+nsp", workers=1,
                  validation_fraction=0.1)
    # pairs move tokens: a looser bound
    assert _share_ok(nsp, 0.1, 0.2, 64), nsp["validation_share"]
    two = prepare([corpus], tok, tmp_path / "two", seq_len=64, workers=2, validation_fraction=0.1)
    assert ({k: v for k, v in two.items()}
            == json.loads((tmp_path / "mlm0.1" / "manifest.json").read_text()))
    for name in sorted(p.name for p in (tmp_path / "two").glob("*.npy")):
        assert ((tmp_path / "two" / name).read_bytes()
                == (tmp_path / "mlm0.1" / name).read_bytes()), name


def test_many_small_documents_are_held_out_whole(tok, tmp_path):
    sentences = [s for d in pydoc_documents() for s in d if len(s) < 400]  # no code listings
    # ~700 documents of ~150 tokens
    docs = [sentences[i : i + 5] for i in range(0, len(sentences), 5)]
    corpus = write_sentences(tmp_path / "small.txt", docs)
    m = prepare([corpus], tok, tmp_path / "out", seq_len=64, workers=1, validation_fraction=0.1)
    assert m["split_unit"] == "document" and m["cut_documents"] == 0
    assert _share_ok(m, 0.1, 0.1, 64)
    val_docs = m["splits"]["validation"]["documents"]
    assert 0.07 * len(docs) < val_docs < 0.13 * len(docs)
    assert val_docs + m["splits"]["train"]["documents"] == len(docs)


def _segments(out, split):
    """A split's packed token stream (row contents concatenated) cut at [SEP]."""
    ids, lengths = _load(out, split, "input_ids"), _load(out, split, "lengths")
    stream = np.concatenate([row[1 : n - 1] for row, n in zip(ids, lengths, strict=True)])
    parts = np.split(stream.astype(np.int64), np.flatnonzero(stream == SEP))
    return [parts[0]] + [p[1:] for p in parts[1:]]  # each [SEP] heads the part after it


def _spans_in(doc, segments):
    """[start, end) of each segment in `doc`, in order; each must be a contiguous slice of it
    after the previous one."""
    spans, cursor = [], 0
    for k, seg in enumerate(segments):
        hits = [p for p in np.flatnonzero(doc[cursor:] == seg[0]) + cursor
                if np.array_equal(doc[p : p + len(seg)], seg)]
        assert hits, f"segment {k} ({len(seg)} tokens) is not a slice of the document"
        spans.append((int(hits[0]), int(hits[0]) + len(seg)))
        cursor = hits[0] + len(seg)
    return spans


def test_chunks_of_one_document_join_without_sep_unless_a_chunk_was_held_out(tok, tmp_path):
    """MLM packing of one document cut into chunks, some held out for validation: in each split
    a [SEP] stands exactly where the document was interrupted (a held-out chunk in between),
    never between two chunks that follow each other in the document."""
    flat = [s for d in pydoc_documents(12) for s in d]
    corpus = write_sentences(tmp_path / "one.txt", [flat])
    m = prepare([corpus], tok, tmp_path / "out", seq_len=64, workers=1, validation_fraction=0.2)
    assert m["counts"]["documents"] == 1 and m["split_unit"] == "chunk"
    doc = np.array(load_tokenizer(tok).encode(" ".join(flat), add_special_tokens=False).ids)
    assert SEP not in doc and len(doc) > 2000
    covered = 0
    for split in ("train", "validation"):
        segments = _segments(tmp_path / "out", split)
        spans = _spans_in(doc, segments)
        assert len(spans) >= 2, split  # the held-out chunks cut the document
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start > end, (split, end, start)  # adjacent slices: a [SEP] inside the text
        covered += sum(e - s for s, e in spans)
    assert covered == len(doc)  # every token, in one split or the other


def test_validation_fraction_zero_holds_out_nothing_and_summary_says_how(
        tok, corpora, tmp_path, capsys):
    base = ["prepare", "--corpus", str(corpora[1]), "--tokenizer", str(tok), "--seq-len", "64",
            "--workers", "1"]
    assert cli_main([*base, "--out", str(tmp_path / "none"), "--validation-fraction", "0"]) == 0
    out = capsys.readouterr().out
    assert "no validation split (--validation-fraction 0)" in out
    m = json.loads((tmp_path / "none" / "manifest.json").read_text())
    assert (m["split_unit"] == "none" and m["splits"]["validation"]["sequences"] == 0
            and m["validation_share"] == 0)
    assert cli_main([*base, "--out", str(tmp_path / "one"), "--validation-fraction", "0.05"]) == 0
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "one" / "manifest.json").read_text())
    assert f"{m['validation_share']:.2%} of the tokens (asked 5.00%)" in out
    assert "split by chunks of documents: 1 of 1 documents have chunks on both sides" in out


def test_lines_format_for_tokenizer_and_prepare(tmp_path, capsys):
    short = [s for d in pydoc_documents() for s in d if len(s) < 200]
    # one per line, no blank lines
    reviews = [" ".join(short[i : i + 2]) for i in range(0, len(short), 2)]
    corpus = tmp_path / "reviews.txt"
    corpus.write_text("\n".join(reviews) + "\n", encoding="utf-8")
    assert cli_main(["tokenizer", "--corpus", str(corpus), "--format", "lines",
                     "--vocab-size", "600", "--out", str(tmp_path / "tok")]) == 0
    assert f"{len(reviews)} documents" in capsys.readouterr().out
    assert cli_main(["prepare", "--corpus", str(corpus), "--format", "lines",
                     "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "data"),
                     "--seq-len", "32", "--workers", "1", "--validation-fraction", "0.05"]) == 0
    m = json.loads((tmp_path / "data" / "manifest.json").read_text())
    assert m["counts"]["documents"] == len(reviews)
    assert m["split_unit"] == "document"  # ~1,300 short reviews: 5% goes by whole reviews
    assert 0.03 * len(reviews) < m["splits"]["validation"]["documents"] < 0.07 * len(reviews)
    ids = np.concatenate([_load(tmp_path / "data", s, "input_ids")
                          for s in ("train", "validation")])
    lengths = np.concatenate([_load(tmp_path / "data", s, "lengths")
                              for s in ("train", "validation")])
    separators = sum(int((row[1 : n - 1] == SEP).sum())
                     for row, n in zip(ids, lengths, strict=True))
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
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tok),
                               str(tmp_path / name)],
                              capture_output=True, text=True, check=True)
        peaks[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert peaks["10x"]["tokens"] > 9 * peaks["1x"]["tokens"]
    for key in ("main_kb", "worker_kb"):
        assert peaks["10x"][key] - peaks["1x"][key] < 25_000, (key, peaks)  # kB: flat, not 10x
    m = prepare([one], tok, tmp_path / "rows", seq_len=128, workers=1, validation_fraction=0.0)
    ids = _load(tmp_path / "rows", "train", "input_ids")
    lengths = _load(tmp_path / "rows", "train", "lengths")
    expected = load_tokenizer(tok).encode(" ".join(lines), add_special_tokens=False).ids
    assert m["counts"]["documents"] == 1 and (lengths[:-1] == 128).all()
    assert (ids[:, 0] == CLS).all() and (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
    assert (np.concatenate([row[1 : n - 1] for row, n in zip(ids, lengths, strict=True)]).tolist()
            == expected)


def test_nsp_validation_rows_with_b_from_their_own_document_are_warned_about(tok, tmp_path):
    """A few long documents: the validation split holds out pieces of one of them, so its random
    Bs come from A's own document. Counted over all rows (train included) they were a small
    share and nothing was said, though val_nsp_acc scored text that follows A as random."""
    corpus = write_sentences(tmp_path / "three.txt", _marked_documents(3, 600))
    report: dict = {}
    with pytest.warns(UserWarning, match=r"validation: \d+ of its \d+ NSP rows are labelled "
                                          r"random with B from A's own document") as seen:
        prepare([corpus], tok, tmp_path / "out", seq_len=64, objective="mlm+nsp", workers=1,
                report=report)
    assert not any("their chunk held pieces" in str(w.message) for w in seen)
    (unit,) = report["units"]
    assert 0 < unit["nsp_validation_same_document"] <= unit["nsp_same_document"]
