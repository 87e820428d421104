"""Three gaps in what runs and benchmarks record, and in `bertgpu watch`'s start:

1. a fine-tuning run's start record names its task, and `bertgpu report` / `bertgpu watch` take
   it from there (a run in progress has no checkpoint to read it from until one is written);
2. `bertgpu watch OUT` started before the run made OUT (or OUT.tmp) waits for it instead of
   saying "does not exist", when the folder OUT goes in exists;
3. `bench model` rows carry the peak TFLOP/s their MFU is over, and where it came from, and the
   report says it under the table.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import rich.console
from test_finetune import sst2_fixture, tiny_init
from test_report import _write_jsonl

from bertgpu import watch
from bertgpu.cli import main as cli_main
from bertgpu.report import build_report
from bertgpu.report.inputs import load_source
from bertgpu.telemetry.records import read_metrics, run_start


def _info(step: int, event: str, **fields) -> dict:
    return {"step": step, "kind": "info", "time": 1.7e9 + step, "elapsed_s": 2.0 * step,
            "event": event, **fields}


def _train(step: int) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step, "elapsed_s": 2.0 * step,
            "loss": 0.7 / step, "epoch": 1, "lr": 1e-4, "tokens_per_s": 300.0,
            "tokens_seen": 500 * step}


def _once(capsys, monkeypatch, folder: Path) -> str:
    monkeypatch.setenv("COLUMNS", "160")
    assert cli_main(["watch", str(folder), "--once"]) == 0
    return " ".join(capsys.readouterr().out.split())


# --- 1. the task in a fine-tuning run's start record ---------------------------------------------


@pytest.mark.usefixtures("one_thread")
def test_a_finetuning_runs_start_record_names_its_task(tmp_path):
    """A real (tiny) run: its start record's task is results.json's, as the user gave it."""
    init = tiny_init(tmp_path)
    sst2_fixture(tmp_path / "SST-2", n_train=16, n_dev=8)
    from bertgpu.finetune import finetune

    res = finetune("SST-2", tmp_path / "SST-2", init, tmp_path / "ft",
                   overrides=["--epochs", "1", "--global_batch_size", "8", "--max_seq_len", "16"])
    start = run_start(read_metrics(tmp_path / "ft"))
    assert start is not None and start["task"] == res["task"] == "SST-2"


def _run_in_progress(work: Path, task: str | None, checkpoint_task: str | None = None) -> Path:
    """OUT.tmp of a fine-tuning run in its first epoch: no evaluation, no scratch mark (a
    folder made by hand, or copied), a checkpoint only with `checkpoint_task`."""
    work.mkdir(parents=True)
    start = _info(0, "start", host="elsewhere", pid=1, world_size=1, max_steps=30)
    _write_jsonl(work / "metrics.jsonl", [{**start, **({"task": task} if task else {})},
                                          _train(5), _train(10)])
    if checkpoint_task:
        step = work / "checkpoints" / "step_10"
        step.mkdir(parents=True)
        (step / "finetune.json").write_text(json.dumps({"task": checkpoint_task}),
                                            encoding="utf-8")
    return work


def test_report_and_watch_take_the_task_from_the_start_record(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sst2"
    _run_in_progress(tmp_path / "sst2.tmp", "sst2")
    source = load_source(out)
    assert source.kind == "finetune"  # the start record's task says it is one
    assert source.data["task"] == "sst2"
    md = (build_report([out], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "| sst2 | sst2 |" in md
    assert "fine-tuning sst2" in _once(capsys, monkeypatch, out)
    # The start record comes first; a run of an older version (no task in its start record)
    # still has its checkpoint's, and one with neither has none.
    both = _run_in_progress(tmp_path / "both.tmp", "mrpc", checkpoint_task="MRPC-as-given")
    assert load_source(both).data["task"] == "mrpc"
    assert "fine-tuning mrpc" in _once(capsys, monkeypatch, both)
    older = _run_in_progress(tmp_path / "older.tmp", None, checkpoint_task="rte")
    assert load_source(older).data["task"] == "rte"
    assert "fine-tuning rte" in _once(capsys, monkeypatch, older)
    bare = _run_in_progress(tmp_path / "bare.tmp", None)
    (bare / ".bertgpu-scratch").touch()  # else nothing tells it from a pretraining run
    assert load_source(bare).data["task"] == ""
    assert "fine-tuning" not in _once(capsys, monkeypatch, bare)


# --- 2. watch before the run made its folder ----------------------------------------------------


def _terminal(monkeypatch) -> io.StringIO:
    """watch's console as a terminal's (a live view draws nothing into a pipe), into a buffer."""
    buf = io.StringIO()
    real = rich.console.Console
    monkeypatch.setattr(rich.console, "Console",
                        lambda: real(file=buf, force_terminal=True, width=160))
    return buf


@pytest.mark.parametrize("made", ["base", "base.tmp"])
def test_watch_waits_for_a_run_folder_not_made_yet(tmp_path, monkeypatch, made):
    """`bertgpu pretrain ... --out OUT &` then `bertgpu watch OUT`: OUT (or a fine-tuning run's
    OUT.tmp) appears a moment later; watch polls at its interval until it does, then follows it."""
    buf = _terminal(monkeypatch)
    sleeps = []

    def fake_sleep(s: float) -> None:
        sleeps.append(s)
        if len(sleeps) == 2:  # the run starts while watch waits
            (tmp_path / made).mkdir()
            _write_jsonl(tmp_path / made / "metrics.jsonl", [_train(1), _train(2)])
        elif len(sleeps) > 2:
            raise KeyboardInterrupt  # Ctrl-C in the live view

    monkeypatch.setattr(watch.time, "sleep", fake_sleep)
    assert cli_main(["watch", str(tmp_path / "base"), "--interval", "0.25"]) == 0
    assert sleeps == [0.25, 0.25, 0.25]
    text = " ".join(buf.getvalue().split())
    assert "waiting for it (or base.tmp) to appear" in text
    assert "step 2" in text and f"bertgpu watch {tmp_path / made}" in text


def test_ctrl_c_while_waiting_and_what_is_still_an_error(tmp_path, monkeypatch, capsys):
    buf = _terminal(monkeypatch)

    def ctrl_c(s: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(watch.time, "sleep", ctrl_c)
    assert cli_main(["watch", str(tmp_path / "base")]) == 0  # as Ctrl-C in the live view
    assert "waiting for it" in buf.getvalue() and "interrupted" not in capsys.readouterr().err
    # A folder that is not there either (a typo) and --once stay the one-line error.
    for argv in (["watch", str(tmp_path / "typo" / "base")],
                 ["watch", str(tmp_path / "base"), "--once"]):
        assert cli_main(argv) == 2
        err = capsys.readouterr().err
        assert "base: does not exist; expected a run folder" in err and err.count("\n") == 1


# --- 3. the peak TFLOP/s of bench model's MFU ---------------------------------------------------


def _bench(out: Path, *flags: str) -> list[dict]:
    import argparse

    from bertgpu.bench import model as bench_model

    parser = argparse.ArgumentParser()
    bench_model.add_arguments(parser)
    args = parser.parse_args(["--size", "tiny", "--micro-batch", "2", "--seq-len", "8",
                              "--iters", "1", "--warmup", "0", "--models", "bertgpu",
                              "--out", str(out), *flags])
    assert bench_model.main(args) == 0
    if out.suffix == ".csv":
        with out.open(newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.mark.usefixtures("one_thread")
def test_bench_model_rows_carry_the_peak_of_their_mfu(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.delenv("BERTGPU_PEAK_TFLOPS", raising=False)
    (row,) = _bench(tmp_path / "flag.jsonl", "--peak-tflops", "2")
    assert row["mfu"] > 0 and (row["peak_tflops"], row["peak_source"]) == (2.0, "--peak-tflops")
    assert "MFU is over a peak of 2 TFLOP/s (--peak-tflops) per device" in capsys.readouterr().out
    monkeypatch.setenv("BERTGPU_PEAK_TFLOPS", "3")
    (env,) = _bench(tmp_path / "env.csv")
    assert (float(env["peak_tflops"]), env["peak_source"]) == (3.0, "BERTGPU_PEAK_TFLOPS")
    from bertgpu.bench.model import peak_of

    monkeypatch.delenv("BERTGPU_PEAK_TFLOPS")
    assert peak_of("NVIDIA H100 80GB HBM3", "bf16", None) == (989.0, "table: H100 SXM bf16")
    assert peak_of("NVIDIA H100 80GB HBM3", "bf16", 500.0) == (500.0, "--peak-tflops")
    assert peak_of(None, "fp32", None) == (None, None)  # a CPU has no table entry: no MFU
    # fp32 rows on a GPU run on TF32 tensor cores (bench and training allow them): TF32's peak,
    # as training's MFU takes it, not the CUDA cores' 67 TFLOP/s
    assert peak_of("NVIDIA H100 80GB HBM3", "fp32", None) == (494.0, "table: H100 SXM tf32")
    # The report says which peak, under the table; rows of older versions render as before.
    old = {k: v for k, v in row.items() if k not in ("peak_tflops", "peak_source")}
    _write_jsonl(tmp_path / "old.jsonl", [old])
    md = (build_report([tmp_path / "flag.jsonl", tmp_path / "old.jsonl"], tmp_path / "rep")
          / "README.md").read_text(encoding="utf-8")
    assert md.count("MFU is model FLOP/s over the peak of one device") == 1
    assert "MFU is model FLOP/s over the peak of one device: 2 TFLOP/s (--peak-tflops)." in md
    assert "## Benchmark: old" in md


def test_csv_rows_follow_the_header_of_the_file_they_are_appended_to(tmp_path, capsys):
    """A CSV begun before rows had a peak_tflops column: new rows stay under the right names."""
    from bertgpu.bench.cells import append_rows

    path = tmp_path / "rows.csv"
    append_rows(path, [dict(model="a", mfu=0.5, tokens_per_s=1.0)])
    append_rows(path, [dict(model="b", mfu=0.25, peak_tflops=989.0, tokens_per_s=2.0)])
    with path.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["model"], r["mfu"], r["tokens_per_s"]) for r in rows] == [
        ("a", "0.5", "1.0"), ("b", "0.25", "2.0")]
    assert all(None not in r for r in rows)  # no value beyond the header's columns
    assert "rows.csv: its header has no column peak_tflops" in capsys.readouterr().out
