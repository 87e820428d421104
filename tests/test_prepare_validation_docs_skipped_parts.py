"""--validation-docs N with --skip-bad, a bad line in a file read in parts: the file is left out
whole, and the validation split still holds the first N documents of the corpus that is kept.
The documents the file's first parts held were dropped with it and nothing held others in their
place: N=30 gave a validation split of 0 documents, N=200 one of 86, while the summary said
"validation: the first N documents"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from _text_fixtures import pydoc_documents, train_small_tokenizer

from bertgpu.cli import main as cli_main


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_small_tokenizer(tmp_path_factory.mktemp("tok") / "tok", vocab_size=1000)


def _short_documents() -> list[str]:
    """700 documents of four sentences each (about 400 bytes)."""
    sentences = [s for doc in pydoc_documents() for s in doc]
    return [" ".join(sentences[i:i + 4]) for i in range(0, 4 * 700, 4)]


def _jsonl(docs: list[str]) -> str:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> tuple[Path, Path]:
    """(a corpus whose a.jsonl, of 4 units' parts, has a bad line 301; the same without it)."""
    docs = _short_documents()
    bad, good = tmp_path_factory.mktemp("bad"), tmp_path_factory.mktemp("good")
    lines = _jsonl(docs[:400]).splitlines(keepends=True)
    lines[300] = "{oops\n"
    (bad / "a.jsonl").write_text("".join(lines))
    assert 150_000 < (bad / "a.jsonl").stat().st_size < 200_000  # 4 units of 50000 bytes
    for folder in (bad, good):
        (folder / "b.jsonl").write_text(_jsonl(docs[400:]))
        (folder / "c.txt").write_text("".join(d + "\n\n" for d in docs[:40]))
    return bad, good


def _run(tok: Path, corpus: Path, out: Path, n: int) -> int:
    """(--shard-size 20: a unit run again to hold documents writes fewer train shards)"""
    return cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(out), "--seq-len", "64", "--unit-bytes", "50000", "--workers", "1",
                     "--shard-size", "20", "--validation-docs", str(n), "--skip-bad"])


def _prepare(tok: Path, corpus: Path, out: Path, n: int) -> dict:
    assert _run(tok, corpus, out, n) == 0
    return json.loads((out / "manifest.json").read_text())


def _validation_ids(out: Path, manifest: dict) -> np.ndarray:
    shards = manifest["splits"]["validation"]["shards"]
    return np.concatenate([np.load(out / f"{s['name']}.input_ids.npy").ravel() for s in shards])


@pytest.mark.parametrize("n", [30, 200])
def test_the_first_n_documents_of_the_kept_corpus_are_held_out(tok, corpora, tmp_path, capsys,
                                                               n):
    bad, good = corpora
    skipped = _prepare(tok, bad, tmp_path / "skipped", n)
    out = capsys.readouterr().out
    assert [s["path"].rsplit("/", 1)[-1] for s in skipped["skipped_inputs"]] == ["a.jsonl"]
    assert f"validation: the first {n} documents" in out
    reference = _prepare(tok, good, tmp_path / "reference", n)
    assert reference["splits"]["validation"]["documents"] == n
    for key in ("documents", "sequences", "tokens"):
        assert skipped["splits"]["validation"][key] == reference["splits"]["validation"][key]
    assert skipped["counts"] == reference["counts"]
    assert np.array_equal(_validation_ids(tmp_path / "skipped", skipped),
                          _validation_ids(tmp_path / "reference", reference))
    npy = {p.name for p in (tmp_path / "skipped").glob("*.npy")}
    listed = {f"{s['name']}.{k}.npy" for split in skipped["splits"].values()
              for s in split["shards"] for k in ("input_ids", "lengths")}
    assert npy == listed  # no shard of a unit run again left behind


def test_a_run_stopped_as_a_unit_runs_again_leaves_none_of_its_shards(tok, corpora, tmp_path,
                                                                      capsys, monkeypatch):
    """Ctrl-C just as a unit is run again (its earlier shards and record removed): the same
    command finishes the set with the reference's split and no shard of the earlier run."""
    from bertgpu.data.output import WorkFolder

    bad, good = corpora
    forget = WorkFolder.forget

    def stopping(self, unit):
        again = self._record(f"units/{unit:05d}.json") is not None
        forget(self, unit)
        if again:
            raise KeyboardInterrupt

    monkeypatch.setattr(WorkFolder, "forget", stopping)
    assert _run(tok, bad, tmp_path / "skipped", 200) == 130
    assert "the same command goes on from them" in capsys.readouterr().err
    monkeypatch.undo()
    skipped = _prepare(tok, bad, tmp_path / "skipped", 200)
    reference = _prepare(tok, good, tmp_path / "reference", 200)
    assert skipped["splits"]["validation"] == {**reference["splits"]["validation"],
                                               "shards": skipped["splits"]["validation"]["shards"]}
    npy = {p.name for p in (tmp_path / "skipped").glob("*.npy")}
    listed = {f"{s['name']}.{k}.npy" for split in skipped["splits"].values()
              for s in split["shards"] for k in ("input_ids", "lengths")}
    assert npy == listed
