"""A project folder moved whole (`mv`, `cp -a`: the corpus keeps its size and modification
time) re-runs `tokenizer` and `prepare` as the same: a review found both refused as "from
another corpus: /old/corpus.txt, where this one has /new/corpus.txt" once records named files by
their resolved paths. A file changed after the move is still refused."""

from __future__ import annotations

import os
import shutil

from _text_fixtures import pydoc_documents, write_sentences
from test_rerun_same_corpus_other_spelling import _prepare, _tokenizer


def _project(folder):
    (folder / "corpus").mkdir(parents=True)
    write_sentences(folder / "corpus" / "a.txt", pydoc_documents(20))
    write_sentences(folder / "corpus" / "b.txt", pydoc_documents(10))


def test_a_moved_project_re_runs_as_the_same(tmp_path, monkeypatch, capsys):
    _project(tmp_path / "one")
    monkeypatch.chdir(tmp_path / "one")
    assert _tokenizer("corpus", "tok") == 0 and _prepare("corpus", "tok", "data") == 0
    manifest = (tmp_path / "one" / "data" / "manifest.json").read_bytes()
    shutil.move(tmp_path / "one", tmp_path / "two")
    monkeypatch.chdir(tmp_path / "two")
    capsys.readouterr()
    assert _tokenizer("corpus", "tok") == 0 and _prepare("corpus", "tok", "data") == 0
    out = capsys.readouterr()
    assert "another corpus" not in out.err and out.out.count("nothing to do") == 2, out
    assert (tmp_path / "two" / "data" / "manifest.json").read_bytes() == manifest


def test_a_moved_project_whose_corpus_changed_is_refused(tmp_path, monkeypatch, capsys):
    _project(tmp_path / "one")
    monkeypatch.chdir(tmp_path / "one")
    assert _tokenizer("corpus", "tok") == 0 and _prepare("corpus", "tok", "data") == 0
    shutil.move(tmp_path / "one", tmp_path / "two")
    monkeypatch.chdir(tmp_path / "two")
    changed = tmp_path / "two" / "corpus" / "b.txt"
    os.utime(changed, ns=(1, changed.stat().st_mtime_ns + 10**9))
    capsys.readouterr()
    assert _prepare("corpus", "tok", "data") == 2
    assert "changed since" in capsys.readouterr().err
    assert _tokenizer("corpus", "tok") == 2
    assert "changed since" in capsys.readouterr().err
