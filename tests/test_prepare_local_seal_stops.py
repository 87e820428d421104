"""A local output stopped while it is sealed: the same command keeps the finished units and
ends with the bytes of a run never stopped. The records (units/) were removed and the plan
renamed before manifest.json was written and DATADIR.tmp renamed to DATADIR, so a Ctrl-C or a
kill in between left a folder recognised as prepare's own with nothing kept: every unit was
prepared again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_prepare_store_failures_keep_units import (  # noqa: F401 (fixtures: tok, corpus)
    _prepare,
    corpus,
    tok,
)

from bertgpu.data import output
from bertgpu.data.output import MANIFEST, UNITS, WorkFolder


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def _stop_at_the_manifest(monkeypatch) -> None:
    write = WorkFolder._write_text

    def stopping(self, name, text):
        if name == MANIFEST:
            raise KeyboardInterrupt
        write(self, name, text)

    monkeypatch.setattr(WorkFolder, "_write_text", stopping)


def _stop_at_the_rename(monkeypatch) -> None:
    """Stopped with manifest.json written in DATADIR.tmp, before it becomes DATADIR."""
    def stopping(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "replace_dir", stopping)


@pytest.mark.parametrize("stop", [_stop_at_the_manifest, _stop_at_the_rename])
def test_a_local_seal_stopped_keeps_every_unit(tok, corpus, tmp_path, capsys,  # noqa: F811
                                               monkeypatch, stop):
    assert _prepare(tok, str(tmp_path / "fresh"), corpus) == 0
    stop(monkeypatch)
    assert _prepare(tok, str(tmp_path / "data"), corpus) == 130
    assert "the same command goes on from them" in capsys.readouterr().err
    monkeypatch.undo()
    assert _prepare(tok, str(tmp_path / "data"), corpus) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert re.search(r" (\d+) work units on the local engine, \1 of them finished by an earlier "
                     "run and kept", out), out  # none redone
    assert _tree(tmp_path / "data") == _tree(tmp_path / "fresh")
    assert not (tmp_path / "data.tmp").exists()


def test_a_local_set_stopped_before_its_bookkeeping_went_is_done_and_tidied(
        tok, corpus, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Renamed into place, stopped at once (before prepare-plan.json and units/ went, since
    they go after the rename): a sealed set the same command finds done, and tidies."""
    assert _prepare(tok, str(tmp_path / "fresh"), corpus) == 0
    rename = output.replace_dir

    def stopping(*args, **kwargs):
        rename(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "replace_dir", stopping)
    assert _prepare(tok, str(tmp_path / "data"), corpus) == 130
    assert (tmp_path / "data" / MANIFEST).is_file()
    monkeypatch.undo()
    capsys.readouterr()
    assert _prepare(tok, str(tmp_path / "data"), corpus) == 0
    assert "already holds this shard set" in capsys.readouterr().out
    assert not (tmp_path / "data" / UNITS).exists()
    assert _tree(tmp_path / "data") == _tree(tmp_path / "fresh")
