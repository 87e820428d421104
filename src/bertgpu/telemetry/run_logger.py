"""`open_logger`: the run's `MetricsLogger` with the metric sinks and the GPU monitor that the
`[logging]` section asks for, on every rank (rank 0 writes)::

    logger = open_logger(run_dir, is_main, cfg.logging, config_dict, device=device,
                         total_steps=max_steps, log_every=10, initial_step=step)
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bertgpu.config.sections import LoggingSection
from bertgpu.telemetry.metrics import MetricsLogger
from bertgpu.telemetry.monitor import GpuMonitor
from bertgpu.telemetry.sinks import MlflowSink, Sink, SinkStartError, WandbSink, check_packages


def _node_rank() -> tuple[int, int]:
    """(node index, local rank) from torchrun's environment; (0, 0) outside it."""
    local = int(os.environ.get("LOCAL_RANK", "0") or 0)
    node = os.environ.get("GROUP_RANK") or os.environ.get("NODE_RANK")
    if node is None:
        rank, local_world = int(os.environ.get("RANK", "0") or 0), int(
            os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        return rank // max(local_world, 1), local
    return int(node), local


def open_logger(
    run_dir: Path | str | None,
    is_main: bool,
    logging_cfg: LoggingSection | None,
    config_dict: Mapping[str, Any] | None,
    *,
    device: Any = None,
    nvml: Any = None,
    **logger_kwargs: Any,
) -> Any:
    """A ``MetricsLogger`` with the sinks and the GPU monitor ``logging_cfg`` asks for.

    Call it on every rank (a missing package raises BertgpuError on every rank alike). Rank 0
    (``is_main``) writes metrics.jsonl, the sinks and ``gpu.jsonl``; on a node other than the
    first, local rank 0 samples that node's GPUs into ``gpu.nodeN.jsonl`` when it is given the
    (shared) ``run_dir``; other ranks get a logger that does nothing. ``config_dict`` (the
    resolved config) goes to every sink; ``device`` is this process's device, whose NVML
    utilisation and memory go into the train records. ``nvml`` replaces pynvml (tests).
    ``logger_kwargs`` go to ``MetricsLogger`` (``total_steps``, ``log_every``,
    ``initial_step``, ``elapsed_offset_s``, ...). The logger closes the sinks and the monitor.
    """
    cfg = logging_cfg if logging_cfg is not None else LoggingSection()
    check_packages(cfg)
    run_dir = Path(run_dir) if run_dir is not None else None
    node, local_rank = _node_rank()
    gpu_file: Path | None = None
    if run_dir is not None and is_main:
        gpu_file = run_dir / "gpu.jsonl"
    elif run_dir is not None and local_rank == 0 and node > 0:
        gpu_file = run_dir / f"gpu.node{node}.jsonl"
    monitor = None
    if is_main or gpu_file is not None:
        monitor = GpuMonitor.start_if_available(gpu_file, cfg.gpu_monitor_interval_s, nvml=nvml)
    sinks: list[Sink] = []
    # The folder the run will live in: a fine-tune runs in OUT.tmp and records OUT as its "out".
    out = (config_dict or {}).get("out")
    final = Path(out) if isinstance(out, str) and out else run_dir
    try:
        if is_main and run_dir is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            for flag, make in (("wandb", WandbSink), ("mlflow", MlflowSink)):
                if getattr(cfg, flag):
                    sink = _start(flag, lambda make=make: make(run_dir, cfg, final))
                    sinks += [sink] if sink is not None else []
        logger_kwargs.setdefault("tensorboard", cfg.tensorboard is not False)
        logger = MetricsLogger(run_dir if is_main else None, is_main, sinks=sinks,
                               monitor=monitor, device=device, **logger_kwargs)
    except BaseException:
        for sink in sinks:
            sink.close()
        if monitor is not None:
            monitor.close()
        raise
    if config_dict is not None:
        logger.log_config(config_dict)
    return logger


def renamed_run(logging_cfg: LoggingSection, work: Path, config: Mapping[str, Any],
                facts: Mapping[str, Any]) -> tuple[LoggingSection, dict[str, Any]]:
    """The ``[logging]`` section and the sinks' config of a run written in ``work`` (``OUT.tmp``)
    and renamed to ``OUT`` once complete (a fine-tune): the sinks name the run after ``OUT``
    (``OUT/TASK/seed_N`` for a glue cell, whose folder names alone repeat across cells) unless
    the section names it, point at ``OUT``, and get ``facts`` (task, init, init_checkpoint, data,
    max_seq_len as used) beside the config, as results.json records them."""
    out = work.with_name(work.name.removesuffix(".tmp"))
    parts = out.resolve().parts
    name = "/".join(parts[-3:] if out.name.startswith("seed_") else parts[-1:])
    named = dataclasses.replace(logging_cfg, wandb_run_name=logging_cfg.wandb_run_name or name,
                                mlflow_run_name=logging_cfg.mlflow_run_name or name)
    ckpt = facts.get("init_checkpoint")  # finetune's InitCheckpoint: its record, as results.json
    facts = {**facts, "init_checkpoint": ckpt.record() if hasattr(ckpt, "record") else ckpt}
    return named, {**config, **facts, "out": str(out)}


def _start(flag: str, make: Any) -> Sink | None:
    """The sink, or None after one warning: a sink that cannot start (no API key, a server that
    is down, a store that cannot be written) must not end the run, as one failing later does not
    (sinks.SinkFanout). A missing package is a config error instead (check_packages)."""
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - whatever the tracking client raises
        if isinstance(e, SinkStartError):
            why = str(e)
        else:
            text = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
            why = f"{type(e).__name__}: {text}" if text else type(e).__name__
        print(f"bertgpu: warning: the {flag} sink could not start ({why}); the run goes on "
              f"without it (logging.{flag} = false to silence this)", file=sys.stderr, flush=True)
        return None


__all__ = ["open_logger", "renamed_run"]
