"""Edges of prepare's data path that no other test pins: the split of a later work unit (its
first unit may be held out, its thresholds drawn from its own index), units never growing past
the plan's limit, manifest checks on shard entries, split totals, special-token ids and the format
version, the work folder's resume rules (a unit missing a file is redone, another plan starts
afresh, a legacy scratch folder gets its mark, a folder of the user's is never discarded), a
sealed file longer than recorded, and an empty folder at an output path being replaceable."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from _tiny_init import SPECIAL, word_tokenizer

from bertgpu import fsutil
from bertgpu.data.corpus import Piece
from bertgpu.data.manifest import Manifest
from bertgpu.data.output import PLAN, WorkFolder
from bertgpu.data.prepare_worker import Encoded
from bertgpu.data.split import SplitPlan, mlm_units
from bertgpu.data.unit_job import UnitJob, run_unit
from bertgpu.data.units import Unit
from bertgpu.errors import BertgpuError

# ----------------------------------------------------------------------------- split


def _draw(seed: int, work_unit: int, index: int) -> float:
    """The threshold r of unit ``index`` of a later work unit: blake2b of "seed:unit:index"."""
    digest = hashlib.blake2b(f"{seed}:{work_unit}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def test_a_later_work_units_first_unit_may_be_held_out():
    """Only work unit 0's first unit is sure to train: with fraction 1.0, work unit 1's first
    unit goes to validation (and starts a document, so it does not join)."""
    plan = SplitPlan(seed=7, fraction=1.0, validation_docs=None, corpus_bytes=4000, work_unit=1)
    plan.new_document()
    assert plan.assign(100) == (True, False)
    assert plan.documents == {"train": 0, "validation": 1}


def test_units_never_grow_past_the_limit():
    """A document arriving in two parts of 40 tokens is cut at the limit (64): units of 64 and 16
    tokens, in order, never one of 80."""
    plan = SplitPlan(seed=0, fraction=0.01, validation_docs=None, corpus_bytes=0)
    assert plan.limit == 64
    tokens = np.arange(80, dtype=np.int32)
    parts = [(Encoded(tokens[:40], None, None, None), True),
             (Encoded(tokens[40:], None, None, None), False)]
    units = list(mlm_units(parts, plan))
    assert [len(u[1]) for u in units] == [64, 16]
    assert np.concatenate([u[1] for u in units]).tolist() == list(range(80))
    assert plan.documents["train"] + plan.documents["validation"] == 1


WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]


def test_run_unit_draws_the_thresholds_of_its_own_work_unit(tmp_path):
    """Work unit 2 of a corpus of 8 one-word documents of 10 tokens each (each its own split
    unit) holds out exactly the documents that work unit 2's blake2b draws pick, its first
    included (error diffusion: held when F*T - H >= s*r)."""
    seed, fraction, size = 7, 0.3, 10
    tok = word_tokenizer(tmp_path / "tok", WORDS)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join([w] * size)}) + "\n" for w in WORDS))
    ids = {tok.token_to_id(w): k for k, w in enumerate(WORDS)}
    assert sorted(ids) == list(range(len(SPECIAL), len(SPECIAL) + len(WORDS)))
    read = held = 0
    expected = set()
    for k in range(len(WORDS)):
        read += size
        if fraction * read - held >= size * _draw(seed, 2, k):
            expected.add(k)
            held += size
    assert expected == {0, 4}  # what those draws give (work unit 0's would give {2, 5})
    out = tmp_path / "data"
    job = UnitJob(
        tokenizer_json=tok.to_str(), tokenizer_hash="x",
        settings={"seed": seed, "objective": "mlm", "seq_len": 64, "short_seq_prob": 0.0,
                  "cls": 2, "sep": 3, "unk": 1, "segmenter": None},
        fmt="auto", text_field="text", skip_bad=False, fraction=fraction, validation_docs=None,
        min_unit=64, shard_size=1000, chunk_docs=1000, dtype="uint16", word_starts=False,
        out=str(out), base=str(tmp_path))
    WorkFolder(out).begin({"test": 1}, overwrite=False)
    unit = Unit(2, (Piece(corpus, span=(0, corpus.stat().st_size)),))
    record = run_unit(job, unit, held_docs=None, workers=1)
    assert record["splits"]["validation"]["documents"] == len(expected)
    assert record["splits"]["train"]["documents"] == len(WORDS) - len(expected)
    folder = tmp_path / "data.tmp"
    val = np.load(folder / "validation-00002-00000.input_ids.npy")
    assert {ids[t] for t in val.ravel().tolist() if t in ids} == expected
    train = np.load(folder / "train-00002-00000.input_ids.npy")
    assert {ids[t] for t in train.ravel().tolist() if t in ids} == set(range(8)) - expected


# ----------------------------------------------------------------------------- manifest


def _manifest_data(**changes) -> dict:
    """A small valid manifest.json object: train of 3 + 2 sequences, no validation shards."""
    data = {
        "format_version": 1, "objective": "mlm", "seq_len": 16, "dtype": "uint16",
        "vocab_size": 100, "tokenizer_hash": "x",
        "special_tokens": {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4},
        "splits": {"train": {"sequences": 5, "tokens": 50,
                             "shards": [{"name": "train-00000", "sequences": 3, "tokens": 30},
                                        {"name": "train-00001", "sequences": 2, "tokens": 20}]},
                   "validation": {"sequences": 0, "tokens": 0, "shards": []}},
    }
    data.update(changes)
    return data


def test_the_small_manifest_is_valid(tmp_path):
    m = Manifest.from_json(_manifest_data(), tmp_path / "manifest.json")
    assert m.split_shards("train", tmp_path) == [("train-00000", 3), ("train-00001", 2)]
    assert m.split_shards("validation", tmp_path) == []


@pytest.mark.parametrize("shard", [
    {"name": "train-00000", "sequences": -1, "tokens": 0},
    {"name": "..\\evil", "sequences": 3, "tokens": 30},
])
def test_a_bad_shard_entry_is_refused_naming_it(tmp_path, shard):
    """A negative row count, or a name with a backslash (a path, not a file stem)."""
    data = _manifest_data()
    data["splits"]["train"]["shards"][0] = shard
    path = tmp_path / "manifest.json"
    m = Manifest.from_json(data, path)
    with pytest.raises(BertgpuError) as err:
        m.split_shards("train", path)
    assert str(err.value).startswith(f"{path}: splits.train.shards[0]: found ")


@pytest.mark.parametrize("declared, shards, held", [(5, [2, 1], 3), (3, [3, 2], 5)])
def test_split_sequences_must_equal_its_shards_sum(tmp_path, declared, shards, held):
    """More declared than the shards hold, and fewer: both refused with both numbers."""
    data = _manifest_data()
    data["splits"]["train"] = {
        "sequences": declared,
        "shards": [{"name": f"train-{k:05d}", "sequences": n} for k, n in enumerate(shards)]}
    path = tmp_path / "manifest.json"
    with pytest.raises(BertgpuError) as err:
        Manifest.from_json(data, path).split_shards("train", path)
    assert str(err.value) == (f"{path}: splits.train.sequences is {declared} but its shards "
                              f"hold {held}")


def test_a_special_token_id_equal_to_vocab_size_is_refused(tmp_path):
    special = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 100}
    path = tmp_path / "manifest.json"
    with pytest.raises(BertgpuError, match="special_tokens: found .*expected integer ids below"):
        Manifest.from_json(_manifest_data(special_tokens=special), path)
    special["mask"] = 99  # the last id of the vocabulary is fine
    m = Manifest.from_json(_manifest_data(special_tokens=special), path)
    assert m.special_tokens == special


def test_a_manifest_without_format_version_is_refused(tmp_path):
    data = _manifest_data()
    del data["format_version"]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BertgpuError) as err:
        Manifest.read(path)
    assert str(err.value).startswith(f"{path}: format_version: found None, expected 1")


# ----------------------------------------------------------------------------- work folder

PLAN_A = {"units": [1, 2], "seed": 1}
PLAN_B = {"units": [1, 2], "seed": 2}
RECORD = {"unit": 0, "keys": ["input_ids", "lengths"],
          "splits": {"train": {"shards": [{"name": "train-00000-00000"}]},
                     "validation": {"shards": []}}}
FILES = ["train-00000-00000.input_ids.npy", "train-00000-00000.lengths.npy"]


def _finished_unit(tmp_path: Path, plan: dict) -> tuple[WorkFolder, Path]:
    """A work folder for tmp_path/data that ran `plan` and finished unit 0 (two shard files)."""
    work = WorkFolder(tmp_path / "data")
    assert work.begin(plan, overwrite=False) == {}
    folder = tmp_path / "data.tmp"
    for name in FILES:
        (folder / name).write_bytes(b"npy")
    work.write_record(0, RECORD)
    return work, folder


def test_a_resumed_run_keeps_a_finished_unit(tmp_path):
    work, _ = _finished_unit(tmp_path, PLAN_A)
    assert work.begin(PLAN_A, overwrite=False) == {0: RECORD}


def test_a_unit_missing_one_of_its_shard_files_is_redone(tmp_path):
    work, folder = _finished_unit(tmp_path, PLAN_A)
    (folder / FILES[1]).unlink()
    assert work.begin(PLAN_A, overwrite=False) == {}


def test_another_plan_starts_afresh(tmp_path):
    """A re-run with another plan keeps nothing, and its plan replaces the old one."""
    work, folder = _finished_unit(tmp_path, PLAN_A)
    assert work.begin(PLAN_B, overwrite=False) == {}
    assert json.loads((folder / PLAN).read_text()) == PLAN_B
    assert not (folder / FILES[0]).exists() and list((folder / "units").iterdir()) == []


def test_a_legacy_scratch_folder_gets_its_mark_on_resume(tmp_path):
    """DATA.tmp of bertgpu 0.1 (same plan, no scratch mark) is kept and marked as bertgpu's."""
    work, folder = _finished_unit(tmp_path, PLAN_A)
    (folder / fsutil.SCRATCH_MARK).unlink()
    assert work.begin(PLAN_A, overwrite=False) == {0: RECORD}
    assert (folder / fsutil.SCRATCH_MARK).is_file()


def test_discard_leaves_a_users_tmp_folder_alone(tmp_path):
    folder = tmp_path / "data.tmp"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    WorkFolder(tmp_path / "data").discard()
    assert (folder / "notes.txt").read_text() == "mine"


def test_discard_removes_bertgpus_own_tmp_folder(tmp_path):
    work, folder = _finished_unit(tmp_path, PLAN_A)
    work.discard()
    assert not folder.exists()


# ----------------------------------------------------------------------------- fsutil


def test_a_sealed_file_grown_after_sealing_is_longer_than_recorded(tmp_path):
    folder = tmp_path / "step_1"
    folder.mkdir()
    (folder / "weights.bin").write_bytes(b"0123456789")
    fsutil.seal(folder)
    assert fsutil.verify_folder(folder) is None
    with open(folder / "weights.bin", "ab") as f:
        f.write(b"xyz")
    assert fsutil.verify_folder(folder) == (
        "weights.bin is longer than recorded (13 bytes, 10 recorded)")


def test_an_empty_folder_at_an_output_path_is_replaceable(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    fsutil.check_replaceable(out, lambda p: False, "an export")  # empty: no error
    (out / "thesis.tex").write_text("x")
    with pytest.raises(BertgpuError, match="a folder that is not an export"):
        fsutil.check_replaceable(out, lambda p: False, "an export")
