"""The leaderboard file written by `finetune TASK --predict-test` takes its index column from
the test file (header "index\\tprediction", GLUE's submission format), and the official TSV
reader refuses a row with more fields than its header (a tab inside a text) as it refuses one
with fewer.

A mutation probe found no test failing when the job's writer dropped the test file's indices
(0..N-1 written whatever the file said), or when the reader took a row with extra fields and
silently dropped the text after the stray tab."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from _tiny_init import word_tokenizer

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.errors import BertgpuError
from bertgpu.tasks import glue
from bertgpu.tasks.glue_files import read_examples, read_examples_counted
from bertgpu.tasks.glue_job import examples_job, read_test_splits

GLUE = Path(__file__).parent / "fixtures" / "glue"


def _job_writing(tmp_path: Path, task: str, data: Path):
    t = glue.get_task(task)
    train = read_examples(t, glue.find_split_file(GLUE, t, "train"))
    devs = [(s, read_examples(t, glue.find_split_file(GLUE, t, s))) for s in t.dev_splits]
    tok = word_tokenizer(tmp_path / "tok", ["the", "a", "film"])
    return examples_job(t, train, devs, tok, FinetuneConfig(), "fixtures",
                        read_test_splits(t, data))


def _rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_submission_index_is_the_test_files_own(tmp_path: Path) -> None:
    data = tmp_path / "glue"
    (data / "SST-2").mkdir(parents=True)
    (data / "SST-2" / "test.tsv").write_text(
        "index\tsentence\n7\tthe film\n3\ta film\n12\tthe \" film\n", encoding="utf-8")
    job = _job_writing(tmp_path, "sst2", data)
    [(split, enc, write)] = job.predict_test
    assert split == "test" and len(enc) == 3
    write({"logits": np.array([[0.0, 2.0], [2.0, 0.0], [0.0, 1.0]], dtype=np.float32)},
          tmp_path / "run")
    assert _rows(tmp_path / "run" / "submission" / "SST-2.tsv") == [
        ["index", "prediction"], ["7", "1"], ["3", "0"], ["12", "1"]]


def test_mnli_writes_matched_mismatched_and_ax_with_their_indices(tmp_path: Path) -> None:
    data = tmp_path / "glue"
    (data / "MNLI").mkdir(parents=True)
    (data / "diagnostic").mkdir()
    head = "index\tsentence1\tsentence2\n"
    (data / "MNLI" / "test_matched.tsv").write_text(head + "4\ta\tb\n5\tc\td\n", encoding="utf-8")
    (data / "MNLI" / "test_mismatched.tsv").write_text(head + "9\te\tf\n", encoding="utf-8")
    (data / "diagnostic" / "diagnostic.tsv").write_text(head + "0\tg\th\n1\ti\tj\n",
                                                        encoding="utf-8")
    job = _job_writing(tmp_path, "mnli", data)
    out = tmp_path / "run"
    for _split, enc, write in job.predict_test:
        write({"logits": np.tile(np.array([[0.0, 0.0, 1.0]], dtype=np.float32), (len(enc), 1))},
              out)
    files = out / "submission"
    assert sorted(p.name for p in files.iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    assert _rows(files / "MNLI-m.tsv") == [["index", "prediction"], ["4", "contradiction"],
                                           ["5", "contradiction"]]
    assert _rows(files / "MNLI-mm.tsv") == [["index", "prediction"], ["9", "contradiction"]]
    assert [r[0] for r in _rows(files / "AX.tsv")] == ["index", "0", "1"]


def test_a_row_with_more_fields_than_the_header_is_refused_or_skipped(tmp_path: Path) -> None:
    path = tmp_path / "RTE" / "train.tsv"
    path.parent.mkdir()
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                    "1\tc\td\tmore of d\tnot_entailment\n2\te\tf\tnot_entailment\n",
                    encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"train\.tsv:3: 5 columns, expected 4 for GLUE RTE"):
        read_examples("rte", path)
    examples, skipped = read_examples_counted("rte", path, skip_malformed=True)
    assert skipped == 1 and [e.guid for e in examples] == ["0", "2"]
    test = tmp_path / "RTE" / "test.tsv"
    test.write_text("index\tsentence1\tsentence2\n0\ta\tb\n1\tc\td\textra\n", encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"test\.tsv:3: 4 columns, expected 3 .*a test file"):
        read_examples("rte", test)
