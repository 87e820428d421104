"""A URL output stopped while it is sealed: the same command seals it from the finished units,
and --overwrite replaces it. The bookkeeping (prepare-plan.json, units/) was removed before
manifest.json was uploaded, so a Ctrl-C or a kill in between left the shards, tokenizer/ and
prepared-from.json without either: every re-run, --overwrite or not, was refused with "holds
files that are not a shard set", although the message of the stop said the same command goes
on from the finished units."""

from __future__ import annotations

import re

import pytest
from test_prepare_store_failures_keep_units import (  # noqa: F401 (fixtures: tok, corpus, bucket)
    _prepare,
    _tree,
    bucket,
    corpus,
    tok,
)

from bertgpu.data.output import MANIFEST, PLAN, WorkFolder

fsspec = pytest.importorskip("fsspec")


def _stop_at_the_manifest(monkeypatch) -> None:
    """Ctrl-C as manifest.json is about to be uploaded: everything else of the seal done."""
    write = WorkFolder._write_text

    def stopping(self, name, text):
        if name == MANIFEST:
            raise KeyboardInterrupt
        write(self, name, text)

    monkeypatch.setattr(WorkFolder, "_write_text", stopping)


def test_a_seal_stopped_before_the_manifest_is_finished_by_the_same_command(
        tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    assert _prepare(tok, f"memory://{bucket}/fresh", corpus) == 0
    fresh = _tree(f"{bucket}/fresh")
    _stop_at_the_manifest(monkeypatch)
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 130
    assert "the same command goes on from them" in capsys.readouterr().err
    monkeypatch.undo()
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert re.search(r" (\d+) work units on the local engine, \1 of them finished by an earlier "
                     "run and kept", out), out  # none redone
    assert _tree(f"{bucket}/data") == fresh  # the same bytes, no bookkeeping left


def test_a_seal_stopped_before_the_manifest_is_sealed_with_overwrite(
        tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    """(--overwrite replaces a sealed set; the finished units of the same plan are kept, as
    for a run stopped earlier)"""
    _stop_at_the_manifest(monkeypatch)
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 130
    monkeypatch.undo()
    assert _prepare(tok, f"memory://{bucket}/data", corpus, "--overwrite") == 0, (
        capsys.readouterr().err)
    assert "/manifest.json" in _tree(f"{bucket}/data")


def test_a_seal_stopped_by_an_earlier_version_is_prepared_again(
        tok, corpus, bucket, capsys):  # noqa: F811
    """What an earlier bertgpu left when stopped while sealing (prepared-from.json, no plan,
    no manifest) is its own output: the same command prepares it again."""
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0
    memory = fsspec.filesystem("memory")
    memory.rm_file(f"{bucket}/data/{MANIFEST}")
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0, capsys.readouterr().err
    assert f"/{MANIFEST}" in _tree(f"{bucket}/data")


def test_a_set_stopped_after_its_manifest_is_done_and_its_overwrite_prepares_again(
        tok, corpus, bucket, capsys, monkeypatch):  # noqa: F811
    """Stopped after manifest.json, before the bookkeeping went: a sealed set (the same
    command does nothing), and --overwrite prepares it again rather than resuming."""
    memory = fsspec.filesystem("memory")
    remove = type(memory).rm_file

    def stopping(self, path, *args, **kwargs):
        if path.endswith(PLAN):
            raise KeyboardInterrupt
        return remove(self, path, *args, **kwargs)

    monkeypatch.setattr(type(memory), "rm_file", stopping)
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 130
    monkeypatch.undo()
    assert _prepare(tok, f"memory://{bucket}/data", corpus) == 0
    assert "already holds this shard set" in capsys.readouterr().out
    assert _prepare(tok, f"memory://{bucket}/data", corpus, "--overwrite") == 0
    assert "finished by an earlier run" not in capsys.readouterr().out
    tree = _tree(f"{bucket}/data")
    assert f"/{MANIFEST}" in tree and f"/{PLAN}" not in tree
    assert not any(name.startswith("/units/") for name in tree)
