"""The end of a fine-tuning run (rank 0): the test predictions, results.json, then OUT.tmp
renamed to OUT, its checkpoints removed (finetune.py runs it once the loop has ended)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.config.finetune import FinetuneConfig, peak_lr
from bertgpu.config.overrides import config_to_dict
from bertgpu.fsutil import replace_dir
from bertgpu.tasks.finetune_output import (
    FINETUNE_OUTPUT,
    device_name,
    drop_checkpoints,
    is_finetune_output,
    json_text,
    metric_text,
)

if TYPE_CHECKING:
    from bertgpu.tasks.finetuning import Job
    from bertgpu.tasks.init_model import InitCheckpoint


def write_results(job: Job, task: Any, loop: Any, result: Any, extra: dict[str, Any],
                   cfg: FinetuneConfig, init: str, config_from: Any, tok_dir: Path, out: Path,
                   info: Any, timing: dict[str, float], max_seq_len: int,
                   ckpt: InitCheckpoint | None) -> dict[str, Any]:
    """Rank 0: test predictions, results.json, then OUT.tmp -> OUT (checkpoints removed).

    Times (rank 0, seconds): `seconds` the whole run in this process; `load_seconds` tokenizer,
    data (`load_data_seconds`: reading and encoding), model and engine; `train_seconds` the
    training steps (host batch building included: `data_wait_seconds`); `eval_seconds` every
    dev evaluation (sharded forward, gather, scoring); per epoch, `epochs[i].train_seconds` is
    the cumulative train time at that evaluation and `epochs[i].eval_seconds` its own time.
    `best` is the epoch with the highest dev score, the earliest of epochs tied on it."""
    import torch

    from bertgpu import __version__
    from bertgpu.config.finetune import doc_stride

    work = loop.run_dir
    for _split, data, write in job.predict_test:
        write(task.predict(data), work)
    history = task.history
    train_s = task.train_seconds()  # the steps before a resume included
    final = history[-1]
    # the highest dev score; of tied epochs the earliest (max keeps the first maximum)
    best = max(history, key=lambda r: r["score"])
    # GLUE's results-table columns: each split's own score (the job's primary score of that split).
    columns = {ev.column: job.primary({ev.name: final["metrics"][ev.name]})
               for ev in job.evals if ev.column}
    results = {
        "task": job.name, **extra, "init": init,
        # the weights it started from (a run folder's newest checkpoint when the run started)
        "init_checkpoint": ckpt.record() if ckpt is not None else None,
        "config_from": str(config_from) if config_from else None,
        "tokenizer": str(tok_dir),
        "metrics": final["metrics"], "score": final["score"], "columns": columns,
        "best": {"epoch": best["epoch"], "metrics": best["metrics"], "score": best["score"]},
        "epochs": history,
        "config": config_to_dict(cfg),
        "max_seq_len": max_seq_len,  # as used (config's max_seq_len stays as given, none = default)
        # SQuAD's window overlap as used, likewise (config's doc_stride as given)
        **({"doc_stride": doc_stride(cfg, max_seq_len)} if job.head == "qa" else {}),
        "train_sequences": len(job.train),
        "eval_sequences": {e.name: len(e.data) for e in job.evals},
        "steps": loop.engine.step, "skipped_steps": loop.engine.skipped_steps,
        "peak_lr": peak_lr(cfg),
        **timing,
        "train_seconds": train_s,
        "data_wait_seconds": task.data_wait_seconds(),
        "eval_seconds": sum(r.get("eval_seconds", 0.0) for r in history),
        "train_examples_per_s": result.sequences_seen / max(train_s, 1e-9),
        "eval_examples_per_s": task.eval_examples / max(task.eval_s, 1e-9),
        "device": device_name(info.device), "world_size": info.world_size,
        "torch_version": torch.__version__, "bertgpu_version": __version__,
    }
    tmp = work / "results.json.tmp"
    tmp.write_text(json_text(results, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, work / "results.json")
    drop_checkpoints(work)
    replace_dir(work, out, replaces=is_finetune_output, what=FINETUNE_OUTPUT)
    scores = (f"{s} " + ", ".join(metric_text(k, v) for k, v in m.items())
              for s, m in final["metrics"].items())
    print(f"{job.name}: {', '.join(scores)} -> {out}", flush=True)
    return results
