"""`bertgpu report` sections whose numbers or wording used to mislead: the per-rank compute time
(per step, over log windows of any length and across resumes), a scaling file that several bench
runs appended to (each run on its own), the GLUE table's protocol and published rows, and the
quality table's rate (named for what it divides by)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from test_report import _table_rows, _write_jsonl

from bertgpu.report import build_report
from bertgpu.report.quality import pretrain_table, quality_blocks
from bertgpu.report.render import render_markdown


def _start(step: int) -> dict:
    return {"step": step, "kind": "info", "event": "start", "host": "h", "pid": 1,
            "world_size": 2, "max_steps": 17}


def _train(step: int, rank_compute_s: list[float]) -> dict:
    return {"step": step, "kind": "train", "elapsed_s": float(step), "loss": 5.0,
            "tokens_per_s": 100.0, "rank_compute_s": rank_compute_s, "slowest_rank": 0,
            "slowest_vs_median": 1.5}


def test_rank_compute_time_is_per_step_over_each_log_window(tmp_path):
    """`rank_compute_s` sums a rank's compute seconds over the record's log window (here 5
    steps, 2 after a resume and at the end); the Ranks section showed those sums as the time
    per step (0.7 s for rank 0 here, 3 to 5 times its real 0.23 s)."""
    run = tmp_path / "n2"
    run.mkdir()
    _write_jsonl(run / "metrics.jsonl", [
        _start(0),
        _train(5, [1.0, 0.5]),  # steps 1-5: 0.2 and 0.1 s per step
        _train(10, [9.0, 9.0]),  # superseded: the run died after it, resumed from step 8
        _start(8),
        _train(10, [0.6, 0.2]),  # steps 9-10 of the resumed process: 0.3 and 0.1
        _train(15, [1.0, 0.5]),  # 0.2 and 0.1
        _train(17, [0.6, 0.2]),  # the last steps, logged when the run ended: 0.3 and 0.1
    ])
    md = (build_report([run], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    assert rows[""] == ["mean compute time per step", "slowest in (log windows)"]
    # every window's seconds over every window's steps: 3.2 / 14 and 1.4 / 14
    assert rows["n2 rank 0"] == ["0.2286 s", "4 of 4"]
    assert rows["n2 rank 1"] == ["0.1 s", "0 of 4"]
    assert "divided by the window's steps" in md and "(rank_step_time_n2.png)" in md


def _scaling_row(workers: int, accumulation: int, tps: float, base: float, **run: str) -> dict:
    return {"workers": workers, "accumulation": accumulation, "tokens_per_s": tps,
            "speedup": tps / base, "efficiency": tps / base / workers, "device": "cpu", **run}


def test_a_scaling_file_of_two_bench_runs_draws_each_run_on_its_own(tmp_path):
    """`bench scaling` appends every run to scaling.jsonl; the report drew all rows of an
    accumulation as one line (1 -> 1 -> 2 -> 2 workers, zig-zag), its ideal line from the
    smallest 1-worker point of any run, and the efficiency labels of both runs on it."""
    first, second = {"run_id": "2026-11-27T09:37:00"}, {"run_id": "2026-11-27T09:38:00"}
    rows = [_scaling_row(w, a, t, b, **first)
            for w, a, t, b in ((1, 1, 520.0, 520.0), (2, 1, 11357.0, 520.0))]
    rows += [_scaling_row(w, a, t, b, **second)
             for w, a, t, b in ((1, 1, 5380.0, 5380.0), (2, 1, 8703.0, 5380.0))]
    path = _write_jsonl(tmp_path / "scaling.jsonl", rows)
    md = (build_report([path], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert "2 bench runs appended to this file, each with its own table and plot" in md
    first_part, second_part = md.split("Run 2026-11-27T09:38:00:")
    assert "Run 2026-11-27T09:37:00:" in first_part
    assert "| 2 | 1 | 11,357 |" in first_part and "| 2 | 1 | 8,703 |" not in first_part
    assert "| 2 | 1 | 8,703 |" in second_part and "| 2 | 1 | 11,357 |" not in second_part
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images == ["bench0_scaling_scaling_0.png", "bench0_scaling_scaling_1.png"]
    assert all((tmp_path / "rep" / name).read_bytes()[:4] == b"\x89PNG" for name in images)
    # Rows of versions that wrote no run_id: one run per time stamp.
    from bertgpu.report.sections import scaling_runs

    old = [{k: v for k, v in r.items() if k != "run_id"} | {"time": r["run_id"]} for r in rows]
    assert [(label, len(group)) for label, group in scaling_runs(old)] == [
        ("2026-11-27T09:37:00", 2), ("2026-11-27T09:38:00", 2)]
    assert [label for label, _ in scaling_runs([{"workers": 1}, {"workers": 2}])] == [""]
    # `bench scaling --out DIR` writes DIR/scaling.jsonl: the folder reads as that file (it was
    # refused as "not a pretraining run ... or bench result file")
    folder = tmp_path / "bench-out"
    folder.mkdir()
    (folder / "scaling.jsonl").write_bytes(path.read_bytes())
    again = (build_report([folder], tmp_path / "rep2") / "README.md").read_text(encoding="utf-8")
    assert "2 bench runs appended to this file" in again


def _glue_folder(folder: Path, average: float, epochs: int, references: list[dict]) -> Path:
    folder.mkdir()
    (folder / "glue_results.json").write_text(json.dumps({
        "convention": "glue-score",
        "convention_text": "average = unweighted mean over the tasks shown",
        "protocol": {"epochs": epochs, "lr": 0.0003, "global_batch_size": 32, "max_seq_len": 128,
                     "warmup_fraction": 0.1, "decay": "linear", "weight_decay": 0.01,
                     "precision": "fp32", "seeds": [1, 2],
                     "aggregate": "median over 2 seeds per metric", "checkpoint": "final epoch"},
        "tasks": {"CoLA": {"score": 10.0}, "SST-2": {"score": 80.0}},
        "columns": {"CoLA": 10.0, "SST-2": 80.0}, "average": average,
        "references": references}), encoding="utf-8")
    return folder


def test_the_glue_table_names_each_protocol_and_quotes_published_rows(tmp_path):
    """The report's GLUE table dropped each folder's protocol and the note that published rows
    are quoted as published (their sources and notes), and said "average = unweighted mean over
    the tasks shown" above a published row whose average is over nine tasks."""
    sidsite = {"name": "sidsite-8gb", "label": "BERT from scratch on one 8 GB GPU (published)",
               "columns": {"CoLA": 41.0, "SST-2": 89.1, "RTE": 55.9}, "average": "72.7",
               "source": "sidsite.com, BERT from scratch on one 8 GB GPU",
               "note": "average as published"}
    a = _glue_folder(tmp_path / "short", 45.0, 3, [sidsite])
    b = _glue_folder(tmp_path / "long", 45.0, 10, [sidsite])  # the same published row
    md = (build_report([a, b], tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    for name, epochs in (("short", 3), ("long", 10)):
        assert (f"{name}: protocol: fine-tuning {epochs} epochs, lr 0.0003 (linear decay, 10% "
                "warm-up), batch 32, max_seq_len 128, fp32, seeds 1 2; each cell is the median "
                "over 2 seeds per metric of the final epoch dev score. Average of the "
                f"{name} row (not of the published rows, which keep their own): \"glue-score\" "
                "convention: average = unweighted mean over the tasks shown." in md)
    rows = _table_rows(md)
    assert rows["BERT from scratch on one 8 GB GPU (published)"] == ["41.0", "89.1", "72.7"]
    assert md.count("| BERT from scratch on one 8 GB GPU (published) |") == 1
    assert ("Published rows are quoted as published (their own protocols and averaging; empty "
            "cells were not reported or not in this table):\n\n- BERT from scratch on one 8 GB "
            "GPU (published): sidsite.com, BERT from scratch on one 8 GB GPU; average as "
            "published.\n" in md)


def test_the_glue_row_reads_as_in_the_folders_own_table(tmp_path):
    """The report gave a GLUE score to four digits (84.37) where the folder's glue_results.md,
    and the published tables beside it, give one decimal (84.4)."""
    from bertgpu.glue import write_table

    summary = {
        "init": "run", "convention": "glue-score", "convention_text": "the mean",
        "protocol": {"epochs": 3, "lr": 3e-4, "global_batch_size": 32, "max_seq_len": 128,
                     "warmup_fraction": 0.1, "decay": "linear", "weight_decay": 0.01,
                     "precision": "fp32", "seeds": [1], "aggregate": "median over 1 seed per "
                     "metric", "checkpoint": "final epoch"},
        "columns": {"CoLA": 41.2345, "SST-2": 84.3667, "MNLI-m": 80.0}, "average": 68.53706,
        "tasks": {n: {"score": v, "metrics": {}, "per_seed": {}}
                  for n, v in (("CoLA", 41.2345), ("SST-2", 84.3667), ("MNLI", 80.0))},
        "skipped": [], "references": []}
    write_table(summary, tmp_path / "glue")
    own = _table_rows((tmp_path / "glue" / "glue_results.md").read_text(encoding="utf-8"))
    md = (build_report([tmp_path / "glue"], tmp_path / "rep") / "README.md").read_text("utf-8")
    assert _table_rows(md)["glue"] == own["ours"] == ["41.2", "84.4", "80.0", "68.5"]


def test_the_quality_table_names_its_rate_for_what_it_divides_by():
    """The quality table's "tokens/s" was tokens seen / the run's wall-clock (start-up, the
    first step and evaluations included) while the report of the same run averages the logged
    interval rates, also called tokens/s: 5,140 and 6,352 for one run."""
    rows = [{"bench": "quality", "run_id": "r", "kind": "pretrain", "name": "tiny",
             "architecture": "bert", "params": 1.49e6, "steps": 25, "tokens_seen": 102400,
             "wall_s": 20.0, "val_mlm_loss": 7.9, "val_mlm_acc": 0.044}]
    header, cells = pretrain_table(rows)
    assert header[6] == "tokens / wall-clock s" and cells[0][6] == "5,120"
    md = render_markdown(quality_blocks(rows, None, "quality"))
    assert ("tokens / wall-clock s: tokens seen over the wall-clock of the run's last train "
            "record (its first step, compilation, evaluations and checkpoints included)" in md)
    assert "shows tokens over the time of the logged intervals" in md  # as the report does


def test_published_sources_render_as_a_list_in_html(tmp_path):
    """The HTML page, too, lacked the published rows' sources and notes."""
    a = _glue_folder(tmp_path / "g", 45.0, 3, [{"name": "x", "label": "X (published)",
                                                "columns": {}, "average": "80.9",
                                                "source": "a paper", "note": "average only"}])
    page = (build_report([a], tmp_path / "rep", "html") / "index.html").read_text(encoding="utf-8")
    assert "<ul><li>X (published): a paper; average only.</li></ul>" in page


def test_a_bench_model_file_is_the_table_the_run_printed(tmp_path):
    """`report` on `bench model --out FILE` had shown each row's 40-odd fields (flops_per_token,
    peak_source, time, ...) with raw numbers; now the columns and formats of the bench's own
    table (bench/model.py reads them from report/bench_rows.py), the device and torch above it."""
    row = {"bench": "model", "arch": "bert", "model": "bertgpu", "size": "tiny",
           "micro_batch": 4, "seq_len": 64, "dtype": "fp32", "compile": False,
           "compile_mode": "off", "padding": "padded", "lengths": "full", "mean_length": 64.0,
           "iters": 2, "fwd_ms": 149.36, "bwd_ms": 80.02, "opt_ms": 34.77, "step_ms": 264.8,
           "tokens_per_s": 966.72, "mfu": 0.3475, "peak_tflops": 989.0, "peak_source": "table",
           "flops_per_token": 5913721.125, "vs_hf_eager": 1.8072, "vs_hf_compiled": None,
           "timed_compiles": 0, "device": "cuda", "device_name": "NVIDIA H200",
           "torch": "2.11.0+cu130", "time": 1795872842.875}
    bench = _write_jsonl(tmp_path / "model.jsonl", [row, {**row, "padding": "unpadded",
                                                          "tokens_per_s": 802.04}])
    md = (build_report([bench], tmp_path / "rep", "md") / "README.md").read_text()
    assert "Measured on NVIDIA H200 (torch 2.11.0+cu130)" in md
    assert "| arch | size | B | T | lengths | dtype | compile | padding | model | fwd ms |" in md
    first = [c.strip() for c in next(line for line in md.splitlines()
                                     if line.startswith("| bert |")).strip("|").split(" | ")]
    assert first[:9] == ["bert", "tiny", "4", "64", "full", "fp32", "off", "padded", "bertgpu"]
    assert "967" in first and "34.8%" in first and "1.81x" in first, first
    assert "flops_per_token" not in md and "peak_source" not in md


def test_each_run_is_named_with_its_architecture_and_masking(tmp_path):
    """Two runs' final MLM losses side by side, a BERT at 15% whole-word masking and a ModernBERT
    at 30%: the report's line under each said only "3 layers x 128 hidden, 2 heads, vocab 4000",
    nothing of why the losses differ."""
    runs = []
    for name, arch, rate, whole in (("bert", "bert", 0.15, True),
                                    ("modern", "modernbert", 0.3, False)):
        run = tmp_path / name
        run.mkdir()
        (run / "config.toml").write_text(
            f'seed = 0\n[model]\narchitecture = "{arch}"\nhidden_size = 128\n'
            "num_hidden_layers = 3\nnum_attention_heads = 2\nvocab_size = 4000\n"
            f"[data]\nmask_rate = {rate}\nwhole_word_masking = {str(whole).lower()}\n"
            '[train]\nglobal_batch_size = 16\nprecision = "fp32"\n', encoding="utf-8")
        _write_jsonl(run / "metrics.jsonl", [_start(0), _train(1, [1.0, 1.0])])
        runs.append(run)
    md = (build_report(runs, tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    assert ("BERT, 3 layers x 128 hidden, 2 heads, vocab 4000; 15% masked, whole words; global "
            "batch 16, fp32") in md
    assert "ModernBERT, 3 layers x 128 hidden, 2 heads, vocab 4000; 30% masked; global" in md


def test_a_short_duration_is_not_shown_as_zero():
    """A fine-tuning of 0.08 s read "0 s" in the report's train time."""
    from bertgpu.report.sections import _fmt_duration

    assert [_fmt_duration(s) for s in (0.08, 0.4, 3.14159, 9.6, 42.4, 123, 3900)] == [
        "0.08 s", "0.4 s", "3.1 s", "10 s", "42 s", "2 min 03 s", "1 h 05 min"]
