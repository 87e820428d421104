"""GLUE task table and readers: official TSV fixtures (tests/fixtures/glue, exact GLUE layouts,
CoLA without header, MRPC with a byte-order mark, MNLI with 12/16 columns, QQP with a short row)
and Hugging Face exports written here with pyarrow / json / csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.tasks.glue import (
    TASKS,
    column_name,
    find_split_file,
    get_task,
    write_glue_submission,
)
from bertgpu.tasks.glue_files import read_examples, read_examples_counted

GLUE = Path(__file__).parent / "fixtures" / "glue"

# (task, split, number of examples, first label, last label) from the fixture files.
EXPECTED = [
    ("cola", "train", 4, 1, 1),
    ("cola", "dev", 2, 1, 0),
    ("sst2", "train", 3, 0, 1),
    ("mrpc", "train", 3, 1, 1),
    ("mrpc", "dev", 2, 1, 0),
    ("stsb", "train", 3, 5.0, 3.8),
    ("stsb", "dev", 3, 5.0, 0.0),
    ("qqp", "dev", 3, 0, 1),
    ("mnli", "train", 3, 1, 2),  # neutral=1, contradiction=2 (HF order)
    ("mnli", "dev_matched", 2, 1, 2),
    ("mnli", "dev_mismatched", 3, 2, 0),
    ("qnli", "train", 3, 1, 0),  # not_entailment=1, entailment=0
    ("rte", "train", 2, 1, 0),
    ("wnli", "train", 3, 1, 0),
]


@pytest.mark.parametrize("key,split,n,first,last", EXPECTED)
def test_official_tsv_layouts(key: str, split: str, n: int, first: float, last: float) -> None:
    task = get_task(key)
    path = find_split_file(GLUE, task, split)
    assert path.parent.name == task.name and path.suffix == ".tsv"
    ex = read_examples(task, path)
    assert len(ex) == n
    assert ex[0].label == first and ex[-1].label == last
    for e in ex:
        assert e.text_a.strip()
        assert (e.text_b is not None) == task.is_pair
        assert type(e.label) is (float if task.kind == "regression" else int)


def test_every_task_has_fixtures_and_a_complete_row() -> None:
    assert [t.name for t in TASKS.values()] == [
        "CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"]
    for task in TASKS.values():
        for split in ("train", *task.dev_splits):
            assert find_split_file(GLUE, task, split).is_file()
        assert task.num_labels == (1 if task.kind == "regression" else len(task.labels))
        assert len(task.tsv_labels) == len(task.labels)


def test_label_order_is_huggingface() -> None:
    assert get_task("mnli").labels == ("entailment", "neutral", "contradiction")
    assert get_task("qnli").labels == ("entailment", "not_entailment")
    assert get_task("rte").labels == ("entailment", "not_entailment")
    assert get_task("wnli").labels == ("not_entailment", "entailment")
    assert get_task("cola").labels == ("unacceptable", "acceptable")


def test_quotes_do_not_swallow_rows() -> None:
    # MRPC's first row holds `" the witness "`: a quote-aware reader would merge lines.
    ex = read_examples("MRPC", GLUE / "MRPC" / "train.tsv")
    assert ex[0].text_a.startswith("Amrozi accused his brother , whom he called \" the witness \"")
    assert ex[1].text_a.startswith("Yucaipa")
    cola = read_examples("cola", GLUE / "CoLA" / "train.tsv")
    assert cola[-1].text_a == '"Mary" left.'


def test_aliases() -> None:
    for name in ("sts-b", "STS-B", "stsb", "STSB", "sts_b"):
        assert get_task(name) is TASKS["stsb"]
    for name in ("SST-2", "sst2", "sst-2"):
        assert get_task(name) is TASKS["sst2"]
    assert get_task("MNLI-mm") is TASKS["mnli"]
    with pytest.raises(BertgpuError, match="unknown GLUE task 'squad'.*CoLA"):
        get_task("squad")
    assert column_name("mnli", "dev_matched") == "MNLI-m"
    assert column_name("mnli", "validation_mismatched") == "MNLI-mm"
    assert column_name("sst2", "dev") == "SST-2"


def test_test_files_are_unlabeled_and_keep_their_index() -> None:
    for key, split, n in (("cola", "test", 2), ("sst2", "test", 2), ("mrpc", "test", 1),
                          ("stsb", "test", 1), ("qqp", "test", 1), ("mnli", "test_matched", 1)):
        ex = read_examples(key, find_split_file(GLUE, key, split))
        assert len(ex) == n
        assert [e.guid for e in ex] == [str(i) for i in range(n)]
        assert all(e.label is None for e in ex)


def test_mnli_has_no_plain_dev_split() -> None:
    with pytest.raises(BertgpuError, match="MNLI has no split 'dev'.*dev_matched, dev_mismatched"):
        find_split_file(GLUE, "mnli", "dev")
    assert find_split_file(GLUE, "mnli", "validation_matched").name == "dev_matched.tsv"


def test_qqp_malformed_rows() -> None:
    path = GLUE / "QQP" / "train.tsv"
    with pytest.raises(BertgpuError) as err:
        read_examples("qqp", path)
    msg = str(err.value)
    assert f"{path}:5:" in msg and "4 columns, expected 6" in msg and "\n" not in msg
    ex, skipped = read_examples_counted("qqp", path, skip_malformed=True)
    assert skipped == 1 and len(ex) == 4 and ex[-1].guid == "150663" and ex[-1].label == 1


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_errors_name_file_line_and_problem(tmp_path: Path) -> None:
    bad_label = _write(tmp_path / "RTE" / "dev.tsv",
                       "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\ta\tb\tfoo\n")
    with pytest.raises(BertgpuError, match=r"dev.tsv:3: unknown RTE label 'foo' \(expected one of "
                                           r"'entailment', 'not_entailment'\)"):
        read_examples("rte", bad_label)

    bad_score = _write(tmp_path / "STS-B" / "dev.tsv",
                       "index\tg\tf\ty\to\ts1\ts2\tsentence1\tsentence2\tscore\n"
                       "0\tg\tf\ty\to\ts\ts\tA.\tB.\tfive\n")
    with pytest.raises(BertgpuError, match=r"dev.tsv:2: STS-B score 'five' is not a number"):
        read_examples("stsb", bad_score)

    empty = _write(tmp_path / "SST-2" / "dev.tsv", "")
    with pytest.raises(BertgpuError, match=r"dev.tsv: empty file"):
        read_examples("sst2", empty)

    header_only = _write(tmp_path / "SST-2" / "train.tsv", "sentence\tlabel\n")
    with pytest.raises(BertgpuError, match=r"train.tsv: no examples"):
        read_examples("sst2", header_only)

    no_col = _write(tmp_path / "QNLI" / "dev.tsv",
                    "index\tquestion\tsentnce\tlabel\n0\tq\ts\tentailment\n")
    with pytest.raises(BertgpuError, match=r"dev.tsv:1: missing column 'sentence' for GLUE QNLI"):
        read_examples("qnli", no_col)

    empty_label = _write(tmp_path / "WNLI" / "dev.tsv",
                         "index\tsentence1\tsentence2\tlabel\n0\ta\tb\t\n")
    with pytest.raises(BertgpuError, match=r"dev.tsv:2: empty WNLI label column 'label'"):
        read_examples("wnli", empty_label)

    no_label = _write(tmp_path / "QNLI" / "train.tsv", "index\tquestion\tsentence\n0\tq\ts\n")
    with pytest.raises(BertgpuError, match=r"missing label column 'label'"):
        read_examples("qnli", no_label)

    with pytest.raises(BertgpuError) as err:
        find_split_file(tmp_path, "cola", "train")
    msg = str(err.value)
    assert "no train file for GLUE task CoLA" in msg and str(tmp_path / "CoLA") in msg
    assert "train.tsv" in msg and "train.parquet" in msg and "\n" not in msg

    with pytest.raises(BertgpuError, match="no such file"):
        read_examples("cola", tmp_path / "nope.tsv")


def test_huggingface_parquet_jsonl_json_csv(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"premise": "A man sleeps.", "hypothesis": "A man is awake.", "label": 2, "idx": 0},
        {"premise": "A dog runs.", "hypothesis": "An animal moves.", "label": 0, "idx": 1},
        {"premise": "Test row.", "hypothesis": "No label.", "label": -1, "idx": 2},
    ]
    folder = tmp_path / "mnli"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), folder / "validation_matched-00000-of-00001.parquet")
    (folder / "validation_mismatched.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (folder / "train.json").write_text(json.dumps(rows), encoding="utf-8")
    with open(folder / "test_matched.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["premise", "hypothesis", "label", "idx"])
        w.writeheader()
        w.writerows(rows)

    for split in ("dev_matched", "dev_mismatched", "train", "test_matched"):
        path = find_split_file(tmp_path, "MNLI", split)
        ex = read_examples("mnli", path, expect_labels=True)
        assert [e.label for e in ex] == [2, 0, None], path
        assert [e.guid for e in ex] == ["0", "1", "2"]
        assert ex[0].text_a == "A man sleeps." and ex[1].text_b == "An animal moves."

    sts = tmp_path / "stsb"
    sts.mkdir()
    pq.write_table(pa.Table.from_pylist([
        {"sentence1": "a", "sentence2": "b", "label": 4.25, "idx": 0},
        {"sentence1": "c", "sentence2": "d", "label": -1.0, "idx": 1},
    ]), sts / "validation.parquet")
    ex = read_examples("sts-b", find_split_file(tmp_path, "STS-B", "dev"))
    assert [e.label for e in ex] == [4.25, None]

    bad = _write(tmp_path / "cola" / "train.jsonl", '{"sentence": "x", "label": 1}\n{"label": 0}\n')
    with pytest.raises(BertgpuError, match=r"train.jsonl: line 2: missing column 'sentence'"):
        read_examples("cola", bad)


def test_submission_format(tmp_path: Path) -> None:
    out = write_glue_submission("mnli", [0, 2, 1], tmp_path / "MNLI-m.tsv")
    assert out.read_text().splitlines() == [
        "index\tprediction", "0\tentailment", "1\tcontradiction", "2\tneutral"]
    out = write_glue_submission("cola", [[0.1, 0.9], [2.0, -1.0]], tmp_path / "CoLA.tsv")
    assert out.read_text().splitlines() == ["index\tprediction", "0\t1", "1\t0"]
    out = write_glue_submission("stsb", [4.5, 0.25], tmp_path / "STS-B.tsv")
    rows = list(csv.reader(out.open(), delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and [float(r[1]) for r in rows[1:]] == [4.5, 0.25]
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(BertgpuError, match="not a RTE class id"):
        write_glue_submission("rte", [3], tmp_path / "RTE.tsv")


def test_stsb_submissions_are_clipped_to_its_range(tmp_path: Path) -> None:
    """A regression head predicts any number; STS-B's leaderboard scores lie in [0, 5]."""
    out = write_glue_submission("stsb", [-0.4, 2.5, 5.3], tmp_path / "STS-B.tsv")
    rows = list(csv.reader(out.open(), delimiter="\t"))
    assert [float(r[1]) for r in rows[1:]] == [0.0, 2.5, 5.0]


def test_malformed_rows_name_the_flag_that_skips_them(tmp_path: Path) -> None:
    path = GLUE / "QQP" / "train.tsv"
    with pytest.raises(BertgpuError, match=r"expected 6 for GLUE QQP \(pass --skip_malformed true "
                                           r"to skip such rows\)$"):
        read_examples("qqp", path)
    with pytest.warns(UserWarning, match=r"train\.tsv: skipped 1 malformed rows .*read 4$"):
        assert len(read_examples("qqp", path, skip_malformed=True)) == 4
    # A test file keeps every row: the leaderboard wants a prediction for each.
    test = _write(tmp_path / "QQP" / "test.tsv", "id\tquestion1\tquestion2\n0\ta\tb\n1\ta\n")
    with pytest.raises(BertgpuError, match=r"test\.tsv:3: 2 columns, expected 3 .*a test file "
                                           "must keep every row"):
        read_examples("qqp", test)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv"])
def test_a_null_text_in_a_huggingface_export_is_a_malformed_row(tmp_path: Path,
                                                                suffix: str) -> None:
    """A null text (a short row of the TSV an export was made from) became the text "None" and
    was trained and scored on without a word. It is now a malformed row, as a short TSV row is:
    a one-line error naming the file, row and column, or skipped with --skip_malformed."""
    rows = [{"question1": "how do i learn python ?",
             "question2": None if i == 3 else "what is python ?", "label": i % 2, "idx": i}
            for i in range(6)]
    path = tmp_path / "qqp" / f"train{suffix}"
    path.parent.mkdir()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
        where = "row 3"
    elif suffix == ".csv":  # a row cut short: DictReader fills the missing cell with None
        path.write_text("question1,question2,label,idx\n" + "".join(
            f"{r['question1']},{r['question2']},{r['label']},{r['idx']}\n" if r["question2"]
            else f"{r['question1']}\n" for r in rows), encoding="utf-8")
        where = "line 5"
    elif suffix == ".json":
        path.write_text(json.dumps(rows), encoding="utf-8")
        where = "item 3"
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        where = "line 4"
    with pytest.raises(BertgpuError) as err:
        read_examples("qqp", path)
    assert str(err.value) == (f"{path}: {where}: null in text column 'question2', expected a "
                              "string for GLUE QQP (pass --skip_malformed true to skip such rows)")
    with pytest.warns(UserWarning, match=rf"train\{suffix}: skipped 1 malformed rows .*read 5$"):
        ex = read_examples("qqp", path, skip_malformed=True)
    assert [e.guid for e in ex] == ["0", "1", "2", "4", "5"]
    assert all(e.text_b == "what is python ?" for e in ex)
    # A test file keeps every row: the leaderboard wants a prediction for each.
    test = path.with_name(f"test{suffix}")
    path.rename(test)
    with pytest.raises(BertgpuError, match=rf"{where}: null in text column 'question2'.*a test "
                                           "file must keep every row"):
        read_examples("qqp", test)
