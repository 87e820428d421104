"""`bertgpu tokenizer` and `bertgpu prepare` run again on their finished output: the same
command does nothing (exit 0, one line), another corpus or other settings is an error naming the
difference, and --overwrite still prepares again (`data/rerun.py`)."""

from __future__ import annotations

import json
import os

import fsspec
import pytest
from _text_fixtures import pydoc_documents, write_sentences

from bertgpu.cli import main as cli_main
from bertgpu.data.prepare import prepare
from bertgpu.errors import BertgpuError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    docs = pydoc_documents(40)
    write_sentences(folder / "a.txt", docs[:20])
    write_sentences(folder / "b.txt", docs[20:])
    return folder


def _tokenizer(corpus, out, *extra):
    return cli_main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "400", "--out",
                     str(out), *extra])


def _prepare(corpus, tok, out, *extra):
    return cli_main(["prepare", "--corpus", str(corpus), "--tokenizer", str(tok), "--out",
                     str(out), "--seq-len", "64", "--workers", "1", *extra])


def _stamps(folder):
    return {p.name: p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_the_same_commands_again_do_nothing_and_other_settings_are_named(corpus, tmp_path,
                                                                         capsys):
    tok, data = tmp_path / "tok", tmp_path / "data"
    assert _tokenizer(corpus, tok) == 0 and _prepare(corpus, tok, data) == 0
    capsys.readouterr()
    before = _stamps(tok), _stamps(data)

    assert _tokenizer(corpus, tok) == 0
    assert "tokenizer: " + f"{tok} already holds this tokenizer" in capsys.readouterr().out
    assert _prepare(corpus, tok, data, "--workers", "2") == 0  # (--workers changes no byte)
    out = capsys.readouterr().out
    assert f"prepare: {data} already holds this shard set" in out and "nothing to do" in out
    assert (_stamps(tok), _stamps(data)) == before  # not a file written again

    assert _tokenizer(corpus, tok, "--cased") == 2
    assert (f"{tok}: holds a tokenizer trained with --cased off (asked on); expected a new "
            "output folder") in capsys.readouterr().err
    assert _prepare(corpus, tok, data, "--seed", "7", "--objective", "mlm+nsp") == 2
    err = capsys.readouterr().err
    assert (f"{data}: holds a shard set prepared with --seed 12345 (asked 7); with --objective "
            "mlm (asked mlm+nsp); expected a new folder, or --overwrite to replace it") in err
    assert _prepare(corpus / "a.txt", tok, data) == 2
    assert f"prepared from a larger corpus: also {corpus / 'b.txt'}; expected" \
        in capsys.readouterr().err
    os.utime(corpus / "b.txt", ns=(1, 1))  # the same bytes, another version
    assert _tokenizer(corpus, tok) == 2
    assert "trained from an earlier version of the corpus: 1 file changed since" \
        in capsys.readouterr().err
    assert _prepare(corpus, tok, data) == 2
    assert "from an earlier version of the corpus: 1 file changed since (size or modification " \
        f"time; first: {corpus / 'b.txt'})" in capsys.readouterr().err
    assert (_stamps(tok), _stamps(data)) == before  # every refusal left both as they were

    assert _prepare(corpus, tok, data, "--overwrite") == 0  # prepared again, then the same
    assert "already holds" not in capsys.readouterr().out
    assert _prepare(corpus, tok, data) == 0
    assert "already holds this shard set" in capsys.readouterr().out


def test_a_set_without_its_record_is_refused_as_before(corpus, tmp_path, capsys):
    """A shard set of an older bertgpu (no prepared-from.json) or a record that is not the
    plan's JSON: nothing says how it was made, so it is not taken for this command's output."""
    tok, data = tmp_path / "tok", tmp_path / "data"
    assert _tokenizer(corpus, tok) == 0 and _prepare(corpus, tok, data) == 0
    record = (data / "prepared-from.json").read_text()
    (data / "prepared-from.json").unlink()
    with pytest.raises(BertgpuError, match=r"already exists and is not empty; expected a new "
                                           r"folder \(or --overwrite\)"):
        prepare([corpus], tok, data, seq_len=64, workers=1)
    (data / "prepared-from.json").write_text(record.replace('"seq_len": 64', '"seq_len": 65'))
    with pytest.raises(BertgpuError, match=r"with --seq-len 65 \(asked 64\)"):
        prepare([corpus], tok, data, seq_len=64, workers=1)
    (data / "prepared-from.json").write_text(record)
    manifest = (data / "manifest.json").read_text()
    assert prepare([corpus], tok, data, seq_len=64, workers=1) == json.loads(manifest)
    # a damaged manifest beside the same record: one line naming it (a JSON traceback before)
    (data / "manifest.json").write_text(manifest[:40])
    assert _prepare(corpus, tok, data) == 2
    assert capsys.readouterr().err.startswith(
        f"bertgpu prepare: error: {data / 'manifest.json'}: line ")


def test_a_url_output_is_found_finished_too(corpus, tmp_path):
    tok = tmp_path / "tok"
    assert _tokenizer(corpus, tok) == 0
    memory = fsspec.filesystem("memory")
    try:
        first = prepare([corpus], tok, "memory://rerun/data", seq_len=64, workers=1)
        stored = {p: memory.cat_file(p) for p in memory.find("/rerun/data")}
        assert "/rerun/data/prepared-from.json" in stored
        assert "/rerun/data/prepare-plan.json" not in stored
        report: dict = {}
        assert prepare([corpus], tok, "memory://rerun/data", seq_len=64, workers=1,
                       report=report) == first
        assert report == {"done": True}
        assert {p: memory.cat_file(p) for p in memory.find("/rerun/data")} == stored
        with pytest.raises(BertgpuError, match="memory://rerun/data: holds a shard set prepared "
                                               r"with --seq-len 64 \(asked 32\)"):
            prepare([corpus], tok, "memory://rerun/data", seq_len=32, workers=1)
    finally:
        memory.rm("/rerun", recursive=True)


def test_a_corpus_file_name_that_is_not_utf8_is_recorded(corpus, tmp_path):
    """trained-from.json was written as UTF-8 JSON: a file name of Latin-1 bytes (its
    undecodable byte a surrogate in Python) stopped the tokenizer with a traceback."""
    folder = tmp_path / "odd"
    folder.mkdir()
    name = os.fsdecode(b"lat\xe9in.txt")
    (folder / name).write_bytes((corpus / "a.txt").read_bytes())
    assert _tokenizer(folder, tmp_path / "tok") == 0
    assert _tokenizer(folder, tmp_path / "tok") == 0  # and read back: the same corpus


def test_an_mlm_set_recorded_with_nsp_only_settings_is_the_same(corpus, tmp_path, capsys):
    """An older bertgpu took --short-seq-prob and --chunk-docs with mlm and recorded them; now
    that they are refused with mlm, such a set could neither be re-run ("prepared with
    --short-seq-prob 0.3 (asked 0.1)") nor named by them again: they change no byte of it."""
    tok, data = tmp_path / "tok", tmp_path / "data"
    assert _tokenizer(corpus, tok) == 0 and _prepare(corpus, tok, data) == 0
    record = json.loads((data / "prepared-from.json").read_text())
    record["settings"]["short_seq_prob"] = 0.3
    record["job"][6] = 7  # --chunk-docs
    (data / "prepared-from.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert _prepare(corpus, tok, data) == 0
    assert "nothing to do" in capsys.readouterr().out
    record["settings"]["seq_len"] = 32  # what does change the set is still named
    (data / "prepared-from.json").write_text(json.dumps(record))
    assert _prepare(corpus, tok, data) == 2
    err = capsys.readouterr().err
    assert "with --seq-len 32 (asked 64)" in err and "short-seq-prob" not in err, err
