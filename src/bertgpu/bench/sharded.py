"""`bertgpu bench model --strategy fsdp`: memory per rank of replicated (DDP) and sharded (FSDP)
training, measured, and predicted beyond the ranks this machine can run.

For each strategy and each world size of `--ranks` (default 1,2) the benchmark starts that many
processes (gloo on CPU, NCCL on CUDA with one GPU each), wraps our BertForPreTraining of
`--size` as training would (`distributed.wrap_model`: DDP, or FSDP2 per layer then the root),
builds AdamW after it, and runs `--warmup` + `--iters` steps on one micro batch. After the last
backward it reads the bytes of this rank's parameters and gradients, after the optimizer step
those of the optimizer state: the tensors' own sizes (a DTensor's local shard), not an estimate.

    bertgpu bench model --strategy fsdp --size base --micro-batch 2 --seq-len 64
    bertgpu bench model --strategy fsdp --size large --ranks 1,2 --out results/memory.jsonl

Rows for 4 and 8 ranks that were not measured are predicted from the measured one-rank bytes:
FSDP keeps 1/N of every tensor per rank, so params + grads + optimizer = (P + G + O) / N (plus
at most N - 1 padding rows per tensor); DDP keeps all of it on every rank, whatever N. Both leave
out activations and the layer FSDP all-gathers for its forward and backward (one layer's
parameters, plus one prefetched); with gradient accumulation FSDP keeps the parameters and the
gradients whole until the last micro-step (train/sharding.py), so the saving is then the
optimizer state's. The step time is the mean wall time of the timed steps (side by side in one
run; not a speed claim on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

PREDICTED_RANKS = (4, 8)
MIB = 2**20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, job: dict[str, Any], out: str) -> None:
    """One rank of one measurement (a spawned process)."""
    import torch

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    from bertgpu.train import distributed
    from bertgpu.train.sharding import local_state_bytes

    with distributed.process_group(job["device"], strategy=job["strategy"]) as info:
        row = _measure_built(job, info, local_state_bytes)
        if info.is_main:
            Path(out).write_text(json.dumps(row), encoding="utf-8")


def _measure_built(job: dict[str, Any], info: Any, local_state_bytes: Any) -> dict[str, Any]:
    """Build and measure; the sharded model dies with this frame, before the group is torn down."""
    model, optimizer, batch = _build(job, info)
    return _measure(model, optimizer, batch, job, info, local_state_bytes)


def _build(job: dict[str, Any], info: Any) -> tuple[Any, Any, dict[str, Any]]:
    import torch

    from bertgpu.bench.batches import SIZES, make_batches
    from bertgpu.config.sections import DistributedSection
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.train import sharding
    from bertgpu.train.optim import build_optimizer

    device = torch.device(info.device)
    torch.manual_seed(job["seed"])
    model = BertForPreTraining(BertConfig(**SIZES[job["size"]])).to(device)
    dist = DistributedSection(strategy=job["strategy"])
    model = sharding.wrap_model(model, info, dist, precision=job["dtype"])
    optimizer = build_optimizer(getattr(model, "module", model), "adamw", 1e-4)
    batch = make_batches(
        1, job["micro_batch"], job["seq_len"], 30522, "full", job["seed"] + info.rank, device
    )[0]
    return model, optimizer, batch


def _measure(
    model: Any,
    optimizer: Any,
    batch: dict[str, Any],
    job: dict[str, Any],
    info: Any,
    local_state_bytes: Any,
) -> dict[str, Any]:
    import torch

    cuda = info.device.startswith("cuda")
    autocast = torch.autocast(
        torch.device(info.device).type, dtype=torch.bfloat16, enabled=job["dtype"] == "bf16"
    )
    raw = getattr(model, "module", model)
    times, sizes = [], {}
    for i in range(job["warmup"] + job["iters"]):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        sizes = local_state_bytes(raw)  # gradients exist now, sharded or whole
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if i >= job["warmup"]:
            times.append(time.perf_counter() - t0)
    sizes["optimizer"] = local_state_bytes(raw, optimizer)["optimizer"]
    return {
        "bench": "model_memory",
        "strategy": job["strategy"],
        "ranks": info.world_size,
        "size": job["size"],
        "dtype": job["dtype"],
        "micro_batch": job["micro_batch"],
        "seq_len": job["seq_len"],
        "params_bytes": sizes["params"],
        "grads_bytes": sizes["grads"],
        "optimizer_bytes": sizes["optimizer"],
        "total_bytes": sizes["params"] + sizes["grads"] + sizes["optimizer"],
        "step_ms": 1e3 * sum(times) / max(len(times), 1),
        "mem_peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "device": info.device.split(":")[0],
        "source": "measured",
    }


def measure(job: dict[str, Any], world: int) -> dict[str, Any]:
    """Run one measurement on `world` fresh processes; rank 0's row."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "row.json")
        mp.start_processes(
            _worker,
            args=(world, _free_port(), job, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        return json.loads(Path(out).read_text(encoding="utf-8"))


def predicted(one_rank: dict[str, Any], world: int) -> dict[str, Any]:
    """The row of `world` ranks from a measured one-rank row (see the module docstring)."""
    n = world if one_rank["strategy"] == "fsdp" else 1
    row = {**one_rank, "ranks": world, "source": "predicted", "step_ms": None, "mem_peak_gib": None}
    for key in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        row[key] = -(-one_rank[key] // n)
    row["total_bytes"] = row["params_bytes"] + row["grads_bytes"] + row["optimizer_bytes"]
    return row


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: bytes per rank in MiB, and each row's total against DDP's on as many ranks."""
    ddp = {r["ranks"]: r["total_bytes"] for r in rows if r["strategy"] == "ddp"}
    head = (
        "| strategy | ranks | params MiB | grads MiB | optimizer MiB | total MiB | vs ddp "
        "| step ms | source |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ref = ddp.get(r["ranks"])
        vs = f"{r['total_bytes'] / ref:.2f}" if ref else "-"
        step = f"{r['step_ms']:.0f}" if r.get("step_ms") is not None else "-"
        lines.append(
            f"| {r['strategy']} | {r['ranks']} | {r['params_bytes'] / MIB:.1f} | "
            f"{r['grads_bytes'] / MIB:.1f} | {r['optimizer_bytes'] / MIB:.1f} | "
            f"{r['total_bytes'] / MIB:.1f} | {vs} | {step} | {r['source']} |"
        )
    return "\n".join(lines)


def _ranks(text: str) -> list[int]:
    try:
        ranks = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        ranks = []
    if not ranks or ranks[0] < 1:
        raise BertgpuError(
            f"--ranks {text!r}: expected a comma list of positive integers, e.g. 1,2"
        )
    return ranks


def main(args: argparse.Namespace) -> int:
    import torch

    from bertgpu.bench.cells import append_rows

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BertgpuError(
            f"--device {device}: CUDA is not available on this machine; expected --device cpu"
        )
    ranks = _ranks(args.ranks)
    if 1 not in ranks:
        ranks = [1, *ranks]  # the predictions start from the one-rank measurement
    most = torch.cuda.device_count() if device.startswith("cuda") else max(ranks)
    dtype = (args.dtype or (["bf16"] if device.startswith("cuda") else ["fp32"]))[0]
    iters = args.iters if args.iters is not None else 2
    warmup = args.warmup if args.warmup is not None else 1
    print(
        f"bertgpu bench model --strategy {args.strategy} | device {device} | {dtype} | "
        f"micro batch {args.micro_batch[0]} x {args.seq_len[0]} | torch {torch.__version__}",
        flush=True,
    )
    rows: list[dict[str, Any]] = []
    for size in args.size:
        for strategy in ("ddp", "fsdp"):
            job = dict(
                size=size,
                strategy=strategy,
                device="cuda" if device.startswith("cuda") else "cpu",
                dtype=dtype,
                micro_batch=args.micro_batch[0],
                seq_len=args.seq_len[0],
                iters=iters,
                warmup=warmup,
                seed=args.seed,
            )
            measured = {n: measure(job, n) for n in ranks if n <= most}
            rows += list(measured.values())
            rows += [predicted(measured[1], n) for n in PREDICTED_RANKS if n not in measured]
    rows.sort(key=lambda r: (r["size"], r["strategy"], r["ranks"]))
    for size in args.size:
        print(f"\nsize {size}: parameter + gradient + optimizer (AdamW) bytes per rank")
        print(format_table([r for r in rows if r["size"] == size]))
    print(
        "\npredicted: fsdp (P + G + O) / N from the one-rank measurement; ddp the same on every N"
    )
    if args.out is not None:
        append_rows(args.out, [{**r, "time": time.time()} for r in rows])
        print(f"appended {len(rows)} rows to {args.out}")
    return 0
