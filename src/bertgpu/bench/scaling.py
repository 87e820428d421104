"""Data-parallel scaling: the same short training at 1, 2, ... N workers and accumulation 1 vs k.

    bertgpu bench scaling                          # CPU: 1 and 2 gloo workers, tiny model
    bertgpu bench scaling --recipe configs/bert-base.toml --workers 1 2 4 8 --accumulation 1 4 \\
        --micro-batch-size 32 --seq-len 128 --precision bf16 --out bench_out/scaling
    bertgpu bench scaling --predict-only --bandwidth-gbps 200 16   # the ring all-reduce cost
                                                                   # model only

Weak scaling: every run keeps the per-device micro batch, so the global batch is
micro x accumulation x workers. Each (workers, accumulation) point is a fresh `bertgpu pretrain`
(N > 1: `python -m torch.distributed.run --standalone --nproc-per-node N -m bertgpu pretrain ...`,
the launcher `--nproc` uses; 1 worker: the plain single-process path, no DDP) on synthetic shards
(or `--data`), for `--warmup-steps` + `--steps` optimizer steps. Throughput is read back from the
run's metrics.jsonl over the steps after the warm-up: total tokens/s, tokens/s per device,
speedup over 1 worker at the same accumulation, efficiency = speedup / N, and `comm_share` (the
exposed gradient all-reduce time over step time that pretrain logs; see distributed.CommTimer).

Writes OUT/scaling.jsonl (appended, one line per point, a run's rows share its ``run_id``: the
report draws each run on its own), OUT/scaling.md (this run's table and the cost model's
expectations) and OUT/scaling.png (this run's tokens/s vs workers, ideal-linear dashed). With
`--data`, the sequences are the shard set's own length and the model is checked against it first.

On CPU each worker gets `--threads-per-worker` threads (default: cores / most workers), so that
"a worker" is a fixed share of the machine, like a GPU; gloo over shared memory stands in for the
interconnect, so CPU numbers test the machinery, not a cluster.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bertgpu.bench import cells
from bertgpu.config.sections import PRECISIONS
from bertgpu.errors import BertgpuError

# The default model when no recipe is given: small enough for a 2-core CPU.
TINY_MODEL = {
    "vocab_size": 4096,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 128,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--recipe", help="TOML recipe (default: a tiny 2-layer, 128-wide BERT)")
    add("--data", help="shard set from `bertgpu prepare` (default: synthetic random tokens)")
    add("--workers", type=int, nargs="+",
        help="worker counts (default: 1, 2, 4, ... up to every visible GPU; 1 2 on CPU)")
    add("--accumulation", type=int, nargs="+", default=[1, 4],
        help="micro batches per optimizer step, one gradient all-reduce each (default: 1 4)")
    add("--micro-batch-size", type=cells.positive(int), default=None,
        help="sequences per forward pass per device (default: 8 on CPU, 32 on GPU)")
    add("--seq-len", type=cells.positive(int), default=None,
        help="sequence length (default: --data's, else 64 on CPU, 128 on GPU)")
    add("--steps", type=int, default=20, help="measured optimizer steps (default: 20)")
    add("--warmup-steps", type=int, default=3, help="unmeasured steps first, >= 1 (default: 3)")
    add("--device", default="auto", type=cells.device, help=cells.DEVICE_HELP)
    add("--precision", choices=PRECISIONS, help="fp32, bf16 or fp16 (default: the recipe's)")
    add("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="extra pretrain override, e.g. --set distributed.bucket_cap_mb=50 (repeatable)")
    add("--threads-per-worker", type=cells.positive(int), default=None,
        help="OMP threads per worker on CPU (default: cores / the largest worker count)")
    add("--out", default="bench_out/scaling", help="results folder (default: bench_out/scaling)")
    add("--timeout-s", type=cells.positive(), default=1800.0,
        help="limit per training run, seconds (default: 1800)")
    add("--bandwidth-gbps", type=cells.positive(), nargs="+", default=[200.0, 16.0],
        help="all-reduce bus bandwidths (GB/s) for the cost model: NVLink ~150-300, PCIe ~12-25 "
             "(default: 200 16)")
    add("--device-tflops", type=cells.positive(), default=400.0,
        help="achieved TFLOP/s per GPU for the cost model (default: 400, H100 bf16 at ~40%% MFU)")
    add("--predict-only", action="store_true", help="print the cost model's table and exit")


# --------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------


def predict_efficiency(
    params: int,
    bucket_mb: float,
    bandwidth_GBps: float,
    step_compute_s: float,
    accumulation: int,
    n: int,
    *,
    bytes_per_grad: int = 4,
    tail_params: int = 0,
    backward_fraction: float = 2.0 / 3.0,
    latency_s: float = 30e-6,
) -> float:
    """Expected weak-scaling efficiency of DDP at `n` workers: t(1 worker) / t(n workers).

    Assumptions (a ring all-reduce, DDP's bucketed overlap, nothing else):
    - Per optimizer step each worker computes `accumulation` micro-steps of `step_compute_s`
      (forward + backward), and all-reduces the gradients once, during the last backward.
    - Ring all-reduce of b bytes over n workers takes 2(n-1)/n x b / bandwidth, plus a fixed
      `latency_s` per bucket (launch + pipeline fill); `bandwidth_GBps` is the bus bandwidth
      (nccl-tests' busbw). Buckets are all-reduced one after another.
    - Gradients come ready at a constant rate over the backward pass (`backward_fraction` of the
      micro-step, backward ~ 2x forward), cut into buckets of `bucket_mb` MiB; `tail_params`
      (the word embedding tied to the MLM decoder) are ready only at the very end.
    - Communication overlaps backward compute perfectly; what runs past the end of the backward
      is exposed and adds to the step. Compute is not slowed by concurrent communication, the
      optimizer step and data loading cost the same at any n.
    """
    if n < 1 or accumulation < 1 or step_compute_s <= 0 or bandwidth_GBps <= 0 or bucket_mb <= 0:
        raise BertgpuError("predict_efficiency: n, accumulation, step_compute_s, bandwidth and "
                           "bucket_mb must be positive")
    if n == 1:
        return 1.0
    total = params * bytes_per_grad
    tail = min(tail_params * bytes_per_grad, total)
    body = total - tail
    bucket = bucket_mb * 2**20
    backward_s = backward_fraction * step_compute_s
    k = max(1, math.ceil(body / bucket)) if body > 0 else 0
    # (ready time, bytes) of each bucket, in the order DDP launches them.
    buckets = [(backward_s * (i + 1) / k, body / k) for i in range(k)]
    if tail > 0:
        buckets.append((backward_s, tail))
    ring = 2.0 * (n - 1) / n
    free = 0.0
    for ready, nbytes in buckets:
        free = max(free, ready) + latency_s + ring * nbytes / (bandwidth_GBps * 1e9)
    exposed = max(0.0, free - backward_s)
    compute = accumulation * step_compute_s
    return compute / (compute + exposed)


def bert_params(hidden: int, layers: int, vocab: int = 30522, positions: int = 512,
                intermediate: int | None = None) -> tuple[int, int]:
    """(trainable parameters of BertForPreTraining, of which the tied word embedding) — the
    decoder weight is tied, so it is counted once. The vocabulary tables count with the rows the
    model pads them to (`shared.padded_vocab_size`): their gradients are all-reduced too."""
    from bertgpu.models.shared import padded_vocab_size

    vocab = padded_vocab_size(vocab)
    d, ff = hidden, intermediate or 4 * hidden
    embeddings = (vocab + positions + 2) * d + 2 * d
    layer = 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d
    # MLM transform + bias, pooler, NSP
    heads = d * d + d + 2 * d + vocab + (d * d + d) + (2 * d + 2)
    return embeddings + layers * layer + heads, vocab * d


def expected_table(bandwidths: list[float], device_tflops: float, micro_batch: int = 32,
                   seq_len: int = 128, n: int = 8, bucket_mb: float = 25.0) -> list[dict[str, Any]]:
    """The cost model for BERT-base and BERT-large at `n` GPUs, accumulation 1 and 4."""
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.telemetry import flops

    rows = []
    for name, hidden, layers in (("BERT-base", 768, 12), ("BERT-large", 1024, 24)):
        cfg = BertConfig.from_dict({"hidden_size": hidden, "num_hidden_layers": layers,
                                    "num_attention_heads": hidden // 64,
                                    "intermediate_size": 4 * hidden})
        fpt = flops.flops_per_token_from_config(cfg, seq_len, mlm_fraction=0.15, with_nsp=False)
        step_s = micro_batch * seq_len * fpt / (device_tflops * 1e12)
        params, tail = bert_params(hidden, layers)
        for bw in bandwidths:
            for acc in (1, 4):
                eff = predict_efficiency(params, bucket_mb, bw, step_s, acc, n, tail_params=tail)
                rows.append({"model": name, "params_M": round(params / 1e6, 1),
                             "bandwidth_GBps": bw, "accumulation": acc,
                             "micro_step_ms": round(step_s * 1e3, 2),
                             "allreduce_ms": round(2 * (n - 1) / n * params * 4 / (bw * 1e9) * 1e3,
                                                   2),
                             "workers": n, "efficiency": round(eff, 3)})
    return rows


def format_expected(rows: list[dict[str, Any]], device_tflops: float, micro_batch: int,
                    seq_len: int) -> str:
    head = (f"Expected weak-scaling efficiency at {rows[0]['workers']} GPUs (ring all-reduce cost "
            "model: fp32 gradients, 25 MiB buckets overlapped with the last backward, tied "
            f"embedding last; {device_tflops:g} TFLOP/s achieved per GPU, micro batch "
            f"{micro_batch} x {seq_len} tokens)\n\n")
    lines = ["| model | params (M) | bus GB/s | accumulation | micro-step ms | all-reduce ms | "
             "efficiency |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['params_M']} | {r['bandwidth_GBps']:g} | "
                     f"{r['accumulation']} | {r['micro_step_ms']} | {r['allreduce_ms']} | "
                     f"{r['efficiency']:.2f} |")
    return head + "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------------


def write_synthetic_data(folder: Path, vocab_size: int, seq_len: int, n_train: int = 2048,
                         n_val: int = 64, seed: int = 0) -> Path:
    """A synthetic shard set in the `bertgpu prepare` layout (full-length rows of random words):
    enough for a throughput benchmark, the model does the same work on any tokens."""
    from bertgpu.data.synthetic import write_synthetic_shards

    return write_synthetic_shards(folder, n_train=n_train, n_val=n_val, seq_len=seq_len,
                                  vocab_size=vocab_size, seed=seed,
                                  sequences_per_shard=max(n_train, n_val),
                                  created_by="bertgpu bench scaling (synthetic)")


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def _on_gpu(device: str) -> bool:
    import torch

    return device != "cpu" and torch.cuda.is_available()


def default_workers(device: str) -> list[int]:
    """1, 2, 4, ... up to every visible GPU (and the count itself); 1 2 on CPU."""
    import torch

    if not _on_gpu(device):
        return [1, 2]
    count = torch.cuda.device_count()
    out = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= count]
    return out + ([count] if count not in out else [])


def pretrain_command(workers: int, recipe: str | None, overrides: list[str],
                     log_dir: Path) -> list[str]:
    """The command of one point: the elastic launcher for N > 1 (its ranks' error files under
    `log_dir`), the plain entry point for 1."""
    from bertgpu.train.launcher import launcher_command

    argv = ["pretrain", *([recipe] if recipe else []), *overrides]
    if workers > 1:
        return launcher_command(workers, argv, str(log_dir))
    return [sys.executable, "-m", "bertgpu", *argv]


def measure(metrics_path: Path, warmup_steps: int) -> dict[str, float]:
    """Steady-state numbers of one run from its metrics.jsonl (one train record per step):
    tokens/s over the steps after `warmup_steps`, and the step-time-weighted comm and data
    shares."""
    from bertgpu.telemetry.records import read_metrics

    train = [r for r in read_metrics(metrics_path) if r.get("kind") == "train"]
    origin = next((r for r in train if r["step"] == warmup_steps), None)
    after = [r for r in train if r["step"] > warmup_steps]
    if origin is None or not after:
        raise BertgpuError(f"{metrics_path}: found no train records after step {warmup_steps}; did "
                           "the run fail?")
    dt = after[-1]["elapsed_s"] - origin["elapsed_s"]
    if dt <= 0:
        raise BertgpuError(f"{metrics_path}: elapsed_s does not increase after the warm-up")
    out = {
        "tokens_per_s": (after[-1]["tokens_seen"] - origin["tokens_seen"]) / dt,
        "step_time_s": dt / len(after),
        "steps_measured": len(after),
    }
    prev = origin["elapsed_s"]
    weights, comm, data = [], [], []
    for r in after:
        weights.append(r["elapsed_s"] - prev)
        prev = r["elapsed_s"]
        comm.append(r.get("comm_share", 0.0))
        data.append(r.get("data_wait_share", 0.0))
    total = sum(weights) or 1.0
    out["comm_share"] = sum(w * c for w, c in zip(weights, comm, strict=True) if c == c) / total
    out["data_wait_share"] = (sum(w * d for w, d in zip(weights, data, strict=True) if d == d)
                              / total)
    return out


def _run_point(args: argparse.Namespace, data_dir: Path, workers: int, accumulation: int,
               micro: int, model_overrides: list[str], env: dict[str, str],
               runs_dir: Path) -> dict[str, Any]:
    run_dir = runs_dir / f"w{workers}_a{accumulation}"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a leftover run folder would be resumed, not measured
    # KEY=VALUE words only: without a recipe, argparse would take a lone value for the recipe.
    overrides = [
        f"--data={data_dir}", f"--out={run_dir}",
        f"--train.max_steps={args.warmup_steps + args.steps}",
        f"--train.global_batch_size={micro * accumulation * workers}",
        f"--impl.micro_batch_size={micro}",
        f"--impl.device={args.device}",
        "--train.log_every_steps=1", "--train.eval_every_steps=0", "--train.eval_sequences=1",
        "--checkpoint.every_steps=0", "--checkpoint.keep_last=1",
        *model_overrides,
    ]
    if args.precision:
        overrides.append(f"--train.precision={args.precision}")
    overrides += _set_overrides(args.sets)
    # torch's launcher keeps each rank's error file here (kept if the point fails)
    launcher_logs = runs_dir / f"w{workers}_a{accumulation}.launcher"
    cmd = pretrain_command(workers, args.recipe, overrides, launcher_logs)
    log = runs_dir / f"w{workers}_a{accumulation}.log"
    wall_s = cells.run_logged(cmd, env, log, args.timeout_s,
                              f"{workers} worker{'s' if workers > 1 else ''}, accumulation "
                              f"{accumulation}")
    shutil.rmtree(launcher_logs, ignore_errors=True)
    result = measure(run_dir / "metrics.jsonl", args.warmup_steps)
    shutil.copyfile(run_dir / "metrics.jsonl",
                    runs_dir / f"w{workers}_a{accumulation}.metrics.jsonl")
    shutil.rmtree(run_dir)  # checkpoints and exports of a benchmark are not worth the disk
    return {"workers": workers, "accumulation": accumulation, "micro_batch_size": micro,
            "global_batch": micro * accumulation * workers, "wall_s": round(wall_s, 1),
            **result}


def _set_overrides(sets: list[str]) -> list[str]:
    for item in sets:
        if "=" not in item:
            raise BertgpuError(f"--set {item!r}: expected KEY=VALUE, e.g. "
                               "distributed.bucket_cap_mb=50")
    return ["--" + item for item in sets]


def _model_config(args: argparse.Namespace) -> tuple[list[str], Any]:
    """Overrides for the default tiny model, and the config the points share (typos fail)."""
    from bertgpu.config import schema

    overrides = [] if args.recipe else [f"--model.{k}={v}" for k, v in TINY_MODEL.items()]
    data = [f"--data={args.data}"] if args.data else []
    cfg = schema.load_config(args.recipe, [*overrides, *data, *_set_overrides(args.sets)])
    return overrides, cfg


def sequence_length(args: argparse.Namespace, cfg: Any, on_gpu: bool) -> int:
    """The tokens per sequence of every run, before any run: --data's own (the model checked
    against the shard set as pretrain does; a --seq-len must agree), else --seq-len or the
    default, within the model's positions."""
    positions = cfg.model.max_position_embeddings
    if args.data:
        from bertgpu.config.overrides import config_to_dict
        from bertgpu.tasks.pretraining import PretrainData

        data = PretrainData(cfg.data.dir, cfg.data.objective, cfg.train.with_nsp)
        try:
            data.check_model(config_to_dict(cfg.model), None)
        except BertgpuError as e:
            raise BertgpuError(f"--data: {e} (the benchmark's model: --recipe, or the built-in "
                               "tiny one, with --set model.KEY=VALUE)") from None
        found = data.train.seq_len
        if args.seq_len is not None and args.seq_len != found:
            raise BertgpuError(f"--seq-len {args.seq_len}: the shard set --data {args.data} holds "
                               f"sequences of {found} tokens ({data.train.manifest_path}); "
                               f"expected --seq-len {found} or none with --data")
        return found
    if args.seq_len is not None and args.seq_len > positions:
        raise BertgpuError(f"--seq-len {args.seq_len}: longer than the model's "
                           f"max_position_embeddings {positions}; expected at most {positions}")
    return args.seq_len or min(128 if on_gpu else 64, positions)


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workers | accumulation | global batch | tokens/s | tokens/s per device | speedup | "
             "efficiency | comm share | data wait share |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['workers']} | {r['accumulation']} | {r['global_batch']} | "
            f"{r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_device']:,.0f} | "
            f"{r['speedup']:.2f} | {r['efficiency']:.2f} | {r['comm_share']:.3f} | "
            f"{r['data_wait_share']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """tokens/s vs workers, one line per accumulation, each with its ideal-linear line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for acc in sorted({r["accumulation"] for r in rows}):
        pts = sorted((r["workers"], r["tokens_per_s"]) for r in rows if r["accumulation"] == acc)
        ws, tps = [p[0] for p in pts], [p[1] for p in pts]
        (line,) = ax.plot(ws, tps, "o-", label=f"accumulation {acc}")
        base = next((t for w, t in pts if w == 1), None)
        if base is not None:
            ax.plot(ws, [base * w for w in ws], "--", color=line.get_color(), alpha=0.5,
                    label=f"ideal (accumulation {acc})")
    ax.set_xticks(sorted({r["workers"] for r in rows}))
    ax.set_xlabel("workers")
    ax.set_ylabel("tokens/s (total)")
    ax.set_title("bertgpu data-parallel scaling")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def main(args: argparse.Namespace) -> int:
    on_gpu = _on_gpu(args.device)
    micro = args.micro_batch_size or (32 if on_gpu else 8)
    expected = expected_table(list(args.bandwidth_gbps), args.device_tflops)
    expected_text = format_expected(expected, args.device_tflops, 32, 128)
    if args.predict_only:
        unused = [flag for flag, v in (("--recipe", args.recipe), ("--data", args.data),
                                       ("--set", args.sets)) if v]
        if unused:  # the table said nothing of them: they were read by nothing
            raise BertgpuError(f"{', '.join(unused)}: not with --predict-only, whose table is "
                               "the cost model of the built-in BERT-base and BERT-large")
        print(expected_text)
        return 0
    workers, accumulations = _points(args, on_gpu)

    out = Path(args.out)
    cells.check_bench_folder(out, "scaling", ["scaling.jsonl", "scaling.md", "scaling.png"],
                             ("synthetic_data",))
    model_overrides, cfg = _model_config(args)
    seq_len = sequence_length(args, cfg, on_gpu)  # nothing written before these checks
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    cells.mark_bench_folder(out, "scaling")
    (runs_dir := out / "runs").mkdir(exist_ok=True)
    data_dir = (Path(args.data) if args.data
                else write_synthetic_data(out / "synthetic_data", cfg.model.vocab_size, seq_len))
    env = _child_env(args, on_gpu, max(workers))

    rows: list[dict[str, Any]] = []
    for acc in accumulations:
        for w in workers:
            print(f"bench scaling: {w} worker{'s' if w > 1 else ''}, accumulation {acc} ...",
                  flush=True)
            rows.append(_run_point(args, data_dir, w, acc, micro, model_overrides, env, runs_dir))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    device = "cuda" if on_gpu else "cpu"
    for r in rows:
        base = next((b for b in rows
                     if b["workers"] == 1 and b["accumulation"] == r["accumulation"]), None)
        r["tokens_per_s_per_device"] = r["tokens_per_s"] / r["workers"]
        r["speedup"] = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        r["efficiency"] = r["speedup"] / r["workers"]
        r.update(device=device, seq_len=seq_len, recipe=args.recipe or "tiny (built in)",
                 data=args.data or "synthetic", run_id=run_id, time=stamp)
    data = f"the shard set {args.data}" if args.data else "synthetic shards"
    header = (f"# bertgpu bench scaling (run {run_id}, {device})\n\n"
              f"`{('bertgpu ' + ' '.join(sys.argv[1:])).strip()}`\n\n"
              f"Micro batch {micro} x {seq_len} tokens per device ({data}), {args.warmup_steps} "
              f"warm-up + {args.steps} measured steps; efficiency = speedup / workers; comm share "
              "= exposed all-reduce time / step time.")
    _write_outputs(rows, out, header, expected_text)
    return 0


def _points(args: argparse.Namespace, on_gpu: bool) -> tuple[list[int], list[int]]:
    """The worker counts and accumulations to measure, checked before anything runs."""
    if args.warmup_steps < 1 or args.steps < 1:
        raise BertgpuError(f"--warmup-steps {args.warmup_steps}, --steps {args.steps}: "
                           "expected both >= 1")
    workers = sorted(set(args.workers or default_workers(args.device)))
    accumulations = sorted(set(args.accumulation))
    if min(workers) < 1 or min(accumulations) < 1:
        raise BertgpuError("--workers and --accumulation: expected positive integers")
    if on_gpu:
        import torch

        if max(workers) > torch.cuda.device_count():
            raise BertgpuError(f"--workers {max(workers)}: only {torch.cuda.device_count()} "
                               "GPUs are visible")
    return workers, accumulations


def _child_env(args: argparse.Namespace, on_gpu: bool, most_workers: int) -> dict[str, str]:
    """The environment of the measured runs: CPU threads shared out between the workers."""
    if on_gpu:
        return cells.child_env(None)
    threads = args.threads_per_worker or max(1, (os.cpu_count() or 1) // most_workers)
    return cells.child_env(threads)


def _write_outputs(rows: list[dict[str, Any]], out: Path, header: str, expected_text: str) -> None:
    """Append scaling.jsonl, replace scaling.md, draw scaling.png, print the tables."""
    table = format_table(rows)
    cells.append_jsonl(out / "scaling.jsonl", rows)  # NaN (no 1-worker baseline) as null
    cells.write_atomic(out / "scaling.md", f"{header}\n\n{table}\n{expected_text}")
    png = plot(rows, out / "scaling.png")
    print(table)
    print(expected_text)
    print(f"wrote {out / 'scaling.jsonl'}, {out / 'scaling.md'}" + (f", {png}" if png else ""))
