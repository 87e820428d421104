"""prepare with URLs as an object store serves them: files whose readline takes no size (s3fs,
gcsfs and https files are fsspec's AbstractBufferedFile), an output URL that already holds the
user's files or the corpus, an output that cannot be written, and a run resumed from kept units
that reports the rate of its own work."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from _corpora import documents, tree_bytes, write_parquet
from _text_fixtures import train_small_tokenizer

from bertgpu.cli import main as cli_main

fsspec = pytest.importorskip("fsspec")

from fsspec.implementations.local import LocalFileSystem  # noqa: E402
from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem  # noqa: E402


class _RangeFile(AbstractBufferedFile):
    """A local file read by byte ranges, as S3File and HTTPFile read theirs."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(start)
            return f.read(end - start)


class _RangeStore(AbstractFileSystem):
    """Local files behind the `ranged://` protocol, opened as `_RangeFile`s."""

    protocol = "ranged"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.local = LocalFileSystem()

    def ls(self, path, detail=True, **kwargs):
        return self.local.ls(self._strip_protocol(path), detail=detail)

    def info(self, path, **kwargs):
        return self.local.info(self._strip_protocol(path))

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        path = self._strip_protocol(path)
        return _RangeFile(self, path, mode, block_size=block_size or 4096,
                          size=os.path.getsize(path))


class _ReadOnlyMemory(MemoryFileSystem):
    """memory:// that refuses every write, as a bucket without write permission does."""

    protocol = "readonly"
    store: dict = {}
    pseudo_dirs = [""]

    def pipe_file(self, path, value, **kwargs):
        raise PermissionError(f"Access Denied: {path}")

    def makedirs(self, path, exist_ok=False):
        raise PermissionError(f"Access Denied: {path}")

    def mkdir(self, path, create_parents=True, **kwargs):
        raise PermissionError(f"Access Denied: {path}")


fsspec.register_implementation("ranged", _RangeStore, clobber=True)
fsspec.register_implementation("readonly", _ReadOnlyMemory, clobber=True)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The documents as JSON Lines, text and (with pyarrow) Parquet, in one folder."""
    folder = tmp_path_factory.mktemp("corpus")
    docs = documents()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:40]))
    (folder / "b.txt").write_text("".join(d + "\n\n" for d in docs[40:60]))
    if importlib.util.find_spec("pyarrow") is not None:
        write_parquet(folder / "c.parquet", docs[60:], row_group_size=4)
    return folder


def _prepare(tok: Path, out: str, *corpus: str, extra: tuple[str, ...] = ()) -> int:
    return cli_main(["prepare", "--corpus", *corpus, "--tokenizer", str(tok), "--out", out,
                     "--seq-len", "64", "--unit-bytes", "20000", "--workers", "1", *extra])


def test_files_of_a_store_that_reads_by_ranges_give_the_local_bytes(tok, corpus, tmp_path):
    """JSON Lines, text and Parquet from `ranged://` (fsspec's buffered files, as s3://, gs:// and
    https:// give): the shards of the same files read locally. Their readline takes no size,
    and prepare stopped with "TypeError: AbstractBufferedFile.readline() takes 1 positional
    argument but 2 were given" on every uncompressed line-based file at such a URL."""
    assert _prepare(tok, str(tmp_path / "local"), str(corpus)) == 0
    assert _prepare(tok, str(tmp_path / "ranged"), f"ranged://{corpus}") == 0
    local, ranged = tree_bytes(tmp_path / "local"), tree_bytes(tmp_path / "ranged")
    assert {k: v for k, v in ranged.items() if k.endswith(".npy")} == {
        k: v for k, v in local.items() if k.endswith(".npy")}
    assert cli_main(["tokenizer", "--corpus", f"ranged://{corpus}", "--vocab-size", "300",
                     "--sample-bytes", "20000", "--out", str(tmp_path / "tok")]) == 0


def _memory_tree(root: str) -> dict[str, bytes]:
    memory = fsspec.filesystem("memory")
    return {p: memory.cat_file(p) for p in memory.find(root)}


@pytest.mark.parametrize("case", ["holds the corpus", "is the corpus", "is inside the corpus",
                                  "holds a file of the user's",
                                  "holds a file of the user's, --overwrite"])
def test_an_output_url_over_other_files_is_refused_and_they_stay(tok, corpus, capsys, case):
    """A URL output is built in place (a store cannot rename folders), so prepare removed what
    was at it: `--corpus memory://b/corpus/ --out memory://b/` deleted the corpus and every
    other file under b/, and a folder holding only the user's notes was emptied with exit 0.
    Now the output may not overlap the corpus, and a non-empty folder that is no shard set is
    refused, --overwrite or not, as for a local output; everything stays."""
    memory = fsspec.filesystem("memory")
    bucket = "/bucket-" + "".join(c if c.isalnum() else "-" for c in case)
    memory.pipe_file(f"{bucket}/corpus/a.jsonl", (corpus / "a.jsonl").read_bytes())
    memory.pipe_file(f"{bucket}/notes/keep.csv", b"a,b\n1,2\n")
    out, extra, message = {
        "holds the corpus": (f"memory://{bucket}/", (), "overlaps the input"),
        "is the corpus": (f"memory://{bucket}/corpus/", (), "overlaps the input"),
        "is inside the corpus": (f"memory://{bucket}/corpus/data", (), "overlaps the input"),
        "holds a file of the user's": (f"memory://{bucket}/notes", (), "holds files that are "
                                       "not a shard set"),
        "holds a file of the user's, --overwrite": (f"memory://{bucket}/notes",
                                                    ("--overwrite",),
                                                    "holds files that are not a shard set"),
    }[case]
    before = _memory_tree(bucket)
    try:
        code = _prepare(tok, out, f"memory://{bucket}/corpus/", extra=extra)
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1, err
        assert message in err, err
        assert _memory_tree(bucket) == before
    finally:
        memory.rm(bucket, recursive=True)


def test_an_output_url_that_cannot_be_written_is_one_line(tok, corpus, capsys):
    """A store that refuses writes (or a host that does not answer) had ended prepare with the
    store's traceback, exit 1."""
    code = _prepare(tok, "readonly://bucket/data", str(corpus))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "readonly://bucket/data: cannot write (PermissionError: Access Denied" in err


def test_shard_files_that_did_not_arrive_are_not_sealed(tok, corpus, capsys, monkeypatch):
    """The driver checks every shard file the units recorded before it writes manifest.json: an
    upload that went elsewhere (here: dropped) had given a sealed set without its shards."""
    from bertgpu.data.output import WorkFolder

    monkeypatch.setattr(WorkFolder, "publish", lambda self, path: path.unlink())
    code = _prepare(tok, "memory://dropped/data", str(corpus))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "shard files the work units wrote are not there (first: train-00000-00000." in err
    assert not fsspec.filesystem("memory").exists("/dropped/data")  # nothing sealed or left


def test_a_resumed_run_reports_the_rate_of_its_own_units(tok, corpus, tmp_path, capsys,
                                                          monkeypatch):
    """The summary's tokens/s counted the units an earlier run had finished as if this run had
    tokenized them (1.99 M tokens/s printed where 0.5-0.6 M was real). An interruption says that
    the finished units are kept and that the same command goes on from them."""
    from bertgpu.data import engines

    real_run_all = engines.run_all

    def stop_after_two(runner, units, finished, validation_docs):
        seen = []

        class Stopping:
            def __getattr__(self, name):
                return getattr(runner, name)

            def run(self, work, done):
                def counted(record):
                    done(record)
                    seen.append(record["unit"])
                    if len(seen) == 2:
                        raise KeyboardInterrupt
                runner.run(work, counted)

        return real_run_all(Stopping(), units, finished, validation_docs)

    out = tmp_path / "data"
    monkeypatch.setattr("bertgpu.data.prepare.run_all", stop_after_two)
    assert _prepare(tok, str(out), str(corpus)) == 130
    err = capsys.readouterr().err
    assert f"the work units finished so far are kept in {out}.tmp; the same command goes on" in err
    monkeypatch.undo()
    assert _prepare(tok, str(out), str(corpus)) == 0
    lines = capsys.readouterr().out
    summary = next(line for line in lines.splitlines() if " tokens/s" in line)
    assert "0.00 M tokens/s" not in summary  # a small corpus's rate in k
    manifest = json.loads((out / "manifest.json").read_text())  # sealed
    assert "2 of them finished by an earlier run and kept" in lines
    total = manifest["counts"]["tokens"]
    new = int(summary.split("(the ")[1].split(" tokens of the units this run tokenized)")[0])
    assert 0 < new < total
    assert tree_bytes(out)  # (a whole set)


def test_a_file_named_as_a_path_and_as_a_file_url_is_read_once(corpus):
    """`--corpus a.jsonl file:///.../a.jsonl` read the file twice (its documents doubled)."""
    from bertgpu.data.sources import resolve_inputs

    f = corpus / "a.jsonl"
    assert len(resolve_inputs([str(f), f"file://{f}"])) == 1
    files = len(list(corpus.iterdir()))
    assert len(resolve_inputs([f"file://{f}", str(corpus)])) == files  # a.jsonl once
