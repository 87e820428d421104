"""Corpus inputs a probe of `bertgpu tokenizer` and `bertgpu prepare` found mishandled: a lone
surrogate escape in JSON Lines and invalid UTF-8 in a Parquet or Arrow string column (tracebacks),
``file://`` outputs and corpora that passed every local output guard, tar archives read as text,
xz/zip/7z files called "invalid UTF-8", and a "no validation split" line naming a flag not given.
Each bad input is one line naming the file (and line or row), exit 2; with --skip-bad the file
is skipped and counted like any other bad file."""

from __future__ import annotations

import gzip
import io
import json
import lzma
import random
import tarfile
import zipfile

import pytest
from _text_fixtures import train_small_tokenizer

from bertgpu.cli import main as cli_main
from bertgpu.data.corpus import CorpusStats, Piece, iter_documents, iter_piece_items
from bertgpu.data.prepare import prepare, split_summary
from bertgpu.data.tokenizer import train_tokenizer
from bertgpu.errors import BertgpuError

TEXT = "".join(f"Sentence {i} of the tiny corpus is here.\nIt has a second line.\n\n"
               for i in range(30))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


def _good(tmp_path):
    good = tmp_path / "zz_good.txt"
    good.write_text("A fine sentence.\n")
    return good


def _one_line_exit_2(args, capsys) -> str:
    code = cli_main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err


def _refused_then_skipped(bad, message, tmp_path, kept) -> None:
    """`bad` alone is refused with `message`; with --skip-bad beside a good file it is skipped
    and counted, and the documents read are `kept`."""
    with pytest.raises(BertgpuError) as info:
        list(iter_documents([bad]))
    assert str(info.value) == message
    stats = CorpusStats()
    assert list(iter_documents([bad, _good(tmp_path)], skip_bad=True, stats=stats)) == kept
    assert stats.skipped == [(str(bad), message)]


# --------------------------------------------------------------------------- 1: surrogates


def test_a_lone_surrogate_escape_in_json_lines_is_one_line_not_a_traceback(tok, tmp_path, capsys):
    """`{"text": "bad \\ud800 surrogate"}` (JSON escapes are common in scraped text) decodes to a
    str no UTF-8 encodes: prepare crashed in the tokenizer (TypeError: TextEncodeInput must
    be ...) and tokenizer with UnicodeEncodeError, --skip-bad or not. A surrogate pair (an emoji
    escaped) is text and still reads."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine \\ud83d\\ude00 text"}\n{"text": "bad \\ud800 surrogate"}\n')
    message = (f"{bad}:2: field 'text' holds a string with an unpaired surrogate \\ud800 (not "
               "UTF-8 text); expected text whose \\ud800-\\udfff escapes come in high-low pairs")
    _refused_then_skipped(bad, message, tmp_path, [["fine \U0001f600 text"], ["A fine sentence."]])
    for command in (["tokenizer", "--vocab-size", "100"], ["prepare", "--tokenizer", str(tok)]):
        out = tmp_path / f"out_{command[0]}"
        err = _one_line_exit_2([*command, "--corpus", str(bad), "--out", str(out)], capsys)
        assert err.endswith(f"error: {message}\n"), err
        assert not out.exists()
    m = prepare([bad, _good(tmp_path)], tok, tmp_path / "d", workers=1, skip_bad=True,
                validation_fraction=0.0)
    assert [s["path"] for s in m["skipped_inputs"]] == [str(bad)]


# --------------------------------------------------------------------------- 2: bad UTF-8 columns


def _bad_utf8_column():
    """A string column whose row 1 holds bytes that are not UTF-8 (Spark can write such)."""
    import numpy as np
    import pyarrow as pa

    data = b"hello world\xff\xfebad text"
    offsets = np.array([0, 11, len(data)], np.int32)
    column = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(offsets.tobytes()),
                                                    pa.py_buffer(data)])
    return pa.table({"text": column})


def test_invalid_utf8_in_a_parquet_or_arrow_column_names_the_file_and_row(tmp_path):
    """pyarrow's to_pylist raised UnicodeDecodeError, a traceback with or without --skip-bad."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = _bad_utf8_column()
    pq.write_table(table, tmp_path / "bad.parquet")
    with pa.OSFile(str(tmp_path / "bad.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    for bad in (tmp_path / "bad.parquet", tmp_path / "bad.arrow"):
        message = (f"{bad}: row 1 (counting from 0) of column 'text' is not UTF-8 text "
                   "(invalid start byte: byte 0xff); expected UTF-8 strings (the writer stored "
                   "other bytes in a string column)")
        _refused_then_skipped(bad, message, tmp_path, [["A fine sentence."]])



def test_a_parquet_or_arrow_file_compressed_whole_says_so(tok, tmp_path, capsys):
    """`x.parquet.gz` was "not a readable Parquet file (Parquet magic bytes not found in
    footer...)": the user could not tell that the gzip around it was the trouble."""
    import bz2

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"text": ["A fine sentence.", "Another one here."]})
    pq.write_table(table, tmp_path / "a.parquet")
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    packed = tmp_path / "a.parquet.gz"
    packed.write_bytes(gzip.compress((tmp_path / "a.parquet").read_bytes()))
    arrow = tmp_path / "b.arrow.bz2"
    arrow.write_bytes(bz2.compress((tmp_path / "b.arrow").read_bytes()))
    for bad, compression, kind in ((packed, "gzip", "a Parquet"), (arrow, "bz2", "an Arrow")):
        message = (f"{bad}: a {compression} stream, not {kind} file ({kind.split()[1]} is read "
                   "in place and compresses its own columns); expected the file itself "
                   "(decompress it first)")
        _refused_then_skipped(bad, message, tmp_path, [["A fine sentence."]])
    err = _one_line_exit_2(["prepare", "--corpus", str(packed), "--tokenizer", str(tok),
                            "--out", str(tmp_path / "d"), "--workers", "1"], capsys)
    assert err.startswith(f"bertgpu prepare: error: {packed}: a gzip stream, not a Parquet"), err
    assert not (tmp_path / "d").exists()


def test_json_lines_named_txt_is_refused_under_auto(tok, tmp_path):
    """A .txt file of JSON Lines was read as sentences: braces, "text": and all went into the
    vocabulary and the shards without a word. Under --format auto it is refused, whole and in
    work units; --format sentences still reads the lines as they are, --format jsonl the field."""
    lines = [json.dumps({"text": f"Document {i} is a fine sentence here.", "id": i})
             for i in range(400)]
    small, big = tmp_path / "small.txt", tmp_path / "big.txt"
    small.write_text("\n".join(lines[:3]) + "\n", encoding="utf-8")
    big.write_text("\n".join(lines) + "\n", encoding="utf-8")
    message = (f"{small}: named as text (one sentence per line), but its first line is a JSON "
               "object; expected --format jsonl to read its --text-field (or a name ending in "
               ".jsonl), or --format sentences to read the lines as they are")
    _refused_then_skipped(small, message, tmp_path, [["A fine sentence."]])
    assert big.stat().st_size > 16384  # read in work units
    with pytest.raises(BertgpuError, match="big.txt: named as text .* first line is a JSON"):
        prepare([big], tok, tmp_path / "d", workers=1, unit_bytes=16384)
    assert not (tmp_path / "d").exists()
    assert next(iter_documents([small], fmt="sentences")) == lines[:3]
    assert list(iter_documents([small], fmt="jsonl"))[0] == ["Document 0 is a fine sentence here."]
    plain = tmp_path / "plain.txt"  # a brace that opens no JSON object is text
    plain.write_text("{braces} open this line.\nA second sentence.\n", encoding="utf-8")
    assert list(iter_documents([plain])) == [["{braces} open this line.", "A second sentence."]]

# --------------------------------------------------------------------------- 3: file:// URLs


def test_a_file_url_output_or_corpus_gets_the_local_output_guards(tok, tmp_path, monkeypatch):
    """`if not is_url(out)` skipped check_output_folder, the --overwrite check and check_apart
    for file:// (which the writer then treated as local): an existing shard set was replaced
    without --overwrite, and outputs inside the corpus were accepted, in both commands."""
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "cc"
    corpus.mkdir()
    (corpus / "sent.txt").write_text(TEXT)
    earlier = tmp_path / "ofu"
    earlier.mkdir()
    (earlier / "manifest.json").write_text("{}")  # an earlier shard set
    with pytest.raises(BertgpuError, match="ofu: already exists and is not empty; expected a new "
                                           r"folder \(or --overwrite\)"):
        prepare([corpus], tok, f"file://{earlier}", workers=1, validation_fraction=0.0)
    assert (earlier / "manifest.json").read_text() == "{}"
    overlap = "overlaps the input .*cc \\(--corpus\\)"
    for corpus_arg, out in ((str(corpus), f"file://{corpus}/out"),
                            (f"file://{corpus}", "cc/out2")):
        with pytest.raises(BertgpuError, match=overlap):
            prepare([corpus_arg], tok, out, workers=1, validation_fraction=0.0)
    with pytest.raises(BertgpuError, match=overlap):
        train_tokenizer([f"file://{corpus}"], "cc/tk2", vocab_size=100)
    assert sorted(p.name for p in corpus.iterdir()) == ["sent.txt"]
    # a file:// output of the tokenizer is the local folder it names, as prepare's is
    assert train_tokenizer([corpus], f"file://{tmp_path}/tk3", vocab_size=100) == tmp_path / "tk3"



def test_a_file_url_folder_is_found_as_the_same_folder_by_name(tmp_path):
    """fsspec's local find listed a link to a folder as a file: `--corpus file:///c` failed with
    "cannot open (IsADirectoryError...)" where `--corpus /c` read the folder behind the link,
    and a pattern over such a link matched nothing. A file:// folder, file or pattern now gives
    what the same path by name gives, as file:// URLs; a broken link is refused the same way."""
    from bertgpu.data.sources import resolve_inputs

    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "real" / "sub" / "a.txt").write_text(TEXT)
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "b.txt").write_text(TEXT)
    (corpus / "link").symlink_to(tmp_path / "real")
    (corpus / ".hidden.txt").write_text(TEXT)
    for given in (str(corpus), str(corpus / "*")):
        local = resolve_inputs([given])
        assert [p.relative_to(corpus).as_posix() for p in local] == ["b.txt", "link/sub/a.txt"]
        assert resolve_inputs([f"file://{given}"]) == [f"file://{p}" for p in local]
    assert len(list(iter_documents([f"file://{corpus}"]))) == 60
    assert resolve_inputs([f"file://{corpus}/b.txt"]) == [f"file://{corpus}/b.txt"]
    (corpus / "gone.txt").symlink_to(tmp_path / "nowhere")
    with pytest.raises(BertgpuError, match="gone.txt: a broken symbolic link"):
        resolve_inputs([f"file://{corpus}"])
    with pytest.raises(BertgpuError, match=f"^file://{tmp_path}/none: no such file or folder$"):
        resolve_inputs([f"file://{tmp_path}/none"])

# --------------------------------------------------------------------------- 4, 5: archives


def test_a_tar_archive_is_refused_not_read_as_text(tmp_path):
    """A .tar.gz (or .tar) corpus was read as text, its header the first row ("sent.txt0000644
    ...ustar root..."), in whole files and in the parts a sample or a work unit reads."""
    (tmp_path / "sent.txt").write_text(TEXT)
    plain = tmp_path / "corpus.tar"
    with tarfile.open(plain, "w") as tar:
        tar.add(tmp_path / "sent.txt", arcname="sent.txt")
    packed = tmp_path / "corpus.tar.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    named_txt = tmp_path / "named.txt"  # the name says text: the content decides
    named_txt.write_bytes(plain.read_bytes())
    for bad in (plain, packed, named_txt):
        with pytest.raises(BertgpuError) as info:
            list(iter_documents([bad]))
        assert str(info.value) == f"{bad}: a tar archive; expected text (extract it first)"
    size = plain.stat().st_size
    part = Piece(plain, "sentences", 0, size // 2, 0, 2, (0, size // 2))
    items = list(iter_piece_items([part], skip_bad=True))
    assert items == [("bad", (str(plain), f"{plain}: a tar archive; expected text (extract it "
                                          "first)"), False)]
    stats = CorpusStats()
    assert list(iter_documents([packed, _good(tmp_path)], skip_bad=True, stats=stats)) == [
        ["A fine sentence."]]
    assert [p for p, _ in stats.skipped] == [str(packed)]


def test_xz_zip_and_7z_files_say_what_they_are(tok, tmp_path, capsys):
    """They were decoded as text: "invalid UTF-8 byte 0xfd at byte offset 0". Planning the work
    units of a file larger than one (its format sniffed) does not refuse it: --skip-bad still
    skips it."""
    xz = tmp_path / "a.txt.xz"
    xz.write_bytes(lzma.compress(TEXT.encode()))
    misnamed = tmp_path / "b.jsonl.gz"  # not "named .gz but not a gzip stream"
    misnamed.write_bytes(xz.read_bytes())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("sent.txt", TEXT)
    zipped = tmp_path / "c.zip"
    zipped.write_bytes(buffer.getvalue())
    seven = tmp_path / "d.7z"
    seven.write_bytes(b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(24))
    supported = "not supported; expected plain text, gzip, bzip2 or zstd"
    for bad, what in ((xz, "xz-compressed"), (misnamed, "xz-compressed"),
                      (zipped, "a zip archive"), (seven, "7z-compressed")):
        with pytest.raises(BertgpuError) as info:
            list(iter_documents([bad]))
        assert str(info.value) == f"{bad}: {what}: {supported}"
    err = _one_line_exit_2(["tokenizer", "--corpus", str(xz), "--out", str(tmp_path / "t")],
                           capsys)
    assert err == f"bertgpu tokenizer: error: {xz}: xz-compressed: {supported}\n"
    big = tmp_path / "big.xz"  # 3 work units of 16 KiB
    big.write_bytes(lzma.compress(random.Random(0).randbytes(40000), preset=0))
    assert big.stat().st_size > 2 * 16384
    m = prepare([big, _good(tmp_path)], tok, tmp_path / "d", workers=1, skip_bad=True,
                unit_bytes=16384, validation_fraction=0.0)
    assert m["skipped_inputs"] == [{"path": str(big),
                                    "reason": f"{big}: xz-compressed: {supported}"}]


# --------------------------------------------------------------------------- 6: the summary


def test_no_validation_split_names_the_flag_given():
    """--validation-docs 0 printed "no validation split (--validation-fraction 0)"."""
    manifest = {"splits": {"validation": {"sequences": 0}}, "validation_share": 0.0,
                "split_unit": "none", "validation_fraction": None, "validation_docs": 0}
    assert split_summary(manifest) == "no validation split (--validation-docs 0)"
    manifest.update(validation_fraction=0.0, validation_docs=None)
    assert split_summary(manifest) == "no validation split (--validation-fraction 0)"


def test_invalid_utf8_in_a_later_row_group_of_a_parquet_part_names_the_file_row(tmp_path):
    """A work unit that starts at a later row group (a large Parquet file is split by row groups)
    counts its rows from the file's first row: the error names the row of the file, not of the
    unit. The expected row comes from pyarrow's own row-group sizes."""
    pytest.importorskip("pyarrow")
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertgpu.data.units import split_file

    texts = [f"Row {i} of the corpus is fine.".encode() for i in range(12)]
    bad_row = 7  # in the second row group
    texts[bad_row] = b"not utf-8 \xff\xfe here"
    offsets = np.cumsum([0] + [len(t) for t in texts]).astype(np.int32)
    column = pa.Array.from_buffers(pa.string(), len(texts), [
        None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(texts))])
    path = tmp_path / "groups.parquet"
    pq.write_table(pa.table({"text": column}), path, row_group_size=5)
    meta = pq.ParquetFile(path).metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert sizes == [5, 5, 2]
    group = next(g for g in range(len(sizes)) if sum(sizes[: g + 1]) > bad_row)
    assert group == 1

    pieces = split_file(path, path.stat().st_size, "auto", part_bytes=1)  # a part per row group
    assert [(p.kind, p.start, p.stop) for p in pieces] == [("parquet", 0, 1), ("parquet", 1, 2),
                                                            ("parquet", 2, None)]
    message = (f"{path}: row {bad_row} (counting from 0) of column 'text' is not UTF-8 text "
               "(invalid start byte: byte 0xff); expected UTF-8 strings (the writer stored "
               "other bytes in a string column)")
    for read in (pieces[group:group + 1], [Piece(path)]):  # the part, and the whole file
        with pytest.raises(BertgpuError) as info:
            list(iter_piece_items(read))
        assert str(info.value) == message
    # the other parts read cleanly: the bad value is in the second row group only
    for piece in (pieces[0], pieces[2]):
        assert [item[1] for item in iter_piece_items([piece]) if item[0] == "jsonl"] == [
            t.decode() for t in texts[sum(sizes[:piece.start]):][:sizes[piece.start]]]
