"""Fine-tuning of exports and their random twins on the demo's labelled sets, once per seed:
step 4 of `bertgpu bench quality` and stage 5 of `bertgpu demo`.

A re-run goes on where the last one ended. A seed whose run finished before (OUT/results.json)
is kept when it is provably the same run: the record beside it (OUT.run.json, written when the
run starts) names the same init weights (a sha256 of the export's files: its path alone stays
the same when pretraining goes further), set, data, settings and seed, and its results.json
agrees. Anything else is run again; a stopped run (OUT.tmp) of other weights or settings is
started over rather than resumed. A stop signal during a run raises `RunStopped`, which the
commands turn into one line and 128 + the signal.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import signal
import statistics
import warnings
from pathlib import Path
from typing import Any

from bertgpu.bench import cells
from bertgpu.errors import BertgpuError

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
"""Weight files: what a random twin does not read of the folder it takes its shape from."""


class RunStopped(Exception):
    """A stop signal (SIGTERM, Ctrl-C) ended a fine-tuning run part-way; it kept its checkpoint
    for a re-run. Not an error: the command ends with `status` (128 + the signal: 143 SIGTERM, 130
    SIGINT) and one line; `str()` names the run, the step and its folder, `again` what a re-run
    does."""

    def __init__(self, status: int, run: str, step: int, where: Path, again: str) -> None:
        super().__init__(f"the fine-tuning {run} at step {step}, in {where}")
        self.status, self.run, self.step, self.where, self.again = status, run, step, where, again

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.status - 128).name
        except ValueError:
            return f"exit status {self.status}"


def stopped(result: dict[str, Any], run: str, where: Path, again: str) -> None:
    """Raise `RunStopped` when `result` (what finetune and glue return) says a signal stopped it."""
    if result.get("preempted"):
        raise RunStopped(int(result.get("exit_status", 128 + signal.SIGTERM)), run,
                         int(result.get("step", 0)), where, again)


@contextlib.contextmanager
def quiet(log: Path):
    """The run's own console lines go to `log`; the bench prints one line per run."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f):
        yield


def set_overrides(name: str | None, extra: list[str]) -> list[str]:
    """Fine-tuning words of a demo set (or GLUE, name None), then `extra` (which wins)."""
    from bertgpu.tasks.demo_sets import finetune_words

    if name is None:
        return list(extra)
    return [*finetune_words(name), *extra]


def spread_row(scores: list[float]) -> dict[str, float]:
    return {"median": float(statistics.median(scores)), "min": min(scores), "max": max(scores),
            "spread": max(scores) - min(scores)}


def read_score(folder: Path) -> tuple[float, str]:
    """The final dev score of a fine-tuning run and the names of its metrics, from results.json."""
    path = folder / "results.json"
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertgpuError(f"{path}: unreadable ({e}); did the fine-tuning run fail?") from None
    metrics = next(iter(res["metrics"].values()))
    return float(res["score"]), " / ".join(metrics)


def folder_digest(folder: Path, weights: bool = True) -> str | None:
    """sha256 over the names and bytes of every file under `folder` (without the weight files
    unless `weights`); None when it cannot be read: then nothing made from it is kept."""
    from bertgpu.fsutil import file_sha256

    h = hashlib.sha256()
    try:
        files = sorted(p for p in Path(folder).rglob("*") if p.is_file()
                       and (weights or p.suffix not in WEIGHT_SUFFIXES))
        for path in files:
            h.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\0".encode())
    except OSError:
        return None
    return h.hexdigest() if files else None


def _examples_digest(train: list[Any], dev: list[Any]) -> str:
    rows = [[[e.guid, e.text_a, e.text_b, e.label] for e in split] for split in (train, dev)]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _record_of(run: Path) -> Path:
    return run.with_name(run.name + ".run.json")


def _finished_same(run: Path, made: dict[str, Any]) -> bool:
    """`run` finished (results.json) as the run `made` describes: its record is `made` and its
    results.json agrees on the set, init and seed. In doubt (no digest, no record): False."""
    try:
        then = json.loads(_record_of(run).read_text(encoding="utf-8"))
        res = json.loads((run / "results.json").read_text(encoding="utf-8"))
        return (made["init_sha256"] is not None and then == made
                and res.get("task") == made["task"] and res.get("init") == made["init"]
                and res.get("config_from") == made["config_from"]
                and res["config"]["seed"] == made["seed"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _start(run: Path, made: dict[str, Any]) -> None:
    """Make way for the run `made` describes: no finished output, no stopped run of other weights
    or settings (finetune would resume it: an export's path is all it compares), its record."""
    from bertgpu.fsutil import remove_scratch

    shutil.rmtree(run, ignore_errors=True)
    record, work = _record_of(run), run.with_name(run.name + ".tmp")
    try:
        then = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        then = None
    if work.exists() and then != made:
        print(f"    {work}: stopped before with other init weights or settings (or unrecorded); "
              "starting it over", flush=True)
        remove_scratch(work, run)
    run.parent.mkdir(parents=True, exist_ok=True)
    cells.write_atomic(record, json.dumps(made, indent=1, sort_keys=True) + "\n")


def compare_downstream(inits: dict[str, Path], sets: list[str], seeds: list[int], out: Path,
                       extra: list[str] | None = None, split_seed: int = 0) -> list[dict[str, Any]]:
    """Fine-tune every export in `inits` (name -> HF folder) and its random twin on the demo's
    `sets` once per seed; one row per (name, init, set) with the scores read from results.json.
    The train/dev split is fixed (`split_seed`): seeds vary the fresh weights and the data order.
    A seed finished before from the same weights and settings is kept (module docstring);
    `RunStopped` when a stop signal ends a run."""
    from bertgpu import __version__
    from bertgpu.finetune import finetune_examples
    from bertgpu.tasks.demo_sets import demo_tasks

    data = demo_tasks(split_seed)
    rows = []
    for name, hf in inits.items():
        for label, init, config_from in (("pretrained", hf, None), ("random", "random", hf)):
            # the twin reads only the shape and tokenizer of `hf`, not its weights
            digest = folder_digest(Path(hf), weights=label == "pretrained")
            for set_name in sets:
                train, dev, task = data[set_name]
                words = set_overrides(set_name, extra or [])
                scores, metric, dirs = [], "", []
                for seed in seeds:
                    run = out / name / label / set_name / f"seed_{seed}"
                    made = {"init": str(init), "config_from": str(config_from) if config_from
                            else None, "init_sha256": digest, "task": set_name,
                            "scored_like": task.key, "data_sha256": _examples_digest(train, dev),
                            "overrides": words, "seed": seed, "bertgpu_version": __version__}
                    if _finished_same(run, made):
                        print(f"    kept seed_{seed}: finished before ({run}: the same init "
                              "weights, set, settings and seed)", flush=True)
                    else:
                        _start(run, made)
                        with quiet(run.with_suffix(".log")), warnings.catch_warnings():
                            # The task head is fresh in every pretrained run: expected, said once
                            # in the table.
                            warnings.filterwarnings("ignore", message=".*initialised fresh")
                            result = finetune_examples(task, train, dev, init, run,
                                                       config_from=config_from, name=set_name,
                                                       overrides=[*words, "--seed", str(seed)])
                        stopped(result or {}, f"{name}/{label}/{set_name}/seed_{seed}",
                                run.with_name(run.name + ".tmp"),
                                "runs finished from the same init weights and settings are "
                                "kept, a stopped one of them resumes from its checkpoint")
                    score, metric = read_score(run)
                    scores.append(score)
                    dirs.append(str(run))
                rows.append({"kind": "finetune", "name": name, "init": label, "task": set_name,
                             "scored_like": task.name, "metric": metric,
                             "train_examples": len(train), "dev_examples": len(dev),
                             "seeds": list(seeds), "scores": scores, **spread_row(scores),
                             "dirs": dirs})
                print(f"    fine-tuned {name} ({label} init) on {set_name}, seeds "
                      f"{', '.join(map(str, seeds))}: "
                      + ", ".join(f"{s:.1f}" for s in scores), flush=True)
    return rows
