"""Corpus folders and files a probe found mishandled: real data files named like a repository's
notice or licence (notice_of_appeal_0001.txt) were left out of a folder without a word, and
zstd files made by pzstd (a skippable frame first) were refused as "not a zstd stream"."""

from __future__ import annotations

import warnings

import pytest

from bertgpu.cli import main as cli_main
from bertgpu.data.corpus import iter_documents, resolve_inputs
from bertgpu.data.tokenizer import train_tokenizer
from bertgpu.errors import BertgpuError


def _legal(root):
    """A corpus folder of legal texts beside the repository's own README and LICENSE."""
    (root / "legal").mkdir(parents=True)
    for i, name in enumerate(["notice_of_appeal_0001.txt", "license_agreement_0007.txt",
                              "ruling_0002.txt"]):
        (root / "legal" / name).write_text(f"The court heard case {i}.\nIt ruled on it.\n\n")
    (root / "README.md").write_text("# Legal corpus\n")
    (root / "LICENSE-MIT").write_text("MIT\n")
    return root


def test_data_files_named_like_notice_or_license_are_corpus(tmp_path):
    corpus = _legal(tmp_path / "corpus")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = resolve_inputs([corpus])
    assert [p.name for p in found] == ["license_agreement_0007.txt", "notice_of_appeal_0001.txt",
                                       "ruling_0002.txt"]
    (message,) = [str(w.message) for w in caught]
    assert message.startswith("left out 2 files of the corpus folders as a repository's README")
    assert f"{corpus / 'LICENSE-MIT'}, {corpus / 'README.md'};" in message


def test_files_left_out_are_named_by_both_commands(tmp_path, capsys):
    corpus = _legal(tmp_path / "corpus")
    for i in range(5):  # one more than the line names
        (corpus / "legal" / f"CITATION_{'abcde'[i]}.cff").write_text("cff-version: 1.2.0\n")
    code = cli_main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "60", "--out",
                     str(tmp_path / "tok")])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [line for line in err.splitlines() if "left out" in line]
    assert lines == [f"bertgpu tokenizer: warning: left out 7 files of the corpus folders as a "
                     f"repository's README, LICENSE, ... by name: {corpus / 'LICENSE-MIT'}, "
                     f"{corpus / 'README.md'}, {corpus / 'legal' / 'CITATION_a.cff'} and 4 more; "
                     "name a file on the command line (or by a pattern) to read it"]
    code = cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "tok"),
                     "--out", str(tmp_path / "data"), "--workers", "1",
                     "--validation-fraction", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "bertgpu prepare: warning: left out 7 files of the corpus folders" in captured.err
    assert "prepare: 3 documents" in captured.out


def test_a_folder_of_data_alone_is_no_warning(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("One sentence.\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_inputs([tmp_path / "d"]) == [tmp_path / "d" / "a.txt"]


def _pzstd(text: bytes) -> bytes:
    """What pzstd writes: each zstd frame after a skippable frame (magic 0x184D2A50, 4 bytes
    of content: the size of the frame that follows)."""
    zstandard = pytest.importorskip("zstandard")
    out = b""
    for part in (text[: len(text) // 2], text[len(text) // 2 :]):
        frame = zstandard.ZstdCompressor().compress(part)
        out += ((0x184D2A50).to_bytes(4, "little") + (4).to_bytes(4, "little")
                + len(frame).to_bytes(4, "little") + frame)
    return out


@pytest.mark.parametrize("name", ["docs.txt.zst", "docs.txt"])
def test_a_zstd_file_that_starts_with_a_skippable_frame_is_read(tmp_path, name):
    docs = [[f"Sentence {i} of document {d}." for i in range(3)] for d in range(50)]
    text = "".join("\n".join(doc) + "\n\n" for doc in docs).encode()
    path = tmp_path / name
    path.write_bytes(_pzstd(text))
    assert path.read_bytes()[:4] == b"P*M\x18"
    assert list(iter_documents([path])) == docs
    # and a stream cut inside its second frame is still an error naming the file
    cut = tmp_path / f"cut_{name}"
    cut.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(BertgpuError, match=r"cut_docs\.txt.*truncated zstd stream"):
        list(iter_documents([cut]))


def test_tokenizer_reads_a_pzstd_file(tmp_path):
    path = tmp_path / "corpus.jsonl.zst"
    path.write_bytes(_pzstd(b"".join(b'{"text": "The river flows past the mill %d."}\n' % i
                                     for i in range(200))))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message="--vocab-size")
        assert train_tokenizer([path], tmp_path / "tok", vocab_size=100).is_dir()
