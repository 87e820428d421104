"""Corpus inputs a probe of `bertgpu tokenizer` and `bertgpu prepare` found mishandled: a folder
that cannot be listed was left out without a word (and a --corpus folder at mode 000 "contains
no corpus files"), an https file's version was its size alone (a same-size edit looked
unchanged), JSON Lines that Python's json refuses without a JSONDecodeError gave a traceback, a
pipe was "a broken symbolic link" (and one in a folder hung the run), and an https server
without range requests gave fsspec's ValueError as a traceback. Each is one line naming the
path, exit 2; with --skip-bad the file or folder is skipped and listed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _text_fixtures import train_small_tokenizer

from bertgpu.cli import main as cli_main
from bertgpu.data import sources
from bertgpu.data.corpus import CorpusStats, iter_documents
from bertgpu.data.prepare import prepare
from bertgpu.data.sources import file_version, resolve_inputs
from bertgpu.errors import BertgpuError

fsspec = pytest.importorskip("fsspec")

from fsspec.spec import AbstractBufferedFile  # noqa: E402
from test_prepare_remote import _RangeStore  # noqa: E402  (local files behind a protocol)

DOCS = "".join(f"Document {i} has a sentence.\nAnd a second one here.\n\n" for i in range(50))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=300)


def _one_line_exit_2(args, capsys) -> str:
    code = cli_main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err


# --------------------------------------------------------------------------- 1: unreadable folders


def _unlistable(monkeypatch, *folders: Path) -> None:
    """os.scandir of ``folders`` fails as on a folder at mode 000 (root's DAC override would
    read one, so chmod alone proves nothing under root)."""
    real = os.scandir
    refused = {str(f) for f in folders}

    def scandir(path="."):
        if not isinstance(path, int) and os.path.abspath(os.fspath(path)) in refused:
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_a_subfolder_that_cannot_be_listed_is_an_error_or_skipped(tok, tmp_path, monkeypatch,
                                                                  capsys):
    """c/sub at mode 000: os.walk passed over it, and prepare exited 0 with half the corpus and
    a manifest listing only c/a.txt."""
    corpus = tmp_path / "c"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text(DOCS)
    (corpus / "sub" / "b.txt").write_text(DOCS)
    _unlistable(monkeypatch, corpus / "sub")
    monkeypatch.chdir(tmp_path)
    message = ("c/sub: cannot read the folder (PermissionError: [Errno 13] Permission denied: "
               "'c/sub'); expected a folder this user can list")
    for command in (["tokenizer", "--vocab-size", "100"], ["prepare", "--tokenizer", str(tok),
                                                            "--workers", "1"]):
        err = _one_line_exit_2([*command, "--corpus", "c", "--out", "out"], capsys)
        assert err.endswith(f"error: {message} (or --skip-bad)\n"), err
        assert not Path("out").exists()
    m = prepare(["c"], tok, "data", workers=1, skip_bad=True)
    assert [i["path"] for i in m["inputs"]] == ["c/a.txt"]
    assert m["skipped_inputs"] == [{"path": "c/sub", "reason": message}]


def test_a_corpus_folder_that_cannot_be_listed_says_so(tmp_path, monkeypatch):
    """--corpus c at mode 000 said "folder contains no corpus files (hidden files, README...)"."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text(DOCS)
    _unlistable(monkeypatch, corpus)
    with pytest.raises(BertgpuError, match=r"^.*/c: cannot read the folder \(PermissionError: "
                       r".*\); expected a folder this user can list \(or --skip-bad\)$"):
        resolve_inputs([corpus])
    with pytest.raises(BertgpuError, match=r"^no documents read from the corpus \(1 input skipped "
                       r"by --skip-bad; the first: .*/c: cannot read the folder"):
        resolve_inputs([corpus], [])


# --------------------------------------------------------------------------- 2: https versions


class _Info:
    """A store whose info is ``info``, as `sources.filesystem` gives it."""

    def __init__(self, info: dict) -> None:
        self.info_dict = info

    def info(self, path: str) -> dict:
        return {"name": path, "size": 5, "type": "file", **self.info_dict}


@pytest.mark.parametrize("key", ["Last-Modified", "ETag", "Content-MD5", "Digest", "blob_id"])
def test_a_same_size_edit_of_a_url_changes_its_version(monkeypatch, key):
    """fsspec's https info names the time "Last-Modified" (and may give Content-MD5 or Digest
    alone), hf:// names its hash "blob_id": only the size was the version, and a re-run took
    a changed corpus of the same size for the one it had read."""
    versions = []
    for value in ("one", "two"):
        monkeypatch.setattr(sources, "filesystem", lambda url, v=value: (_Info({key: v}), url))
        versions.append(file_version("https://host/corpus.txt"))
    assert versions == ["5:one", "5:two"]


def test_a_url_version_prefers_a_hash_to_a_time(monkeypatch):
    """The keys are tried in one order, hashes first: s3's ETag over its LastModified, as
    before (a re-run of an s3 corpus finds the version it recorded)."""
    info = {"LastModified": "t", "Last-Modified": "t2", "ETag": "e", "Digest": "d"}
    monkeypatch.setattr(sources, "filesystem", lambda url: (_Info(info), url))
    assert file_version("s3://bucket/corpus.txt") == "5:e"


# --------------------------------------------------------------------------- 3: JSON Python refuses


@pytest.mark.parametrize("line, message", [
    ('{"id": ' + "9" * 5000 + ', "text": "x y."}',
     "bad.jsonl:2: JSON that Python's json cannot decode (Exceeds the limit (4300 digits) for "
     "integer string conversion: value has 5000 digits; use sys.set_int_max_str_digits() to "
     "increase the limit); expected one JSON object per line"),
    ('{"text": "x y.", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "bad.jsonl:2: JSON nested too deep for Python's json; expected one JSON object per line, "
     "nested less than {limit} levels deep"),
], ids=["5000-digit int", "nested 100k deep"])
def test_json_python_refuses_is_a_bad_line(tok, tmp_path, monkeypatch, capsys, line, message):
    """A 5000-digit integer (ValueError) or arrays nested 100k deep (RecursionError) gave a
    traceback, --skip-bad or not: json.JSONDecodeError alone was caught."""
    import sys

    message = message.format(limit=sys.getrecursionlimit())
    monkeypatch.chdir(tmp_path)
    Path("bad.jsonl").write_text(json.dumps({"text": "Fine."}) + "\n" + line + "\n")
    Path("good.jsonl").write_text(json.dumps({"text": "A good sentence."}) + "\n")
    with pytest.raises(BertgpuError) as info:
        list(iter_documents(["bad.jsonl"]))
    assert str(info.value) == message
    stats = CorpusStats()
    assert list(iter_documents(["bad.jsonl", "good.jsonl"], skip_bad=True, stats=stats)) == [
        ["Fine."], ["A good sentence."]]
    assert stats.skipped == [("bad.jsonl", message)]
    err = _one_line_exit_2(["prepare", "--corpus", "bad.jsonl", "--tokenizer", str(tok),
                            "--out", "out", "--workers", "1"], capsys)
    assert err.endswith(f"/{message}\n")  # the path made absolute for the workers


# --------------------------------------------------------------------------- 4: pipes


def test_a_pipe_given_as_the_corpus_is_not_a_broken_link(tok, tmp_path, capsys):
    """`--corpus <(xzcat c.jsonl.xz)` is /dev/fd/63, a link to "pipe:[988431]": it was called a
    broken symbolic link."""
    read, write = os.pipe()
    try:
        path = f"/dev/fd/{read}"
        if not os.path.islink(path):
            pytest.skip("no /dev/fd links to the process's pipes here")
        message = (f"{path}: not a regular file (a pipe, socket or device); expected a corpus "
                   "file or folder (write a stream to a file first, e.g. decompress it)")
        with pytest.raises(BertgpuError) as info:
            resolve_inputs([path])
        assert str(info.value) == message
        err = _one_line_exit_2(["prepare", "--corpus", path, "--format", "jsonl", "--tokenizer",
                                str(tok), "--out", str(tmp_path / "out")], capsys)
        assert err.endswith(f"error: {message}\n")
    finally:
        os.close(read)
        os.close(write)


def test_a_pipe_in_a_corpus_folder_is_an_error_or_skipped(tmp_path):
    """A named pipe in a folder was listed as a corpus file, and reading it waited for a writer
    forever."""
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "a.txt").write_text(DOCS)
    os.mkfifo(corpus / "b.txt")
    message = (f"{corpus}/b.txt: not a regular file (a pipe, socket or device); expected a "
               "corpus file or folder (write a stream to a file first, e.g. decompress it)")
    with pytest.raises(BertgpuError) as info:
        resolve_inputs([corpus])
    assert str(info.value) == message + " (or --skip-bad)"
    skipped: list[tuple[str, str]] = []
    assert resolve_inputs([corpus], skipped) == [corpus / "a.txt"]
    assert skipped == [(str(corpus / "b.txt"), message)]


# --------------------------------------------------------------------------- 5: no range requests

NO_RANGES = ("The HTTP server doesn't appear to support range requests. Only reading this file "
             "from the beginning is supported. Open with block_size=0 for a streaming file "
             "interface.")


class _NoRangeFile(AbstractBufferedFile):
    """A local file read as fsspec's HTTPFile reads one from a server without range requests:
    a fetch from byte 0 gives the bytes asked for, a fetch past it fsspec's ValueError."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        if start > 0:
            raise ValueError(NO_RANGES if "other" not in self.path else "another ValueError")
        with open(self.path, "rb") as f:
            return f.read(end)


class _NoRangeStore(_RangeStore):
    """Local files behind the `norange://` protocol, in blocks of ``block`` bytes."""

    protocol = "norange"
    block = 4096

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        path = self._strip_protocol(path)
        return _NoRangeFile(self, path, mode, block_size=self.block,
                            size=os.path.getsize(path))


fsspec.register_implementation("norange", _NoRangeStore, clobber=True)


@pytest.fixture
def norange():
    return _NoRangeStore


RANGE_ERROR = ("cannot read (the HTTP server does not answer range requests, which reading it "
               "past its start needs; expected a server that does (or the file downloaded "
               "first))")


def test_a_server_without_range_requests_is_a_read_error(norange, tmp_path):
    """A file longer than its first read: prepare and tokenizer stopped with fsspec's ValueError."""
    (tmp_path / "big.txt").write_text(DOCS * 500)  # over the 1 MiB that open_raw buffers
    (tmp_path / "good.txt").write_text("A good sentence.\n")
    url = f"norange://{tmp_path}/big.txt"
    with pytest.raises(BertgpuError) as info:
        list(iter_documents([url]))
    assert str(info.value) == f"{url}: {RANGE_ERROR}"
    stats = CorpusStats()
    list(iter_documents([url, f"norange://{tmp_path}/good.txt"], skip_bad=True, stats=stats))
    assert stats.skipped == [(url, f"{url}: {RANGE_ERROR}")]


def test_another_value_error_of_a_remote_file_is_not_a_read_error(norange, tmp_path):
    """Only fsspec's range-request error is taken for a read error: any other ValueError is a
    bug, and stays one."""
    (tmp_path / "other.txt").write_text(DOCS * 500)
    with pytest.raises(ValueError, match="another ValueError"):
        list(iter_documents([f"norange://{tmp_path}/other.txt"]))


def test_parquet_from_a_server_without_range_requests_is_one_line(norange, tmp_path):
    """Parquet is read from its footer, at its end."""
    from _corpora import documents, write_parquet

    pytest.importorskip("pyarrow")
    write_parquet(tmp_path / "c.parquet", documents(), row_group_size=8)
    url = f"norange://{tmp_path}/c.parquet"
    with pytest.raises(BertgpuError) as info:
        list(iter_documents([url]))
    assert str(info.value).startswith(f"{url}: ")
    assert "the HTTP server does not answer range requests" in str(info.value)


def test_the_sha256_of_a_part_from_a_server_without_range_requests_is_one_line(
        tok, norange, tmp_path, monkeypatch):
    """A file within the first block is read whole from byte 0 for its text, but the sha256 of
    a part of it (--unit-bytes) is read from the part's start: fsspec's ValueError came from
    unit_job's hash as a traceback."""
    monkeypatch.setattr(norange, "block", 1 << 20)
    (tmp_path / "c.txt").write_text(DOCS * 10)  # ~40 KB: three parts of 16 KiB
    url = f"norange://{tmp_path}/c.txt"
    with pytest.raises(BertgpuError) as info:
        prepare([url], tok, tmp_path / "out", workers=1, unit_bytes=16 << 10)
    assert str(info.value) == f"{url}: {RANGE_ERROR}"


def test_a_part_skipped_for_range_requests_is_not_read_again_for_its_sha256(tok, norange,
                                                                              tmp_path):
    """--skip-bad: the part past the first MiB cannot be read, and the file is left out; its
    sha256 was then read from that part's start, and the same error stopped the run."""
    (tmp_path / "big.txt").write_text(DOCS * 500)
    (tmp_path / "good.txt").write_text(DOCS)
    url = f"norange://{tmp_path}/big.txt"
    m = prepare([url, tmp_path / "good.txt"], tok, tmp_path / "out", workers=1,
                unit_bytes=1 << 20, skip_bad=True)
    assert m["skipped_inputs"] == [{"path": url, "reason": f"{url}: {RANGE_ERROR}"}]
    assert [i["path"] for i in m["inputs"]] == [str(tmp_path / "good.txt")]


def test_a_json_line_nested_too_deep_for_json_is_sniffed_as_json_lines():
    """Format sniffing (a .txt that holds JSON Lines, a file without an extension) parsed the
    first line with json.loads and caught only ValueError: a record nested deeper than Python's
    json follows raised RecursionError. It is judged as a line too long to parse is: by its
    start, so the JSON Lines reader then names the problem."""
    from bertgpu.data.textio import is_json_object_line

    deep = b'{"text": "x", "a": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert is_json_object_line(deep)
    assert not is_json_object_line(b"{" + b"[" * 5000 + b"]" * 5000)


def test_a_file_whose_lines_end_in_cr_alone_is_refused_not_read_as_one_line(tmp_path):
    """Classic Mac OS line ends (CR alone) made the whole file one line: one document, one
    'sentence', without a word. It is a one-line error naming the file; CRLF and a stray CR in
    a line read as before."""
    import io

    from bertgpu.data.textio import decoded_lines
    from bertgpu.errors import BertgpuError

    cr = b"The first line.\rThe second line.\r\rAnother document.\r"
    with pytest.raises(BertgpuError, match=r"c.txt: lines end in CR alone \(classic Mac OS\); "
                                           r"expected LF or CRLF line ends"):
        list(decoded_lines("c.txt", io.BytesIO(cr)))
    crlf = b"The first line.\r\nThe second line.\r\n\r\nAnother\rdocument.\r\n"
    assert [t for _, t, _ in decoded_lines("c.txt", io.BytesIO(crlf))] == [
        "The first line.", "The second line.", "", "Another\rdocument."]


def test_crs_in_a_first_line_that_ends_or_in_a_long_record_are_text(tmp_path):
    """The CR-alone check read two CRs in the first line as a CR-only file: a first line that
    ends in LF ("Chapter 1\\rThe Beginning\\rBy Someone\\n") was refused, and so was a JSONL
    record over PART_CHARS with CRs between its paragraphs (its text is read in lines too)."""
    import io
    import json

    from bertgpu.data.corpus import PART_CHARS
    from bertgpu.data.textio import decoded_lines
    from bertgpu.data.tokenizer import train_tokenizer

    first = b"Chapter 1\rThe Beginning\rBy Someone\nThe story starts here.\n"
    assert [t for _, t, _ in decoded_lines("c.txt", io.BytesIO(first))] == [
        "Chapter 1\rThe Beginning\rBy Someone", "The story starts here."]
    paragraph = "the war ended in paris and the city was free again. "
    long_text = "\r".join([paragraph * 40] * (PART_CHARS // (len(paragraph) * 40) + 2))
    assert len(long_text) > PART_CHARS
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in [paragraph] * 5 + [long_text])
                      + "\n", encoding="utf-8")
    assert (train_tokenizer([corpus], tmp_path / "tok", vocab_size=60) / "vocab.txt").is_file()


def test_an_upgrade_alone_does_not_make_a_url_corpus_look_changed(tmp_path):
    """Outputs made before https's Last-Modified (and hf://'s blob_id) were read recorded such
    files by their size alone; the same command after the upgrade said "1 file changed since"
    and refused the tokenizer and shard set (hours of prepare to redo). A size-only version
    matches a versioned one of the same size; another size is still a change."""
    import json

    from bertgpu.data.rerun import TRAINED, same_as_prepared, same_as_trained
    from bertgpu.errors import BertgpuError

    url = "https://example.org/c.txt"
    now = {"versions": {url: "18661:Tue, 01 Dec 2026 10:00:00 GMT"}, "settings": {"cased": False}}
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    (tok / TRAINED).write_text(json.dumps({**now, "versions": {url: "18661"}}), encoding="utf-8")
    assert same_as_trained(tok, now)
    (tok / TRAINED).write_text(json.dumps({**now, "versions": {url: "18000"}}), encoding="utf-8")
    with pytest.raises(BertgpuError, match="1 file changed since"):
        same_as_trained(tok, now)
    plan = {"tokenizer_hash": "h", "settings": {"objective": "mlm+nsp"}, "job": [],
            "unit_bytes": 1, "versions": now["versions"]}
    assert same_as_prepared("out", "{}", json.dumps({**plan, "versions": {url: "18661"}}), plan)
