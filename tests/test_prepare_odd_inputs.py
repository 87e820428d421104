"""`bertgpu prepare` on odd real-world inputs (a probe's findings): Hugging Face folders whose
tokenizer.json and tokenizer_config.json disagree, tokenizer files that are JSON but not objects,
text that normalises to no token, and words longer than a line piece; the shards are checked
against transformers' AutoTokenizer."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from _text_fixtures import train_small_tokenizer

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare
from bertgpu.data.tokenizer_folder import tokenizer_hash
from bertgpu.errors import BertgpuError


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def cased(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "cased", vocab_size=1000,
                                 lowercase=False)


def _token_stream(out) -> list[int]:
    """The text tokens of the train split, rows unpacked ([CLS] and the last [SEP] dropped)."""
    shards = json.loads((out / "manifest.json").read_text())["splits"]["train"]["shards"]
    ids = [np.load(out / f"{s['name']}.input_ids.npy") for s in shards]
    lengths = [np.load(out / f"{s['name']}.lengths.npy") for s in shards]
    return [t for a, n in zip(ids, lengths, strict=True) for row, k in zip(a, n, strict=True)
            for t in row[1 : k - 1].tolist()]


def _reference(hf, lines: list[str]) -> list[int]:
    """transformers' ids of one document per line, [SEP] between documents."""
    out: list[int] = []
    for line in lines:
        out += hf(line, add_special_tokens=False)["input_ids"] + [hf.sep_token_id]
    return out[:-1]


def test_shards_of_a_bert_folder_follow_its_config_as_transformers_does(cased, tmp_path):
    """A cased tokenizer.json under a tokenizer_config.json without do_lower_case: the shards
    were cased ('Paris') and the manifest said do_lower_case false, while the folder's
    AutoTokenizer (the one the exported model is used with) lower-cases ('p ##ar ##is'). Now
    the shards hold AutoTokenizer's ids, and the manifest's do_lower_case and tokenizer hash
    describe that encoding."""
    from transformers import AutoTokenizer

    folder = tmp_path / "hf"
    shutil.copytree(cased, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["do_lower_case"], config["strip_accents"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    lines = ["Paris and Berlin are Capital Cities. Café Über naïve.", "The Quick Brown Fox."] * 3
    corpus = tmp_path / "cased.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="encoding as the config says"):
        m = prepare([corpus], folder, tmp_path / "data", fmt="lines", workers=1,
                    validation_fraction=0.0)
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "data" / "tokenizer"))
    assert _token_stream(tmp_path / "data") == _reference(hf, lines)
    assert m["do_lower_case"] is True
    uncased = tmp_path / "uncased"  # the same vocabulary, stated lower-casing
    shutil.copytree(cased, uncased)
    (uncased / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": True}))
    assert m["tokenizer_hash"] == tokenizer_hash(uncased) != tokenizer_hash(cased)


@pytest.mark.parametrize("name, content, message", [
    ("tokenizer_config.json", "[]", "a JSON array, not an object; expected a tokenizer config"),
    ("special_tokens_map.json", '"[CLS]"',
     "a JSON string, not an object; expected a map of special tokens"),
    ("config.json", "3", "a JSON number, not an object; expected a model config"),
])
def test_a_tokenizer_file_of_json_but_not_an_object_is_one_line_error(tok, tmp_path, capsys,
                                                                      name, content, message):
    """tokenizer_config.json `[]` or special_tokens_map.json `"[CLS]"` (valid JSON, not an
    object) gave an AttributeError traceback, exit 1."""
    folder = tmp_path / "tok"
    shutil.copytree(tok, folder)
    if name == "config.json":  # read when the tokenizer config names no class
        config = json.loads((folder / "tokenizer_config.json").read_text())
        del config["tokenizer_class"]
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / name).write_text(content)
    corpus = tmp_path / "real.txt"
    corpus.write_text("A real document.\n")
    out = tmp_path / "data"
    code = cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(folder), "--out",
                     str(out), "--workers", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err == f"bertgpu prepare: error: {folder / name}: {message}\n"
    assert not out.exists() and not out.with_name("data.tmp").exists()


def test_text_that_gives_no_token_is_no_text_not_a_document(tok, tmp_path):
    """Documents of control or format characters only (zero-width spaces, a BOM, \\x01) are
    text that BERT's normaliser removes. A corpus of them failed with "--validation-fraction
    0.0: ... all of them were held out" (nothing was), and beside real documents they counted
    in counts.documents (3 for 1 with tokens). Now such a file is "no text", named, and only
    documents with tokens count."""
    zw = tmp_path / "zw.jsonl"
    zw.write_text('{"text": "\\u200b"}\n{"text": "\\ufeff\\u200d"}\n')
    ctrl = tmp_path / "ctrl.txt"
    ctrl.write_bytes(b"\x01\x02\x03\n\n\x7f\x00\n")
    real = tmp_path / "real.txt"
    real.write_text("A real document.\n\n\x01\x02\n\nAnother one.\n")  # 2 documents with text
    for bad in (zw, ctrl):
        with pytest.raises(BertgpuError) as info:
            prepare([bad, real], tok, tmp_path / "d", workers=1, validation_fraction=0.0)
        assert str(info.value).endswith(f"{bad.name}: no text (only control or format "
                                        "characters, which the tokenizer removes); expected at "
                                        "least one document")
    for workers in (1, 2):
        m = prepare([ctrl, real], tok, tmp_path / f"w{workers}", workers=workers, skip_bad=True,
                    validation_fraction=0.0)
        assert m["counts"]["documents"] == m["splits"]["train"]["documents"] == 2
        assert [s["path"] for s in m["skipped_inputs"]] == [str(ctrl)]
        assert [i["path"] for i in m["inputs"]] == [str(real)]


def test_a_word_longer_than_a_line_piece_is_one_unk_as_in_transformers(tok, tmp_path,
                                                                      monkeypatch):
    """A line longer than a piece (LINE_PIECE_BYTES, 1 MiB) is read in pieces. A piece that
    ended inside a run of characters without space gave one [UNK] per piece ('x' * 2.5M: three,
    transformers one), and one cut inside a word of 'a,b,c' text split it in two. Pieces now end
    where BERT's pre-tokenizer ends a word, or inside a word too long to be anything but one
    [UNK], whose rest is skipped: the shards hold transformers' ids."""
    from transformers import AutoTokenizer

    import bertgpu.data.corpus as corpus_module

    hf = AutoTokenizer.from_pretrained(str(tok))
    big = tmp_path / "big.txt"  # the probe's line, at the real piece size
    big.write_text("x" * 2_500_000 + "\n")
    prepare([big], tok, tmp_path / "big", fmt="lines", workers=1, validation_fraction=0.0)
    assert _token_stream(tmp_path / "big") == [hf.unk_token_id]
    monkeypatch.setattr(corpus_module, "LINE_PIECE_BYTES", 4096)
    lines = ["x" * 20_000 + " tail.",  # one [UNK] across five pieces
             "hello " + "ab" * 9_000 + " world.",
             "a " * 1_900 + "y" * 500 + " after the cut",  # a word across the cut: cut before it
             ",".join(["ab"] * 5_000) + " end.",  # punctuation, no space
             "中文，" * 3_000,  # CJK characters are words
             "z" * 4_095 + "é" + " and " + "q\u200b" * 3_000 + "!",  # cut in a 2-byte character
             "Ordinary line."]
    corpus = tmp_path / "long.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    prepare([corpus], tok, tmp_path / "long", fmt="lines", workers=1, validation_fraction=0.0)
    assert _token_stream(tmp_path / "long") == _reference(hf, lines)


def test_null_text_rows_are_counted_in_the_summary_and_manifest(tok, tmp_path, capsys):
    """Parquet nulls were dropped without a word (4 rows, 1 null: "2 documents" and nothing
    more), a JSON Lines null stopped the run: both are skipped, counted in the manifest and said
    in the summary. A Parquet file of nulls read in parts (work units of its row groups) is "no
    text" for its nulls, not for "blank lines, markup or control characters"."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = ["First row. It has text.", None, "", "Fourth row here."]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), tmp_path / "rows.parquet")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "data"
    assert cli_main(["prepare", "--corpus", str(tmp_path / "rows.parquet"),
                     str(tmp_path / "rows.jsonl"), "--tokenizer", str(tok), "--out", str(out),
                     "--seq-len", "64", "--workers", "1", "--validation-fraction", "0"]) == 0
    printed = capsys.readouterr().out
    assert ("prepare: 2 null texts skipped (a row whose text is null is no document, in Parquet, "
            "Arrow and JSON Lines alike)\n") in printed
    m = json.loads((out / "manifest.json").read_text())
    assert m["counts"]["null_rows"] == 2 and m["counts"]["documents"] == 4
    clean = prepare([tmp_path / "rows.jsonl"], tok, tmp_path / "clean", workers=1,
                    validation_fraction=0.0)  # (the JSONL has a null too: count 1)
    assert clean["counts"]["null_rows"] == 1
    (tmp_path / "ok.jsonl").write_text('{"text": "No null here."}\n')
    assert "null_rows" not in prepare([tmp_path / "ok.jsonl"], tok, tmp_path / "ok",
                                      workers=1)["counts"]
    # all nulls, in 4 units of 2 row groups (an id column gives the row groups their size)
    rows = 8000
    table = pa.table({"id": np.arange(rows, dtype=np.int64) * 7919 % 104729,
                      "text": pa.array([None] * rows, pa.string())})
    pq.write_table(table, tmp_path / "allnull.parquet", row_group_size=1000, compression="none")
    report: dict = {}
    with pytest.raises(BertgpuError) as info:
        prepare([tmp_path / "allnull.parquet", tmp_path / "ok.jsonl"], tok, tmp_path / "parts",
                workers=1, unit_bytes=16 << 10, report=report)
    assert str(info.value) == (
        f"{tmp_path / 'allnull.parquet'}: no text (every row's text is null or empty, 8000 of "
        "them null); expected at least one row with text (choose the column or field with "
        "--text-field)")
    m = prepare([tmp_path / "allnull.parquet", tmp_path / "ok.jsonl"], tok, tmp_path / "skip",
                workers=1, unit_bytes=16 << 10, skip_bad=True, report=report)
    assert len(report["units"]) > 2  # the Parquet file was read in parts
    assert [s["path"] for s in m["skipped_inputs"]] == [str(tmp_path / "allnull.parquet")]
    assert "null_rows" not in m["counts"]  # (the nulls of a file left out are not counted)
