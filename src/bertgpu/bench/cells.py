"""What the benchmarks that run one command per cell share (`bench scaling`,
`bench finetune-scaling`): the children's environment, one run in a fresh process with its console
in a log file, and the outputs (JSONL rows appended, a markdown table replaced atomically).

A fresh process per cell (never a function call in this one) keeps cells independent: nothing of
one run's threads, allocator, compiled graphs or process group leaks into the next, and a worker
count > 1 goes through the same launcher a user's command does.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import check_output_folder


def child_env(threads: int | None) -> dict[str, str]:
    """The environment of a measured run: this bertgpu first on the path, not a torchrun worker,
    and `threads` intra-op threads per process (None: leave OMP_NUM_THREADS as it is)."""
    env = dict(os.environ)
    env.pop("WORLD_SIZE", None)  # a benchmark started under torchrun must not look like a worker
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    src = str(Path(__file__).resolve().parents[2])  # the children import this same bertgpu
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_logged(cmd: list[str], env: Mapping[str, str], log: Path, timeout_s: float,
               what: str) -> float:
    """Run `cmd` to completion with stdout and stderr in `log`; the wall-clock seconds it took.
    A non-zero exit or the timeout is a BertgpuError naming `what`, the log and its last line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        try:
            rc = subprocess.run(cmd, env=dict(env), stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout_s, check=False).returncode
        except subprocess.TimeoutExpired:
            raise BertgpuError(f"{log}: {what}: no result within --timeout-s {timeout_s:g}"
                               ) from None
    if rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
        raise BertgpuError(f"{log}: {what} failed with exit code {rc} "
                           f"({tail[0] if tail else 'no output'})")
    return time.monotonic() - t0


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def append_jsonl(path: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Append one JSON object per row; NaN and infinities (no baseline, not reached) as null, so
    the file stays valid JSON for any reader."""
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            row = {k: _finite_or_none(v) for k, v in r.items()}
            f.write(json.dumps(row, allow_nan=False) + "\n")


def positive(kind: type = float):
    """An argparse type: a finite number above 0 (`kind` int or float). Zero, negatives, nan and
    inf are refused at parsing, naming the flag (a 0 in a cost model divided by zero, a nan
    bandwidth read as perfect efficiency, a negative budget as negative tokens)."""
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, found "
                                             f"{text!r}") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"expected a positive finite {kind.__name__}, "
                                             f"found {text}")
        return value
    parse.__name__ = f"positive {kind.__name__}"
    return parse


def open_fraction(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1 (a held-out share the benchmark
    measures on: 0 left nothing to measure, found only after the tokenizer and the shards)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, found "
                                         f"{text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1 (both excluded), "
                                         f"found {text}")
    return value


def check_result_files(folder: Path, names: list[str]) -> None:
    """Before a benchmark runs: none of the files it will write into `folder` is a folder (that
    was a traceback after all the measurements, with half its files written)."""
    for name in names:
        if (Path(folder) / name).is_dir():
            raise BertgpuError(f"{Path(folder) / name}: is a folder; expected the benchmark's "
                               "results file there (move the folder away or choose another --out)")


DEVICE_HELP = "auto, cpu, cuda, cuda:N or mps (default: auto)"


def device(text: str) -> str:
    """argparse type of a --device passed on to `pretrain --impl.device`: auto, cpu, cuda,
    cuda:N or mps, refused at parsing (it failed in the first run, after OUT/runs was made)."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected auto, cpu, cuda, cuda:N or mps")
    return text


BENCH_MARK = ".bertgpu-bench"
"""In a benchmark's --out folder: the name of the suite that writes there (`mark_bench_folder`)."""


def check_bench_folder(out: Path, bench: str, results: list[str],
                       folders: tuple[str, ...] = ()) -> None:
    """Before a benchmark runs: `out` is new, empty or an earlier output of `bertgpu bench
    {bench}` (its mark, one of its `results` files, or one of the `folders` only it makes: a
    run of an older bertgpu stopped before its results), none of whose `results` is a folder
    (`check_result_files`). A suite adds its runs, data and results to the folder (and `bench
    quality` replaces its tokenizer/ and data/): a tokenizer or run folder given as --out took
    them all, and a run folder's rows went into the same metrics file. So folders any project
    has (runs/, data/) prove nothing."""
    check_output_folder(out, f"a folder for the results of bertgpu bench {bench}")
    check_result_files(out, results)
    if not out.is_dir() or not any(out.iterdir()):
        return
    mark = out / BENCH_MARK
    if mark.is_file():
        if mark.read_text(encoding="utf-8", errors="replace").strip() == bench:
            return
    elif (any((out / name).exists() for name in results)  # an output of an older bertgpu
          or any((out / name).is_dir() for name in folders)):
        return
    raise BertgpuError(f"{out}: a folder that is not an output of bertgpu bench {bench} (no "
                       f"{results[0]}); expected a new or empty --out folder, or an earlier one "
                       "of this benchmark (it adds its runs and results there; one an older "
                       f"bertgpu left unfinished: echo {bench} > {out / BENCH_MARK})")


def mark_bench_folder(out: Path, bench: str) -> None:
    """`out` made (if need be) and marked as `bench`'s, before the suite writes anything else
    there: a run stopped before its results is still its own to the next (`check_bench_folder`)."""
    out.mkdir(parents=True, exist_ok=True)
    mark = out / BENCH_MARK
    if not mark.is_file():
        mark.write_text(bench + "\n", encoding="utf-8")


def check_rows_file(path: str | Path, bench: str, also: tuple[str, ...] = ()) -> None:
    """Before a benchmark runs: `path` can take its rows (not a folder, under a folder that is
    or can be made), so that minutes of measurements are not lost at the end; and an existing
    file is an earlier results file of this benchmark: its first row's ``bench`` is `bench` (a
    JSONL file may hold the rows of `also` as well: each row keeps its own fields; a CSV's
    columns are those of one kind). Any other .jsonl (a run's metrics.jsonl, a corpus) or CSV
    got the rows appended (a CSV of another header, rows of empty fields)."""
    path = Path(path)
    if path.is_dir():
        raise BertgpuError(f"{path}: is a folder; expected a .jsonl or .csv file to append the "
                           "rows to")
    if path.suffix not in (".jsonl", ".csv"):
        raise BertgpuError(f"{path}: expected a .jsonl or .csv file name (the rows' format "
                           "follows it, and `bertgpu report` reads them by it)")
    check_output_folder(path.parent, "a folder for the results file")
    found = _first_bench(path)
    kinds = (bench,) if path.suffix == ".csv" else (bench, *also)
    if found is not None and found[0] not in kinds:
        raise BertgpuError(f"{path}: not a file of `bench: {bench}` rows ({found[1]}); expected "
                           "a new file name, or an earlier --out of these rows (they are "
                           "appended)")


def _first_bench(path: Path) -> tuple[str | None, str] | None:
    """The ``bench`` field of the first row of a results file (None: it has none) and what that
    row is, in words; None for a missing or empty file."""
    try:
        with path.open(newline="", encoding="utf-8", errors="replace") as f:
            if path.suffix == ".csv":
                header = next(csv.reader(f), [])
                if header and "bench" not in header:
                    return None, f"its header has no bench column: {','.join(header)[:60]!r}"
                row = next(csv.DictReader(f, fieldnames=header), None) if header else None
            else:
                line = next((text for text in f if text.strip()), None)
                try:
                    row = json.loads(line) if line is not None else None
                except ValueError:
                    row = line
                if row is not None and not (isinstance(row, dict) and "bench" in row):
                    return None, (f"its first line is not a row with a bench field: "
                                  f"{line.strip()[:60]!r}")
    except FileNotFoundError:
        return None
    except csv.Error as e:  # (a binary file)
        return None, f"not a CSV file: {e}"
    if row is None:
        return None
    return str(row.get("bench")), f"its first row is bench {row.get('bench')}'s"


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append rows to a JSONL file (`append_jsonl`), or to a CSV (header written when the file is
    new). A CSV's rows follow its header: rows with columns it lacks (a file begun by an older
    bertgpu, before `peak_tflops`, say) are written without them, said in one line, rather than
    shifted under the wrong names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        header = _csv_header(path)
        keys = header or (list(rows[0]) if rows else [])
        with path.open("a", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
            if not header:
                w.writeheader()
            w.writerows(rows)
        left = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in keys]
        if left:
            print(f"note: {path}: its header has no column {', '.join(left)}: left out of the "
                  "rows appended (a new file would have it)", flush=True)
        return
    append_jsonl(path, rows)


def _csv_header(path: Path) -> list[str]:
    """The column names of a CSV file's first line; [] for a missing or empty file."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except FileNotFoundError:
        return []


def write_atomic(path: Path, text: str) -> None:
    """`path` replaced by `text` in one rename: a reader never sees half a table."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
