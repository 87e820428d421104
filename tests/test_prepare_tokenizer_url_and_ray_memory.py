"""`prepare --tokenizer URL` and a memory:// corpus with --engine ray, refused up front in one
line naming the option. A tokenizer URL read as the local path Path() made of it ("memory:/tok:
no such tokenizer folder", though the folder was there); a memory:// corpus started a Ray
cluster whose workers (other processes, each with its own empty memory:// store) failed with
"memory://c/corpus.txt: no such file". A file:// tokenizer is the local folder it names."""

from __future__ import annotations

import fsspec
import pytest
from _text_fixtures import pydoc_documents, train_small_tokenizer, write_sentences

from bertgpu.cli import main as cli_main


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=300)


@pytest.fixture
def corpus(tmp_path):
    write_sentences(tmp_path / "corpus.txt", pydoc_documents(20))
    return tmp_path / "corpus.txt"


@pytest.fixture
def memory():
    fs = fsspec.filesystem("memory")
    yield fs
    for root in ("/tok", "/c"):
        if fs.exists(root):
            fs.rm(root, recursive=True)


def _prepare(corpus, tok, out, *extra):
    return cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(out), "--seq-len", "32", "--workers", "1", *extra])


@pytest.mark.parametrize("url", ["memory://tok", "s3://bucket/tok"])
def test_a_tokenizer_url_is_refused_naming_the_option(tok, corpus, memory, tmp_path, capsys,
                                                      url):
    for path in tok.iterdir():
        memory.pipe(f"/tok/{path.name}", path.read_bytes())
    assert _prepare(corpus, url, tmp_path / "data") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert (f"error: --tokenizer {url}: a tokenizer folder must be a local folder; expected a "
            "local path") in err, err
    assert not (tmp_path / "data").exists() and not (tmp_path / "data.tmp").exists()


def test_a_file_url_tokenizer_is_the_local_folder(tok, corpus, tmp_path):
    assert _prepare(corpus, f"file://{tok}", tmp_path / "data") == 0
    assert (tmp_path / "data" / "manifest.json").is_file()


def test_a_memory_corpus_with_the_ray_engine_is_refused_before_any_work(tok, corpus, memory,
                                                                       tmp_path, capsys):
    memory.pipe("/c/corpus.txt", corpus.read_bytes())
    assert _prepare("memory://c/corpus.txt", tok, tmp_path / "data", "--engine", "ray") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert ("error: --corpus memory://c/corpus.txt with --engine ray: Ray's workers are other "
            "processes and cannot read this process's memory:// store; expected") in err, err
    assert not (tmp_path / "data").exists() and not (tmp_path / "data.tmp").exists()
