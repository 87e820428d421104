"""Tests for bertgpu.report: every input kind (pretraining run, fine-tuning folder, GLUE folder,
bench JSONL) rendered to markdown and HTML, the numbers in the tables, valid PNG plots, partial
data (no eval rows, nulls, empty log), atomic replacement of the output, and bad inputs."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from bertgpu.cli import main as cli_main
from bertgpu.errors import BertgpuError
from bertgpu.report import build_report
from bertgpu.report.inputs import load_source, pretrain_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _train(step: int, loss: float | None, tps: float, **extra: float) -> dict:
    return {"step": step, "kind": "train", "time": 1.7e9 + step, "elapsed_s": 10.0 * step,
            "loss": loss, "mlm_loss": loss, "mlm_acc": 0.01 * step, "lr": 1e-3 / step,
            "tokens_per_s": tps, "tokens_per_s_per_device": tps / 2, "tokens_seen": 1000 * step,
            "mem_peak_gib": 1.0 + 0.1 * step, "mfu": 0.2, **extra}


@pytest.fixture()
def run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "base"
    run.mkdir()
    (run / "config.toml").write_text(
        "seed = 0\n[model]\nhidden_size = 64\nnum_hidden_layers = 2\nnum_attention_heads = 2\n"
        "vocab_size = 512\n[train]\nglobal_batch_size = 8\nprecision = \"fp32\"\n",
        encoding="utf-8")
    _write_jsonl(run / "metrics.jsonl", [
        _train(1, 9.0, 100.0),  # start-up interval: left out of the means
        _train(2, None, 200.0),  # a non-finite loss, logged as null
        {"step": 2, "kind": "eval", "time": 1.7e9, "elapsed_s": 21.0, "val_mlm_loss": 8.5,
         "val_mlm_acc": 0.05},
        _train(3, 7.0, 300.0),
        {"step": 4, "kind": "eval", "time": 1.7e9, "elapsed_s": 45.0, "val_mlm_loss": 6.25,
         "val_mlm_acc": 0.125},
        _train(4, 6.5, 400.0, world_size=2),
        {"step": 4, "kind": "info", "time": 1.7e9, "elapsed_s": 46.5, "event": "end",
         "world_size": 2},
    ])
    return run


@pytest.fixture()
def finetune_dir(tmp_path: Path) -> Path:
    out = tmp_path / "ft_sst2"
    out.mkdir()
    epochs = [{"epoch": e, "step": 8 * e, "train_loss": 0.7 - 0.1 * e,
               "metrics": {"dev": {"accuracy": 60.0 + 5 * e}}, "score": 60.0 + 5 * e}
              for e in (1, 2, 3)]
    (out / "results.json").write_text(json.dumps({
        "task": "SST-2", "metrics": {"dev": {"accuracy": 75.0}}, "score": 75.0,
        "columns": {"SST-2": 75.0}, "epochs": epochs, "steps": 24, "train_seconds": 90.0,
        "train_examples_per_s": 12.5}), encoding="utf-8")
    return out


@pytest.fixture()
def glue_dir(tmp_path: Path) -> Path:
    out = tmp_path / "glue"
    out.mkdir()
    # No top-level "columns": the task table alone, one task as a bare number.
    (out / "glue_results.json").write_text(json.dumps({
        "tasks": {"CoLA": {"score": 21.5, "columns": {"CoLA": 21.5}}, "SST-2": 85.25,
                  "RTE": {"score": None}},
        "average": 53.375, "convention_text": "mean of the task columns",
        "references": [{"name": "ref", "label": "BERT-base (published)", "columns": {"CoLA": 52.1},
                        "average": "78.6-80.7"}]}), encoding="utf-8")
    # A GLUE folder also holds TASK/seed_N/results.json: glue_results.json decides its kind.
    (out / "CoLA" / "seed_0").mkdir(parents=True)
    (out / "CoLA" / "seed_0" / "results.json").write_text("{}", encoding="utf-8")
    return out


@pytest.fixture()
def bench_files(tmp_path: Path) -> list[Path]:
    model = _write_jsonl(tmp_path / "model.jsonl", [
        {"bench": "model_vs_hf", "size": "tiny", "seq_len": 128, "dtype": "fp32",
         "tokens_per_s": {"bertgpu": 1162.5, "transformers": 556.9}, "ratio": 2.0875},
        {"bench": "model_vs_hf", "size": "base", "seq_len": 128, "dtype": "fp32",
         "tokens_per_s": {"bertgpu": 58.25, "transformers": None}, "ratio": None},
    ])
    scaling = _write_jsonl(tmp_path / "scaling.jsonl", [
        {"workers": w, "accumulation": a, "tokens_per_s": 1000.0 * w * (0.9 if w > 1 else 1),
         "efficiency": 0.9 if w > 1 else 1.0} for a in (1, 4) for w in (1, 2, 4)
    ])
    return [model, scaling]


def _table_rows(md: str) -> dict[str, list[str]]:
    """First cell -> the other cells, over every markdown table row."""
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 5000 and data[:8] == PNG_MAGIC, path


def test_pretrain_summary_numbers(run_dir: Path):
    s = pretrain_summary(load_source(run_dir).data["records"])
    assert s["steps"] == 4 and s["tokens_seen"] == 4000
    assert s["train_loss"] == 6.5  # the last finite train loss
    assert s["val_mlm_loss"] == 6.25 and s["val_mlm_acc"] == 0.125
    assert s["tokens_per_s"] == pytest.approx(300.0)  # mean of 200, 300, 400 (step 1 left out)
    assert s["tokens_per_s_per_device"] == pytest.approx(150.0)
    assert s["mem_peak_gib"] == pytest.approx(1.4)
    assert s["wall_s"] == 46.5 and s["world_size"] == 2 and s["val_nsp_acc"] is None
    # resumed on one device: the row said "devices 1" beside a per-device rate of two
    resumed = [*load_source(run_dir).data["records"],
               {"step": 9, "kind": "info", "event": "start", "world_size": 1}]
    assert pretrain_summary(resumed)["world_size"] == "2 then 1"


def test_pretrain_summary_of_a_run_that_logs_compile_time():
    """Rates logged beside compile_s leave the compile steps out already: every interval counts
    (the first too), and the compile time of a resumed run adds up over its processes."""
    records = [_train(1, 9.0, 100.0, compile_s=30.0), _train(2, 8.0, 200.0, compile_s=30.0),
               _train(3, 7.0, 300.0, compile_s=42.0),  # a recompile
               _train(4, 6.0, 400.0, compile_s=20.0)]  # resumed: a new process compiled again
    s = pretrain_summary(records)
    assert s["tokens_per_s"] == pytest.approx(250.0) and s["compile_s"] == pytest.approx(62.0)
    assert pretrain_summary([_train(s, 1.0, 100.0 * s) for s in (1, 2, 3)])["compile_s"] is None
    # A resumed process that compiled longer than the first (a cold cache on another node): its
    # start record says a new count begins; a drop alone could not see it (65.3 for 80.9).
    start = {"kind": "info", "event": "start", "step": 0}
    records = [start, _train(5, 9.0, 100.0, compile_s=15.6), _train(10, 8.0, 200.0, compile_s=15.6),
               {**start, "step": 10}, _train(15, 7.0, 300.0, compile_s=65.3),
               _train(20, 6.0, 400.0, compile_s=65.3)]
    assert pretrain_summary(records)["compile_s"] == pytest.approx(80.9)


def test_full_report_md_and_html(tmp_path, run_dir, finetune_dir, glue_dir, bench_files):
    out = build_report([run_dir, finetune_dir, glue_dir, *bench_files], tmp_path / "rep", "both")
    assert out == tmp_path / "rep"
    md = (out / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["optimizer steps"] == ["4"]
    assert rows["tokens seen"] == ["4.00k"]
    assert rows["final train loss"] == ["6.5000"]
    assert rows["final val MLM loss"] == ["6.2500"]
    assert rows["final val MLM accuracy"] == ["12.50 %"]
    assert rows["tokens/s (all devices; tokens / time of the logged intervals)"] == ["300"]
    assert rows["tokens/s per device (likewise)"] == ["150"]
    assert rows["MFU (weighted by interval time)"] == ["20.0 %"]
    assert rows["peak memory"] == ["1.40 GiB"]
    assert rows["wall time (of the kept timeline: work lost to a crash not counted)"] == ["46 s"]
    assert "final val NSP accuracy" not in rows  # never logged: no row
    assert "2 layers x 64 hidden" in md
    # GLUE: columns from the task table, missing score as an empty cell.
    assert rows["model"] == ["CoLA", "SST-2", "average"]
    assert rows["glue"] == ["21.5", "85.2", "53.4"]  # one decimal, as glue_results.md
    assert rows["BERT-base (published)"] == ["52.1", "", "78.6-80.7"]
    assert ("glue: protocol: not recorded (glue_results.json of an older version). Average of "
            "the glue row (not of the published rows, which keep their own): convention: mean "
            "of the task columns." in md)
    # Fine-tuning and bench rows.
    assert rows["ft_sst2"][:3] == ["SST-2", "75.0", "dev: accuracy 75.0"]
    assert "| tiny | 1,162 | 557 | 2.087 |" in md
    assert "| base | 58 |  |  |" in md  # nulls: empty cells
    assert "| workers | accumulation | tokens/s | efficiency |" in md
    assert "| 4 | 4 | 3,600 | 0.90 |" in md

    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    for name in ("loss.png", "mlm_accuracy.png", "learning_rate.png", "throughput.png",
                 "glue.png", "finetune.png", "bench0_model.png", "bench1_scaling_scaling.png"):
        assert name in images
    for name in images:
        _assert_png(out / name)
    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)  # self-contained
    assert [base64.b64decode(e) for e in embedded] == [(out / n).read_bytes() for n in images]
    assert "<td>6.5000</td>" in page and "http" not in re.sub(r'src="data:[^"]+"', "", page)
    assert not (tmp_path / "rep.tmp").exists()


def test_partial_run_without_eval_and_md_only(tmp_path):
    run = tmp_path / "noeval"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [
        {"step": 1, "kind": "train", "elapsed_s": 1.0, "loss": None, "lr": 0.1},
        {"step": 2, "kind": "train", "elapsed_s": 2.0, "loss": 3.0, "lr": 0.2},
    ])
    (run / "metrics.jsonl").open("a").write('{"step": 3, "kind": "tra')  # cut short by a crash
    out = build_report([run], tmp_path / "rep")
    md = (out / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows["final train loss"] == ["3.0000"] and "final val MLM loss" not in rows
    assert "mlm_accuracy.png" not in md and "throughput.png" not in md  # nothing to draw
    assert "loss.png" in md and "learning_rate.png" in md
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "learning_rate.png", "loss.png"]


def test_empty_log_and_replaces_existing_report(tmp_path):
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "metrics.jsonl").write_text("", encoding="utf-8")
    out = tmp_path / "rep"
    build_report([run], out, "md")
    (out / "stale.png").write_bytes(b"old")  # an earlier report's, replaced whole
    build_report([run], out, "html")
    assert sorted(p.name for p in out.iterdir()) == ["index.html"]
    assert "No train or eval records" in (out / "index.html").read_text(encoding="utf-8")


def test_same_folder_names_get_parent_labels(tmp_path, run_dir):
    other = tmp_path / "b" / "base"
    other.mkdir(parents=True)
    (other / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text())
    md = (build_report([run_dir, other], tmp_path / "rep") / "README.md").read_text()
    assert f"|  | {run_dir.parent.name}/base | b/base |" in md


def test_bad_inputs(tmp_path, run_dir):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertgpuError, match=r"empty: not a pretraining run") as e:
        build_report([run_dir, tmp_path / "empty"], tmp_path / "rep")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "rep").exists() and not (tmp_path / "rep.tmp").exists()
    with pytest.raises(BertgpuError, match="does not exist"):
        load_source(tmp_path / "missing")
    with pytest.raises(BertgpuError, match="--format"):
        build_report([run_dir], tmp_path / "rep", "pdf")
    with pytest.raises(BertgpuError, match="overlaps"):
        build_report([run_dir], run_dir / "report")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"workers": 1}\nnot json\n{"workers": 2}\n', encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"bad.jsonl:2"):
        load_source(bad)


def test_cli(tmp_path, run_dir, capsys):
    assert cli_main(["report", str(tmp_path / "nothing"), "--out", str(tmp_path / "r")]) == 2
    assert "bertgpu report: error:" in capsys.readouterr().err
    assert cli_main(["report", str(run_dir), "--out", str(tmp_path / "r"), "--format", "both"]) == 0
    assert (tmp_path / "r" / "README.md").is_file() and (tmp_path / "r" / "index.html").is_file()


def _gpu_run(tmp_path: Path) -> Path:
    """A run whose GPU series come from the real monitor over a simulated NVML: node 0 has a
    throttling GPU and one that falls off the bus; node 1 (gpu.node1.jsonl) one quiet GPU."""
    from bertgpu.telemetry.monitor import GpuMonitor
    from bertgpu.testing.nvml_sim import SimGpu, SimulatedNvml

    run = tmp_path / "base"
    run.mkdir()
    times = [0.5, 0.5, 0.6, 1.0]  # rank 2 is the slow one in 3 of 4 windows, rank 3 in one
    _write_jsonl(run / "metrics.jsonl", [
        _train(s, 5.0 / s, 100.0 * s, rank_compute_s=[0.5, 0.5, 0.5 + 0.1 * s, times[s - 1]],
               slowest_rank=2, slowest_vs_median=1.2) for s in range(1, 5)])
    hot = SimGpu(name="RTX 3090", temp_c=[70, 80, 86, 88], util_pct=[100, 90, 80, 70],
                 power_w=[300, 340, 350, 350], throttle=[0, 0x4, 0x40, 0x1])
    nvml = SimulatedNvml([hot, SimGpu(name="RTX 3060", util_pct=[50.0])])
    mon = GpuMonitor(nvml, run / "gpu.jsonl", interval_s=1.0)
    for i in range(4):
        if i == 2:
            nvml.gpus[1].lost = True
        mon.sample()
    mon.close()
    node1 = GpuMonitor(SimulatedNvml([SimGpu(util_pct=[10.0])]), run / "gpu.node1.jsonl", 1.0)
    node1.sample()
    node1.close()
    return run


def test_gpu_and_rank_sections(tmp_path):
    run = _gpu_run(tmp_path)
    out = build_report([run], tmp_path / "rep", "both")
    md = (out / "README.md").read_text(encoding="utf-8")
    assert "## GPUs" in md and "## Ranks" in md
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in md.splitlines()
             if line.startswith("| base | ")]
    rows = {(c[0], c[1]): c[2:] for c in cells}
    # name, samples, mean util, peak temp, mean power, limit, mean SM clock, peak mem, throttled
    assert rows[("base", "gpu0")] == ["RTX 3090", "4", "85 %", "88 °C", "335 W", "350 W",
                                      "1800 MHz", "10.0 GiB", "50 %", "hw_thermal, sw_power_cap"]
    assert rows[("base", "gpu1")][:3] == ["RTX 3060", "2", "50 %"]
    assert rows[("base", "gpu1")][-1] == "lost mid-run"
    assert rows[("base", "node1:gpu0")][2] == "10 %"
    table = _table_rows(md)
    assert table["base rank 2"] == ["0.75 s", "3 of 4"]  # mean of 0.6, 0.7, 0.8, 0.9
    assert table["base rank 3"] == ["0.65 s", "1 of 4"]
    for name in ("gpus_base.png", "rank_step_time_base.png"):
        assert f"({name})" in md
        _assert_png(out / name)
    gpus = base64.b64encode((out / "gpus_base.png").read_bytes()).decode()
    assert f'src="data:image/png;base64,{gpus}"' in (out / "index.html").read_text(encoding="utf-8")


def test_a_run_that_diverged_or_stopped_says_so(tmp_path, run_dir):
    """A diverged run's final train loss is its last record's (nan), not an earlier finite one,
    and the table says how each run ended; a run without an end record says it has none."""
    run = tmp_path / "nan"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [
        {"step": 0, "kind": "info", "event": "start", "host": "h", "pid": 7, "max_steps": 30},
        _train(1, 9.009, 100.0),
        {"step": 1, "kind": "eval", "val_mlm_loss": 4.7285, "val_mlm_acc": 0.2},
        *[_train(s, None, 100.0) for s in (2, 3, 4, 5)],
        {"step": 5, "kind": "eval", "val_mlm_loss": None, "val_mlm_acc": 0.0333},
        {"step": 6, "kind": "info", "event": "end", "reason": "diverged",
         "error": "training diverged: 5 steps in a row"},
    ])
    term = tmp_path / "term"
    term.mkdir()
    _write_jsonl(term / "metrics.jsonl", [
        {"step": 0, "kind": "info", "event": "start", "host": "h", "pid": 8, "max_steps": 30},
        _train(9, 4.5, 100.0), {"step": 9, "kind": "info", "event": "end", "reason": "preempted"},
    ])
    killed = tmp_path / "killed"
    killed.mkdir()
    _write_jsonl(killed / "metrics.jsonl", [_train(1, 3.0, 100.0)])
    md = (build_report([run, term, killed, run_dir], tmp_path / "rep") / "README.md").read_text()
    rows = _table_rows(md)
    assert rows["final train loss"] == ["nan", "4.5000", "3.0000", "6.5000"]
    # the last evaluation's loss beside its accuracy, not an earlier finite one (4.7285)
    assert rows["final val MLM loss"][0] == "nan"
    assert rows["final val MLM accuracy"][0] == "3.33 %"
    assert rows["how the run ended"] == [
        "stopped (diverged at step 6)",
        "stopped (preempted at step 9 of 30; re-run the same command to resume)",
        "no end record (still running, or killed)", "finished"]
    assert rows["optimizer steps"][:2] == ["6", "9"]  # the end record's step counts


def test_a_run_resumed_with_other_settings_says_which_settings_are_shown(tmp_path, run_dir):
    """config.toml holds only the latest settings of a run resumed with changed ones (the
    earlier are kept as config.step_N.toml): the report said "global batch 8" for the whole
    run; it now says which stretch that is and where the earlier settings are."""
    (run_dir / "config.step_2.toml").write_text("[train]\nglobal_batch_size = 4\n")
    (run_dir / "config.step_2.2.toml").write_text("[train]\nglobal_batch_size = 2\n")
    md = (build_report([run_dir], tmp_path / "rep") / "README.md").read_text()
    assert ("global batch 8, fp32 (settings of the latest stretch: the run resumed with other "
            "settings at step 2, 2; the earlier ones are in config.step_2.toml, "
            "config.step_2.2.toml)") in md


def test_a_file_that_is_not_a_benchmarks_rows_is_refused_at_its_first_other_line(tmp_path):
    """A corpus, a run's GPU samples or a quality file with other rows appended were each drawn
    as one benchmark table of their records (a corpus of a million lines as a million rows)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a document"}\n' * 3, encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"corpus.jsonl:1: not a benchmark's row \(it has none "
                                           r"of the fields bench, tokens_per_s, workers, mfu\)"):
        load_source(corpus)
    samples = tmp_path / "gpu.jsonl"
    samples.write_text('{"gpu": 0, "util_pct": 90}\n', encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"gpu.jsonl:1: .*pass the run folder"):
        load_source(samples)
    mixed = tmp_path / "quality.jsonl"
    mixed.write_text('{"bench": "quality", "run_id": "a"}\n{"bench": "model", "tokens_per_s": 1}\n',
                     encoding="utf-8")
    with pytest.raises(BertgpuError, match=r"quality.jsonl: mixes rows of several benchmarks "
                                           r"\(model, quality\)"):
        load_source(mixed)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"bench": "model", "tokens_per_s": 1}\n{"workers": 2, "tokens_per_s": 3}\n',
                    encoding="utf-8")
    assert load_source(rows).kind == "bench"


def test_throughput_is_total_tokens_over_total_time():
    """Ten steps at 1,000 tokens/s (10 s) and ten at 100 tokens/s (100 s) are 20,000 tokens in
    110 s: 182 tokens/s, not the 550 of a plain mean of the two rates (which overstated real
    runs' throughput 2-2.4x). An interval's time is its steps over its steps_per_s; a resumed
    process counts from its start record's step."""
    start = {"step": 0, "kind": "info", "event": "start"}
    records = [start, _train(10, 5.0, 1000.0, steps_per_s=1.0, compile_s=0.0),
               _train(20, 4.0, 100.0, steps_per_s=0.1, compile_s=0.0, mfu=0.1),
               {**start, "step": 20}, _train(30, 3.0, 1000.0, steps_per_s=1.0, compile_s=0.0)]
    s = pretrain_summary(records)
    assert s["tokens_per_s"] == pytest.approx(30000 / 120)
    assert s["tokens_per_s_per_device"] == pytest.approx(15000 / 120)
    assert s["mfu"] == pytest.approx((0.2 * 20 + 0.1 * 100) / 120)


def test_finetune_train_time_is_train_seconds_not_the_whole_run(tmp_path):
    """results.json's `train_seconds` is the training time; `seconds` (the whole run: loading,
    evaluations) is the fallback for a file without it."""
    out = tmp_path / "ft"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({
        "task": "SST-2", "metrics": {"dev": {"accuracy": 75.0}}, "score": 75.0, "steps": 24,
        "train_seconds": 60.0, "seconds": 600.0}), encoding="utf-8")
    md = (build_report([out], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    header = _table_rows(md)["run"]
    assert _table_rows(md)["ft"][header.index("train time")] == "1 min 00 s"


def _glue_json(folder: Path, summary: dict) -> Path:
    folder.mkdir()
    (folder / "glue_results.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


def test_glue_task_count_without_a_task_table_counts_mnli_once(tmp_path):
    """A glue_results.json with columns only (no task table): MNLI-m and MNLI-mm are one task."""
    a = _glue_json(tmp_path / "with_mnli", {
        "columns": {"CoLA": 20.0, "MNLI-m": 80.0, "MNLI-mm": 81.0}, "average": 50.26})
    b = _glue_json(tmp_path / "cola", {"columns": {"CoLA": 30.0}, "average": 30.0})
    rows = _table_rows((build_report([a, b], tmp_path / "rep") / "README.md").read_text())
    assert rows["model"][-1] == "average (own tasks)"
    assert rows["with_mnli"][-1] == "50.3 (2 tasks)" and rows["cola"][-1] == "30.0 (1 task)"


def test_a_reference_two_glue_folders_ask_for_is_shown_once_as_the_first_gave_it(tmp_path):
    def summary(score: float, ref_cola: float) -> dict:
        return {"tasks": {"CoLA": {"score": score}}, "average": score,
                "references": [{"label": "BERT-base (published)", "columns": {"CoLA": ref_cola},
                                "source": f"paper {ref_cola}"}]}

    a = _glue_json(tmp_path / "one", summary(20.0, 52.1))
    b = _glue_json(tmp_path / "two", summary(30.0, 99.0))
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert _table_rows(md)["BERT-base (published)"] == ["52.1", ""]
    assert md.count("BERT-base (published): paper") == 1 and "paper 99.0" not in md


def test_earlier_configs_are_listed_by_step(tmp_path, run_dir, monkeypatch):
    """By step as a number (2, 9, 10), whatever order the folder lists its files in (here the
    reverse of their names, so that the folder's own order cannot pass for a sorted one)."""
    for step in (10, 2, 9):
        (run_dir / f"config.step_{step}.toml").write_text("[train]\nglobal_batch_size = 4\n")
    glob = Path.glob

    def listed_backwards(self, pattern, *args, **kwargs):
        found = list(glob(self, pattern, *args, **kwargs))
        return sorted(found, reverse=True) if pattern.startswith("config.step_") else found

    monkeypatch.setattr(Path, "glob", listed_backwards)
    md = (build_report([run_dir], tmp_path / "rep") / "README.md").read_text()
    assert ("resumed with other settings at step 2, 9, 10; the earlier ones are in "
            "config.step_2.toml, config.step_9.toml, config.step_10.toml)") in md


def test_only_a_glue_folder_without_its_table_gets_the_note_saying_so(tmp_path, run_dir,
                                                                     glue_dir):
    """Inputs that `load_source` reads through another path (a file as its folder) were said
    to be GLUE folders without their table (the note compared the paths)."""
    inputs = [run_dir / "metrics.jsonl", glue_dir / "glue_results.json"]
    md = (build_report(inputs, tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "GLUE table yet" not in md, md
    partial = tmp_path / "glue_in_progress"
    shutil.copytree(run_dir, partial / "SST-2" / "seed_1")  # (any run folder, for the layout)
    md = (build_report([partial], tmp_path / "rep2") / "README.md").read_text(encoding="utf-8")
    assert md.count("GLUE table yet") == 1, md


def test_checkpoints_counts_the_written_ones_only():
    """A background save killed in its write (started at step 40, never written; the re-run
    resumed from step 20) was counted: the report said 5 checkpoints of a run that had 4."""
    def info(step, event, **fields):
        return {"step": step, "kind": "info", "event": event, **fields}

    records = [
        info(20, "checkpoint", stall_s=0.01, background=True),
        info(21, "checkpoint_written", saved_step=20, write_s=0.5),
        info(40, "checkpoint", stall_s=0.01, background=True),  # killed during its write
        info(20, "start", world_size=1),
        info(40, "checkpoint", stall_s=0.02, background=True),
        info(41, "checkpoint_written", saved_step=40, write_s=0.4),
        info(60, "checkpoint", stall_s=0.3, background=False),  # written in the training thread
        info(70, "checkpoint", stall_s=0.2),  # a version that did not log `background`
    ]
    assert pretrain_summary(records)["checkpoints"] == 4


def test_an_input_given_twice_is_reported_once(tmp_path, run_dir):
    """The same run as a folder and as its metrics.jsonl (or twice) made two rows, labelled
    apart by their parents' names as if they were two runs."""
    md = (build_report([run_dir, run_dir / "metrics.jsonl", run_dir], tmp_path / "rep")
          / "README.md").read_text(encoding="utf-8")
    assert _table_rows(md)["optimizer steps"] == ["4"], md


def test_an_interval_weighs_only_the_steps_its_rates_measured():
    """The first interval of a process measures one step fewer (the first is warm-up), and one
    with an evaluation only the steps after it: its time is `rate_steps` / steps_per_s, not all
    its steps' (2 of 3 steps at 1 step/s, then 3 at 0.5: 2 + 6 s, 5 steps of 1,000 tokens)."""
    start = {"step": 0, "kind": "info", "event": "start"}
    records = [start, _train(3, 5.0, 1000.0, steps_per_s=1.0, compile_s=0.0, rate_steps=2),
               _train(6, 4.0, 500.0, steps_per_s=0.5, compile_s=0.0, rate_steps=3)]
    assert pretrain_summary(records)["tokens_per_s"] == pytest.approx(5000 / 8)
    del records[1]["rate_steps"], records[2]["rate_steps"]  # an older run: all its steps
    assert pretrain_summary(records)["tokens_per_s"] == pytest.approx((3000 + 3000) / 9)
