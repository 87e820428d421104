"""A store or the network failing midway is no bad input: prepare stops with one line, keeps the
finished units and the same command goes on from them to the bytes of an uninterrupted run.
Before, the failed upload of manifest.json emptied the output of every finished unit (exit 2,
"expected an output URL this machine can write to"); a failed shard upload on the local engine
ended with the store's traceback (exit 1) and the output deleted; a connection reset while
reading a corpus file deleted everything too, on both engines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _corpora import documents

from bertgpu.cli import main as cli_main
from bertgpu.data.output import MANIFEST, WorkFolder
from bertgpu.errors import BertgpuError

fsspec = pytest.importorskip("fsspec")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402
from test_prepare_remote import (  # noqa: E402 (local files by ranges)
    _RangeFile,
    _RangeStore,
    tok,  # noqa: E402, F401 (a fixture)
)


class _FlakyFile(_RangeFile):
    """A reset connection for the file `_FlakyStore.fails`."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        if _FlakyStore.fails and self.path.endswith(_FlakyStore.fails):
            raise ConnectionResetError(104, "Connection reset by peer")
        return super()._fetch_range(start, end)


class _FlakyStore(_RangeStore):
    """Local files behind `flaky://`, as a store serves them."""

    protocol = "flaky"
    fails: str | None = None

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        path = self._strip_protocol(path)
        return _FlakyFile(self, path, mode, block_size=block_size or 4096,
                          size=os.path.getsize(path))


fsspec.register_implementation("flaky", _FlakyStore, clobber=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    docs = documents()
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:50]))
    (folder / "b.txt").write_text("".join(d + "\n\n" for d in docs[50:]))
    return folder


@pytest.fixture
def bucket():
    memory = fsspec.filesystem("memory")
    yield "/store-failures"
    if memory.exists("/store-failures"):
        memory.rm("/store-failures", recursive=True)


def _prepare(tok: Path, out: str, corpus: str | Path, *extra: str) -> int:  # noqa: F811
    return cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out", out,
                     "--seq-len", "64", "--unit-bytes", "20000", "--workers", "1", *extra])


def _tree(root: str) -> dict[str, bytes]:
    memory = fsspec.filesystem("memory")
    return {p[len(root):]: memory.cat_file(p) for p in memory.find(root)}


def _records(root: str) -> list[str]:
    return [name for name in _tree(root) if name.startswith("/units/")]


def _stopped_and_resumed(tok, corpus: str, bucket: str, capsys, monkeypatch, said: str) -> None:  # noqa: F811
    """The run under the fault stops with one line and keeps units; the re-run seals the set
    from them with the bytes of a run that never failed."""
    code = _prepare(tok, f"memory://{bucket}/data", corpus)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert said in err, err
    assert "kept" in err and "the same command" in err, err
    kept = len(_records(f"{bucket}/data"))
    assert kept > 0
    monkeypatch.undo()
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0, capsys.readouterr().err
    assert f"{kept} of them finished by an earlier run and kept" in capsys.readouterr().out
    assert _prepare(tok, f"memory://{bucket}/fresh", corpus) == 0
    assert _tree(f"{bucket}/data") == _tree(f"{bucket}/fresh")


def test_a_failed_manifest_upload_keeps_every_unit(tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    write = WorkFolder._write_text

    def failing(self, name, text):
        if name == MANIFEST:
            raise ConnectionResetError(104, "Connection reset by peer")
        write(self, name, text)

    monkeypatch.setattr(WorkFolder, "_write_text", failing)
    _stopped_and_resumed(tok, str(corpus), bucket, capsys, monkeypatch,
                         f"memory://{bucket}/data: cannot write (ConnectionResetError: [Errno "
                         "104] Connection reset by peer)")


def test_a_failed_shard_upload_keeps_the_finished_units(tok, corpus, bucket, capsys,  # noqa: F811
                                                        monkeypatch):
    put = MemoryFileSystem.put_file
    uploads = []

    def failing(self, lpath, rpath, *args, **kwargs):
        uploads.append(rpath)
        if len(uploads) == 9:  # a few units in
            raise ConnectionResetError(104, "Connection reset by peer")
        return put(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "put_file", failing)
    _stopped_and_resumed(tok, str(corpus), bucket, capsys, monkeypatch,
                         f"memory://{bucket}/data: cannot write (ConnectionResetError")


def test_a_reset_connection_while_reading_the_corpus_keeps_the_finished_units(
        tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    from bertgpu.data import prepare

    def armed(*args, **kwargs):  # the units planned (b.txt's first bytes read): now it fails
        monkeypatch.setattr(_FlakyStore, "fails", "b.txt")
        return open_engine(*args, **kwargs)

    open_engine = prepare.open_engine
    monkeypatch.setattr(prepare, "open_engine", armed)
    _stopped_and_resumed(tok, f"flaky://{corpus}", bucket, capsys, monkeypatch,
                         "b.txt: cannot read ([Errno 104] Connection reset by peer)")


def test_a_unit_that_cannot_read_for_the_network_fails_as_no_bad_input(tok, corpus, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """What a Ray task raises: not a BertgpuError, which the Ray engine takes for bad input
    (and the run discards its units), but a failed task's error (the units kept)."""
    from bertgpu.data.output import StoreFailed
    from bertgpu.data.prepare import prepare
    from bertgpu.data.unit_job import run_unit

    seen = {}

    class Planned(Exception):
        pass

    def capture(runner, units, finished, validation_docs):
        seen.update(job=runner.job, units=units)
        raise Planned  # the job and the units, for run_unit alone

    monkeypatch.setattr("bertgpu.data.prepare.run_all", capture)
    with pytest.raises(Planned):
        prepare([f"flaky://{corpus}"], tok, tmp_path / "data", seq_len=64, unit_bytes=20000,
                workers=1)
    last = seen["units"][-1]
    monkeypatch.setattr(_FlakyStore, "fails", "b.txt")
    with pytest.raises(StoreFailed, match=r"b.txt: cannot read \(\[Errno 104\]") as info:
        run_unit(seen["job"], last, None)
    assert not isinstance(info.value, BertgpuError)
