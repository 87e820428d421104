"""Reading the report's inputs: run folders, fine-tuning and GLUE folders, bench JSONL files.

Also the numbers taken from a run's records (``series``, ``pretrain_summary``): missing keys and
null (NaN) values are skipped, never read as zeros, except the final train loss, which is the last
train record's as it was (NaN when that step's loss was not finite: a run that diverged), beside
how the run ended (its ``end`` record).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError


@dataclass
class Source:
    """One input of the report: ``kind`` is "pretrain", "finetune", "glue", "bench", "quality" or
    "finetune-scaling"."""

    kind: str
    name: str
    path: Path
    data: Any


# --- Reading the inputs ----------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertgpuError(f"{path}: cannot read ({e}); expected a JSON object") from None
    if not isinstance(data, dict):
        raise BertgpuError(f"{path}: found a JSON {type(data).__name__}, expected an object")
    return data


def _read_config(path: Path) -> dict[str, Any]:
    from bertgpu.config.overrides import read_toml

    try:
        return read_toml(path)
    except BertgpuError:
        return {}  # the config only adds a description line; the metrics are the report


def _flatten(row: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"tokens_per_s": {"a": 1}}`` -> ``{"tokens_per_s.a": 1}``; lists become text."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        elif isinstance(value, list):
            out[name] = " ".join(str(v) for v in value)
        else:
            out[name] = value
    return out


BENCH_ROW_KEYS = ("bench", "tokens_per_s", "workers", "mfu")


def _read_bench(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a bench result file, as written (nested values kept). A line that is
    not a benchmark's row (a corpus, a run's GPU samples) stops the reading at that line: such a
    file was drawn as one large table of its records."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise BertgpuError(f"{path}:{i + 1}: found {line[:60]!r}, expected one JSON "
                                   "object per line") from None
            if not (isinstance(row, dict) and any(k in row for k in BENCH_ROW_KEYS)):
                raise BertgpuError(
                    f"{path}:{i + 1}: not a benchmark's row (it has none of the fields "
                    f"{', '.join(BENCH_ROW_KEYS)}); expected a JSONL file written by bertgpu "
                    "bench (for a run's metrics.jsonl or gpu.jsonl, pass the run folder)")
            rows.append(row)
    if not rows:
        raise BertgpuError(f"{path}: no result rows; expected a JSONL file from bertgpu bench")
    nested = {r.get("bench") for r in rows} & {"quality", "finetune-scaling"}
    if nested and len({r.get("bench") for r in rows}) > 1:
        kinds = sorted({str(r.get("bench", "unnamed")) for r in rows})
        raise BertgpuError(f"{path}: mixes rows of several benchmarks ({', '.join(kinds)}); "
                           f"expected the rows of one (bench {nested.pop()} writes its own file)")
    return rows


def _csv_value(text: str) -> Any:
    """A CSV cell as `bench model` wrote it from a JSON value: "" for none, True/False, numbers."""
    if text in ("", "None"):
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _read_bench_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of `bench model --out FILE.csv` (it writes CSV for a name ending in .csv), as
    the JSONL form's: the report refused the CSV that bench model documents."""
    import csv

    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as f:
            rows = [{k: _csv_value(v or "") for k, v in row.items() if k}
                    for row in csv.DictReader(f)]
    except (OSError, csv.Error) as e:
        raise BertgpuError(f"{path}: cannot read ({e}); expected a CSV file from bertgpu bench "
                           "model --out FILE.csv") from None
    if not rows or not all(any(k in r for k in BENCH_ROW_KEYS) for r in rows):
        raise BertgpuError(f"{path}: no benchmark rows (a header with none of the fields "
                           f"{', '.join(BENCH_ROW_KEYS)}); expected a CSV file from bertgpu bench "
                           "model --out FILE.csv")
    return rows


def read_gpu_files(run: Path) -> dict[str, list[dict[str, Any]]]:
    """The GPU monitor's samples of a run folder: ``{"": gpu.jsonl's, "node1": ...}``."""
    from bertgpu.telemetry.records import read_jsonl

    out = {}
    for path in sorted(run.glob("gpu*.jsonl")):
        label = "" if path.name == "gpu.jsonl" else path.name[len("gpu."):-len(".jsonl")]
        out[label] = [r for r in read_jsonl(path) if isinstance(r.get("gpu"), int)]
    return out


BENCH_FILES = ("scaling.jsonl", "quality.jsonl", "finetune_scaling.jsonl")
"""The result file a bench suite writes in its --out folder (`bench model` writes the file
--out names)."""


def load_source(path: Path | str) -> Source:
    """Recognise and read one report input (see the package docstring for the kinds)."""
    from bertgpu.telemetry.records import read_metrics

    path = Path(path)
    if not path.exists():
        running = path.with_name(path.name + ".tmp")
        if (running / "metrics.jsonl").is_file():  # a fine-tuning run still in progress
            source = load_source(running)
            source.name = path.name
            return source
        if running.is_dir():
            raise BertgpuError(f"{path}: does not exist, and {running} (a fine-tuning run "
                               "starting) has no records yet (metrics.jsonl)")
        raise BertgpuError(f"{path}: does not exist")
    if path.is_file():
        if path.name == "metrics.jsonl":
            return load_source(path.parent)
        if path.name in ("glue_results.json", "results.json"):
            return load_source(path.parent)
        if path.suffix == ".jsonl":
            rows = _read_bench(path)
            # nested rows (curves): report/quality.py
            if all(r.get("bench") == "quality" for r in rows):
                return Source("quality", path.stem, path, rows)
            if all(r.get("bench") == "finetune-scaling" for r in rows):  # finetune_scaling.py
                return Source("finetune-scaling", path.stem, path, rows)
            return Source("bench", path.stem, path, [_flatten(r) for r in rows])
        if path.suffix == ".csv":
            return Source("bench", path.stem, path, _read_bench_csv(path))
    else:
        if (path / "glue_results.json").is_file():
            return Source("glue", path.name, path, _read_json(path / "glue_results.json"))
        if (path / "results.json").is_file():
            return Source("finetune", path.name, path, _read_json(path / "results.json"))
        if (path / "metrics.jsonl").is_file():
            records = read_metrics(path, drop_superseded=True)
            if finetune_in_progress(path, records):
                return Source("finetune", path.name.removesuffix(".tmp"), path,
                              finetune_progress(path, records))
            config = _read_config(path / "config.toml")
            return Source("pretrain", path.name, path, {"records": records, "config": config,
                                                        "gpus": read_gpu_files(path)})
        for name in BENCH_FILES:  # the --out folder of a bench suite: its result file
            if (path / name).is_file():
                return load_source(path / name)
    raise BertgpuError(
        f"{path}: not a pretraining run (metrics.jsonl), fine-tuning folder (results.json), "
        "GLUE folder (glue_results.json), bench result file (*.jsonl, or bench model's *.csv) "
        "or bench folder "
        f"({', '.join(BENCH_FILES)})"
    )


def load_sources(path: Path | str) -> tuple[list[Source], bool]:
    """The sources of one report input, and whether it is a GLUE folder without its table: the
    input itself, or, for a GLUE folder whose table is not written yet (`bertgpu glue`
    interrupted, or still running), the fine-tuning runs in it so far, finished or in progress,
    each named TASK/seed_N (it used to be refused as "not a ... GLUE folder
    (glue_results.json)")."""
    path = Path(path)
    if not path.is_dir() or any((path / n).is_file() for n in (
            "glue_results.json", "results.json", "metrics.jsonl", *BENCH_FILES)):
        return [load_source(path)], False
    runs = glue_runs(path)
    if not runs:
        return [load_source(path)], False
    sources = []
    for name, run in runs:
        if (run / "results.json").is_file() or (run / "metrics.jsonl").is_file():
            source = load_source(run)
            source.name = f"{path.name}/{name}"
            sources.append(source)
    if not sources:
        raise BertgpuError(f"{path}: a GLUE folder without its table (glue_results.json) whose "
                           "runs have no records yet; expected one that `bertgpu glue` has "
                           "trained in for a step or more")
    return sources, True


def glue_runs(path: Path) -> list[tuple[str, Path]]:
    """The runs of `bertgpu glue` in `path`: ("SST-2/seed_1", folder) for each TASK/seed_N, or
    TASK/seed_N.tmp of one not finished, in task folder and seed order (any folder name: the
    report does not import the task table, tasks/glue.py)."""
    import re

    found = []
    for task in sorted(p.name for p in path.iterdir() if p.is_dir()):
        seeds: dict[int, Path] = {}
        for run in (path / task).glob("seed_*"):
            m = re.fullmatch(r"seed_(\d+)(\.tmp)?", run.name)
            if m and run.is_dir() and (not m[2] or int(m[1]) not in seeds):
                seeds[int(m[1])] = run  # a finished run before a re-run of it in progress
        found += [(f"{task}/seed_{n}", seeds[n]) for n in sorted(seeds)]
    return found


def finetune_in_progress(path: Path, records: list[dict[str, Any]]) -> bool:
    """A fine-tuning run still in its OUT.tmp, which has no results.json until the run is done.
    A pretraining run folder holds config.toml before its first record and none of a fine-tuning
    run's marks: the scratch mark of OUT.tmp (fsutil.make_scratch), a start record naming its
    task, a checkpoint's finetune.json, eval records with a ``score``."""
    from bertgpu.fsutil import is_scratch
    from bertgpu.telemetry.records import run_task

    if (path / "config.toml").is_file():
        return False
    return (is_scratch(path) or run_task(records) is not None
            or any(path.glob("checkpoints/*/finetune.json"))
            or any(r.get("kind") == "eval" and "score" in r for r in records))


def finetune_task(path: Path, records: list[dict[str, Any]]) -> str:
    """The task of the fine-tuning run in `path` (an OUT.tmp): its start record's, else (a run of
    a version that did not write it there) the newest checkpoint's; "" when neither names one."""
    from bertgpu.telemetry.records import run_task

    return run_task(records) or _checkpoint_task(path)


def _checkpoint_task(path: Path) -> str:
    """The task named in the newest checkpoint's finetune.json (the run's identity), or ""."""
    def step(p: Path) -> int:
        number = p.parent.name.removeprefix("step_")
        return int(number) if number.isdigit() else -1

    for found in sorted(path.glob("checkpoints/step_*/finetune.json"), key=step, reverse=True):
        try:
            task = json.loads(found.read_text(encoding="utf-8")).get("task")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(task, str):
            return task
    return ""


_EVAL_FIELDS = ("step", "kind", "time", "elapsed_s", "epoch", "score")


def finetune_progress(path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """What results.json would say of a fine-tuning run still in progress, from its records:
    ``task`` (``finetune_task``), ``score`` and ``latest`` (the metrics of its newest evaluation),
    ``epochs`` (one per evaluation: epoch, step, score; not results.json's train loss, the mean
    over the epoch, which no record holds), ``steps`` done of ``max_steps``; and ``ended``: how
    it ended, or that it has not yet."""
    from bertgpu.telemetry.records import run_start

    evals = [r for r in records if r.get("kind") == "eval" and "score" in r]
    latest = evals[-1] if evals else {}
    # the newest train or eval record (an epoch's evaluation comes after its last train record)
    steps = [s for s in (num(r.get("step")) for r in records if r.get("kind") in ("train", "eval"))
             if s is not None]
    start = run_start(records)
    return {
        "task": finetune_task(path, records),
        "score": latest.get("score"),
        "latest": {k: v for k, v in latest.items() if k not in _EVAL_FIELDS},
        "latest_epoch": latest.get("epoch"), "latest_step": latest.get("step"),
        "epochs": [{"epoch": r.get("epoch"), "step": r.get("step"), "score": r.get("score")}
                   for r in evals],
        "steps": max(steps) if steps else None,
        "max_steps": num(start.get("max_steps")) if start is not None else None,
        "ended": _ending(records) or "started; no train or eval record yet",
        "in_progress": True,
    }


def num(value: Any) -> float | None:
    """A finite float, or None for anything else (null/NaN, text, booleans, missing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def series(records: list[dict[str, Any]], kind: str, key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the records of ``kind``, non-finite values skipped."""
    xs, ys = [], []
    for r in records:
        if r.get("kind") == kind:
            x, y = num(r.get("step")), num(r.get(key))
            if x is not None and y is not None:
                xs.append(x)
                ys.append(y)
    return xs, ys


def _last(records: list[dict[str, Any]], kind: str, key: str) -> float | None:
    ys = series(records, kind, key)[1]
    return ys[-1] if ys else None


def _final(records: list[dict[str, Any]], kind: str, key: str) -> float | None:
    """``key`` of the last record of ``kind`` that has it, as it was (NaN for null)."""
    for r in reversed(records):
        if r.get("kind") == kind and key in r:
            v = r[key]
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    return None


def _ending(records: list[dict[str, Any]]) -> str | None:
    """How the run ended (its end record), or that it has none yet; None for an empty log."""
    from bertgpu.telemetry.records import describe_end, run_end, run_start

    end = run_end(records)
    if end is not None:
        start = run_start(records)
        return describe_end(end, num(start.get("max_steps")) if start is not None else None)
    if any(r.get("kind") in ("train", "eval") for r in records):
        return "no end record (still running, or killed)"
    return None


def runs_of(values: list[Any]) -> list[Any]:
    """`values` without consecutive repeats: [2, 2, 1, 1] -> [2, 1]."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def pretrain_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The numbers of a run's summary table; None where the run did not log them.

    Throughput and MFU are over the logged train intervals, weighted by their time: total tokens
    over total seconds (a plain mean of the rates would count a short fast interval as much as a
    long slow one). An interval's time is its measured steps (``rate_steps``, at most the
    interval's; an older run: all its steps) over its ``steps_per_s``. A run that logs
    ``compile_s``
    measured its rates without the steps that compiled and without its first step, so every
    interval counts; an older run's first interval included start-up (compilation, data
    warm-up) and is left out when there are three or more. ``compile_s`` is the time spent in
    steps that compiled, summed over the processes of a resumed run (each starts from zero).
    """
    honest = any("compile_s" in r for r in records if r.get("kind") == "train")

    # (rates, seconds) of each train interval: its steps since the previous train record (or
    # the start record of the process that logged it) over its steps_per_s.
    intervals: list[tuple[dict[str, Any], float]] = []
    prev = 0.0
    for r in records:
        step = num(r.get("step"))
        if r.get("kind") == "info" and r.get("event") == "start" and step is not None:
            prev = step
        elif r.get("kind") == "train" and step is not None:
            sps = num(r.get("steps_per_s"))
            measured = min(step - prev, num(r.get("rate_steps")) or step - prev)
            intervals.append((r, measured / sps if sps and measured > 0 else 1.0))
            prev = step
    intervals = intervals[1:] if len(intervals) >= 3 and not honest else intervals

    def rate(key: str) -> float | None:
        pairs = [(y, t) for y, t in ((num(r.get(key)), t) for r, t in intervals) if y is not None]
        seconds = sum(t for _, t in pairs)
        return sum(y * t for y, t in pairs) / seconds if seconds else None

    compile_s, last = 0.0, 0.0
    for r in records:  # each process's compile_s counts from zero, from its start record
        if r.get("kind") == "info" and r.get("event") == "start":
            last = 0.0
        elif r.get("kind") == "train" and (y := num(r.get("compile_s"))) is not None:
            compile_s += y - last if y >= last else y  # a drop: a process without a start record
            last = y

    # Optimizer steps: the highest step of a train record or of an end record (where it ended).
    steps = [s for s in (num(r.get("step")) for r in records
                         if r.get("kind") == "train"
                         or (r.get("kind") == "info" and r.get("event") == "end")) if s]
    # Checkpoints: how long each kept the training thread (stall_s; background writes: only the
    # host copy and any wait for the previous write) and how long background writes took.
    stalls = series(records, "info", "stall_s")[1]
    writes = series(records, "info", "write_s")[1]
    # written: a save in the training thread is logged once written, one in the background when
    # its write ended (checkpoint_written); one cut short by a kill is not a checkpoint
    saves = [r for r in records if r.get("kind") == "info" and r.get("event") == "checkpoint"]
    written = (sum(1 for r in saves if not r.get("background"))
               + sum(1 for r in records if r.get("event") == "checkpoint_written"))
    elapsed = [e for e in (num(r.get("elapsed_s")) for r in records) if e is not None]
    mem = series(records, "train", "mem_peak_gib")[1]
    worlds = [w for w in (num(r.get("world_size")) for r in records) if w is not None]
    return {
        "steps": max(steps) if steps else None,
        "tokens_seen": _last(records, "train", "tokens_seen"),
        "train_loss": _final(records, "train", "loss"),
        # the last evaluation's, as it was: a NaN loss is not replaced by an earlier finite one
        "val_mlm_loss": _final(records, "eval", "val_mlm_loss"),
        "val_mlm_acc": _final(records, "eval", "val_mlm_acc"),
        "val_nsp_acc": _final(records, "eval", "val_nsp_acc"),
        "tokens_per_s": rate("tokens_per_s"),
        "tokens_per_s_per_device": rate("tokens_per_s_per_device"),
        "mfu": rate("mfu"),
        "compile_s": compile_s if honest else None,
        "mem_peak_gib": max(mem) if mem else None,
        "wall_s": max(elapsed) if elapsed else None,
        # a run resumed on another number of devices: each count in turn, as its rates mix them
        "world_size": (" then ".join(f"{w:.0f}" for w in runs_of(worlds))
                       if len(runs_of(worlds)) > 1 else worlds[-1] if worlds else None),
        "checkpoints": written or None,
        "checkpoint_stall_s": sum(stalls) / len(stalls) if stalls else None,
        "checkpoint_stall_max_s": max(stalls) if stalls else None,
        "checkpoint_write_s": sum(writes) / len(writes) if writes else None,
        "ended": _ending(records),
    }
