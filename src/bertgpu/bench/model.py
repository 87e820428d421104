"""`bertgpu bench model`: training-step speed of our BertForPreTraining vs transformers', side by
side.

For every point of the grid (size x micro batch x seq len x dtype x compile x padding) both models
get the same weights, the same optimizer (AdamW, fused on CUDA) and the same batches (ours with
the host-side `BatchMeta` the loader ships), and their timed steps alternate in one process (who
goes first alternates too), so the ratio is fair on a noisy machine. Forward, backward and the
optimizer step are timed separately (with a device synchronisation between them on CUDA);
tokens/s counts real (non-padding) tokens; MFU uses `flops.flops_per_token_from_config` at the
mean real length and `flops.peak_tflops`.

    bertgpu bench model                          # CPU default: small, B 8, T 128, fp32 (~1 min)
    bertgpu bench model --size base --micro-batch 8 --iters 3 --out results/bench_model.jsonl
    bertgpu bench model --seq-len 512 --padding padded,unpadded --real-lengths data/
                                                 # (lengths of a shard set)
    bertgpu bench model --preset gpu --out results/h100.jsonl   # the GPU table
    bertgpu bench model --check-graph            # graph breaks / host syncs (graph_check.py)
    bertgpu bench model --strategy fsdp --size base   # bytes per rank, ddp vs fsdp

Models are built once per size and reused by every row of that size (unpadding is a per-instance
option, a compiled model wraps the same parameters), and a transformers measurement is reused by
rows that differ only in our model's settings. `--preset gpu` (BERT-base and BERT-large at seq
128 and 512, bf16) compiles only our model, once per size, at seq 128 (two compiles in all); it
is meant to finish in under 6 minutes on one H100 (not measured yet: no GPU in the session that
wrote it). `--padding unpadded` turns on our model's unpadding (transformers has none, it runs
padded); `--padding bucketed` is not a model switch: see `PretrainLoader(bucket_window=k)`. Rows
are appended to `--out` (JSONL, or CSV when the name ends in .csv), so runs accumulate.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from bertgpu.bench.batches import SIZES, make_batches
from bertgpu.bench.cells import append_rows
from bertgpu.errors import BertgpuError

# The GPU table, run in order; "compile_models" lists who is compiled on the compile-on rows.
GPU_PRESET: list[dict[str, Any]] = [
    dict(size="base", micro_batch=128, seq_len=128, dtype="bf16", compile=["off", "on"],
         padding=["padded"], compile_models=["bertgpu"]),
    dict(size="base", micro_batch=32, seq_len=512, dtype="bf16", compile=["off"],
         padding=["padded", "unpadded"], lengths="uniform"),
    dict(size="large", micro_batch=64, seq_len=128, dtype="bf16", compile=["off", "on"],
         padding=["padded"], compile_models=["bertgpu"]),
    dict(size="large", micro_batch=16, seq_len=512, dtype="bf16", compile=["off"],
         padding=["padded"]),
]


def _csv_list(kind: type, choices: tuple[str, ...] | None = None):
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        try:
            out = [kind(t) for t in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of {kind.__name__}, "
                                             f"found {text!r}") from None
        if not out:
            raise argparse.ArgumentTypeError("expected at least one value")
        if choices is not None:
            bad = [t for t in out if t not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad[0]!r}: expected one of "
                                                 f"{', '.join(choices)}")
        return out
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--size", type=_csv_list(str, tuple(SIZES)), default=["small"],
                        help="model sizes, comma list of tiny, small, base, large (default small)")
    parser.add_argument("--micro-batch", type=_csv_list(int), default=[8],
                        help="sequences per step (comma list)")
    parser.add_argument("--seq-len", type=_csv_list(int), default=[128],
                        help="sequence lengths (comma list)")
    parser.add_argument("--dtype", type=_csv_list(str, ("fp32", "bf16")), default=None,
                        help="fp32 and/or bf16 (autocast); default bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--compile", type=_csv_list(str, ("off", "on")), default=["off"],
                        help="torch.compile both models: off, on or off,on")
    parser.add_argument("--padding", type=_csv_list(str, ("padded", "unpadded")),
                        default=["padded"],
                        help="padded (both models see the padded batch) and/or unpadded (our model "
                             "gathers the real tokens; transformers stays padded)")
    parser.add_argument("--real-lengths", default="full", metavar="full|uniform|DATA_DIR",
                        help="sequence lengths: full (no padding, default), uniform (synthetic, "
                             "uniform in [T/8, T]) or a shard set whose train lengths are sampled")
    parser.add_argument("--grad-ckpt", action="store_true",
                        help="activation checkpointing in both models")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed steps per model (default 3 CPU, 10 CUDA)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps per model first (default 1 CPU, 3 CUDA)")
    parser.add_argument("--models", type=_csv_list(str, ("bertgpu", "transformers")),
                        default=["bertgpu", "transformers"],
                        help="which models to time (default both)")
    parser.add_argument("--device", default=None,
                        help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak TFLOP/s of one device for MFU (default: the table in "
                             "metrics.py; none on CPU)")
    parser.add_argument("--preset", choices=["gpu"], default=None,
                        help="gpu: base+large seq 128 bf16 compile off/on, base seq 512 "
                             "padded vs unpadded")
    parser.add_argument("--check-graph", action="store_true",
                        help="instead of timing: check that every training micro-step (pretraining "
                             "padded/packed/unpadded, NSP on/off, the task heads) compiles with no "
                             "graph break and runs with no host sync; exit 1 if not (see "
                             "bench/graph_check.py)")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default=None,
                        help="instead of ours vs transformers: parameter + gradient + optimizer "
                             "bytes per rank of ddp and fsdp on --ranks processes, predicted for "
                             "4 and 8 (sharded.py)")
    parser.add_argument("--ranks", default="1,2",
                        help="with --strategy: world sizes to measure (default 1,2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None,
                        help="append one row per model and grid point (.jsonl or .csv)")


# --------------------------------------------------------------------------------------------
# Batches


# --------------------------------------------------------------------------------------------
# Timing


class _Runner:
    """One model, its optimizer, and the accumulated phase times of its timed steps."""

    def __init__(self, name: str, model: Any, optimizer: Any, device: Any, autocast: Any) -> None:
        self.name, self.model, self.optimizer = name, model, optimizer
        self.device, self.autocast = device, autocast
        self.times = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}
        self.steps = 0
        self.tokens = 0
        self.peak_bytes: int | None = None
        self.loss = float("nan")

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, batch: dict[str, Any], timed: bool) -> None:
        import torch

        cuda = self.device.type == "cuda"
        if self.name == "transformers":
            batch = {k: v for k, v in batch.items() if k != "batch_meta"}
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._sync()
        t0 = time.perf_counter()
        with self.autocast():
            loss = self.model(**batch).loss
        self._sync()
        t1 = time.perf_counter()
        loss.backward()
        self._sync()
        t2 = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._sync()
        t3 = time.perf_counter()
        self.loss = float(loss.detach())
        if timed:
            self.times["fwd"] += t1 - t0
            self.times["bwd"] += t2 - t1
            self.times["opt"] += t3 - t2
            self.steps += 1
            self.tokens += int(batch["attention_mask"].sum())
            if cuda:
                self.peak_bytes = max(self.peak_bytes or 0,
                                      torch.cuda.max_memory_allocated(self.device))


class Models:
    """Both models of one size with identical weights, their optimizers, and compiled wrappers
    made on first use (a compiled wrapper shares the parameters: one compile serves every row)."""

    def __init__(self, size: str, device: Any, names: list[str], grad_ckpt: bool,
                 seed: int) -> None:
        import torch

        from bertgpu.models.bert.config import BertConfig
        from bertgpu.models.bert.model import BertForPreTraining
        from bertgpu.models.layout import load_hf_state_dict
        from bertgpu.models.shared import ModelOptions
        from bertgpu.train.optim import build_optimizer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers

        torch.manual_seed(seed)
        hf = transformers.BertForPreTraining(
            transformers.BertConfig(**SIZES[size], attn_implementation="sdpa"))
        self.size = size
        self.config = BertConfig(**SIZES[size])
        self.eager: dict[str, Any] = {}
        self.optimizers: dict[str, Any] = {}
        self._compiled: dict[str, Any] = {}
        for name in names:
            if name == "transformers":
                model = hf
                if grad_ckpt:
                    model.gradient_checkpointing_enable()
            else:
                options = ModelOptions(gradient_checkpointing=grad_ckpt)
                model = BertForPreTraining(self.config, options=options)
                load_hf_state_dict(model, hf.state_dict())  # fused QKV, padded vocabulary
            self.eager[name] = model.to(device).train()
            self.optimizers[name] = build_optimizer(self.eager[name], "adamw", 1e-4)

    def module(self, name: str, compiled: bool) -> Any:
        import torch

        if not compiled:
            return self.eager[name]
        if name not in self._compiled:
            self._compiled[name] = torch.compile(self.eager[name])
        return self._compiled[name]


def run_point(models: Models, micro_batch: int, seq_len: int, dtype: str, compile_models: list[str],
              padding: str, lengths: str, device: Any, iters: int, warmup: int, grad_ckpt: bool,
              peak: float | None, seed: int,
              reuse: dict[tuple, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Time the models on one grid point; one result row per model timed.

    A model that is not compiled here and whose row for the same (batch, length, dtype, padding)
    is in `reuse` is not timed again: that row is repeated (marked `reused`) and serves the
    ratio."""
    import torch

    from bertgpu.telemetry.flops import flops_per_token_from_config, mfu

    autocast = ((lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if dtype == "bf16"
                else nullcontext)
    reuse = {} if reuse is None else reuse
    if "bertgpu" in models.eager:
        models.eager["bertgpu"].configure(unpad=padding == "unpadded")
    runners, reused = {}, {}
    for name in models.eager:
        key = (name, micro_batch, seq_len, dtype, lengths,
               padding if name == "bertgpu" else "padded")
        if name not in compile_models and key in reuse:
            reused[name] = reuse[key]
            continue
        runners[name] = _Runner(name, models.module(name, name in compile_models),
                                models.optimizers[name], device, autocast)
    batches = make_batches(max(2, min(iters, 4)), micro_batch, seq_len, 30522, lengths,
                           seed, device)
    for i in range(warmup):
        for r in runners.values():
            r.step(batches[i % len(batches)], timed=False)
    order = list(runners)
    for i in range(iters):
        for name in (order if i % 2 == 0 else order[::-1]):  # alternate who goes first
            runners[name].step(batches[i % len(batches)], timed=True)
    # mean length
    real = sum(int(b["attention_mask"].sum()) for b in batches) / (len(batches) * micro_batch)
    fpt = flops_per_token_from_config(models.config, seq_len=max(1, round(real)), mlm_fraction=0.15,
                                      with_nsp=True)
    tps = {n: r.tokens / max(sum(r.times.values()), 1e-12) for n, r in runners.items()}
    tps.update({n: row["tokens_per_s"] for n, row in reused.items()})
    rows = [{**row, "reused": True} for row in reused.values()]
    for name, r in runners.items():
        n = max(r.steps, 1)
        row = dict(
            bench="model", model=name, size=models.size, micro_batch=micro_batch, seq_len=seq_len,
            dtype=dtype, compile=name in compile_models,
            padding=padding if name == "bertgpu" else "padded", lengths=lengths,
            mean_length=round(real, 1), grad_ckpt=grad_ckpt, iters=r.steps,
            fwd_ms=1e3 * r.times["fwd"] / n, bwd_ms=1e3 * r.times["bwd"] / n,
            opt_ms=1e3 * r.times["opt"] / n, tokens_per_s=tps[name],
            ratio_vs_transformers=(tps[name] / tps["transformers"] if "transformers" in tps
                                   else None),
            mfu=mfu(tps[name], fpt, peak), flops_per_token=fpt,
            mem_peak_gib=r.peak_bytes / 2**30 if r.peak_bytes is not None else None, loss=r.loss,
            reused=False)
        if name not in compile_models:
            reuse[(name, micro_batch, seq_len, dtype, lengths, row["padding"])] = row
        rows.append(row)
    del runners, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------
# Output


COLUMNS = [("size", "size"), ("micro_batch", "B"), ("seq_len", "T"), ("dtype", "dtype"),
           ("compile", "compile"), ("padding", "padding"), ("model", "model"), ("fwd_ms", "fwd ms"),
           ("bwd_ms", "bwd ms"), ("opt_ms", "opt ms"), ("tokens_per_s", "tokens/s"),
           ("ratio_vs_transformers", "vs HF"), ("mfu", "MFU"), ("mem_peak_gib", "mem GiB")]


def _fmt(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "compile":
        return "on" if value else "off"
    if key == "mfu":
        return f"{100 * value:.1f}%"
    if key == "ratio_vs_transformers":
        return f"{value:.2f}x"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.1f}" if key.endswith("_ms") else f"{value:.2f}"
    return str(value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of result rows."""
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(k, r.get(k)) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def _grid(args: argparse.Namespace, cuda: bool) -> list[dict[str, Any]]:
    """The points to time, in order (grouped by size so each size's models are built once)."""
    if args.preset == "gpu":
        points = []
        for p in GPU_PRESET:
            for c in p["compile"]:
                for pad in p["padding"]:
                    points.append(dict(size=p["size"], micro_batch=p["micro_batch"],
                                       seq_len=p["seq_len"], dtype=p["dtype"], compile=c == "on",
                                       padding=pad, lengths=p.get("lengths", args.real_lengths),
                                       compile_models=(p.get("compile_models", args.models)
                                                       if c == "on" else [])))
        return points
    dtypes = args.dtype or (["bf16"] if cuda else ["fp32"])
    return [dict(size=s, micro_batch=b, seq_len=t, dtype=d, compile=c == "on", padding=p,
                 lengths=args.real_lengths, compile_models=list(args.models) if c == "on" else [])
            for s in args.size for b in args.micro_batch for t in args.seq_len for d in dtypes
            for c in args.compile for p in args.padding]


def main(args: argparse.Namespace) -> int:
    if args.check_graph:
        from bertgpu.bench import graph_check

        return graph_check.main(args)
    if args.strategy is not None:
        from bertgpu.bench import sharded

        return sharded.main(args)
    import torch

    from bertgpu.telemetry.flops import peak_tflops

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertgpuError(f"--device {args.device}: CUDA is not available on this machine; "
                           "expected --device cpu")
    if (args.padding and "unpadded" in args.padding and args.real_lengths == "full"
            and args.preset is None):
        print("note: --real-lengths full has no padding, so unpadded equals padded; try "
              "--real-lengths uniform")
    cuda = device.type == "cuda"
    iters = args.iters if args.iters is not None else (10 if cuda else 3)
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    if iters < 1 or warmup < 0:
        raise BertgpuError(f"--iters {iters} / --warmup {warmup}: expected iters >= 1 "
                           "and warmup >= 0")
    if cuda:
        # fp32 rows: TF32 tensor cores, as training would
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
    header = (f"bertgpu bench model | device {device} ({name}, {torch.get_num_threads()} "
              f"threads) | torch {torch.__version__} | iters {iters} warmup {warmup}")
    print(header, flush=True)
    rows: list[dict[str, Any]] = []
    models: Models | None = None
    reuse: dict[tuple, dict[str, Any]] = {}
    for point in _grid(args, cuda):
        if models is None or models.size != point["size"]:
            models = None  # free the previous size first
            if cuda:
                torch.cuda.empty_cache()
            models = Models(point["size"], device, args.models, args.grad_ckpt, args.seed)
            reuse = {}
        peak = peak_tflops(name if cuda else None, point["dtype"], override=args.peak_tflops)
        t0 = time.perf_counter()
        new = run_point(models, point["micro_batch"], point["seq_len"], point["dtype"],
                        point["compile_models"], point["padding"], point["lengths"], device, iters,
                        warmup, args.grad_ckpt, peak, args.seed, reuse)
        stamp = dict(device=str(device), device_name=name,
                     torch=torch.__version__, threads=torch.get_num_threads(), time=time.time(),
                     wall_s=round(time.perf_counter() - t0, 1))
        new = [{**r, **stamp} for r in new]
        rows += new
        print(format_table(new).split("\n", 2)[2] if len(rows) > len(new) else format_table(new),
              flush=True)
        if args.out is not None:
            append_rows(args.out, new)
    print()
    print(format_table(rows))
    if args.out is not None:
        print(f"appended {len(rows)} rows to {args.out}")
    return 0
