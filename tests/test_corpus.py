"""Corpus readers: each format on small fixtures, the real gensim Wikipedia sample, bad input."""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json

import pytest
from _text_fixtures import GENSIM_WIKI, write_wiki

from bertgpu.data import compressed
from bertgpu.data.compressed import open_binary, read_errors
from bertgpu.data.corpus import (
    CorpusStats,
    detect_format,
    gensim_test_data,
    iter_documents,
    resolve_inputs,
)
from bertgpu.data.textio import split_sentences
from bertgpu.data.wikitext import strip_wiki_markup, wiki_to_sentences
from bertgpu.errors import BertgpuError

needs_gensim = pytest.mark.skipif(importlib.util.find_spec("gensim") is None,
                                  reason="gensim not installed")


def test_sentences_format_documents_split_on_blank_lines(tmp_path):
    path = tmp_path / "sample.txt"
    path.write_bytes("\ufeffFirst sentence.\r\nSecond one.\r\n\r\n\r\n"
                     "Other doc.\n  \nLast doc\n".encode())
    stats = CorpusStats()
    docs = list(iter_documents([path], stats=stats))
    assert docs == [["First sentence.", "Second one."], ["Other doc."], ["Last doc"]]
    assert (stats.files, stats.documents, stats.skipped) == (1, 3, [])


def test_text_format_paragraphs_are_documents_split_into_sentences(tmp_path):
    path = tmp_path / "book.md"
    path.write_text("The cat sat. It was\nhappy! Was it?\n\n"
                    "E.g. this stays, e.g. whole. Next one.\n")
    docs = list(iter_documents([path], fmt="text"))
    assert docs == [["The cat sat.", "It was happy!", "Was it?"],
                    ["E.g. this stays, e.g. whole.", "Next one."]]


def test_split_sentences_handles_quotes_and_cjk():
    assert split_sentences('He said "Stop." Then he left.') == ['He said "Stop."', "Then he left."]
    assert split_sentences("我爱自然语言处理。很有趣。") == ["我爱自然语言处理。", "很有趣。"]
    # a closing quote stays with its sentence; a run of ends is one end; ! and ? after an
    # ideograph; the danda and the Arabic question mark
    assert split_sentences("他说：“你好。”然后走了。") == ["他说：“你好。”", "然后走了。"]
    assert split_sentences("真的吗？！太好了。") == ["真的吗？！", "太好了。"]
    assert split_sentences("你好!我是小明?你呢") == ["你好!", "我是小明?", "你呢"]
    assert split_sentences("वे दिल्ली में हैं। फिर आए।") == ["वे दिल्ली में हैं।", "फिर आए।"]
    assert split_sentences("هل أنت بخير؟ نعم.") == ["هل أنت بخير؟", "نعم."]
    assert split_sentences("e.g. the cat. The dog") == ["e.g. the cat.", "The dog"]
    # not after a title, an abbreviation or an initial (3.3% of the Wikipedia sample's
    # "sentences" were such fragments: "Dr.", "Brown live at No.")
    assert split_sentences("Dr. Smith paid $3.50 for it. He left.") == [
        "Dr. Smith paid $3.50 for it.", "He left."]
    assert split_sentences("Mr. and Mrs. Brown live at No. 5 Main St. in town. Fine.") == [
        "Mr. and Mrs. Brown live at No. 5 Main St. in town.", "Fine."]
    assert split_sentences("It was William B. Yeats in the U.S. Army. I saw it. Go.") == [
        "It was William B. Yeats in the U.S. Army.", "I saw it.", "Go."]
    assert split_sentences("Answer: No. It is not.") == ["Answer: No.", "It is not."]  # no number
    assert split_sentences("He wore No. IX, then No. #5. Yes.") == [
        "He wore No. IX, then No. #5.", "Yes."]
    assert split_sentences("他说：『她说：「好。」』然后走了。") == [
        "他说：『她说：「好。」』", "然后走了。"]
    assert split_sentences("真的?!然后。") == ["真的?!", "然后。"]


def test_jsonl_reads_text_field_and_custom_field(tmp_path):
    path = tmp_path / "web.jsonl"
    rows = [{"text": "One. Two.", "id": 1}, {"text": "", "id": 2},
            {"text": "Para one.\n\nPara two."}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert list(iter_documents([path])) == [["One.", "Two."], ["Para one.", "Para two."]]
    other = tmp_path / "body.json"
    other.write_text(json.dumps({"body": "Hello there."}) + "\n")
    assert list(iter_documents([other], text_field="body")) == [["Hello there."]]


@pytest.mark.parametrize("compress", [False, True])
def test_wiki_reader_skips_redirects_and_strips_markup(tmp_path, compress):
    path = write_wiki(tmp_path / ("dump.xml.bz2" if compress else "dump.xml"), compress=compress)
    assert detect_format(path) == "wiki"
    docs = list(iter_documents([path]))
    assert len(docs) == 2  # Alpha and Beta: 2 redirects and a namespace-4 page skipped
    text = " ".join(docs[0])
    assert "Alpha is the first letter of the Greek script." in docs[0]  # [[a|b]] -> b, '''x''' -> x
    assert "It comes before Beta." in docs[0]  # [[a]] -> a
    assert "ancient times" in text and "later periods" in text  # [http://x label] -> label
    assert "First list item about alpha." in docs[0]  # list prefix gone
    for junk in ("{{", "}}", "[[", "]]", "Infobox", "citation", "caption", "Category", "table cell",
                 "Header", "History", "<", "'''", "de:Alpha", "http"):
        assert junk not in text, junk
    assert docs[1] == ["Beta is the second letter.", "It follows alpha.", "Its value is two."]


def test_strip_wiki_markup_nested_templates_and_file_links():
    text = "A {{a|{{b|{{c}}}}}} B [[Image:x.jpg|cap [[y]] with [bracket]]] C [[Category:Z]] D"
    assert " ".join(strip_wiki_markup(text).split()) == "A B C D"


def test_bare_bz2_with_mediawiki_inside_is_detected(tmp_path):
    path = write_wiki(tmp_path / "enwiki-articles1.xml-p1p30.bz2", compress=True)
    assert detect_format(path) == "wiki"
    plain = tmp_path / "notes.txt.bz2"
    plain.write_bytes(bz2.compress(b"Just a sentence.\n"))
    assert detect_format(plain) == "sentences"
    assert list(iter_documents([plain])) == [["Just a sentence."]]


@needs_gensim
def test_real_wikipedia_sample_from_gensim():
    path = gensim_test_data(GENSIM_WIKI)
    stats = CorpusStats()
    docs = list(iter_documents([path], stats=stats))
    assert stats.documents == len(docs) == 106  # 206 pages: 100 redirects, 1 project page
    sentences = [s for d in docs for s in d]
    assert len(sentences) > 20_000
    words = sum(len(s.split()) for s in sentences)
    assert 400_000 < words < 500_000
    for junk in ("{{", "}}", "[[", "]]", "<ref", "'''", "{|", "|}"):
        assert not any(junk in s for s in sentences), junk
    assert docs[0][0].startswith("Anarchism is a political philosophy")


def test_gensim_test_data_missing_file_is_an_error():
    with pytest.raises(BertgpuError, match="no-such-file"):
        gensim_test_data("no-such-file.txt")


def test_resolve_inputs_folders_globs_and_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "deep").mkdir(parents=True)
    for rel in ("b/2.txt", "a/deep/1.txt", "a/0.txt", "a/.hidden", "c.jsonl"):
        (tmp_path / rel).write_text("x\n")
    found = resolve_inputs([tmp_path / "b", tmp_path / "a", str(tmp_path / "*.jsonl"),
                            tmp_path / "a/0.txt"])
    assert ([p.relative_to(tmp_path).as_posix() for p in found]
            == ["b/2.txt", "a/0.txt", "a/deep/1.txt", "c.jsonl"])
    with pytest.raises(BertgpuError, match="pattern matches no files"):
        resolve_inputs([str(tmp_path / "*.xml")])
    with pytest.raises(BertgpuError, match="no such file"):
        resolve_inputs([tmp_path / "missing.txt"])


def _bad_inputs(tmp_path):
    """(file, expected message fragment) for each kind of bad input."""
    utf = tmp_path / "latin1.txt"
    utf.write_bytes(b"good line\nalso good\ncaf\xe9 au lait\n")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\n")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "ok"}\n{"text": oops}\n')
    no_field = tmp_path / "nofield.jsonl"
    no_field.write_text('{"body": "ok"}\n')
    not_wiki = tmp_path / "other.xml"
    not_wiki.write_text("<rss><item>x</item></rss>")
    broken_xml = tmp_path / "broken.xml"
    broken_xml.write_text("<mediawiki><page><ns>0</ns><text>x</page>")
    return [
        (utf, r"latin1.txt:3: invalid UTF-8 byte 0xe9 at byte offset 23"),
        (empty, r"empty.txt: empty file"),
        (blank, r"blank.txt: no text"),
        (bad_json, r"bad.jsonl:2: not valid JSON"),
        (no_field, r"nofield.jsonl:1: no string field 'text'"),
        (not_wiki, r"other.xml: root element <rss> is not <mediawiki>"),
        (broken_xml, r"broken.xml:1: XML error"),
    ]


def test_each_bad_input_raises_one_line_error_naming_file_and_line(tmp_path):
    for path, message in _bad_inputs(tmp_path):
        with pytest.raises(BertgpuError, match=message) as info:
            list(iter_documents([path]))
        assert "\n" not in str(info.value)


def test_skip_bad_counts_skipped_files_and_keeps_going(tmp_path):
    bad = _bad_inputs(tmp_path)
    good = tmp_path / "zz_good.txt"
    good.write_text("A fine sentence.\n")
    stats = CorpusStats()
    docs = list(iter_documents([p for p, _ in bad] + [good], skip_bad=True, stats=stats))
    # a file is read up to its first problem: the unfinished document of the latin-1 file is
    # dropped, the JSONL file's first line had been yielded already
    assert docs == [["ok"], ["A fine sentence."]]
    assert stats.files == 1
    assert [p for p, _ in stats.skipped] == [str(p) for p, _ in bad]
    assert "7 skipped" in stats.summary()


def _jsonl_with_a_bad_line(n: int = 3000) -> bytes:
    """JSON Lines whose line 5 is not JSON (what a damaged stream decompressed to)."""
    lines = [json.dumps({"text": f"Article {i} is about the river number {i}."}) for i in range(n)]
    lines[4] = lines[4][:7] + "\x01" + lines[4][8:]
    return "".join(line + "\n" for line in lines).encode()


def _bad_crc(data: bytes) -> bytes:
    """A gzip member of ``data`` whose CRC32 (the trailer's first 4 bytes) does not match: the
    damage gzip finds only at the member's end, after the text it garbled was read."""
    member = bytearray(gzip.compress(data, mtime=0))
    member[-8] ^= 0xFF
    return bytes(member)


def test_a_damaged_compressed_stream_is_reported_as_damaged_not_as_bad_text(tmp_path):
    """A damaged gzip (bzip2) stream decompresses into garbage before the CRC (end of stream) is
    checked: it was reported as bad JSON or bad UTF-8 at a line of the decompressed text
    ("bad.jsonl.gz:9986: not valid JSON"), sending the user to fix a line that is fine."""
    gz = tmp_path / "bad.jsonl.gz"
    gz.write_bytes(_bad_crc(_jsonl_with_a_bad_line()))
    text = tmp_path / "bad.txt.gz"
    text.write_bytes(_bad_crc(b"Fine text.\n\nThen caf\xe9 au lait.\n" + b"More.\n" * 30000))
    # bzip2 level 1 has 100 kB blocks: the first (with the bad line) decodes, the cut is in a later
    whole = bz2.compress(_jsonl_with_a_bad_line(6000), compresslevel=1)
    cut = tmp_path / "cut.jsonl.bz2"
    cut.write_bytes(whole[: len(whole) * 3 // 4])
    for path, message in (
        (gz, r"bad.jsonl.gz: damaged gzip stream \(CRC check failed 0x[0-9a-f]+ != 0x[0-9a-f]+\); "
             r"the bad text found before it \(line 5: not valid JSON \(.*\)\) is what the "
             r"damage decompressed to; expected an intact gzip file \(`gzip -t` checks one\)$"),
        (text, r"bad.txt.gz: damaged gzip stream \(CRC check failed .*\); the bad text found "
               r"before it \(line 3: invalid UTF-8 byte 0xe9 at byte offset 20\) is what"),
        (cut, r"cut.jsonl.bz2: damaged bzip2 stream \(Compressed file ended before the "
              r"end-of-stream marker was reached\); the bad text found before it \(line 5: "),
    ):
        with pytest.raises(BertgpuError, match=message) as info:
            list(iter_documents([path]))
        assert "\n" not in str(info.value)
        stats = CorpusStats()  # --skip-bad: the file is skipped for its damage
        list(iter_documents([path], skip_bad=True, stats=stats))
        assert [reason for _, reason in stats.skipped] == [str(info.value)]


def test_bad_text_in_an_intact_compressed_stream_is_bad_text(tmp_path, monkeypatch):
    """The stream read to its end without damage: the text itself is bad, as before. A stream
    too long to read to its end is not checked, and the line is said to be of its decompressed
    text."""
    gz = tmp_path / "ok.jsonl.gz"
    gz.write_bytes(gzip.compress(_jsonl_with_a_bad_line(), mtime=0))
    with pytest.raises(BertgpuError, match=r"ok.jsonl.gz:5: not valid JSON \(.*\); expected one "
                                           r"JSON object per line$"):
        list(iter_documents([gz]))
    monkeypatch.setattr(compressed, "CHECK_BYTES", 1000)
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(_bad_crc(_jsonl_with_a_bad_line()))
    with pytest.raises(BertgpuError, match=r"bad.jsonl.gz:5: not valid JSON .*; expected one JSON "
                                           r"object per line \(a line of the gzip-decompressed "
                                           r"text; the stream was not read to its end to look for "
                                           r"damage: `gzip -t .*bad.jsonl.gz` checks it\)$"):
        list(iter_documents([bad]))


def _zstd_frames() -> tuple[bytes, list[bytes], set[int]]:
    """Text, and a zstd file of it in frames of every shape: plain, with a checksum, several
    blocks (over 128 KiB of text), a skippable frame between; and where each frame ends."""
    zstandard = pytest.importorskip("zstandard")
    lines = [f"Sentence number {i} of the test, with a square {i * i}.\n" for i in range(4000)]
    parts = ["".join(lines[:40]), "".join(lines[40:80]), "".join(lines[80:])]
    frames = [zstandard.ZstdCompressor().compress(parts[0].encode()),
              zstandard.ZstdCompressor(write_checksum=True).compress(parts[1].encode()),
              (0x184D2A53).to_bytes(4, "little") + (6).to_bytes(4, "little") + b"skip me",
              zstandard.ZstdCompressor(level=1, write_content_size=False
                                       ).compress(parts[2].encode())]
    frames[2] = frames[2][:-1]  # 6 bytes of skippable content
    ends, at = set(), 0
    for frame in frames:
        at += len(frame)
        ends.add(at)
    return "".join(parts).encode(), frames, ends


def test_truncated_zstd_is_an_error_wherever_it_is_cut(tmp_path):
    """A zstd file cut short names the file (zstandard's own reader ends quietly where the bytes
    end: a file cut at 70% gave 69% of its text); only a cut exactly between frames is a
    complete file, as with gzip's members."""
    text, frames, ends = _zstd_frames()
    whole = b"".join(frames)
    assert len(frames[3]) > 3000  # several blocks
    path = tmp_path / "docs.txt.zst"
    path.write_bytes(whole)
    with open_binary(path) as f:
        assert f.read() == text
    cuts = {*range(1, 120), *(e + d for e in ends for d in (-5, -4, -3, -1, 1, 2, 3)),
            *range(120, len(whole), 97)}
    for cut in sorted(c for c in cuts - ends if c < len(whole)):
        path.write_bytes(whole[:cut])
        with pytest.raises((BertgpuError, *read_errors())) as info:  # < 4 bytes: not zstd
            with open_binary(path) as f:
                while f.read(1 << 16):
                    pass
        assert cut < 4 or "truncated zstd stream" in str(info.value), cut
    path.write_bytes(whole[: int(len(whole) * 0.7)])  # the tester's: read silently, exit 0
    with pytest.raises(BertgpuError, match=r"docs.txt.zst: cannot read \(truncated zstd stream"
                       ) as info:
        list(iter_documents([path]))
    assert "\n" not in str(info.value)
    small = tmp_path / "small.txt.zst"  # one block cut in half: was "empty file; expected text"
    small.write_bytes(frames[0][: len(frames[0]) // 2])
    with pytest.raises(BertgpuError, match=r"small.txt.zst: cannot read \(truncated zstd stream"):
        list(iter_documents([small]))
    stats = CorpusStats()  # --skip-bad skips it, and says why
    assert list(iter_documents([small], skip_bad=True, stats=stats)) == []
    assert "truncated zstd stream" in stats.skipped[0][1]


def test_jsonl_without_a_jsonl_name_is_sniffed(tmp_path):
    """Spark writes JSON Lines as part-00000 (plain or .gz) beside an empty _SUCCESS: the content
    says JSON Lines (the JSON syntax went into the training data as text)."""
    import gzip

    spark = tmp_path / "spark"
    spark.mkdir()
    rows = [{"text": "First doc. Two sentences.", "id": 1}, {"id": 2, "text": "Second doc."}]
    (spark / "part-00000").write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))
    (spark / "part-00001.gz").write_bytes(gzip.compress(b'{"text": "Third doc."}\n'))
    (spark / "_SUCCESS").write_bytes(b"")
    (tmp_path / "braces.txt").write_text("{not json} but a sentence.\n")
    (tmp_path / "notes").write_text("{not json} but a sentence.\n")
    assert detect_format(spark / "part-00000") == "jsonl"
    assert detect_format(spark / "part-00001.gz") == "jsonl"
    assert detect_format(tmp_path / "notes") == "sentences"
    assert list(iter_documents([spark])) == [["First doc.", "Two sentences."], ["Second doc."],
                                             ["Third doc."]]
    assert list(iter_documents([tmp_path / "notes"])) == [["{not json} but a sentence."]]


@pytest.mark.parametrize("content, message", [
    (json.dumps([{"text": "a"}, {"text": "b"}], indent=2),
     r"doc.json:1: a JSON document spread over several lines, not JSON Lines"),
    (json.dumps({"data": [{"text": "a"}]}, indent=1),
     r"doc.json:1: a JSON document spread over several lines, not JSON Lines"),
    (json.dumps([{"text": "a"}, {"text": "b"}]), r"doc.json:1: a JSON array, not JSON Lines"),
    ('{"text": null}', r"doc.json: no text \(every row's text is null or empty, 1 of them "
                       r"null\); expected at least one row with text \(choose the column or "
                       r"field with --text-field\)"),  # a null is no document (as in Parquet)
    ('null', r"doc.json:1: no string field 'text' \(found null, not an object\)"),
    ('{"text": 123}', r"doc.json:1: no string field 'text' \(its value is a number\)"),
    ('"just text"', r"doc.json:1: no string field 'text' \(found a string, not an"),
    ('{"text": "ok"}\n{"text": ["a"]}', r"doc.json:2: no string field 'text' \(its value is an "
                                        "array"),
])
def test_json_that_is_not_json_lines_says_what_it_is(tmp_path, content, message):
    path = tmp_path / "doc.json"
    path.write_text(content + "\n")
    with pytest.raises(BertgpuError, match=message) as info:
        list(iter_documents([path]))
    assert "\n" not in str(info.value)


def _null_rows(folder) -> list:
    """The same rows (one null, one empty) as Parquet, an Arrow stream and JSON Lines."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = ["First row. It has text.", None, "", "Fourth row here."]
    table = pa.table({"text": pa.array(texts, pa.string())})
    pq.write_table(table, folder / "rows.parquet")
    with pa.OSFile(str(folder / "rows.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (folder / "rows.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return [folder / n for n in ("rows.parquet", "rows.arrow", "rows.jsonl")]


def test_null_text_is_no_document_and_counted_alike_in_every_format(tmp_path):
    """Parquet and Arrow nulls were dropped silently and uncounted while a JSON Lines null was an
    error, and a column of nulls said "only blank lines or markup" (which Parquet cannot
    have): a null is no document in every format, counted per file, and a file of nulls says
    so."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in _null_rows(tmp_path):
        stats = CorpusStats()
        assert list(iter_documents([path], stats=stats)) == [["First row.", "It has text."],
                                                             ["Fourth row here."]], path
        assert stats.nulls == {str(path): 1}
        assert stats.summary() == "1 file, 2 documents, 1 null text skipped"
    pq.write_table(pa.table({"text": pa.array([None, None], pa.string())}),
                   tmp_path / "allnull.parquet")
    (tmp_path / "allnull.jsonl").write_text('{"text": null}\n{"text": ""}\n{"text": null}\n')
    for name, nulls in (("allnull.parquet", 2), ("allnull.jsonl", 2)):
        with pytest.raises(BertgpuError) as info:
            list(iter_documents([tmp_path / name]))
        assert str(info.value) == (
            f"{tmp_path / name}: no text (every row's text is null or empty, {nulls} of them "
            "null); expected at least one row with text (choose the column or field with "
            "--text-field)")
    stats = CorpusStats()
    list(iter_documents([tmp_path / "allnull.parquet", tmp_path / "rows.jsonl"], skip_bad=True,
                        stats=stats))
    assert [p for p, _ in stats.skipped] == [str(tmp_path / "allnull.parquet")]
    assert stats.summary().endswith(", 3 null texts skipped, 1 skipped") and len(stats.skipped) == 1


def test_unknown_format_is_an_error(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    with pytest.raises(BertgpuError, match="--format 'csv'"):
        list(iter_documents([path], fmt="csv"))


def test_lines_format_one_document_per_line(tmp_path):
    path = tmp_path / "reviews.txt"
    path.write_text("Great phone. Battery lasts!\n\n  \nTerrible support. Never again.\nOk\n")
    stats = CorpusStats()
    docs = list(iter_documents([path], fmt="lines", stats=stats))
    assert docs == [["Great phone.", "Battery lasts!"],
                    ["Terrible support.", "Never again."], ["Ok"]]
    assert (stats.files, stats.documents) == (1, 3)


def test_long_document_and_long_line_arrive_in_bounded_parts(tmp_path, monkeypatch):
    """A document with no blank lines (and a line with no newline) is read in parts; joined, they
    give the same text as whole, so tokens are unchanged."""
    import bertgpu.data.corpus as corpus

    monkeypatch.setattr(corpus, "PART_CHARS", 40)
    monkeypatch.setattr(corpus, "LINE_PIECE_BYTES", 32)
    words = [f"word{i}" for i in range(60)]
    text = " ".join(words)  # one 400-character line
    path = tmp_path / "one.txt"
    path.write_text(text + "\n" + "Short line.\n" + text)  # no blank line: one document
    parts = list(corpus.iter_document_parts([path]))
    assert [new for _, new in parts] == [True] + [False] * (len(parts) - 1) and len(parts) > 10
    assert all(sum(map(len, s)) <= 40 + 32 for s, _ in parts)
    joined = " ".join(s for p, _ in parts for s in p)
    assert joined.split() == words + ["Short", "line."] + words
    lines = list(corpus.iter_documents([path], fmt="lines"))
    assert [" ".join(d).split() for d in lines] == [words, ["Short", "line."], words]
    cjk = tmp_path / "zh.txt"
    cjk.write_text("我爱自然语言处理" * 20, encoding="utf-8")  # 3-byte characters, no spaces
    [doc] = list(corpus.iter_documents([cjk]))
    assert "".join(doc) == "我爱自然语言处理" * 20  # cut between characters, never inside one


def test_bad_utf8_in_a_long_line_names_line_and_byte(tmp_path, monkeypatch):
    import bertgpu.data.corpus as corpus

    monkeypatch.setattr(corpus, "LINE_PIECE_BYTES", 16)
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok line\n" + b"abc def ghi jkl mno pqr stu \xff vwx\n")
    with pytest.raises(BertgpuError,
                       match=r"bad.txt:2: invalid UTF-8 byte 0xff at byte offset 36") as info:
        list(corpus.iter_documents([path], fmt="lines"))
    assert "\n" not in str(info.value)


def test_decoded_lines_pieces_end_every_line(tmp_path):
    """Pieces of a line carry its number; the last piece of each line ends it, even when the
    file stops right after a cut."""
    import io

    from bertgpu.data.textio import decoded_lines

    got = list(decoded_lines(tmp_path / "x", io.BytesIO(b"ab cd ef\nxy zzz "), piece_bytes=4))
    assert got == [(1, "ab ", False), (1, "cd ", False), (1, "ef", True), (2, "xy ", False),
                   (2, "zzz ", False), (2, "", True)]


def test_a_broken_json_line_names_its_column_once(tmp_path):
    """json's own message can end in "at" ("Unterminated string starting at"): the error said
    "starting at at column 10"."""
    path = tmp_path / "broken.jsonl"
    for line, message in [('{"text": "broken', "Unterminated string starting at column 10"),
                          ('{"text": "tab\there"}', "Invalid control character at column 14"),
                          ('{"text": }', "Expecting value at column 10")]:
        path.write_text('{"text": "ok doc."}\n' + line + "\n")
        with pytest.raises(BertgpuError) as info:
            list(iter_documents([path]))
        assert str(info.value) == (f"{path}:2: not valid JSON ({message}); expected one JSON "
                                   "object per line")


NAMESPACES_XML = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.11/" version="0.11">
  <siteinfo><sitename>Wikipedia</sitename><namespaces>
    <namespace key="0" case="first-letter" />
    <namespace key="1" case="first-letter">Talk</namespace>
    <namespace key="14" case="first-letter">Category</namespace>
  </namespaces></siteinfo>
  <page>
    <title>Talk:Gamma</title><ns>1</ns><id>7</id>
    <revision><id>17</id><text xml:space="preserve">Should this article mention delta? \
~~~~</text></revision>
  </page>
  <page>
    <title>Gamma</title><ns>0</ns><id>6</id>
    <revision><id>16</id><text xml:space="preserve">Gamma is the third letter.</text></revision>
  </page>
  <page>
    <title>Category:Letters</title><ns>14</ns><id>8</id>
    <revision><id>18</id><text xml:space="preserve">Letters of the Greek alphabet are listed \
here.</text></revision>
  </page>
</mediawiki>
"""


def test_wiki_reader_keeps_only_articles_of_namespace_0(tmp_path):
    """MediaWiki puts articles in namespace 0; Talk (1) and Category (14) pages are not article
    text, whatever order they come in."""
    from bertgpu.data.wikitext import read_wiki

    path = tmp_path / "namespaces.xml"
    path.write_text(NAMESPACES_XML, encoding="utf-8")
    with open(path, "rb") as f:
        assert list(read_wiki(path, f)) == ["Gamma is the third letter."]
    assert list(iter_documents([path])) == [["Gamma is the third letter."]]


def test_a_link_with_several_pipes_keeps_its_last_segment():
    """`[[a|b|c]]` -> "c": the label after the last pipe, WikiExtractor's rule
    ("[[title |...|label]] -> label", the extractor behind BERT's Wikipedia text), so no "|" of
    link syntax reaches the text. (MediaWiki itself shows "b|c" for a plain article link: its
    parser takes everything after the first pipe as the label. For File links the caption is the
    last segment, and those are dropped whole here.)"""
    assert strip_wiki_markup("[[a|b|c]]") == "c"
    assert strip_wiki_markup("See [[Alpha (letter)|first|the first letter]] here.") == (
        "See the first letter here.")
    assert strip_wiki_markup("[[a|b]] and [[d]]") == "b and d"


def test_an_unclosed_template_or_table_keeps_the_rest_of_the_article():
    """An unclosed ``{{`` or ``{|`` (broken markup occurs in real dumps; MediaWiki shows it as
    text) dropped everything after it: the article below was read as its first sentence."""
    for opener in ("{{Infobox city|name=Foo", "{| class=wikitable"):
        text = strip_wiki_markup(f"Foo is a city in the north. {opener}\nFoo has a long history "
                                 "of music.\n\nThe river {{convert|3|km}} runs through the city.")
        assert "Foo has a long history of music." in text, text
        assert "The river  runs through the city." in text or \
            "The river runs through the city." in text, text
        assert "convert" not in text  # a closed template after it is still removed



def test_template_parameters_in_triple_braces_leave_no_stray_brace():
    """``{{{1}}}`` (a template parameter, left in articles by substituted templates) and a
    template holding one were closed a pair of braces at a time: "Before } after."."""
    for markup in ("{{{1}}}", "{{{name|default}}}", "{{tmpl|{{{arg|x}}}}}", "{{{{a}}}}",
                   "{{a|{{b}}}}"):
        text = strip_wiki_markup(f"Before {markup} after. {{{{c}}}}The end.")
        assert "}" not in text and "{" not in text, (markup, text)
        assert " ".join(text.split()) == "Before after. The end.", (markup, text)
    assert "x }} y" in strip_wiki_markup("x }} y")  # a closer with no opener is text

def test_a_pattern_reads_the_folders_it_matches_as_folders_given_by_name(tmp_path):
    """`--corpus 'mix/*'` left out mix/sub/ without a word, while the shell's expansion of the
    same pattern (mix/a.txt mix/sub) read it: the quoting changed the corpus."""
    for rel in ("mix/a.txt", "mix/sub/b.txt", "mix/sub/deep/c.txt", "mix/sub/.hidden.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\n")
    by_pattern = resolve_inputs([str(tmp_path / "mix" / "*")])
    by_shell = resolve_inputs([tmp_path / "mix" / "a.txt", tmp_path / "mix" / "sub"])
    assert by_pattern == by_shell
    assert [p.relative_to(tmp_path).as_posix() for p in by_pattern] == [
        "mix/a.txt", "mix/sub/b.txt", "mix/sub/deep/c.txt"]
    (tmp_path / "only" / "en").mkdir(parents=True)
    (tmp_path / "only" / "en" / "t.txt").write_text("x\n")
    assert resolve_inputs([str(tmp_path / "only" / "*")]) == [tmp_path / "only/en/t.txt"]


def test_chinese_wikipedia_variant_markup_shows_one_variant():
    # -{...}- went into the shards as markup, with both spellings
    text = ("'''电子计算机'''，简称-{zh-hans:计算机;zh-hant:電腦}-，是一种设备。"
            "它可以执行-{zh-cn:程序; zh-tw:程式}-。")
    assert wiki_to_sentences(text) == ["电子计算机，简称计算机，是一种设备。", "它可以执行程序。"]
    assert strip_wiki_markup("-{C++}- 时间-{10:30}-") == "C++ 时间10:30"  # no variants: the text
    assert strip_wiki_markup("-{H|zh-cn:软件;zh-tw:軟體}-x-{T|zh-cn:标题}-") == "x"  # rules only
    assert strip_wiki_markup("-{A|zh-cn:软件;zh-tw:軟體}- -{zh-hans;zh-hant|函数}-") == "软件 函数"
    assert strip_wiki_markup("a -{ 计算机=>zh-cn:电脑; 计算机=>zh-tw:電腦 }- b") == "a 电脑 b"


def test_variant_markup_leaves_templates_after_a_hyphen_alone():
    # "-{{" is a hyphen before a template, not variant markup: it lost a brace on each side and
    # its markup went into the text; an unclosed "-{" scanned the whole article for each one
    assert wiki_to_sentences("The house has a 2-{{frac|1|2}}-story tower. It was built.") == [
        "The house has a 2--story tower.", "It was built."]
    assert wiki_to_sentences("The {{convert|5|km}}-long road is new.") == ["The -long road is new."]
    assert strip_wiki_markup("outer -{zh-hans:a -{x}- b;zh-hant:c}- end") == "outer a x b end"
    assert strip_wiki_markup("a -{ unclosed. And -{x}- more.") == "a -{ unclosed. And x more."
    # a block across lines (wrapping a list), and one whose variant breaks a line
    assert strip_wiki_markup("名单：\n-{\n* 臺灣大學\n* 國立清華大學\n}-\n正文。") == (
        "名单：\n\n臺灣大學\n國立清華大學\n\n正文。")
    assert strip_wiki_markup("他生于-{zh-hans:\n北京;zh-hant:北平}-。") == "他生于北京。"
