"""Corpus and tokenizer edges: flags of `bertgpu tokenizer` reaching the trainer, Arrow columns,
vocab-only folders, the format table, sample cuts of wiki articles and the launcher's flags."""

from __future__ import annotations

import json

import pytest

from bertgpu.cli import main as cli_main
from bertgpu.cli import strip_launch_flags
from bertgpu.data.corpus import detect_format, iter_documents, raw_to_sentences
from bertgpu.data.textsize import cut_part
from bertgpu.data.tokenizer import train_tokenizer
from bertgpu.data.tokenizer_folder import SPECIAL_TOKENS, load_tokenizer


def _vocab(folder) -> set[str]:
    return set((folder / "vocab.txt").read_text(encoding="utf-8").splitlines())


def _tokenizer_command(corpus, capsys, *flags: str):
    """`bertgpu tokenizer` on `corpus` (vocabulary 200, every pair counted) with `flags`; the
    folder it wrote."""
    out = corpus.parent / "tok"
    code = cli_main(["tokenizer", "--corpus", str(corpus), *flags, "--vocab-size", "200",
                     "--min-frequency", "1", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    return out


def _jsonl_rows(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_tokenizer_command_reads_the_text_field_it_is_given(tmp_path, capsys):
    """`bertgpu tokenizer --text-field body` must train on the "body" field of each JSONL row,
    not silently on the default "text" field."""
    corpus = _jsonl_rows(tmp_path / "rows.jsonl",
                         [{"text": "xxx yyy xxx", "body": "zebra quokka zebra quokka"}] * 20)
    vocab = _vocab(_tokenizer_command(corpus, capsys, "--text-field", "body"))
    assert "q" in vocab and "z" in vocab
    assert "x" not in vocab and "y" not in vocab


def test_tokenizer_command_reads_a_txt_file_as_jsonl_when_told(tmp_path, capsys):
    """`--format jsonl` on a .txt file must parse each line as JSON: the braces, quotes and keys
    of the JSON syntax must not end up in the vocabulary."""
    corpus = _jsonl_rows(tmp_path / "rows.txt", [{"text": "hello world, hello moon."}] * 20)
    vocab = _vocab(_tokenizer_command(corpus, capsys, "--format", "jsonl"))
    assert "hello" in vocab
    assert not vocab & {"{", "}", '"', "text", "t"}


def test_tokenizer_command_strip_accents_no_keeps_accents_when_uncased(tmp_path, capsys):
    """`--strip-accents no` on an (uncased) tokenizer must keep accents: "é" stays a character of
    the vocabulary and the saved config says strip_accents false."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Café résumé and the café.\n" * 10, encoding="utf-8")
    out = _tokenizer_command(corpus, capsys, "--strip-accents", "no")
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["do_lower_case"] is True and config["strip_accents"] is False
    assert "é" in _vocab(out)
    assert "é" in "".join(load_tokenizer(out).encode("café").tokens)


def test_min_frequency_keeps_pieces_of_a_word_seen_once_out(tmp_path):
    """A minimum frequency above 1 must keep merged pieces of a word seen only once out of the
    vocabulary (with 1 they are in, so the setting is what decides)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat.\n" * 30 + "zqvk\n", encoding="utf-8")
    rare = {"zq", "zqv", "zqvk", "##qv", "##qvk", "##vk"}
    with pytest.warns(UserWarning, match="the corpus gave only"):  # a small vocabulary
        loose = _vocab(train_tokenizer([corpus], tmp_path / "loose", vocab_size=300,
                                       min_frequency=1))
    assert "zqvk" in loose  # the rare word is merged whole when every pair counts
    with pytest.warns(UserWarning, match="the corpus gave only"):
        strict = _vocab(train_tokenizer([corpus], tmp_path / "strict", vocab_size=300,
                                        min_frequency=2))
    assert "z" in strict and "cat" in strict
    assert not strict & rare


def _arrow_rows(path, fmt):
    pa = pytest.importorskip("pyarrow")
    table = pa.table({
        "id": pa.array(["row-1", "row-2"], pa.string()),
        "text": pa.array(["Wrong column one.", "Wrong column two."], pa.string()),
        "body": pa.array(["Body of the first row.", "Body of the second row."], pa.string()),
    })
    with pa.OSFile(str(path), "wb") as sink:
        new = pa.ipc.new_file if fmt == "file" else pa.ipc.new_stream
        with new(sink, table.schema) as writer:
            writer.write_table(table)
    return path


@pytest.mark.parametrize("fmt", ["stream", "file"])
def test_arrow_corpus_reads_the_text_field_column(tmp_path, fmt):
    """With an Arrow corpus, --text-field body must read the "body" column, not the "text"
    column nor the first column of the table."""
    path = _arrow_rows(tmp_path / "rows.arrow", fmt)
    docs = list(iter_documents([path], text_field="body"))
    assert docs == [["Body of the first row."], ["Body of the second row."]]


def test_vocab_only_folder_follows_tokenize_chinese_chars_false(tmp_path):
    """A folder of vocab.txt and a config saying "tokenize_chinese_chars": false must not split
    Chinese text into characters: "中国" is one word found whole in the vocabulary."""
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "中国", "中", "国", "##国"])
                                      + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "tokenize_chinese_chars": False}))
    assert load_tokenizer(folder).encode("中国").tokens == ["[CLS]", "中国", "[SEP]"]


def test_jsonl_text_lines_are_separate_sentences():
    """A JSONL text's lines (a title above its body) must become separate sentences, not be
    glued into one sentence across the line break."""
    assert raw_to_sentences("jsonl", "Title line\nBody sentence.") == [
        "Title line", "Body sentence."]


FORMAT_BY_EXTENSION = {".jsonl": "jsonl", ".json": "jsonl", ".xml": "wiki",
                       ".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow",
                       ".txt": "sentences", ".text": "sentences"}


@pytest.mark.parametrize(("ext", "expected"), sorted(FORMAT_BY_EXTENSION.items()))
def test_format_follows_the_file_extension(tmp_path, ext, expected):
    """Each known extension must pick its reader, whatever the file holds (here a JSON line,
    which sniffing alone would read as JSONL)."""
    path = tmp_path / f"a{ext}"
    path.write_text(json.dumps({"text": "a b c."}) + "\n", encoding="utf-8")
    assert detect_format(path) == expected
    assert detect_format(tmp_path / f"b{ext.upper()}") == expected


def test_sample_cut_keeps_a_wiki_article_whole():
    """With --sample-bytes, a Wikipedia article must be kept whole (its markup is stripped later
    and must not be cut open), whatever the budget."""
    item = ("wiki", "'''Title''' is [[a link]] " * 10, True)
    assert cut_part(item, 10) == (item, len(item[1]))


def test_launch_flags_in_either_form_are_not_passed_to_workers():
    """`--nproc 2` and `--nproc=2` (and --max-restarts alike) are the launcher's: the worker
    processes must not get them."""
    argv = ["pretrain", "--nproc=2", "--max-restarts=1", "--out", "x", "--nproc", "auto",
            "--max-restarts", "3", "--steps", "5"]
    assert strip_launch_flags(argv) == ["pretrain", "--out", "x", "--steps", "5"]
