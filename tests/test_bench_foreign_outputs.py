"""`bertgpu bench` writes only into its own results: `bench model --out` appended its rows to
any .jsonl (a run's metrics.jsonl, a corpus, which `prepare` then could not read) and to a CSV
of another header (rows of empty fields: every measurement lost), and `bench scaling|quality|
finetune-scaling --out DIR` wrote runs, data and results into any folder (a tokenizer's, a
run's; `bench quality` even replaced its tokenizer/ and data/). Each is now refused in one line
before any measurement; the suites' own earlier outputs are still added to."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bertgpu.bench import scaling as bs
from bertgpu.cli import main as cli
from bertgpu.errors import BertgpuError

pytestmark = pytest.mark.usefixtures("one_thread")

BENCH_MARK = ".bertgpu-bench"  # (cells.BENCH_MARK) the suite's name in its --out folder

TINY = ["bench", "model", "--size", "tiny", "--micro-batch", "2", "--seq-len", "8", "--iters",
        "1", "--warmup", "0", "--models", "bertgpu", "--device", "cpu"]


@pytest.fixture
def no_runs(monkeypatch):
    """Every measurement or run of the suites fails the test: the refusals come before them."""
    from bertgpu.bench import finetune_scaling, quality, sharded

    def ran(*args, **kwargs):
        raise AssertionError("a benchmark ran")

    for module, name in ((bs, "_run_point"), (quality, "run_bench"),
                         (finetune_scaling, "run_study"), (sharded, "measure")):
        monkeypatch.setattr(module, name, ran)


def _refused(argv: list[str], capsys, message: str) -> None:
    assert cli(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_bench_model_refuses_a_file_that_holds_no_bench_model_rows(tmp_path, capsys, no_runs):
    files = {
        "metrics.jsonl": '{"kind": "train", "step": 1, "loss": 7.5}\n',
        "corpus.jsonl": '{"text": "A sentence of a corpus."}\n',
        "notes.jsonl": "\nnot json at all\n",
        "other.csv": "id,text\n1,hello\n",
        "quality.jsonl": '{"bench": "quality", "run_id": "x"}\n',
        "memory.csv": "bench,strategy,ranks\nmodel_memory,ddp,1\n",  # another kind's columns
    }
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text)
        _refused([*TINY, "--out", str(path)], capsys,
                 f"{path}: not a file of `bench: model` rows (")
        assert path.read_text() == text, name
    # --strategy's rows too, before its processes start
    path = tmp_path / "metrics.jsonl"
    _refused(["bench", "model", "--strategy", "fsdp", "--size", "tiny", "--out", str(path)],
             capsys, f"{path}: not a file of `bench: model_memory` rows (its first line is "
                     "not a row with a bench field")


def test_bench_model_appends_to_its_own_files(tmp_path, capsys):
    jsonl = tmp_path / "rows.jsonl"
    first = {"bench": "model_memory", "strategy": "ddp", "ranks": 1}
    jsonl.write_text(json.dumps(first) + "\n")  # --strategy's rows share a JSONL file
    assert cli([*TINY, "--out", str(jsonl)]) == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert rows[0] == first and [r["bench"] for r in rows[1:]] == ["model"]
    table = tmp_path / "rows.csv"
    for _ in range(2):
        assert cli([*TINY, "--out", str(table)]) == 0
    lines = table.read_text().splitlines()
    assert lines[0].startswith("bench,") and len(lines) == 3
    assert all(line.startswith("model,bert,bertgpu,tiny,") for line in lines[1:]), lines
    capsys.readouterr()


@pytest.mark.parametrize("suite, argv", [
    ("scaling", ["--workers", "1", "--device", "cpu"]),
    ("quality", []),
    ("finetune-scaling", []),
])
def test_bench_suites_refuse_a_folder_that_is_not_their_output(tmp_path, capsys, no_runs, suite,
                                                               argv):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    _refused(["bench", suite, *argv, "--out", str(folder)], capsys,
             f"{folder}: a folder that is not an output of bertgpu bench {suite}")
    assert [p.name for p in folder.iterdir()] == ["vocab.txt"]
    other = tmp_path / "other"  # another suite's output is not this one's either
    other.mkdir()
    (other / BENCH_MARK).write_text("some-other-suite\n")
    _refused(["bench", suite, *argv, "--out", str(other)], capsys,
             f"{other}: a folder that is not an output of bertgpu bench {suite}")


def test_bench_scaling_adds_to_its_own_folder_even_after_a_failed_run(tmp_path, monkeypatch):
    """A run that stopped before its results (a point past --timeout-s) left runs/ and
    synthetic_data/ only: the folder is still the benchmark's to the next run."""
    out = tmp_path / "scaling"
    argv = ["--workers", "1", "--accumulation", "1", "--device", "cpu", "--out", str(out)]

    def timed_out(*args, **kwargs):
        raise BertgpuError("no result within --timeout-s 1")

    monkeypatch.setattr(bs, "_run_point", timed_out)
    parse = argparse.ArgumentParser()
    bs.add_arguments(parse)
    with pytest.raises(BertgpuError, match="no result"):
        bs.main(parse.parse_args(argv))
    assert sorted(p.name for p in out.iterdir()) == [BENCH_MARK, "runs", "synthetic_data"]

    def point(args, data_dir, workers, accumulation, micro, model_overrides, env, runs_dir):
        return {"workers": workers, "accumulation": accumulation, "micro_batch_size": micro,
                "global_batch": micro * accumulation * workers, "wall_s": 1.0,
                "tokens_per_s": 100.0, "step_time_s": 0.1, "steps_measured": 2,
                "comm_share": 0.0, "data_wait_share": 0.0}

    monkeypatch.setattr(bs, "_run_point", point)
    assert bs.main(parse.parse_args(argv)) == 0
    assert len((out / "scaling.jsonl").read_text().splitlines()) == 1


def test_bench_scaling_is_refused_a_run_folder(tmp_path, capsys, no_runs):
    """A pretraining run folder given as --out got runs/, synthetic_data/ and scaling.* beside
    its checkpoints."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    _refused(["bench", "scaling", "--workers", "1", "--device", "cpu", "--out", str(run)], capsys,
             f"{run}: a folder that is not an output of bertgpu bench scaling (no scaling.jsonl)")
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]
    assert Path(run / "metrics.jsonl").read_text() == '{"kind": "train", "step": 1}\n'


def test_an_older_bench_scaling_folder_stopped_before_its_results_is_still_its_own(tmp_path):
    """A run of the bertgpu before the mark, stopped before its results, left runs/ and
    synthetic_data/ only: refused as "not an output of bertgpu bench scaling", where users
    re-run into it. Its synthetic_data/ (only bench scaling makes one) says whose it is; a
    folder that only has runs/ (any project's) stays refused, and says how to mark it."""
    from bertgpu.bench import cells

    old = tmp_path / "old"
    (old / "runs" / "w1").mkdir(parents=True)
    (old / "synthetic_data").mkdir()
    cells.check_bench_folder(old, "scaling", ["scaling.jsonl"], ("synthetic_data",))
    project = tmp_path / "project"
    (project / "runs").mkdir(parents=True)
    with pytest.raises(BertgpuError, match=r"echo scaling > .*\.bertgpu-bench"):
        cells.check_bench_folder(project, "scaling", ["scaling.jsonl"], ("synthetic_data",))
    assert cli(["bench", "scaling", "--predict-only", "--device", "cuda:1"]) == 0
