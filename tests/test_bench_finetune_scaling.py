"""`bertgpu bench finetune-scaling`: a tiny grid (1-2 workers x aggregation 1, 2, one optimizer) on
a tiny init and a learnable classification fixture; every number of the JSONL rows and of the
table is the one in the cell's own results.json, speedup and efficiency are recomputed from
those files, the 2-worker cell trains like its 1-worker reference (same global batch, no
dropout), and `bertgpu report` renders the study. Bad grids fail in one line before any work.
Plus fine-tuning's lr scaling and the timing fields of results.json."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
from _tiny_init import SPECIAL, tiny_init

from bertgpu.bench import finetune_scaling as fs
from bertgpu.bench.finetune_grid import parse_target, plan_cells
from bertgpu.cli import main
from bertgpu.errors import BertgpuError

WORDS = "apple river stone cloud table green quiet music paper window garden silver".split()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
TIMES = ("seconds", "load_seconds", "load_data_seconds", "train_seconds", "eval_seconds",
         "data_wait_seconds", "train_examples_per_s", "eval_examples_per_s")


def classify_fixture(folder: Path, n_train: int = 64, n_dev: int = 16) -> tuple[Path, Path]:
    """JSONL files where the label is whether "good" or "bad" is in the sentence."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", n_train), ("dev", n_dev)):
        lines = []
        for _ in range(n):
            y = rng.randrange(2)
            words = rng.sample(WORDS, 4)
            words.insert(rng.randrange(5), "good" if y else "bad")
            lines.append(json.dumps({"text": " ".join(words), "label": "pos" if y else "neg"}))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        paths.append(folder / f"{split}.jsonl")
    return paths[0], paths[1]


@pytest.fixture(scope="module")
def fixture(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("fs")
    train, dev = classify_fixture(tmp / "data")
    init = tiny_init(tmp, SPECIAL + ["good", "bad"] + WORDS)
    # No attention dropout either (the study's --ft hidden_dropout_prob=0 sets the rest): a cell
    # and its 1-worker reference then differ only in floating-point summation order.
    config = json.loads((init / "config.json").read_text(encoding="utf-8"))
    config["attention_probs_dropout_prob"] = 0.0
    (init / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return {"tmp": tmp, "init": init, "train": train, "dev": dev}


def _argv(fx: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["bench", "finetune-scaling", "--task", "classify", "--train-file", str(fx["train"]),
            "--dev-file", str(fx["dev"]), "--init", str(fx["init"]), "--device", "cpu",
            "--out", str(out), *extra]


# --------------------------------------------------------------------------------------------
# The grid


def test_references_are_added_and_run_first():
    cells = plan_cells([1, 2], [1, 4, 16], ["adamw", "radam"], ["none"], [0])
    names = [(c.optimizer, c.workers, c.aggregation, c.reference_only) for c in cells]
    assert names[:9] == [
        ("adamw", 1, 1, False), ("adamw", 1, 2, True), ("adamw", 1, 4, False),
        ("adamw", 1, 8, True), ("adamw", 1, 16, False), ("adamw", 1, 32, True),
        ("adamw", 2, 1, False), ("adamw", 2, 4, False), ("adamw", 2, 16, False)]
    assert len(cells) == 18
    for i, c in enumerate(cells):  # every cell's reference (same global batch, 1 worker) runs first
        ref = c.reference()
        assert ref.workers * ref.aggregation == c.workers * c.aggregation
        assert any(r.name == ref.name for r in cells[:i + 1])


def test_time_to_target_is_the_train_time_of_the_first_epoch_that_reaches_it():
    res = {"epochs": [{"epoch": e, "train_seconds": 10.0 * e, "score": s,
                       "metrics": {"dev_matched": {"accuracy": s},
                                   "dev_mismatched": {"accuracy": s + 5}}}
                      for e, s in ((1, 70.0), (2, 80.0), (3, 79.0))]}

    def reached(target: str) -> tuple:
        return fs.time_to_target(res, parse_target(target, "mnli", False))

    assert reached("accuracy=80") == (20.0, 2)
    assert reached("dev_mismatched.accuracy=75") == (10.0, 1)
    assert reached("Score=81") == (None, None)
    assert parse_target("F1=88.5", "squad", False).metric == "f1"
    assert parse_target("HasAns_F1=80", "squad2", False).metric == "HasAns_f1"


@pytest.mark.parametrize("extra, message", [
    (["--workers", "1", "1"], "--workers 1 1: a value is repeated"),
    (["--workers", "0", "1"], "--workers 0 1: expected positive integers"),
    (["--aggregation", "4", "4"], "--aggregation 4 4: a value is repeated"),
    (["--seeds", "3", "3"], "--seeds 3 3: a value is repeated"),
    (["--optimizer", "adamw", "sgd"], "--optimizer 'sgd': expected one of adamw, lamb, radam"),
    (["--optimizer", "radam", "radam"], "--optimizer radam radam: a value is repeated"),
    (["--lr-scaling", "cubic"], "--lr-scaling 'cubic': expected one of none, linear, sqrt"),
    (["--target", "f1=90"], "--target 'f1=90': classify reports accuracy, macro_f1, score"),
    (["--target", "accuracy"], "--target 'accuracy': expected METRIC=VALUE"),
    (["--ft", "global_batch_size=8"], "every cell sets global_batch_size itself"),
    (["--ft", "epochz=2"], "epochz"),
    (["--workers", "1", str(CORES + 1)], "cores; expected at most one thread per core"),
    (["--threads-per-worker", "0"], "--threads-per-worker 0: expected a positive integer"),
])
def test_bad_grids_fail_in_one_line_before_any_work(fixture, tmp_path, capsys, extra, message):
    out = tmp_path / "out"
    assert main(_argv(fixture, out, *extra)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not out.exists()


def test_bad_task_flags_and_batches_fail_before_any_work(fixture, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["bench", "finetune-scaling", "--init", str(fixture["init"]), "--out", str(out),
            "--device", "cpu"]
    pytest.importorskip("gensim", reason="the polarity set is gensim's test data")
    polarity = [*base, "--task", "polarity"]
    assert main([*polarity, "--micro-batch-size", "8", "--aggregation", "16"]) == 2
    assert ("global batch 256 (micro batch x aggregation x workers, the largest cell): polarity "
            "has 160 training examples") in capsys.readouterr().err
    assert main([*polarity, "--data", "x"]) == 2
    assert "--data: --task polarity is a set that ships offline" in capsys.readouterr().err
    assert main([*base, "--task", "classify", "--train-file", str(fixture["train"])]) == 2
    assert "--dev-file" in capsys.readouterr().err
    assert main([*base, "--task", "nosuchtask"]) == 2
    err = capsys.readouterr().err  # the bench's own offline sets are named too
    assert "nosuchtask" in err
    assert err.rstrip().endswith("or a set that ships offline: polarity, lee")
    assert not out.exists()


# --------------------------------------------------------------------------------------------
# A tiny study end to end


@pytest.fixture(scope="module")
def study(fixture) -> Path:
    out = fixture["tmp"] / "study"
    # sqrt lr scaling from batch 4: every cell's peak lr differs, and a cell and its reference
    # (same global batch) share theirs; no dropout, so they train alike.
    assert main(_argv(fixture, out, "--workers", "1", "2", "--aggregation", "1", "2",
                      "--optimizer", "adamw", "--micro-batch-size", "4", "--epochs", "2",
                      "--lr", "3e-3", "--max-seq-len", "16", "--lr-scaling", "sqrt",
                      "--target", "accuracy=50", "--ft", "hidden_dropout_prob=0",
                      "--ft", "log_every_steps=1")) == 0
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "finetune_scaling.jsonl").read_text().splitlines()]


def _results(row: dict) -> dict:
    return json.loads((Path(row["dir"]) / "results.json").read_text())


@pytest.mark.timeout(400)
def test_every_number_is_the_runs_own(study: Path):
    rows = _rows(study)
    cells = [(r["workers"], r["aggregation"], r["global_batch"], r["reference_only"]) for r in rows]
    assert cells == [(1, 1, 4, False), (1, 2, 8, False), (1, 4, 16, True), (2, 1, 8, False),
                     (2, 2, 16, False)]
    by_cell = {r["cell"]: r for r in rows}
    for r in rows:
        res = _results(r)
        assert res["world_size"] == r["workers"]
        assert res["config"]["global_batch_size"] == r["global_batch"]
        assert res["config"]["micro_batch_size"] == 4 and res["config"]["lr_scaling"] == "sqrt"
        for key in TIMES:
            assert r[key] == res[key], key
        # The rate from the run's own counts: every epoch trains on all 64 examples, whatever the
        # worker count (examples counted per rank would halve the 2-worker cells' speedup).
        assert res["train_sequences"] == 64 and len(res["epochs"]) == 2
        assert r["train_examples_per_s"] == pytest.approx(2 * 64 / res["train_seconds"], rel=1e-9)
        assert r["steps"] == res["steps"] == 2 * math.ceil(64 / r["global_batch"])
        assert r["metric_value"] == res["metrics"]["dev"]["accuracy"] and r["score"] == res["score"]
        assert r["peak_lr"] == res["peak_lr"]
        assert res["peak_lr"] == pytest.approx(3e-3 * math.sqrt(r["global_batch"] / 4))
        assert r["data_wait_share"] == res["data_wait_seconds"] / res["train_seconds"]
        # Time to target: the cumulative train time at the first epoch that reaches it.
        first = next(e for e in res["epochs"] if e["metrics"]["dev"]["accuracy"] >= 50)
        assert r["time_to_target_s"] == first["train_seconds"]
        assert r["epochs_to_target"] == first["epoch"]
        # Speedup against the 1-worker run at the same global batch, from the two results.json.
        ref = _results(by_cell[r["reference_cell"]])
        assert by_cell[r["reference_cell"]]["workers"] == 1
        assert ref["config"]["global_batch_size"] == r["global_batch"]
        assert r["speedup"] == res["train_examples_per_s"] / ref["train_examples_per_s"]
        assert r["efficiency"] == r["speedup"] / r["workers"]
        assert not (Path(r["dir"]) / "model").exists()  # exports removed unless --keep-models


@pytest.mark.timeout(400)
def test_time_to_target_reached_at_a_later_epoch(study: Path, tmp_path):
    """The row of a cell that first reaches the target at epoch 2 carries epoch 2's cumulative
    train time (not that epoch's own time, nor epoch 1's). The study's cells all reach 50% at
    epoch 1, so a 2-worker cell's results.json is read with its epoch-1 accuracy set below."""
    from bertgpu.bench.finetune_grid import Cell, Plan

    row = next(r for r in _rows(study) if r["workers"] == 2 and r["aggregation"] == 1)
    res = _results(row)
    res["epochs"][0]["metrics"]["dev"]["accuracy"] = 10.0
    (tmp_path / "results.json").write_text(json.dumps(res), encoding="utf-8")
    cell = Cell("adamw", "sqrt", 0, 2, 1)
    plan = Plan(cells=[cell], micro=4, reference_batch=4, device="cpu", threads=None,
                init=str(row["dir"]), target=parse_target("accuracy=50", "classify", False),
                task_words=[], overrides=[])
    got = fs.read_cell(tmp_path, cell, plan, wall_s=row["wall_s"])
    first, second = (e["train_seconds"] for e in res["epochs"])
    assert 0 < first < second
    assert (got["time_to_target_s"], got["epochs_to_target"]) == (second, 2)


@pytest.mark.timeout(400)
def test_results_json_times_add_up(study: Path):
    for r in _rows(study):
        res = _results(r)
        epochs = res["epochs"]
        assert epochs[-1]["train_seconds"] == res["train_seconds"]  # cumulative, per epoch
        assert 0 < epochs[0]["train_seconds"] < epochs[1]["train_seconds"]
        assert res["eval_seconds"] == pytest.approx(sum(e["eval_seconds"] for e in epochs))
        assert 0 <= res["data_wait_seconds"] <= res["train_seconds"]
        assert 0 < res["load_data_seconds"] <= res["load_seconds"]
        assert res["load_seconds"] + res["train_seconds"] + res["eval_seconds"] <= res["seconds"]
        assert res["seconds"] < r["wall_s"]
        records = (Path(r["dir"]) / "metrics.jsonl").read_text().splitlines()
        lrs = [x["lr"] for x in map(json.loads, records) if x["kind"] == "train"]
        # The engine trains at the scaled lr: the logged lr (after warm-up, at most the peak) comes
        # within a warm-up/decay step of it; unscaled, the G=16 cells would be at half of it.
        assert res["peak_lr"] / 1.2 < max(lrs) <= res["peak_lr"] * (1 + 1e-5)


@pytest.mark.timeout(400)
def test_same_global_batch_trains_alike(study: Path):
    """DP=2 with aggregation k is the 1-worker run with aggregation 2k: same steps and losses (no
    dropout anywhere, so only the summation order differs)."""
    rows = _rows(study)
    for r in (r for r in rows if r["workers"] == 2):
        one = _results(next(x for x in rows if x["cell"] == r["reference_cell"]))
        two = _results(r)
        assert two["steps"] == one["steps"]
        assert [e["train_loss"] for e in two["epochs"]] == pytest.approx(
            [e["train_loss"] for e in one["epochs"]], rel=1e-5)


def _table(md: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in md.splitlines() if line.startswith("| optimizer |")]
    assert len(lines) == 1
    block = md.split(lines[0], 1)[1].splitlines()[2:]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in block if line.startswith("|")]
    return [c.strip() for c in lines[0].strip("|").split("|")], rows


@pytest.mark.timeout(400)
def test_table_and_report(study: Path, tmp_path):
    rows = _rows(study)
    for md in ((study / "finetune_scaling.md").read_text(),):
        header, cells = _table(md)
        assert len(cells) == len(rows)
        for r, line in zip(rows, cells, strict=True):
            res, got = _results(r), dict(zip(header, line, strict=True))
            assert got["workers"] == str(res["world_size"])
            assert got["global batch"] == str(res["config"]["global_batch_size"])
            assert got["steps"] == str(res["steps"])
            assert got["dev accuracy"] == f"{res['metrics']['dev']['accuracy']:.1f}"
            assert got["train s"] == f"{res['train_seconds']:.1f}"
            assert got["train examples/s"] == f"{res['train_examples_per_s']:.1f}"
            assert got["load s"] == f"{res['load_seconds']:.1f}"
            assert got["eval s"] == f"{res['eval_seconds']:.1f}"
            assert got["efficiency"] == f"{r['efficiency']:.2f}"
            assert got["aggregation"].endswith("(ref)") == r["reference_only"]
    for png in ("finetune_scaling_metric.png", "finetune_scaling_efficiency.png"):
        assert (study / png).read_bytes()[:8] == PNG_MAGIC
    report = tmp_path / "rep"
    assert main(["report", str(study / "finetune_scaling.jsonl"), "--out", str(report)]) == 0
    text = (report / "README.md").read_text()
    assert "## Fine-tuning scaling" in text and "Time split over the 5 cells" in text
    assert _table(text) == _table((study / "finetune_scaling.md").read_text())
    for png in ("finetune_scaling0_metric.png", "finetune_scaling0_efficiency.png"):
        assert f"]({png})" in text and (report / png).read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------------------------
# Fine-tuning's lr scaling


def test_lr_scaling_needs_a_reference_batch():
    from bertgpu.config.finetune import load_finetune_config, peak_lr

    with pytest.raises(BertgpuError, match="reference_batch_size = None: expected the global"):
        load_finetune_config(None, ["--lr_scaling", "linear"])
    cfg = load_finetune_config(None, ["--lr_scaling", "linear", "--reference_batch_size", "8",
                                      "--lr", "1e-4", "--global_batch_size", "32"])
    assert peak_lr(cfg) == pytest.approx(4e-4) and cfg.lr == 1e-4
    assert peak_lr(load_finetune_config(None, ["--lr", "1e-4"])) == 1e-4
