"""Memory that does not grow with a line's or a record's length: `bertgpu tokenizer` gave BERT's
normaliser (about 58 bytes a character) batches of 1000 line pieces of 1 MiB (a 100 MB one-line
corpus took 5.9 GB), and `bertgpu prepare` encoded a JSONL record or a table row whole (one of
20 MB took 2.3 GB). Memory is not measured here; what each stage is handed is, and the output is
the same as when everything went whole."""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import pytest
from _corpora import tree_bytes
from _text_fixtures import tokenizer_corpus, train_small_tokenizer

from bertgpu.data import corpus, prepare_worker, wordpiece
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer import train_tokenizer

BOUND = 1 << 17  # far below the megabytes the stages were handed at once
_SYLLABLES = "ka lo mi nu ter san é ü ön qua str ing 東 京 bre ath".split()
_WORDS = "the a of, don't they? yes. no! 42 Zürich café".split() + [
    "".join(random.Random(i).choices(_SYLLABLES, k=1 + i % 4)) for i in range(3000)]


def _text(chars: int, seed: int = 0) -> str:
    """About ``chars`` characters of words (many, of few syllables: merges to learn), sentences
    and punctuation, no newline."""
    rng = random.Random(seed)
    words, n = [], 0
    while n < chars:
        words.append(_WORDS[min(int(rng.paretovariate(0.7)), len(_WORDS)) - 1])
        n += len(words[-1]) + 1
    return " ".join(words)


class _Recording:
    """BERT's normaliser, recording the length of what each call is handed."""

    def __init__(self, normalizer) -> None:
        self.normalizer, self.sizes = normalizer, []

    def normalize_str(self, text: str) -> str:
        self.sizes.append(len(text))
        return self.normalizer.normalize_str(text)


def test_tokenizer_normalises_and_copies_a_one_line_corpus_in_bounded_pieces(tmp_path):
    path = tmp_path / "one_line.txt"
    path.write_text(_text(2_500_000) + "\n", encoding="utf-8")
    tok = wordpiece.new_wordpiece(True, None)
    recording = _Recording(tok.normalizer)
    fake = types.SimpleNamespace(normalizer=recording, pre_tokenizer=tok.pre_tokenizer)
    copy = tmp_path / "copy.txt"
    wordpiece.copy_corpus(corpus.iter_document_parts([path]), fake, copy, 1000, 2000)
    assert sum(recording.sizes) > 2_400_000
    assert max(recording.sizes) <= BOUND, "the normaliser was handed megabytes at once"
    lines = copy.read_text(encoding="utf-8").split("\n")
    assert max(map(len, lines)) <= BOUND, "the trainer reads the copy a line at a time"
    assert " ".join(line for line in lines if line).split() == path.read_text().split()


def test_a_one_line_corpus_trains_the_vocabulary_of_the_same_text_in_lines(tmp_path):
    text = _text(1_500_000, seed=1)
    one = tmp_path / "one" / "corpus.txt"
    lines = tmp_path / "lines" / "corpus.txt"
    for path in (one, lines):
        path.parent.mkdir()
    one.write_text(text + "\n", encoding="utf-8")
    words = text.split(" ")
    lines.write_text("".join(" ".join(words[i : i + 12]) + "\n" for i in range(0, len(words), 12)),
                     encoding="utf-8")
    kw = dict(vocab_size=400, min_frequency=1, fmt="sentences")
    a = train_tokenizer([one], tmp_path / "tok_one", **kw)
    b = train_tokenizer([lines], tmp_path / "tok_lines", **kw)
    assert (a / "vocab.txt").read_bytes() == (b / "vocab.txt").read_bytes()


@pytest.mark.parametrize("lowercase", [True, False])
def test_bounded_batches_and_pieces_train_the_same_vocabulary(tmp_path, monkeypatch, lowercase):
    """Tiny batches and normaliser pieces (cut inside sentences, CJK, accents, a long run of
    letters that can only be [UNK]) give the bytes the whole batches gave."""
    corpus_path = tokenizer_corpus(tmp_path / "corpus")
    with open(corpus_path, "a", encoding="utf-8") as f:
        f.write("Crème brûlée " + "x" * 300 + " e\u0301\u0323 Ω\u0345 done.\n")
    kw = dict(vocab_size=1500, min_frequency=1, lowercase=lowercase)
    whole = train_tokenizer([corpus_path], tmp_path / "whole", **kw)
    monkeypatch.setattr(wordpiece, "BATCH_CHARS", 300)
    monkeypatch.setattr(wordpiece, "NORMALIZE_CHARS", 40)
    monkeypatch.setattr(wordpiece, "_CUT_WINDOW", 8)
    pieces = train_tokenizer([corpus_path], tmp_path / "pieces", **kw)
    assert (whole / "vocab.txt").read_bytes() == (pieces / "vocab.txt").read_bytes()


def test_normalised_in_pieces_equals_normalised_whole(monkeypatch):
    """Pieces cut at spaces, or in a run without any before a character where NFD reorders
    nothing, normalise to the whole's string (combining marks, Tibetan vowels that decompose
    into marks, CJK, control and format characters)."""
    monkeypatch.setattr(wordpiece, "NORMALIZE_CHARS", 30)
    monkeypatch.setattr(wordpiece, "_CUT_WINDOW", 6)
    rng = random.Random(3)
    alphabet = list("ab Zé\u0301\u0323\u0f73\u0f71\u0f72\u0344中\t\n\x00\u200b\ufeffΣ한Å\u0345")
    for lowercase, strip in ((True, None), (False, True), (False, None)):
        normalize = wordpiece.new_wordpiece(lowercase, strip).normalizer.normalize_str
        for _ in range(40):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 2000)))
            assert wordpiece._normalized(text, normalize) == normalize(text)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


def _write_records(path: Path, texts: list[str]) -> Path:
    if path.suffix == ".parquet":
        pa = pytest.importorskip("pyarrow")
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": texts}), path)
    else:
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _records(big: int) -> list[str]:
    """Ordinary records around one of ``big`` characters in paragraphs and one long line."""
    huge = "\n\n".join([_text(big // 2, seed=5), *(_text(300, seed=s) for s in range(20)),
                        _text(big // 2, seed=6)])
    return [_text(500, seed=10 + i) for i in range(5)] + [huge] + [_text(800, seed=30)]


@pytest.mark.parametrize("name", ["records.jsonl", "records.parquet"])
def test_prepare_encodes_a_huge_record_in_bounded_parts(tok, tmp_path, monkeypatch, name):
    monkeypatch.setattr(corpus, "PART_CHARS", 4096)
    monkeypatch.setattr(corpus, "LINE_PIECE_BYTES", 16384)
    path = _write_records(tmp_path / name, _records(200_000))
    sizes: list[int] = []
    encode = prepare_worker._encode

    def recording(texts):
        sizes.extend(map(len, texts))
        return encode(texts)

    monkeypatch.setattr(prepare_worker, "_encode", recording)
    prepare([path], tok, tmp_path / "data", seq_len=64, workers=1)
    assert sum(sizes) > 200_000
    assert max(sizes) <= 4096 + 16384, "a record was encoded whole"


@pytest.mark.parametrize("name", ["records.jsonl", "records.parquet"])
def test_a_record_in_parts_gives_the_shards_of_the_record_whole(tok, tmp_path, monkeypatch,
                                                                  name):
    path = _write_records(tmp_path / name, _records(60_000))
    kw = dict(seq_len=64, workers=1, validation_fraction=0.0)
    monkeypatch.setattr(corpus, "PART_CHARS", 1 << 40)  # every record whole, as before
    prepare([path], tok, tmp_path / "whole", **kw)
    monkeypatch.setattr(corpus, "PART_CHARS", 4096)
    monkeypatch.setattr(corpus, "LINE_PIECE_BYTES", 16384)
    prepare([path], tok, tmp_path / "parts", **kw)
    whole, parts = _shards(tmp_path / "whole"), _shards(tmp_path / "parts")
    assert whole and whole == parts


def _shards(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_bytes(folder).items() if k.endswith(".npy")}
