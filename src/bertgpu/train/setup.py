"""What every training job builds before the loop runs: the optimizer, DDP, compile and the
engine around a model (`build_engine`), the per-rank dropout seed, and the checkpoint to resume
from, agreed by every rank (`load_resume`).

    engine, timer = build_engine(model, EngineSettings(precision="bf16", optimizer="lamb", lr=1e-3), info)
    seed_dropout(cfg.seed, info.rank)
    loop = Loop(task, model, engine, settings, info, comm_timer=timer, resume=load_resume(run_dir, info))
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertgpu.errors import BertgpuError
from bertgpu.train import distributed
from bertgpu.train.engine import Engine


def load_resume(run_dir: Path, info: distributed.DistInfo
                ) -> tuple[Path, dict[str, torch.Tensor], dict[str, Any]] | None:
    """(path, model state, train state) of the checkpoint to resume from, the same on every
    rank, or None.

    Rank 0 first repairs what a crash may have left (a `step_N.old` whose `step_N` is missing,
    stale `.tmp`/`.old` folders), then takes the newest checkpoint that verifies against its
    checksums and loads (a damaged newer one is skipped with a warning naming the problem), and
    broadcasts its step; the other ranks load that step (and fail clearly if they cannot see it:
    the run folder must be on a filesystem shared by every node)."""
    from bertgpu.train.checkpoint import (
        COMPLETE,
        checkpoint_dir,
        load_checkpoint,
        recover_checkpoints,
        resume_checkpoint,
    )

    run_dir = Path(run_dir)
    found = None
    if info.is_main:
        for line in recover_checkpoints(run_dir):
            print(f"{run_dir}: {line}", flush=True)
        found = resume_checkpoint(run_dir)
    if info.world_size == 1:
        return found
    step = int(distributed.broadcast_scalar(float(int(found[0].name.split("_")[1]) if found else -1)))
    if step < 0:
        return None
    if info.is_main:
        return found
    path = checkpoint_dir(run_dir, step)
    if not (path / COMPLETE).is_file():
        raise BertgpuError(f"{path}: rank {info.rank} cannot see the checkpoint rank 0 resumes from; "
                           f"expected the output folder on a filesystem shared by every node")
    return (path, *load_checkpoint(path))


@dataclass
class EngineSettings:
    """How a model is trained, whatever the job: precision, optimizer, DDP, compile."""

    precision: str = "fp32"
    grad_clip: float = 1.0
    max_nonfinite_steps: int = 5
    optimizer: str = "adamw"
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    compile: bool = False
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = True
    comm_hook: str = "none"
    measure_comm: bool = True


def build_engine(model: torch.nn.Module, es: EngineSettings, info: distributed.DistInfo
                 ) -> tuple[Engine, distributed.CommTimer | None]:
    """Optimizer, DDP and compile around `model` (already on its device), and the engine.

    DDP wraps first and torch.compile wraps DDP, the order PyTorch recommends: the compiled
    graph is split at DDP's bucket boundaries so gradient all-reduces overlap the backward."""
    from bertgpu.train import optim

    device = torch.device(info.device)
    if device.type == "cuda" and es.precision == "fp32":
        # fp32 matmuls on tensor cores (TF32): ~7x faster on A100/H100, 10-bit mantissa inputs;
        # MFU is reported against the TF32 peak accordingly.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    optimizer = optim.build_optimizer(model, es.optimizer, es.lr, weight_decay=es.weight_decay,
                                      betas=es.betas, eps=es.eps)
    timer = distributed.CommTimer(device) if info.distributed and es.measure_comm else None
    train_model = distributed.wrap_ddp(model, info, bucket_cap_mb=es.bucket_cap_mb,
                                       gradient_as_bucket_view=es.gradient_as_bucket_view,
                                       comm_hook=es.comm_hook, timer=timer)
    is_ddp = train_model is not model
    hook_state = getattr(train_model, "comm_hook_state", None)
    if es.compile:
        train_model = torch.compile(train_model)
    engine = Engine(train_model, optimizer, precision=es.precision, device=device,
                    grad_clip=es.grad_clip, max_nonfinite_steps=es.max_nonfinite_steps, ddp=is_ddp,
                    grads_are_bucket_views=is_ddp and es.gradient_as_bucket_view,
                    on_numerics_reset=(lambda: distributed.reset_comm_hook_state(hook_state))
                    if hook_state is not None else None)
    return engine, timer


def seed_dropout(seed: int, rank: int) -> None:
    """Dropout noise differs per rank (different data, different noise), from (seed, rank)."""
    torch.manual_seed(seed * 1000003 + rank)

