"""Defects a probe of `bertgpu glue` / `bertgpu finetune <glue task>` found: finished runs of
other data reused in one table, STS-B scores outside [0, 5] read silently, no AX predictions from
`finetune mnli --data GLUE/MNLI`, and a stale submission left beside a newer table."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.cli import main
from bertgpu.errors import BertgpuError

FIXTURES = Path(__file__).parent / "fixtures" / "glue"
FAST = ["--epochs", "1", "--max_seq_len", "64", "--global_batch_size", "4"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_init(tmp_path) -> Path:
    """A tiny random BERT whose vocab.txt holds every lower-cased word of SST-2's fixtures."""
    words = sorted({w for p in (FIXTURES / "SST-2").glob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]",
                                        p.read_text(encoding="utf-8").lower())})
    return _tiny_init.tiny_init(tmp_path, [*SPECIAL, *words])


def _sst2_copy(root: Path) -> Path:
    """ROOT with a copy of the SST-2 fixtures in the official layout."""
    shutil.copytree(FIXTURES / "SST-2", root / "SST-2")
    return root


def _glue(data: str | Path, init: Path, out: Path, *extra: str) -> int:
    return main(["glue", "--data-dir", str(data), "--init", str(init), "--out", str(out),
                 "--tasks", "sst2", *FAST, *extra])


# 1. A finished run made on other data is refused, as one of other settings is.

def test_a_finished_run_on_other_data_is_refused(tmp_path, tiny_init, capsys, monkeypatch):
    """`glue --data-dir B` into an --out whose runs read A said "results.json exists, not re-run",
    trained only the new seeds and wrote one median over runs on two datasets. The same folder
    given relative first, absolute later, is the same data."""
    a, b = _sst2_copy(tmp_path / "a"), _sst2_copy(tmp_path / "b")
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    assert _glue("a", tiny_init, out, "--seeds", "1") == 0  # recorded as given: "a"
    summary = json.loads((out / "glue_results.json").read_text())
    assert summary["data"] == str(a.resolve())
    capsys.readouterr()
    assert _glue(a, tiny_init, out, "--seeds", "1") == 0  # the same folder, absolute
    assert "SST-2 seed 1: results.json exists, not re-run" in capsys.readouterr().out
    # The relative path was resolved from the folder the check ran in, not the one the run was
    # made in: from another folder "a" named other data and was accepted, and "../a", the same
    # data, was refused. Runs now record their data folder resolved.
    other = tmp_path / "elsewhere"
    _sst2_copy(other / "a")
    monkeypatch.chdir(other)
    assert _glue("a", tiny_init, out, "--seeds", "1") == 2
    assert f"made with data {a.resolve()} (now a)" in capsys.readouterr().err
    assert _glue("../a", tiny_init, out, "--seeds", "1") == 0

    assert _glue(b, tiny_init, out, "--seeds", "1", "4") == 2
    err = capsys.readouterr().err
    done = out / "SST-2" / "seed_1" / "results.json"
    assert f"{done}: made with data {a.resolve()} (now {b}); a table would mix the two " \
           "settings: pass " \
           "--force to re-run it with this command's, or use another --out" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (out / "SST-2" / "seed_4").exists()  # refused before any training


# 2. STS-B scores outside [0, 5] are refused, naming the file and line.

STSB_HEADER = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
               "\tscore\n")


def _stsb_row(i: int, score: str) -> str:
    return f"{i}\tmain\tMSRvid\t2012\t{i:04d}\tnone\tnone\ta cat sits .\ta cat sat .\t{score}\n"


@pytest.mark.parametrize("score", ["5.5", "-0.2", "10"])
def test_stsb_scores_outside_0_to_5_are_refused_in_tsv(tmp_path, score):
    from bertgpu.tasks.glue_files import read_examples

    path = tmp_path / "train.tsv"
    path.write_text(STSB_HEADER + _stsb_row(0, "0.000") + _stsb_row(1, score))
    with pytest.raises(BertgpuError) as e:
        read_examples("stsb", path)
    assert str(e.value) == (f"{path}:3: STS-B score {score!r} is out of range (expected 0 to 5; "
                            "-1 marks an unlabeled test row)")


def test_stsb_scores_outside_0_to_5_are_refused_in_hf_exports(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertgpu.tasks.glue_files import read_examples

    rows = [{"sentence1": "a cat sits .", "sentence2": "a cat sat .", "label": x, "idx": i}
            for i, x in enumerate([5.0, 6.0])]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(BertgpuError, match=re.escape(f"{jsonl}: line 2: STS-B score 6.0 is out "
                                                     "of range (expected 0 to 5")):
        read_examples("stsb", jsonl)
    parquet = tmp_path / "validation.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    with pytest.raises(BertgpuError, match=re.escape(f"{parquet}: row 1: STS-B score 6.0 is out "
                                                     "of range")):
        read_examples("stsb", parquet)


def test_stsb_bounds_and_unlabeled_test_rows_still_read(tmp_path):
    """0 and 5 are scores; -1 (Hugging Face's test-split marker) is still "no label"."""
    from bertgpu.tasks.glue_files import read_examples

    path = tmp_path / "dev.tsv"
    path.write_text(STSB_HEADER + _stsb_row(0, "0.000") + _stsb_row(1, "5.000"))
    assert [e.label for e in read_examples("stsb", path)] == [0.0, 5.0]
    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps({"sentence1": "a", "sentence2": "b", "label": -1,
                                        "idx": i}) + "\n" for i in range(2)))
    assert [e.label for e in read_examples("stsb", test)] == [None, None]
    assert [e.label for e in read_examples("stsb", FIXTURES / "STS-B" / "test.tsv")][:1] == [None]


# 3. `finetune mnli --data GLUE/MNLI --predict-test` finds the diagnostic set one level up.

def _diagnostic_tsv(path: Path) -> Path:
    path.parent.mkdir(parents=True)
    path.write_text("index\tsentence1\tsentence2\n0\ta cat sits .\ta cat sat .\n"
                    "1\tnobody came .\tall came .\n")
    return path


def test_the_diagnostic_set_is_found_beside_an_mnli_task_folder(tmp_path, monkeypatch):
    """--data is "GLUE root or task folder"; with the MNLI folder no AX.tsv was written, though
    GLUE/diagnostic/diagnostic.tsv was there (only GLUE/ itself was searched)."""
    from bertgpu.tasks import glue, glue_job

    mnli = glue.get_task("mnli")
    root = tmp_path / "GLUE"
    shutil.copytree(FIXTURES / "MNLI", root / "MNLI")
    diag = _diagnostic_tsv(root / "diagnostic" / "diagnostic.tsv")
    with pytest.warns(UserWarning, match="no test_mismatched file"):  # the fixtures have none
        tests = dict(glue_job.read_test_splits(mnli, root / "MNLI"))
    assert [e.text_a for e in tests[glue.DIAGNOSTIC]] == ["a cat sits .", "nobody came ."]
    assert glue.find_diagnostic_file(root, mnli) == diag  # the root as before
    monkeypatch.chdir(root / "MNLI")
    assert glue.find_diagnostic_file(".", mnli) == diag.resolve()  # "." is the task folder

    # A Hugging Face export: mnli/ and ax/ side by side.
    hf = tmp_path / "hf"
    (hf / "mnli").mkdir(parents=True)
    (hf / "ax").mkdir()
    pair = {"premise": "a cat sits .", "hypothesis": "a cat sat .", "idx": 0}
    (hf / "mnli" / "train.jsonl").write_text(json.dumps({**pair, "label": 0}) + "\n")
    (hf / "mnli" / "test_matched.jsonl").write_text(json.dumps({**pair, "label": -1}) + "\n")
    (hf / "ax" / "test.jsonl").write_text(json.dumps({**pair, "label": -1}) + "\n")
    assert glue.find_diagnostic_file(hf / "mnli", mnli) == (hf / "ax" / "test.jsonl").resolve()

    # A GLUE root is not a task folder: a diagnostic set beside the root is not its own.
    outer = tmp_path / "outer"
    shutil.copytree(FIXTURES / "MNLI", outer / "GLUE" / "MNLI")
    _diagnostic_tsv(outer / "diagnostic" / "diagnostic.tsv")
    assert glue.find_diagnostic_file(outer / "GLUE", mnli) is None


# 4. A submission of an earlier --predict-test does not outlive the table it belonged to.

def test_a_table_without_test_predictions_removes_the_earlier_submission(tmp_path, tiny_init,
                                                                        capsys):
    """Re-running `glue` into the same --out without --predict-test wrote a glue_results.json
    without a submission, beside the old submission/ and submission.zip."""
    data, out = _sst2_copy(tmp_path / "data"), tmp_path / "out"
    assert _glue(data, tiny_init, out, "--seeds", "1", "--predict-test") == 0
    assert (out / "submission" / "SST-2.tsv").is_file() and (out / "submission.zip").is_file()
    capsys.readouterr()
    assert _glue(data, tiny_init, out, "--seeds", "1") == 0
    printed = capsys.readouterr().out
    assert f"{out}: removed the earlier submission.zip and submission (this table has no test " \
           "predictions; pass --predict-test for new ones)" in printed
    assert not (out / "submission").exists() and not (out / "submission.zip").exists()
    assert "submission" not in json.loads((out / "glue_results.json").read_text())


def test_a_new_submission_replaces_every_file_of_the_earlier_one(tmp_path):
    """A submission of other tasks keeps no file of the earlier task set, in the folder or the
    zip."""
    from bertgpu.glue import write_submission

    (tmp_path / "submission").mkdir()
    (tmp_path / "submission" / "CoLA.tsv").write_text("index\tprediction\n0\t1\n")
    with zipfile.ZipFile(tmp_path / "submission.zip", "w") as z:
        z.writestr("CoLA.tsv", "index\tprediction\n0\t1\n")
    run = tmp_path / "SST-2" / "seed_1" / "submission"
    run.mkdir(parents=True)
    (run / "SST-2.tsv").write_text("index\tprediction\n0\t0\n")
    with pytest.warns(UserWarning, match="the GLUE leaderboard asks for CoLA"):
        record = write_submission(tmp_path, {"SST-2": {1: {"score": 50.0}}})
    assert record["files"] == ["SST-2"]
    assert [p.name for p in (tmp_path / "submission").iterdir()] == ["SST-2.tsv"]
    with zipfile.ZipFile(tmp_path / "submission.zip") as z:
        assert z.namelist() == ["SST-2.tsv"]


def test_hf_json_lines_with_a_bom_or_a_line_separator_inside_a_string(tmp_path):
    # Valid files refused: a BOM ("Unexpected UTF-8 BOM"), and U+2028 / U+0085 written raw in a
    # JSON string (ensure_ascii=False), which str.splitlines cut as line ends.
    from bertgpu.tasks.glue_files import read_examples

    rows = [{"sentence": "a cat\u2028sits .", "label": 1, "idx": 0},
            {"sentence": "a dog\x85runs .", "label": 0, "idx": 1}]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("\ufeff" + "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in rows),
                     encoding="utf-8")
    examples = read_examples("sst2", jsonl)
    assert [e.text_a for e in examples] == ["a cat\u2028sits .", "a dog\x85runs ."]
    assert [e.label for e in examples] == [1, 0]


def test_squad_json_with_a_bom(tmp_path):
    from bertgpu.tasks.squad_read import read_squad

    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": "A cat sits.", "qas": [{"id": "q", "question": "Who sits?",
                                            "answers": [{"text": "cat", "answer_start": 2}]}]}]}]}
    path = tmp_path / "dev.json"
    path.write_text("\ufeff" + json.dumps(data), encoding="utf-8")
    assert [e.answers for e in read_squad(path)] == [("cat",)]
