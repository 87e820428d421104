"""A URL output whose first write failed: the same command goes on. On a store with real folders
(memory://) units/ was made before the plan was uploaded, so a failed upload left an empty
units/ that every later run refused as "holds files that are not a shard set"."""

from __future__ import annotations

import pytest
from test_prepare_store_failures_keep_units import (  # noqa: F401 (fixtures: tok, corpus, bucket)
    _prepare,
    _tree,
    bucket,
    corpus,
    tok,
)

from bertgpu.data.output import PLAN

fsspec = pytest.importorskip("fsspec")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402


def test_a_failed_first_write_leaves_an_output_the_same_command_writes(
        tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    pipe = MemoryFileSystem.pipe_file

    def failing(self, path, *args, **kwargs):
        if path.endswith(PLAN):
            raise ConnectionResetError(104, "Connection reset by peer")
        return pipe(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", failing)
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Connection reset by peer" in err, err
    monkeypatch.undo()
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0, capsys.readouterr().err
    assert _prepare(tok, f"memory://{bucket}/fresh", corpus) == 0
    assert _tree(f"{bucket}/data") == _tree(f"{bucket}/fresh")


def test_an_empty_units_folder_alone_is_written_over(tok, corpus, bucket, capsys):  # noqa: F811
    """What a failed first write left before (units/ made before the plan's upload)."""
    fsspec.filesystem("memory").makedirs(f"{bucket}/data/units", exist_ok=True)
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0, capsys.readouterr().err
    assert _prepare(tok, f"memory://{bucket}/fresh", corpus) == 0
    assert _tree(f"{bucket}/data") == _tree(f"{bucket}/fresh")
