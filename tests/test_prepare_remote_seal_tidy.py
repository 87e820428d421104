"""A URL output stopped just after manifest.json was uploaded, before its bookkeeping went: the
next run of the same command removes prepare-plan.json and units/ and says there is nothing to
do. They stayed beside the sealed set for good: every re-run said "already holds this shard
set" and left them (readers go by the manifest, but the folder was never tidy)."""

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


def test_a_set_stopped_after_its_manifest_is_tidied_by_the_same_command(
        tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    assert _prepare(tok, f"memory://{bucket}/fresh", corpus) == 0
    remove = MemoryFileSystem.rm_file

    def stopping(self, path, *args, **kwargs):
        if path.endswith(PLAN):
            raise KeyboardInterrupt
        return remove(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "rm_file", stopping)
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 130
    monkeypatch.undo()
    assert f"/{PLAN}" in _tree(f"{bucket}/data")
    capsys.readouterr()
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0
    assert "already holds this shard set" in capsys.readouterr().out
    assert _tree(f"{bucket}/data") == _tree(f"{bucket}/fresh")  # no plan, no units/ left
