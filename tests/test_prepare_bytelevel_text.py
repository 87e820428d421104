"""`bertgpu prepare` with a byte-level BPE tokenizer (ModernBERT's layout: ByteLevel pre-tokenizer,
add_prefix_space false, BERT's special tokens, saved by transformers' PreTrainedTokenizerFast):
the shards hold the tokens the tokenizer gives each document's text as written.

The readers stripped every line and joined lines and sentences by one space, which BERT's
pre-tokenizer does not see but a byte-level one does: code lost its line breaks and indentation
('def add(a, b): if a: return a + b'), a line break after a sentence became a space."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare

CODE = "def add(a, b):\n    if a:\n        return a + b\n\n    return b\n"
PROSE = ("The quick brown fox jumps over the lazy dog. Then it ran away!\nFar away, on a new "
         "line.\n\n  Indented  twice,\tand a tab. Last words")
TRAINING = [CODE, PROSE, "Hello world. This is a test of the tokenizer.\n" * 3]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A tiny byte-level BPE folder as ModernBERT's is saved."""
    from tokenizers import ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(TRAINING * 3, vocab_size=400, min_frequency=1,
                                show_progress=False,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok = trainer._tokenizer
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")),
                                                 ("[SEP]", tok.token_to_id("[SEP]"))])
    folder = tmp_path_factory.mktemp("bpe") / "tok"
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", pad_token="[PAD]",
                            mask_token="[MASK]").save_pretrained(folder)
    return folder


def _documents(out) -> list[list[int]]:
    """The train split's token stream, rows unpacked, cut at the [SEP] between documents."""
    manifest = json.loads((out / "manifest.json").read_text())
    sep = manifest["special_tokens"]["sep"]
    stream: list[int] = []
    for shard in manifest["splits"]["train"]["shards"]:
        ids = np.load(out / f"{shard['name']}.input_ids.npy")
        lengths = np.load(out / f"{shard['name']}.lengths.npy")
        for row, k in zip(ids, lengths, strict=True):
            stream += row[1 : k - 1].tolist()
    docs, doc = [], []
    for t in stream:
        if t == sep:
            docs.append(doc)
            doc = []
        else:
            doc.append(t)
    return [*docs, doc]


def _encoded(folder, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def _prepare(paths, folder, out, fmt="auto"):
    prepare(paths, folder, out, seq_len=32, workers=1, validation_fraction=0.0, fmt=fmt)
    return _documents(out)


def test_jsonl_records_keep_line_breaks_and_indentation(bpe, tmp_path):
    """The probe's corpus: every row decodes to '[CLS]def add(a, b): if a: return a + b...'."""
    from tokenizers import Tokenizer

    texts = [CODE, PROSE, "  leading and trailing spaces  ", "\n\nafter two line breaks"]
    path = tmp_path / "code.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * 5))
    assert _prepare([path], bpe, tmp_path / "d") == _encoded(bpe, texts * 5)
    ids = np.load(tmp_path / "d" / "train-00000-00000.input_ids.npy")
    decoded = Tokenizer.from_file(str(bpe / "tokenizer.json")).decode(ids[0].tolist(), False)
    assert decoded.startswith("[CLS]def add(a, b):\n    if a:\n        return a + b\n\n")


@pytest.mark.parametrize("fmt", ["text", "sentences", "lines"])
def test_line_formats_give_each_document_as_written(bpe, tmp_path, fmt):
    """A paragraph (text, sentences) is its lines joined by their line breaks, indentation kept;
    a line (lines) is the line as it is."""
    paragraphs = [PROSE.replace("\n\n", "\n"), CODE.replace("\n\n", "\n").rstrip("\n"),
                  "One more paragraph.\n   With an indented second line.  "]
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n\n".join(paragraphs) + "\n")
    docs = ([line for p in paragraphs for line in p.split("\n") if line.strip()]
            if fmt == "lines" else paragraphs)
    assert _prepare([path], bpe, tmp_path / "d", fmt=fmt) == _encoded(bpe, docs)


def test_parquet_rows_give_each_document_as_written(bpe, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = [CODE, PROSE, "plain"]
    pq.write_table(pa.table({"text": texts}), tmp_path / "rows.parquet")
    assert _prepare([tmp_path / "rows.parquet"], bpe, tmp_path / "d") == _encoded(bpe, texts)


def test_long_documents_are_cut_where_no_token_changes(bpe, tmp_path, monkeypatch):
    """A record or a paragraph longer than a part (PART_CHARS), and a line longer than a piece
    (LINE_PIECE_BYTES), travel in parts, cut before a space that follows a word: the parts'
    tokens are the whole text's. A run with no space longer than a part can hold is cut where
    it must be, and no text is lost (byte-level tokens decode to it)."""
    from tokenizers import Tokenizer

    import bertgpu.data.corpus as corpus

    monkeypatch.setattr(corpus, "PART_CHARS", 100)
    monkeypatch.setattr(corpus, "LINE_PIECE_BYTES", 256)
    long_text = (CODE + PROSE + "\n") * 12 + "word  " * 200 + "\n\tend"
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"text": long_text}) + "\n" + json.dumps({"text": CODE}) + "\n")
    assert _prepare([path], bpe, tmp_path / "j") == _encoded(bpe, [long_text, CODE])
    paragraph = "A long line of words, " * 60 + "ending here.\n    " + "and indented " * 40
    text = tmp_path / "long.txt"
    last = PROSE.replace("\n\n", "\n")
    text.write_text(paragraph + "\n\n" + last + "\n")
    assert _prepare([text], bpe, tmp_path / "t", fmt="text") == _encoded(bpe, [paragraph, last])
    blob = "x" * 700 + " tail"  # longer than LINE_PIECE_BYTES without a space
    (tmp_path / "blob.jsonl").write_text(json.dumps({"text": blob}) + "\n")
    (doc,) = _prepare([tmp_path / "blob.jsonl"], bpe, tmp_path / "b")
    assert Tokenizer.from_file(str(bpe / "tokenizer.json")).decode(doc) == blob


def test_sentence_pairs_are_refused_in_one_line(bpe, tmp_path, capsys):
    """Sentences encoded one by one lose the whitespace between them ('…away!Far'): mlm+nsp is
    refused for such a tokenizer, before any output is made."""
    path = tmp_path / "prose.jsonl"
    path.write_text(json.dumps({"text": PROSE}) + "\n")
    out = tmp_path / "d"
    assert cli_main(["prepare", "--corpus", str(path), "--tokenizer", str(bpe), "--out",
                     str(out), "--objective", "mlm+nsp", "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--objective mlm+nsp" in err and "ByteLevel pre-tokenizer" in err
    assert "expected --objective mlm" in err and not out.exists()


def test_which_tokenizers_are_whitespace_sensitive():
    """BERT's pipeline (and Whitespace-like pre-tokenizers) keep today's path; ByteLevel,
    Metaspace, a missing pre-tokenizer or a normaliser that rewrites spaces do not."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from bertgpu.data.document_parts import whitespace_sensitive

    def sensitive(pre, norm=None) -> str | None:
        tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        if pre is not None:
            tok.pre_tokenizer = pre
        if norm is not None:
            tok.normalizer = norm
        return whitespace_sensitive(tok.to_str())

    bert = normalizers.BertNormalizer(lowercase=True)
    assert sensitive(pre_tokenizers.BertPreTokenizer(), bert) is None
    assert sensitive(pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                              pre_tokenizers.Digits()])) is None
    assert "ByteLevel" in sensitive(pre_tokenizers.ByteLevel(add_prefix_space=False))
    assert "Metaspace" in sensitive(pre_tokenizers.Metaspace())
    assert "no pre-tokenizer" in sensitive(None)
    assert "Digits" in sensitive(pre_tokenizers.Digits())  # splits at no whitespace
    assert "Replace" in sensitive(pre_tokenizers.Whitespace(),
                                  normalizers.Replace(" ", "\u2581"))
