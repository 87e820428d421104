"""`bertgpu glue` on the official-format GLUE fixtures: table, average convention, idempotence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "glue"
TASKS = ["sst2", "mnli", "stsb"]
FAST = ["--epochs", "1", "--max_seq_len", "64", "--global_batch_size", "4"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_init(tmp_path) -> Path:
    """A tiny random BERT whose vocab.txt holds every lower-cased word of the fixtures."""
    words = sorted({w for p in FIXTURES.rglob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]",
                                        p.read_text(encoding="utf-8").lower())})
    return _tiny_init.tiny_init(tmp_path, [*SPECIAL, *words])


def glue(out: Path, init: Path, *extra: str) -> int:
    return main(["glue", "--data-dir", str(FIXTURES), "--init", str(init), "--out", str(out),
                 "--tasks", *TASKS, *FAST, *extra])


def test_glue_table_average_and_idempotence(tmp_path, tiny_init, capsys):
    out = tmp_path / "glue"
    assert glue(out, tiny_init, "--seeds", "1", "2", "--reference", "bert-base-cramming",
                "sidsite-8gb") == 0
    summary = json.loads((out / "glue_results.json").read_text())
    assert summary["convention"] == "glue-score"
    assert list(summary["columns"]) == ["SST-2", "MNLI-m", "MNLI-mm", "STS-B"]
    assert summary["protocol"]["aggregate"] == "median over 2 seeds per metric"
    assert summary["protocol"]["epochs"] == 1 and summary["protocol"]["seeds"] == [1, 2]
    assert summary["protocol"]["lr"] == 3e-4  # by model size (hidden 32), as the runs recorded it
    # The average counts MNLI once: mean of (SST-2, mean(MNLI-m, MNLI-mm), STS-B).
    c = summary["columns"]
    expected = (c["SST-2"] + (c["MNLI-m"] + c["MNLI-mm"]) / 2 + c["STS-B"]) / 3
    assert summary["average"] == pytest.approx(expected)
    # Each column is the median (here: mean of two) of the per-seed results.
    sst = [json.loads((out / "SST-2" / f"seed_{s}" / "results.json").read_text()) for s in (1, 2)]
    assert c["SST-2"] == pytest.approx((sst[0]["score"] + sst[1]["score"]) / 2)
    assert [r["config"]["seed"] for r in sst] == [1, 2]
    assert set(summary["tasks"]["MNLI"]["metrics"]) == {"dev_matched", "dev_mismatched"}
    md = (out / "glue_results.md").read_text()
    assert '"glue-score" convention' in md and "median over 2 seeds" in md
    assert "| ours |" in md and "(published)" in md and "| 80.9 |" in md
    assert re.search(r"\| BERT from scratch on one 8 GB GPU.*\| 89\.1 \| 79\.3 \| 80\.1 \| "
                     r"61\.9 \| 72\.7 \|", md)

    # Second run: nothing is trained again, the table is rebuilt from results.json. A key newer
    # than a results.json (here skip_malformed, as a run of an older bertgpu lacks it) counts as
    # its default, not as another setting.
    older = out / "SST-2" / "seed_2" / "results.json"
    record = json.loads(older.read_text())
    del record["config"]["skip_malformed"]
    older.write_text(json.dumps(record))
    stamp = (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns
    capsys.readouterr()
    assert glue(out, tiny_init, "--seeds", "1", "2") == 0
    printed = capsys.readouterr().out
    assert printed.count("results.json exists, not re-run") == 6 and "note:" not in printed
    assert (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "glue_results.json").read_text())["columns"] == c
    # How a run logs, checkpoints or evaluates in batches is no other setting: the finished
    # runs are kept (they were refused, "made with checkpoint_every_steps 0 (now 50)")
    assert glue(out, tiny_init, "--seeds", "1", "2", "--checkpoint_every_steps", "50",
                "--eval_batch_size", "16", "--log_every_steps", "3") == 0
    assert capsys.readouterr().out.count("results.json exists, not re-run") == 6
    assert (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns == stamp
    # A finished run of other settings or another init is refused before any training: the
    # table used to list it under this command's protocol and model.
    assert glue(out, tiny_init, "--seeds", "1", "--lr", "1e-4") == 2
    # lr left to the model size: the runs used (and recorded) the small-model default
    err = capsys.readouterr().err
    assert "results.json: made with lr 0.0003 (now 0.0001)" in err and "--force" in err, err
    other = _tiny_init.tiny_init(tmp_path / "other", [*SPECIAL, "a"])
    assert glue(out, other, "--seeds", "1") == 2
    assert f"made with init {tiny_init} (now {other})" in capsys.readouterr().err
    assert json.loads((out / "glue_results.json").read_text())["columns"] == c

    # --force trains again (one task to keep it quick).
    assert main(["glue", "--data-dir", str(FIXTURES), "--init", str(tiny_init), "--out", str(out),
                 "--tasks", "sst2", *FAST, "--force"]) == 0
    assert (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns != stamp


def test_a_submission_of_the_users_is_never_removed(tmp_path, tiny_init, capsys):
    """glue removed (or, with --predict-test, replaced) OUT/submission/ and submission.zip in
    any --out, also where no earlier glue had written them: a user's files were lost."""
    out = tmp_path / "project"
    (out / "submission").mkdir(parents=True)
    (out / "submission" / "mine.csv").write_text("precious")
    (out / "submission.zip").write_text("z")
    for extra in ((), ("--predict-test",)):
        assert glue(out, tiny_init, "--seeds", "1", *extra) == 2
        assert (f"{out}: holds submission and submission.zip, which no earlier `bertgpu glue` "
                "wrote here") in capsys.readouterr().err
        assert (out / "submission" / "mine.csv").read_text() == "precious"
        assert (out / "submission.zip").read_text() == "z"
        assert sorted(p.name for p in out.iterdir()) == ["submission", "submission.zip"]


def test_a_model_run_or_data_folder_is_not_taken_as_out(tmp_path, tiny_init, capsys):
    """glue wrote TASK/seed_N/ and its table into the GLUE data folder, a pretraining run or a
    model folder given as --out (finetune, export and report refuse them)."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    data = tmp_path / "gluedata"
    (data / "SST-2").mkdir(parents=True)
    (data / "SST-2" / "train.tsv").write_text("sentence\tlabel\n")
    for out, held in ((tiny_init, "config.json"), (run, "checkpoints"), (data, "SST-2/train.tsv")):
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        assert glue(out, tiny_init, "--seeds", "1") == 2
        assert f"{out}: holds {held}, so it is a model, run, shard set or data folder" \
            in capsys.readouterr().err
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_missing_task_folder_is_an_error_unless_skipped(tmp_path, tiny_init, capsys):
    """A missing task is found before the first run (it used to stop the command after the
    tasks before it had trained); --skip-missing leaves it out, but not every task."""
    data = tmp_path / "data"
    (data / "SST-2").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (data / "SST-2" / name).write_bytes((FIXTURES / "SST-2" / name).read_bytes())
    args = ["glue", "--data-dir", str(data), "--init", str(tiny_init), "--out", str(tmp_path / "o"),
            "--tasks", "sst2", "rte", *FAST]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no train file for GLUE task RTE" in err and "--skip-missing" in err
    assert not (tmp_path / "o" / "SST-2").exists()  # nothing trained
    assert main(["glue", "--data-dir", str(tmp_path / "none"), "--init", str(tiny_init), "--out",
                 str(tmp_path / "o"), "--tasks", "rte", "--skip-missing", *FAST]) == 2
    assert "none of the tasks asked for has its files (RTE)" in capsys.readouterr().err
    assert main([*args, "--skip-missing"]) == 0
    summary = json.loads((tmp_path / "o" / "glue_results.json").read_text())
    assert summary["skipped"] == ["RTE"] and list(summary["columns"]) == ["SST-2"]
    assert "Skipped (no data folder): RTE." in (tmp_path / "o" / "glue_results.md").read_text()


def test_bad_arguments(tmp_path, tiny_init, capsys):
    base = ["glue", "--data-dir", str(FIXTURES), "--init", str(tiny_init), "--out", str(tmp_path)]
    assert main([*base, "--seed", "3"]) == 2
    assert "use --seeds" in capsys.readouterr().err
    assert main([*base, "--epochz", "3"]) == 2
    assert "unknown key epochz (did you mean epochs?)" in capsys.readouterr().err
    assert main([*base, "--tasks", "nope"]) == 2
    assert "unknown GLUE task 'nope'" in capsys.readouterr().err
    # a negative seed was a numpy traceback from inside the first fine-tuning run
    with pytest.raises(SystemExit):
        main([*base, "--seeds", "1", "-1"])
    assert "argument --seeds: expected a seed from 0 to 4294967295, found -1" in \
        capsys.readouterr().err
    assert not any(tmp_path.glob("*/seed_*"))


def test_a_run_stopped_by_a_signal_stops_the_command_with_its_status(tmp_path, tiny_init, capsys,
                                                                    monkeypatch):
    """Ctrl-C or a preemption inside one fine-tuning run (its checkpoint written, finetune
    returning {"preempted": True}) ends `glue` with that run's exit status and no table; it used
    to go on, find no results.json and say "unreadable results ...; delete it or pass --force"
    with status 2."""
    from bertgpu import finetune

    calls = []

    def stopped(task, *args, **kwargs):
        calls.append(task)
        return {"preempted": True, "step": 3, "exit_status": 130}

    monkeypatch.setattr(finetune, "finetune", stopped)
    out = tmp_path / "glue"
    assert glue(out, tiny_init) == 130
    captured = capsys.readouterr()
    assert "error" not in captured.err and calls == ["sst2"]
    assert not (out / "glue_results.json").exists()


def test_a_tasks_columns_are_the_mean_of_the_metrics_the_table_shows():
    """Each metric and each column used to be its own median over seeds: STS-B showed Pearson
    90.25 (seed 3) and Spearman 76.34 (seed 1), whose mean 83.3 no run had, beside a column of
    80.61. The column is now the mean of the medians shown; MNLI's two columns each come from
    their own split."""
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.glue import summarise
    from bertgpu.tasks.glue import get_task

    pairs = {1: (84.88, 76.34), 2: (90.34, 70.53), 3: (90.25, 79.98)}
    runs = {"STS-B": {s: {"columns": {"STS-B": (p + r) / 2},
                          "metrics": {"dev": {"pearson": p, "spearman": r}}}
                      for s, (p, r) in pairs.items()},
            "MNLI": {s: {"columns": {"MNLI-m": m, "MNLI-mm": mm},
                         "metrics": {"dev_matched": {"accuracy": m},
                                     "dev_mismatched": {"accuracy": mm}}}
                     for s, (m, mm) in {1: (70.0, 60.0), 2: (72.0, 61.0), 3: (71.0, 65.0)}.items()}}
    summary = summarise(runs, [get_task("stsb"), get_task("mnli")], [1, 2, 3],
                        load_finetune_config(None, []), "init", [], [])
    stsb = summary["tasks"]["STS-B"]
    assert stsb["metrics"]["dev"] == {"pearson": 90.25, "spearman": 76.34}
    assert stsb["columns"]["STS-B"] == pytest.approx((90.25 + 76.34) / 2) == stsb["score"]
    assert summary["tasks"]["MNLI"]["columns"] == {"MNLI-m": 71.0, "MNLI-mm": 61.0}


def test_a_tasks_score_is_the_mean_of_its_columns_and_metrics():
    """A task's score is what the GLUE average counts for it (tasks/metrics.py glue_average):
    MNLI's the mean of MNLI-m and MNLI-mm, not the larger of the two; MRPC's the mean of F1 and
    accuracy, STS-B's of Pearson and Spearman (one column each, itself that mean)."""
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.glue import summarise
    from bertgpu.tasks.glue import get_task
    from bertgpu.tasks.metrics import glue_average

    def run(columns: dict[str, float], metrics: dict[str, dict[str, float]]) -> dict:
        return {s: {"columns": columns, "metrics": metrics} for s in (1, 2)}

    runs = {
        "MNLI": run({"MNLI-m": 80.0, "MNLI-mm": 82.0},
                    {"dev_matched": {"accuracy": 80.0}, "dev_mismatched": {"accuracy": 82.0}}),
        "MRPC": run({"MRPC": 87.0}, {"dev": {"f1": 90.0, "accuracy": 84.0}}),
        "STS-B": run({"STS-B": 85.0}, {"dev": {"pearson": 88.0, "spearman": 82.0}}),
    }
    chosen = [get_task(t) for t in ("mnli", "mrpc", "stsb")]
    summary = summarise(runs, chosen, [1, 2], load_finetune_config(None, []), "init", [], [])
    tasks = summary["tasks"]
    assert tasks["MNLI"]["columns"] == {"MNLI-m": 80.0, "MNLI-mm": 82.0}
    assert tasks["MNLI"]["score"] == pytest.approx(81.0)
    assert tasks["MRPC"]["score"] == pytest.approx((90.0 + 84.0) / 2)
    assert tasks["STS-B"]["score"] == pytest.approx((88.0 + 82.0) / 2)
    # the average over tasks is the mean of the task scores, as glue_average counts the columns
    assert summary["average"] == pytest.approx(glue_average(summary["columns"]))
    assert summary["average"] == pytest.approx((81.0 + 87.0 + 85.0) / 3)
    assert summary["average"] == pytest.approx(sum(t["score"] for t in tasks.values()) / 3)


def test_predict_test_writes_the_leaderboard_submission(tmp_path, tiny_init, capsys):
    """`glue --predict-test`: OUT/submission/ and submission.zip hold, for each task, the test
    predictions of its seed with the best dev score, and AX.tsv (GLUE's diagnostic set, which
    the leaderboard asks for) from the MNLI model -- the labels transformers' own classifier
    gives with the exported model. Seeds that ran without --predict-test run again for theirs;
    the leaderboard files no run wrote are named."""
    import shutil
    import zipfile

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    data = tmp_path / "glue_data"
    shutil.copytree(FIXTURES, data)
    pairs = [("the cat sat on the mat .", "a cat is sitting ."), ("nobody came .", "all came ."),
             ("a man is playing a guitar .", "a man plays music .")]
    (data / "diagnostic").mkdir()
    (data / "diagnostic" / "diagnostic.tsv").write_text(
        "index\tsentence1\tsentence2\n" + "".join(f"{i}\t{a}\t{b}\n"
                                                  for i, (a, b) in enumerate(pairs)))
    out = tmp_path / "glue"

    def run(*extra: str) -> int:
        return main(["glue", "--data-dir", str(data), "--init", str(tiny_init), "--out", str(out),
                     "--tasks", *TASKS, *FAST, *extra])

    assert run("--seeds", "1") == 0
    assert not (out / "submission").exists()
    capsys.readouterr()
    assert run("--seeds", "1", "2", "--predict-test") == 0
    printed = capsys.readouterr()
    assert printed.out.count("ran without --predict-test; run again") == 3
    assert ("the GLUE leaderboard asks for CoLA, MRPC, QQP, MNLI-mm, QNLI, RTE, WNLI as well"
            in printed.err), printed.err
    sub = json.loads((out / "glue_results.json").read_text())["submission"]
    names = ["AX.tsv", "MNLI-m.tsv", "SST-2.tsv", "STS-B.tsv"]
    assert sorted(p.name for p in (out / "submission").iterdir()) == names
    with zipfile.ZipFile(out / "submission.zip") as z:
        assert sorted(z.namelist()) == names
        for name in names:
            assert z.read(name) == (out / "submission" / name).read_bytes()
    for task in ("SST-2", "MNLI", "STS-B"):
        scores = {s: json.loads((out / task / f"seed_{s}" / "results.json").read_text())["score"]
                  for s in (1, 2)}
        best = 1 if scores[1] >= scores[2] else 2
        assert sub["seeds"][task] == best
        for path in (out / task / f"seed_{best}" / "submission").glob("*.tsv"):
            assert (out / "submission" / path.name).read_bytes() == path.read_bytes()
    # AX: the MNLI model's predictions, as transformers computes them from the export
    model_dir = out / "MNLI" / f"seed_{sub['seeds']['MNLI']}" / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        logits = model(**tok([a for a, _ in pairs], [b for _, b in pairs], padding=True,
                             truncation=True, max_length=64, return_tensors="pt")).logits
    expected = [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    rows = (out / "submission" / "AX.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction"
    assert [r.split("\t") for r in rows[1:]] == [[str(i), e] for i, e in enumerate(expected)]
    assert "Test predictions for the GLUE leaderboard" in (out / "glue_results.md").read_text()

    # A later seed with the better dev score is the one submitted: in the runs above seed 1 was
    # never worse than seed 2, so "best" could not be told from "first". SST-2's seed 2 now
    # records the higher score (the command reads the scores from results.json, not re-run).
    record = out / "SST-2" / "seed_2" / "results.json"
    res = json.loads(record.read_text())
    res["score"] = json.loads((out / "SST-2" / "seed_1" / "results.json").read_text())["score"] + 1
    record.write_text(json.dumps(res))
    (out / "SST-2" / "seed_2" / "submission" / "SST-2.tsv").write_text("index\tprediction\n0\t1\n")
    assert run("--seeds", "1", "2", "--predict-test") == 0
    sub = json.loads((out / "glue_results.json").read_text())["submission"]
    assert sub["seeds"]["SST-2"] == 2
    assert (out / "submission" / "SST-2.tsv").read_text() == "index\tprediction\n0\t1\n"
    with zipfile.ZipFile(out / "submission.zip") as z:
        assert z.read("SST-2.tsv") == b"index\tprediction\n0\t1\n"


def test_the_submission_takes_each_task_from_its_best_dev_seed(tmp_path, capsys):
    """write_submission picks, per task, the seed with the highest dev score, whichever its
    position (here the middle or the last seed), and the lowest seed of a tie; the files come
    from that seed's folder. A regression to "the first seed" submitted a worse model."""
    from bertgpu.glue import write_submission

    scores = {"SST-2": {1: 50.0, 2: 75.0, 3: 60.0}, "STS-B": {1: 7.9, 2: -71.4, 3: 12.5},
              "MNLI": {1: 40.0, 2: 40.0, 3: 30.0}}
    runs = {}
    for task, per_seed in scores.items():
        runs[task] = {}
        for seed, score in per_seed.items():
            sub = tmp_path / task / f"seed_{seed}" / "submission"
            sub.mkdir(parents=True)
            (sub / f"{task}.tsv").write_text(f"index\tprediction\n0\tseed {seed}\n")
            runs[task][seed] = {"score": score}
    with pytest.warns(UserWarning, match="the GLUE leaderboard asks for"):
        record = write_submission(tmp_path, runs)
    assert record["seeds"] == {"SST-2": 2, "STS-B": 3, "MNLI": 1}
    for task, seed in record["seeds"].items():
        assert (tmp_path / "submission" / f"{task}.tsv").read_text() == \
            f"index\tprediction\n0\tseed {seed}\n"


def test_the_protocol_states_the_max_seq_len_the_runs_used():
    """A model with 64 positions caps GLUE's default 128: the table's protocol line said 128,
    the request's default, while every run recorded (results.json max_seq_len) 64."""
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.glue import summarise
    from bertgpu.tasks.glue import get_task

    runs = {"SST-2": {s: {"columns": {"SST-2": 50.0 + s}, "max_seq_len": 64,
                          "metrics": {"dev": {"accuracy": 50.0 + s}}} for s in (1, 2)}}
    summary = summarise(runs, [get_task("sst2")], [1, 2], load_finetune_config(None, []),
                        "init", [], [])
    assert summary["protocol"]["max_seq_len"] == 64


@pytest.mark.parametrize("given, expected", [([], None), (["--reference"], "all"),
                                             (["--reference", "sidsite-8gb"], ["sidsite-8gb"])])
def test_reference_alone_adds_every_published_row(tmp_path, tiny_init, monkeypatch, given,
                                                  expected):
    """`--reference` with no names adds every published row (it added none, silently)."""
    from bertgpu import glue as glue_mod

    seen = {}

    def run(*args, **kwargs):
        seen["references"] = kwargs["references"]
        return {}

    monkeypatch.setattr(glue_mod, "run", run)
    assert main(["glue", "--data-dir", str(FIXTURES), "--init", str(tiny_init), "--out",
                 str(tmp_path / "glue"), *given]) == 0
    if expected is None:  # no flag: no published rows
        assert not seen["references"]
        return
    want = sorted(glue_mod.REFERENCES) if expected == "all" else expected
    assert seen["references"] == want and (expected != "all" or len(want) >= 2)


@pytest.mark.timeout(120)
def test_a_sigterm_in_a_glue_run_is_said_by_glue(tmp_path, tiny_init):
    """SIGTERM while `bertgpu glue` trains a task: the stop line named "bertgpu finetune",
    a command the user never ran; it names `bertgpu glue` (whose re-run resumes)."""
    import os
    import signal
    import time

    from _e2e import bertgpu_started

    out = tmp_path / "glue"
    proc = bertgpu_started(["glue", "--data-dir", str(FIXTURES), "--init", str(tiny_init),
                            "--out", str(out), "--tasks", "sst2", *FAST, "--epochs", "30"],
                           faults="delay_rank=0:0.2")  # each step 0.2 s: time to land in one
    deadline = time.monotonic() + 90
    while not any('"kind": "eval"' in p.read_text() for p in out.rglob("metrics.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    lines = proc.stderr.read().splitlines()
    stops = [line for line in lines if "SIGTERM" in line]
    assert stops and all(line.startswith("bertgpu glue: ") for line in stops), lines
    assert "re-running the same command resumes" in stops[-1], lines

    # `report` on the folder, which has no table yet: it was refused as "not a ... GLUE folder
    # (glue_results.json)"; it shows the run so far, in progress.
    assert main(["report", str(out), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "README.md").read_text(encoding="utf-8")
    assert f"`{out}` has no GLUE table yet" in text, text
    assert "| glue/SST-2/seed_1 | SST-2 |" in text and "has not finished: it is in progress in" \
        f" `{out / 'SST-2' / 'seed_1.tmp'}`" in text, text


def test_a_glue_folders_runs_are_its_finished_seeds_before_a_rerun_in_progress(tmp_path):
    from bertgpu.report.inputs import glue_runs

    for run in ("SST-2/seed_1", "SST-2/seed_1.tmp", "SST-2/seed_10.tmp", "SST-2/seed_2",
                "CoLA/seed_3.tmp", "CoLA/notes", "STS-B/seed_x", "other/seed_1"):
        (tmp_path / run).mkdir(parents=True)
    assert [(name, str(p.relative_to(tmp_path))) for name, p in glue_runs(tmp_path)] == [
        ("CoLA/seed_3", "CoLA/seed_3.tmp"), ("SST-2/seed_1", "SST-2/seed_1"),
        ("SST-2/seed_2", "SST-2/seed_2"), ("SST-2/seed_10", "SST-2/seed_10.tmp"),
        ("other/seed_1", "other/seed_1")]
