"""Scores a user could not get or could misread (probe "fine-tuning metrics", findings 3 and 4):

- a SQuAD v2.0 file without "is_impossible" (as converted from Hugging Face's squad_v2) was
  refused, though evaluate-v2.0.py scores it: `"answers": []` alone marks a question unanswerable;
- `bertgpu report` put GLUE folders over different task sets under one "average" column (a 5-task
  mean beside a 3-task one, with no note).
"""

from __future__ import annotations

import json
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL
from test_report import _table_rows

from bertgpu.errors import BertgpuError
from bertgpu.finetune import finetune
from bertgpu.report import build_report
from bertgpu.tasks import squad

FIX = Path(__file__).parent / "fixtures"
SQUAD_V2 = FIX / "squad" / "dev-v2.0-sample.json"
VOCAB = SPECIAL + "the of a is in what who and to , . ? normans france normandy".split()
# Two optimizer steps a epoch at a non-zero lr: the runs really train (finding 1's one-step run at
# lr 0 would compare two untouched models).
TRAIN = ["--epochs", "2", "--lr", "1e-3", "--global_batch_size", "2"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _without_flags(path: Path) -> Path:
    """The official v2.0 sample as a squad_v2 conversion writes it: no is_impossible, no
    plausible_answers; unanswerable questions keep `"answers": []`."""
    doc = json.loads(SQUAD_V2.read_text(encoding="utf-8"))
    for article in doc["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                qa.pop("is_impossible")
                qa.pop("plausible_answers", None)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Finding 4: SQuAD v2.0 without "is_impossible"


def test_squad2_file_without_is_impossible_scores_as_with_it(tmp_path: Path) -> None:
    """`finetune squad2` on the flagless file trains and scores exactly as on the official one:
    same unanswerable questions, same training targets (same losses), same predictions and
    EM/F1, HasAns/NoAns split as evaluate-v2.0.py splits it."""
    plain = _without_flags(tmp_path / "v2_no_flag.json")
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    runs = {}
    for name, file in (("flagged", SQUAD_V2), ("plain", plain)):
        out = tmp_path / name
        res = finetune("squad2", None, init, out, overrides=TRAIN, train_file=file,
                       dev_file=file)
        runs[name] = (res, json.loads((out / "predictions.json").read_text(encoding="utf-8")))
    (flagged, flagged_preds), (plain_res, plain_preds) = runs["flagged"], runs["plain"]
    dev = plain_res["metrics"]["dev"]
    assert dev["NoAns_total"] == 2 and dev["HasAns_total"] == 2 and dev["total"] == 4
    assert dev == flagged["metrics"]["dev"]
    assert plain_preds == flagged_preds
    assert [e["train_loss"] for e in plain_res["epochs"]] == [
        e["train_loss"] for e in flagged["epochs"]]
    assert plain_res["steps"] == flagged["steps"] == 4
    flags = [e.is_impossible for e in squad.read_squad(plain, version_2=True)]
    assert flags == [e.is_impossible for e in squad.read_squad(SQUAD_V2, version_2=True)] == [
        False, False, True, True]


def test_flagless_file_given_to_squad_v1_names_squad2(tmp_path: Path) -> None:
    """v1.1 still refuses a question without answers (every v1.1 question has one), and now
    names the command that reads such a file."""
    plain = _without_flags(tmp_path / "v2_no_flag.json")
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    out = tmp_path / "sq"
    with pytest.raises(BertgpuError) as err:
        finetune("squad", None, init, out, overrides=TRAIN, train_file=plain, dev_file=plain)
    assert str(err.value) == (
        f'{plain}: data[0].paragraphs[0].qas[2].answers: empty for a question without '
        '"is_impossible": true (every SQuAD v1.1 question has an answer; for SQuAD v2.0, where '
        '"answers": [] marks an unanswerable question, use finetune squad2)')
    assert not out.exists() and not out.with_name("sq.tmp").exists()
    with pytest.raises(BertgpuError, match="use finetune squad2"):
        squad.read_squad(plain)  # v1.1 rules unless told otherwise


def test_official_v2_file_given_to_squad_v1_names_the_first_question(tmp_path: Path) -> None:
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    with pytest.raises(BertgpuError) as err:
        finetune("squad", None, init, tmp_path / "sq", overrides=TRAIN, train_file=SQUAD_V2,
                 dev_file=SQUAD_V2)
    assert str(err.value) == (f"{SQUAD_V2}: 2 questions without answers (is_impossible) are "
                              'SQuAD v2.0: use finetune squad2 (the first: id '
                              '"5ad39d53604f3c001a3fe8d1")')


def test_is_impossible_false_without_answers_is_refused(tmp_path: Path) -> None:
    """An explicit `"is_impossible": false` with no answers is in no official file (train or
    dev) and contradicts itself: refused, naming the question and what would fix it."""
    doc = json.loads(SQUAD_V2.read_text(encoding="utf-8"))
    doc["data"][0]["paragraphs"][0]["qas"][2]["is_impossible"] = False
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    out = tmp_path / "sq2"
    with pytest.raises(BertgpuError) as err:
        finetune("squad2", None, init, out, overrides=TRAIN, train_file=bad, dev_file=bad)
    assert not out.exists() and not out.with_name("sq2.tmp").exists()
    assert str(err.value) == (
        f'{bad}: data[0].paragraphs[0].qas[2].answers: empty for a question with '
        '"is_impossible": false (expected its answers, or "is_impossible": true for an '
        'unanswerable SQuAD v2.0 question)')


# --------------------------------------------------------------------------------------------
# Finding 3: the report's GLUE average over different task sets


def _glue_folder(folder: Path, tasks: dict[str, dict[str, float]],
                 convention: str | None = "glue-score") -> Path:
    """A glue_results.json as `bertgpu glue` writes it: task table, columns, average."""
    folder.mkdir()
    scores = {t: sum(c.values()) / len(c) for t, c in tasks.items()}
    summary = {"tasks": {t: {"score": scores[t], "columns": c} for t, c in tasks.items()},
               "columns": {k: v for c in tasks.values() for k, v in c.items()},
               "average": sum(scores.values()) / len(scores),
               "convention_text": "average = unweighted mean over the tasks shown"}
    if convention:
        summary["convention"] = convention
    (folder / "glue_results.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


FIVE = {"CoLA": {"CoLA": 10.0}, "SST-2": {"SST-2": 80.0}, "RTE": {"RTE": 60.0},
        "QQP": {"QQP": 70.0}, "MNLI": {"MNLI-m": 60.0, "MNLI-mm": 50.0}}  # average 55
THREE = {"CoLA": {"CoLA": 20.0}, "SST-2": {"SST-2": 70.0}, "RTE": {"RTE": 60.0}}  # average 50


def test_glue_rows_over_different_tasks_average_the_tasks_every_row_has(tmp_path: Path) -> None:
    """A 5-task run (55) beside a 3-task one (50) looked 5 points better; on the 3 tasks both
    ran it is 50 to 50. The column is now over those, says so, and quotes each own average."""
    a = _glue_folder(tmp_path / "five", FIVE)
    b = _glue_folder(tmp_path / "three", THREE)
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["model"] == ["CoLA", "SST-2", "RTE", "QQP", "MNLI-m", "MNLI-mm",
                             "average (shared tasks)"]
    assert rows["five"] == ["10.0", "80.0", "60.0", "70.0", "60.0", "50.0", "50.0"]
    assert rows["three"] == ["20.0", "70.0", "60.0", "", "", "", "50.0"]
    assert ("The GLUE rows cover different tasks, so their average column is over the 3 tasks "
            "every row has: CoLA, SST-2, RTE (\"glue-score\" convention: the unweighted mean of "
            "those task scores). Each folder's own average, over all its tasks: five 55.0 "
            "(5 tasks), three 50.0 (3 tasks)." in md)


def test_glue_averages_that_cannot_be_matched_carry_their_task_count(tmp_path: Path) -> None:
    """Without the convention recorded, no common average is made up: each cell names how many
    tasks it averages (MNLI's two columns once) and a note says they are not comparable."""
    a = _glue_folder(tmp_path / "five", FIVE, convention=None)
    b = _glue_folder(tmp_path / "three", THREE, convention=None)
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["model"][-1] == "average (own tasks)"
    assert rows["five"][-1] == "55.0 (5 tasks)" and rows["three"][-1] == "50.0 (3 tasks)"
    assert ("The GLUE rows cover different tasks and their averages are not comparable: each "
            "average is over its own tasks, and the count is beside it (not every folder "
            "records its task scores in the \"glue-score\" convention, so no common average "
            "is given): five 55.0 (5 tasks), three 50.0 (3 tasks)." in md)


def test_glue_rows_over_the_same_tasks_keep_their_average(tmp_path: Path) -> None:
    a = _glue_folder(tmp_path / "one", THREE)
    b = _glue_folder(tmp_path / "two", {**THREE, "CoLA": {"CoLA": 50.0}})
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["model"][-1] == "average" and "cover different tasks" not in md
    assert rows["one"][-1] == "50.0" and rows["two"][-1] == "60.0"


def test_glue_rows_over_as_many_different_tasks_average_the_shared_ones(tmp_path: Path) -> None:
    """Two tasks each, but not the same two: CoLA + SST-2 (55) beside CoLA + RTE (45) are not
    comparable either; the column is over CoLA, the one task both ran (20 against 40)."""
    a = _glue_folder(tmp_path / "run_a", {"CoLA": {"CoLA": 20.0}, "SST-2": {"SST-2": 90.0}})
    b = _glue_folder(tmp_path / "run_b", {"CoLA": {"CoLA": 40.0}, "RTE": {"RTE": 50.0}})
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["model"] == ["CoLA", "SST-2", "RTE", "average (shared tasks)"]
    assert rows["run_a"] == ["20.0", "90.0", "", "20.0"]
    assert rows["run_b"] == ["40.0", "", "50.0", "40.0"]
    assert "Each folder's own average, over all its tasks: run_a 55.0 (2 tasks), run_b 45.0 " \
           "(2 tasks)." in md


def test_one_glue_score_folder_beside_another_convention_gets_no_common_average(
        tmp_path: Path) -> None:
    """The shared-task mean is the "glue-score" convention's; a folder that averages by another
    (or an unrecorded) convention keeps its own average, with its task count."""
    a = _glue_folder(tmp_path / "five", FIVE)
    b = _glue_folder(tmp_path / "three", THREE, convention=None)
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["model"][-1] == "average (own tasks)"
    assert rows["five"][-1] == "55.0 (5 tasks)" and rows["three"][-1] == "50.0 (3 tasks)"
    assert "not every folder records its task scores in the \"glue-score\" convention" in md


def test_the_shared_tasks_are_those_of_every_row_not_only_the_first_and_last(
        tmp_path: Path) -> None:
    """Three folders, the middle one without SST-2: the shared tasks are CoLA alone."""
    pair = {"CoLA": {"CoLA": 20.0}, "SST-2": {"SST-2": 90.0}}
    a = _glue_folder(tmp_path / "first", pair)
    b = _glue_folder(tmp_path / "middle", {"CoLA": {"CoLA": 40.0}, "RTE": {"RTE": 50.0}})
    c = _glue_folder(tmp_path / "last", {**pair, "CoLA": {"CoLA": 30.0}})
    md = (build_report([a, b, c], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["model"] == ["CoLA", "SST-2", "RTE", "average (shared tasks)"]
    assert [rows[n][-1] for n in ("first", "middle", "last")] == ["20.0", "40.0", "30.0"]
    assert "over the 1 task every row has: CoLA (" in md
