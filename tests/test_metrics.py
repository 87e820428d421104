"""Tests for bertgpu.telemetry.metrics: throughput with a fake clock, memory, and the metrics log
(JSON lines, resume, ranks, console)."""

from __future__ import annotations

import io
import json
import math

import pytest

from bertgpu.errors import BertgpuError
from bertgpu.telemetry.console import format_startup_table
from bertgpu.telemetry.metrics import MetricsLogger, Throughput, device_memory, gpu_utilisation
from bertgpu.telemetry.records import read_metrics

# --------------------------------------------------------------------------------------------
# Memory, GPU state, throughput, formatting
# --------------------------------------------------------------------------------------------


def test_device_memory_cpu_and_gpu_utilisation_degrade():
    mem = device_memory("cpu")
    assert mem["mem_peak_gib"] > 0
    assert mem["mem_peak_gib"] >= mem.get("mem_rss_gib", 0) * 0.99
    assert isinstance(gpu_utilisation(), dict)  # {} without nvidia-ml-py or a GPU


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_throughput_rates_with_fake_clock():
    clock = FakeClock()
    tp = Throughput(window=3, n_devices=2, clock=clock)
    assert tp.rates() == {}
    clock.t += 2.0
    tp.update(tokens=1024, sequences=8)  # 512 tok/s over 2 s
    r = tp.rates()
    assert r["tokens_per_s"] == pytest.approx(512)
    assert r["tokens_per_s_per_device"] == pytest.approx(256)
    assert r["sequences_per_s"] == pytest.approx(4)
    assert r["steps_per_s"] == pytest.approx(0.5)
    assert r["step_time_s"] == pytest.approx(2.0)
    # Then 4 fast steps of 1 s each: the window (3 updates) forgets the slow first step.
    for _ in range(4):
        clock.t += 1.0
        tp.update(tokens=1024, sequences=8)
    r = tp.rates()
    assert r["tokens_per_s"] == pytest.approx(1024)
    assert r["sequences_per_s_per_device"] == pytest.approx(4)
    assert r["steps_per_s"] == pytest.approx(1.0)
    assert (tp.tokens, tp.sequences, tp.steps) == (5 * 1024, 40, 5)
    # reset() drops the window (e.g. after an eval pause) but keeps the totals.
    clock.t += 100.0
    tp.reset()
    assert tp.rates() == {}
    clock.t += 0.5
    tp.update(tokens=1024, sequences=8)
    assert tp.rates()["tokens_per_s"] == pytest.approx(2048)
    assert tp.tokens == 6 * 1024


def test_throughput_leaves_compile_steps_and_the_first_step_out():
    """Steps during which torch compiled (the compile counter moved) are timed apart as
    compile_s and kept out of the rates, so the first rate is already the steady one; the first
    step is kept out also when nothing compiled; compile work before a reset() (an evaluation
    that compiled) does not mark the next step."""
    clock, events = FakeClock(), [0]
    tp = Throughput(window=3, clock=clock, compile_events=lambda: events[0], skip_first=True)

    def step(seconds: float, compiles: int = 0) -> None:
        clock.t += seconds
        events[0] += compiles
        tp.update(tokens=1000, sequences=4)

    step(30.0, compiles=15)  # the first compile
    assert tp.rates() == {}
    assert tp.compile_fields() == {"compile_s": 30.0, "compile_steps": 1, "rate_steps": 0}
    step(0.5)
    assert tp.rates()["tokens_per_s"] == pytest.approx(2000)  # the steady rate at once
    step(5.0, compiles=3)  # a recompile
    step(0.5)
    assert tp.rates()["tokens_per_s"] == pytest.approx(2000)
    assert tp.rates()["step_time_s"] == pytest.approx(0.5)
    assert tp.compile_fields() == {"compile_s": 35.0, "compile_steps": 2, "rate_steps": 2}
    assert (tp.tokens, tp.steps, tp.warmup_s) == (4000, 4, 0.0)
    clock.t += 60.0  # an evaluation that compiled its own graph, then reset()
    events[0] += 7
    tp.reset()
    step(0.25)
    assert tp.rates()["tokens_per_s"] == pytest.approx(4000) and tp.compile_steps == 2
    # Nothing compiled: the first step (cold caches) is warm-up, neither rate nor compile.
    plain = Throughput(clock=clock, compile_events=lambda: 0, skip_first=True)
    clock.t += 9.0
    plain.update(tokens=1000, sequences=4)
    assert plain.rates() == {} and plain.warmup_s == 9.0 and plain.compile_s == 0.0
    clock.t += 1.0
    plain.update(tokens=1000, sequences=4)
    assert plain.rates()["tokens_per_s"] == pytest.approx(1000)


def test_compile_events_mark_compiles_and_recompiles_only(one_thread):
    """torch's own record of compile work grows in a step that compiles (forward and the lazily
    compiled backward) or recompiles (a new shape), and not in a step that reuses a graph."""
    import torch

    from bertgpu.telemetry.throughput import compile_events

    torch._dynamo.reset()
    model = torch.compile(torch.nn.Linear(4, 4), backend="aot_eager", dynamic=False)
    compiled = []
    for rows in (2, 2, 3, 3, 2):
        before = compile_events()
        model(torch.randn(rows, 4)).sum().backward()
        compiled.append(compile_events() > before)
    torch._dynamo.reset()
    assert compiled == [True, False, True, False, False]


def test_console_shows_compile_time_only_when_something_compiled():
    from bertgpu.telemetry.console import console_fields

    assert console_fields({"tokens_per_s": 2000.0, "compile_s": 0.0, "compile_steps": 0}) == [
        "tok/s 2.0k"]
    assert console_fields({"tokens_per_s": 2000.0, "compile_s": 27.14, "compile_steps": 2}) == [
        "tok/s 2.0k", "compile 27.1 s"]


def test_format_startup_table():
    text = format_startup_table(
        [("per-device batch", "32"), ("devices", "8"), ("global batch", "256")], title="batch"
    )
    lines = text.splitlines()
    assert lines[0] == "batch"
    assert lines[1] == "  per-device batch  32"
    assert lines[2] == "  devices           8"
    assert len({line.index(v) for line, v in zip(lines[1:], ["32", "8", "256"], strict=True)}) == 1
    assert format_startup_table([]) == ""


# --------------------------------------------------------------------------------------------
# MetricsLogger and read_metrics
# --------------------------------------------------------------------------------------------


def _train_scalars(i: int) -> dict:
    return {
        "loss": 2.0 / i,
        "lr": 1e-4 * i,
        "grad_norm": 0.5,
        "tokens_per_s": 123456.789,
        "sequences_per_s": 964.5,
        "mfu": 0.4213,
        "mem_peak_gib": 12.34,
    }


def test_logger_writes_valid_json_lines(tmp_path):
    out = io.StringIO()
    with MetricsLogger(tmp_path, is_main=True, total_steps=4, log_every=2, stream=out) as log:
        for i in range(1, 5):
            log.log(i, "train", **_train_scalars(i))
        log.log(4, "eval", loss=float("nan"), accuracy=0.5, mfu=None)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 5
    rows = [json.loads(line) for line in lines]  # strict JSON: NaN would not parse as standard
    train = [r for r in rows if r["kind"] == "train"]
    keys = {"step", "kind", "time", "elapsed_s", *_train_scalars(1)}
    assert all(set(r) == keys for r in train)
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert train[0]["lr"] == pytest.approx(1e-4)  # small values keep their precision
    assert train[0]["tokens_per_s"] == 123457  # rounded to 6 significant digits
    assert rows[-1]["loss"] is None  # NaN -> null
    assert "mfu" not in rows[-1]  # None scalars are dropped
    assert "NaN" not in "".join(lines)
    # Not a TTY: a plain line every log_every=2 train steps, plus the eval line; same fields.
    console = out.getvalue().splitlines()
    assert len(console) == 3
    assert console[0].startswith("train step 2/4 | loss 1.0000 | lr 2.00e-04 | gnorm 0.5")
    assert "tok/s 123.5k" in console[0] and "MFU 42.1%" in console[0]
    assert "mem 12.34GiB" in console[0] and "ETA" in console[0]
    assert console[2].startswith("eval step 4/4 | loss nan") and "accuracy 0.5" in console[2]


def test_logger_appends_on_reopen_and_read_metrics(tmp_path):
    out = io.StringIO()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=10, stream=out)
    for i in range(1, 4):
        log.log(i, "train", loss=1.0 / i)
    log.log(3, "eval", loss=0.9)
    log.close()
    log.close()  # idempotent
    # Simulate a crash mid-write, then a resume from the step-2 checkpoint.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "ki')
    log = MetricsLogger(
        tmp_path, is_main=True, total_steps=10, stream=out, initial_step=2, elapsed_offset_s=50.0
    )
    log.log(3, "train", loss=0.3)
    log.log(4, "train", loss=float("inf"))
    log.close()
    # The reopened file lost its cut line (kept, it sat mid-file once the resumed run appended,
    # and every later read, report's, refused the run as corrupt: "metrics.jsonl:5") and the
    # records of the steps after the checkpoint, which the resumed run goes through again (an
    # eval of step 3 logged twice; pandas counting steps 3 twice).
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    rows = read_metrics(tmp_path)
    assert [(r["kind"], r["step"]) for r in rows] == [("train", i) for i in (1, 2, 3, 4)]
    assert len(lines) == 4 and rows[2]["loss"] == pytest.approx(0.3)
    assert rows[0]["elapsed_s"] < 50.0 <= rows[2]["elapsed_s"]  # continues across the resume
    assert math.isnan(rows[3]["loss"])
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 5, "ki')
    again = read_metrics(tmp_path / "metrics.jsonl")  # a cut last line is skipped
    assert [(r["kind"], r["step"]) for r in again] == [(r["kind"], r["step"]) for r in rows]
    # a file of an older version, with the superseded records in it: readers drop them
    lines[2:2] = [json.dumps({"step": 3, "kind": "train", "loss": 0.1}),
                  json.dumps({"step": 3, "kind": "eval", "loss": 0.9})]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    latest = read_metrics(tmp_path, drop_superseded=True)  # the first run's step 3 is gone
    assert [(r["kind"], r["step"]) for r in latest] == [("train", i) for i in (1, 2, 3, 4)]
    assert latest[2]["loss"] == pytest.approx(0.3)


def test_logger_non_main_rank_writes_nothing(tmp_path):
    out = io.StringIO()
    log = MetricsLogger(tmp_path / "run", is_main=False, total_steps=5, stream=out)
    assert log.log(1, "train", loss=1.0) is None
    log.print("hello")
    log.close()
    assert not (tmp_path / "run").exists()
    assert out.getvalue() == ""


def test_logger_without_run_dir_and_bad_input(tmp_path):
    out = io.StringIO()
    log = MetricsLogger(None, is_main=True, total_steps=None, log_every=1, stream=out)
    record = log.log(7, "train", loss=1.5, note="warmup")
    assert record is not None and record["note"] == "warmup"
    assert out.getvalue().startswith("train step 7 | loss 1.5000")
    log.print("a message")
    assert out.getvalue().splitlines()[-1] == "a message"
    with pytest.raises(ValueError):
        log.log(1, "debug", loss=1.0)
    with pytest.raises(TypeError):
        log.log(1, "train", loss=[1.0])
    log.close()


def test_logger_unwraps_tensors_and_tensorboard_optional(tmp_path):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    out = io.StringIO()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=2, tensorboard=True, stream=out)
    log.log(1, "train", loss=torch.tensor(2.5), grad_norm=np.float32(0.25), tokens=np.int64(3))
    log.close()
    (row,) = read_metrics(tmp_path)
    assert (row["loss"], row["grad_norm"], row["tokens"]) == (2.5, 0.25, 3)


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_logger_progress_bar_on_a_terminal(tmp_path):
    out = _TTY()
    log = MetricsLogger(tmp_path, is_main=True, total_steps=10, stream=out, initial_step=2)
    for i in range(3, 6):
        log.log(i, "train", **_train_scalars(i))
    log.print("checkpoint saved")
    log.close()
    text = out.getvalue()
    assert "checkpoint saved" in text
    assert "5/10" in text and "loss" in text
    assert len(read_metrics(tmp_path)) == 3


def test_the_start_record_goes_to_the_file_only(tmp_path):
    """The start record (host and pid, for `bertgpu watch`) is in metrics.jsonl, but neither on
    the console (the start-up table says it) nor in the sinks (no numbers to plot); the end
    record is in all three, its error message only in the file."""
    class Recorder:
        name = "recorder"

        def __init__(self) -> None:
            self.events: list[tuple[int, str, dict]] = []

        def log(self, step, kind, scalars):
            self.events.append((step, kind, dict(scalars)))

        def log_config(self, config):
            pass

        def close(self):
            pass

    out, sink = io.StringIO(), Recorder()
    with MetricsLogger(tmp_path, is_main=True, total_steps=4, stream=out, sinks=[sink],
                       tensorboard=False) as log:
        log.log(0, "info", event="start", host="node7", pid=1234, world_size=1)
        log.log(4, "info", event="end", reason="error", error="OSError: boom", world_size=1)
    assert [(r["event"], r.get("pid")) for r in read_metrics(tmp_path)] == [("start", 1234),
                                                                          ("end", None)]
    assert read_metrics(tmp_path)[-1]["error"] == "OSError: boom"
    # The command prints the exception itself: the end line does not repeat it.
    assert "start" not in out.getvalue() and "event end | reason error" in out.getvalue()
    assert "boom" not in out.getvalue()
    assert [e[0] for e in sink.events] == [4]


# --------------------------------------------------------------------------------------------
# What counts as compile work, and the ETA
# --------------------------------------------------------------------------------------------


def test_runtime_guard_timings_are_not_compile_work(monkeypatch):
    """torch times `guard_collective` on every call of a compiled function in a multi-rank run
    (the ranks agree on the guards): counted as compile work, every step would be a compile step
    (no tokens/s at all, compile_s the whole run). Only the compile phases count."""
    import torch._dynamo.utils as dynamo_utils

    from bertgpu.telemetry.throughput import compile_events

    metrics: dict[str, list[float]] = {"entire_frame_compile": [12.0], "guard_collective": [0.01]}
    monkeypatch.setattr(dynamo_utils, "compilation_time_metrics", metrics)
    assert compile_events() == 1
    clock = FakeClock()
    tp = Throughput(window=4, clock=clock, compile_events=compile_events)
    for i in range(3):  # steady steps: a guard check each, nothing compiled
        clock.t += 0.5
        metrics["guard_collective"].append(0.01)
        if i == 1:  # a recompile (and its guard check) in the second step
            metrics["entire_frame_compile"].append(3.0)
        tp.update(tokens=1000, sequences=4)
    assert compile_events() == 2
    assert tp.compile_fields() == {"compile_s": 0.5, "compile_steps": 1, "rate_steps": 2}
    assert tp.rates()["tokens_per_s"] == pytest.approx(2000)


def test_a_compile_counter_that_fell_after_a_dynamo_reset():
    """torch._dynamo.reset() clears torch's record of compile work: the count falls. A step in
    which it fell to 0 compiled nothing; one in which it fell and grew again (reset, then a
    compile, fewer phases than before) compiled."""
    clock, events = FakeClock(), [5]
    tp = Throughput(window=4, clock=clock, compile_events=lambda: events[0])

    def step(count: int) -> None:
        clock.t += 1.0
        events[0] = count
        tp.update(tokens=100, sequences=1)

    step(0)  # reset, nothing compiled since
    assert tp.compile_steps == 0 and tp.rates()["tokens_per_s"] == pytest.approx(100)
    step(5)
    step(2)  # reset, then 2 compile phases: below the count before, yet a compile
    assert tp.compile_fields() == {"compile_s": 2.0, "compile_steps": 2, "rate_steps": 1}
    assert tp.rates()["steps_per_s"] == pytest.approx(1.0)  # only the first step measured


class _Monotonic:
    """`time` as metrics.py uses it, its monotonic clock set by the test."""

    def __init__(self) -> None:
        import time

        self.now = 0.0
        self.time = time.time

    def monotonic(self) -> float:
        return self.now


def test_eta_after_a_resume_is_from_this_process_s_step_rate(monkeypatch):
    """Resumed at step 50 of 100: steps 51 -> 61 take 10 s, so 1 s a step and 39 steps left:
    ETA 39 s (not 39 x 10 / 61 s, the rate as if this process had done all 61 steps)."""
    from bertgpu.telemetry import metrics

    clock = _Monotonic()
    monkeypatch.setattr(metrics, "time", clock)
    out = io.StringIO()
    log = MetricsLogger(None, is_main=True, total_steps=100, log_every=1, stream=out,
                        initial_step=50, elapsed_offset_s=500.0)
    log.log(51, "train", loss=1.0)
    clock.now = 10.0
    log.log(61, "train", loss=1.0)
    log.close()
    lines = out.getvalue().splitlines()
    assert "ETA" not in lines[0]  # one point: no rate yet
    assert lines[1].startswith("train step 61/100") and lines[1].endswith("ETA 00:39"), lines[1]


def test_the_last_step_is_printed_when_total_is_not_a_multiple_of_log_every():
    out = io.StringIO()
    with MetricsLogger(None, is_main=True, total_steps=5, log_every=2, stream=out) as log:
        for i in range(1, 6):
            log.log(i, "train", loss=1.0)
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == [
        "train step 2/5", "train step 4/5", "train step 5/5"]


def test_budget_eta_is_the_budget_left_after_the_time_already_spent(monkeypatch):
    """Without a budget clock in the records, the budget left is the budget (`budget_s`, or
    `train.budget_hours` of the config in seconds) minus `elapsed_s`, which includes the time
    before a resume."""
    from bertgpu.telemetry import metrics

    clock = _Monotonic()
    monkeypatch.setattr(metrics, "time", clock)
    out = io.StringIO()
    log = MetricsLogger(None, is_main=True, log_every=1, stream=out, budget_s=100.0,
                        elapsed_offset_s=30.0)
    clock.now = 10.0
    log.log(1, "train", loss=1.0)  # 30 s before the resume, 10 s since: 60 s left
    log.close()
    assert out.getvalue().splitlines()[-1].endswith("ETA 01:00"), out.getvalue()
    out = io.StringIO()
    clock.now = 0.0
    log = MetricsLogger(None, is_main=True, log_every=1, stream=out, elapsed_offset_s=60.0)
    log.log_config({"train": {"budget_hours": 0.5}})  # 1800 s, 60 s of it spent
    clock.now = 120.0
    log.log(1, "train", loss=1.0)
    log.close()
    assert out.getvalue().splitlines()[-1].endswith("ETA 27:00"), out.getvalue()


def test_bytes_that_are_not_utf8_are_one_line_naming_the_line(tmp_path):
    """A node crash can leave garbage bytes in metrics.jsonl: report ended in a
    UnicodeDecodeError traceback."""
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1, "kind": "train"}\n'
                                             b'{"step": 2, "kind": "info", "event": "x\xe9"}\n')
    with pytest.raises(BertgpuError, match=r"metrics\.jsonl:2: not UTF-8 \(byte 0xe9\); "
                                           "expected the JSON lines bertgpu writes"):
        read_metrics(tmp_path)


def test_a_whole_last_record_without_newline_and_a_linked_file_are_kept(tmp_path):
    """A review found two holes in the resume's clean-up: a whole last record without its
    newline (an editor's save) was cut off as if a crash had cut it, and a metrics.jsonl that is
    a link was replaced by a file (the link's target no longer got the run's records)."""
    from bertgpu.telemetry.records import cut_after, open_for_append

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "kind": "train"}\n{"step": 2, "kind": "eval", "score": 77.5}')
    with open_for_append(path) as f:
        f.write('{"step": 3, "kind": "train"}\n')
    assert [(r["step"], r["kind"]) for r in read_metrics(path)] == [(1, "train"), (2, "eval"),
                                                                    (3, "train")]
    target = tmp_path / "shared.jsonl"
    target.write_text("".join(json.dumps({"step": s, "kind": "train"}) + "\n" for s in range(6)))
    link = tmp_path / "run.jsonl"
    link.symlink_to(target)
    assert cut_after(link, 3) == 2 and link.is_symlink()
    assert [r["step"] for r in read_metrics(target)] == [0, 1, 2, 3]


def test_a_resume_keeps_the_record_of_the_checkpoint_it_resumes_from(tmp_path):
    """A background write of step 80's checkpoint ends at step 81 and is logged there; resumed
    from that checkpoint, its record was cut with step 81's, and report counted one checkpoint
    too few. A later checkpoint's record goes with its steps."""
    from bertgpu.telemetry.records import cut_after

    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 80, "kind": "train"},
             {"step": 80, "kind": "info", "event": "checkpoint", "background": True},
             {"step": 81, "kind": "info", "event": "checkpoint_written", "saved_step": 80},
             {"step": 90, "kind": "train"},
             {"step": 90, "kind": "info", "event": "checkpoint", "background": True},
             {"step": 92, "kind": "info", "event": "checkpoint_written", "saved_step": 90},
             {"step": 95, "kind": "train"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert cut_after(path, 80) == 4
    assert [(r["step"], r.get("event")) for r in read_metrics(path)] == [
        (80, None), (80, "checkpoint"), (81, "checkpoint_written")]
