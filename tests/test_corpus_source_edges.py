"""Corpus inputs a probe of `bertgpu tokenizer` and `bertgpu prepare` found mishandled: a folder
that cannot be listed was left out without a word (and a --corpus folder at mode 000 "contains
no corpus files"), an https file's version was its size alone (a same-size edit looked
unchanged), JSON Lines that Python's json refuses without a JSONDecodeError gave a traceback, a
pipe was "a broken symbolic link" (and one in a folder hung the run), and an https server
without range requests gave fsspec's ValueError as a traceback. Each is one line naming the
path, exit 2; with --skip-bad the file or folder is skipped and listed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _text_fixtures import train_small_tokenizer

from bertgpu.cli import main as cli_main
from bertgpu.data import sources
from bertgpu.data.corpus import CorpusStats, iter_documents
from bertgpu.data.sources import file_version
from bertgpu.errors import BertgpuError

fsspec = pytest.importorskip("fsspec")


DOCS = "".join(f"Document {i} has a sentence.\nAnd a second one here.\n\n" for i in range(50))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=300)


def _one_line_exit_2(args, capsys) -> str:
    code = cli_main(args)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, (code, err)
    return err


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

