"""Where a training step's device time goes: torch.profiler over steps of our BERT or ModernBERT,
by kernel family, for deciding what to fuse next.

    PYTHONPATH=src python3 benchmarks/gpu_profile.py --out /tmp/prof               # BERT-base
    PYTHONPATH=src python3 benchmarks/gpu_profile.py --arch modernbert --out /tmp/prof-modern
    PYTHONPATH=src python3 benchmarks/gpu_profile.py --size tiny --device cpu --out /tmp/prof
    PYTHONPATH=src python3 benchmarks/gpu_profile.py --compiled-dropout philox --out /tmp/prof-p
    PYTHONPATH=src python3 benchmarks/gpu_profile.py --inductor coordinate_descent_tuning=True \
        --out /tmp/prof-cdt   # an inductor setting (this one: not done within 130 s on an H200)

The model, batches and optimizer are `bench model`'s (bench/model_runs.py: our
BertForPreTraining or ModernBertForMaskedLM, masks a fixed count per sequence at 15% for BERT and
30% for ModernBERT, fused AdamW on CUDA), compiled in --compile-mode unless --eager, in bf16 on
CUDA (fp32 on the CPU), padded or --unpadded. BERT defaults to 256 x 128 full rows, ModernBERT
to its pretraining point, 32 x 1024 unpadded at uniform lengths. After
--warmup steps (the compile happens there) the profiler records --steps steps and writes:

- `profile.md`: the device time per step by family (matrix products, attention, the compiled
  fused kernels, normalisation, the optimizer, copies, the rest), each family's share, the step
  time and the MFU its FLOPs give; then the 25 kernels with the most device time; compiled on
  CUDA, also the memory traffic of inductor's Triton kernels (the bytes inductor estimates each
  one moves, `kernel_num_gb`, over its measured time): their achieved bandwidth against the
  device's HBM peak says whether the memory-bound part of the step is at the roofline (then only
  fewer bytes help) or far below it (block sizes, RNG, reductions: kernel quality);
- `kernels.py`: compiled on CUDA, the Triton source of the 30 compiled kernels with the most
  device time, each under its time and bytes per step (what a fused kernel does, readable away
  from the GPU); `graph_N.py`, the code inductor generated for each compiled graph (forward,
  backward: the kernels in the order they run, and the library calls between them);
- `trace.json`: the Chrome trace (with --trace; open in Perfetto).

On the CPU (no CUDA activity) the same tables come from the CPU operators, which is what the
test checks; their numbers say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

FAMILIES: list[tuple[str, re.Pattern[str]]] = [
    ("loss (cross-entropy)", re.compile(r"log_softmax|nll_loss|cross_entropy|SoftMax(Forward|"
                                        r"Backward)", re.IGNORECASE)),
    # before the matrix products: the flash kernels' template arguments name cutlass types
    ("attention", re.compile(r"flash|fmha|attention|sdpa|softmax", re.IGNORECASE)),
    ("matrix products", re.compile(r"gemm|sm\d+_xmma|cutlass|cublas|nvjet|aten::(mm|bmm|addmm|"
                                   r"matmul|linear)\b", re.IGNORECASE)),
    # "lamb" but not the "lambda" in a kernel's template arguments
    ("optimizer", re.compile(r"adam|lamb(?!da)|multi_tensor|foreach|Optimizer", re.IGNORECASE)),
    ("normalisation", re.compile(r"layer_?norm|rms_?norm|welford", re.IGNORECASE)),
    ("compiled fused kernels", re.compile(r"^triton_|^cpp_fused|Compiled Region", re.IGNORECASE)),
    ("elementwise and reductions (eager)", re.compile(
        r"elementwise_kernel|reduce_kernel|aten::(add|sub|mul|div|gelu|where|bernoulli|"
        r"native_dropout|dropout|sum|argmax|eq|ne)", re.IGNORECASE)),
    ("copies and fills", re.compile(r"memcpy|memset|copy|fill|cat|index|gather|scatter",
                                    re.IGNORECASE)),
]
"""Kernel (CUDA) or operator (CPU) name -> family, the first pattern that matches."""


def family(name: str) -> str:
    for label, pattern in FAMILIES:
        if pattern.search(name):
            return label
    return "other"


def on_device(event) -> bool:
    """Whether a profiler event is device work itself (a kernel, a copy, a fill), not a host-side
    operator or launcher whose "self device time" is the same kernels' time again, nor a
    `record_function` range drawn on the device's timeline (`Optimizer.step#AdamW.step`, whose
    time is its kernels': an H200 profile counted the optimizer's 0.92 ms twice)."""
    kind = getattr(event, "device_type", None)
    return (kind is not None and getattr(kind, "name", str(kind)).upper().endswith("CUDA")
            and not getattr(event, "is_user_annotation", False))


def kernel_times(events, cuda: bool) -> dict[str, float]:
    """Self device time (us) per kernel name (CPU: self CPU time per operator).

    On CUDA only the device's own events count: a host operator (`aten::mm`) carries its
    kernels' time as its self device time, and a compiled Triton kernel's launcher has the
    kernel's name, so summing every event counted most of a step twice."""
    times: dict[str, float] = {}
    for e in events:
        if cuda and not on_device(e):
            continue
        t = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
             if cuda else e.self_cpu_time_total)
        if t and t > 0:
            times[e.key] = times.get(e.key, 0.0) + float(t)
    return times


def kernel_counts(events, cuda: bool = False) -> dict[str, int]:
    """Launches (CPU: calls) per kernel name over the profiled steps."""
    counts: dict[str, int] = {}
    for e in events:
        if cuda and not on_device(e):
            continue
        counts[e.key] = counts.get(e.key, 0) + int(getattr(e, "count", 0) or 0)
    return counts


HBM_TB_S = {"H100 SXM": 3.35, "H100 PCIe": 2.0, "H100 NVL": 3.9, "H200": 4.8, "H200 NVL": 4.8,
            "A100": 2.0, "A10": 0.6, "L40S": 0.86, "L4": 0.3, "RTX 4090": 1.0, "RTX 3090": 0.94}
"""Peak memory bandwidth (TB/s) of the devices telemetry/flops.py names (vendor figures; the
80 GB A100s)."""


def _autotuners() -> list:
    """Inductor's compiled Triton kernels alive in this process (their autotuners)."""
    import gc

    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return []
    # not isinstance: no proxy's __class__
    return [obj for obj in gc.get_objects() if issubclass(type(obj), CachingAutotuner)]


def triton_kernel_bytes() -> dict[str, list[float]]:
    """Bytes per launch of every compiled Triton kernel in this process, by kernel name, as
    inductor estimates them (`kernel_num_gb`, recorded when `torch._inductor.config.
    benchmark_kernel` is on at compile time). Names can repeat across compiled graphs (the
    forward's and the backward's kernels are numbered separately): a list per name."""
    out: dict[str, list[float]] = {}
    for obj in _autotuners():
        meta = getattr(obj, "inductor_meta", None) or {}
        name, gb = meta.get("kernel_name"), meta.get("kernel_num_gb")
        if name and gb:
            out.setdefault(str(name), []).append(float(gb) * 1e9)
    return out


def triton_kernel_sources() -> dict[str, str]:
    """The Triton source of every compiled kernel in this process, by kernel name (the first
    where names repeat across graphs)."""
    out: dict[str, str] = {}
    for obj in _autotuners():
        name = (getattr(obj, "inductor_meta", None) or {}).get("kernel_name")
        src = getattr(getattr(obj, "fn", None), "src", None)
        if name and isinstance(src, str):
            out.setdefault(str(name), src)
    return out


def compiled_graph_files() -> list[Path]:
    """The Python files inductor wrote for the compiled graphs of this process (their `call` runs
    the graph: the order of the Triton kernels and library calls, each kernel's source inline)."""
    try:
        from torch._inductor.codecache import PyCodeCache
    except ImportError:
        return []
    files = []
    for module in list(getattr(PyCodeCache, "modules", [])):
        path = getattr(module, "__file__", None)
        if path and callable(getattr(module, "call", None)) and Path(path).is_file():
            files.append(Path(path))
    return files


def kernel_sources_text(times: dict[str, float], sources: dict[str, str], steps: int,
                        moved: dict[str, tuple[float, float]], top: int = 30) -> str:
    """The sources of the `top` compiled kernels by device time, each under a comment with its
    time and (where inductor estimated it) bytes per step: what each fused kernel reads, computes
    and writes, for deciding what to fuse next away from the GPU."""
    parts = []
    for name, t in sorted(((n, t) for n, t in times.items() if n in sources),
                          key=lambda kv: -kv[1])[:top]:
        note = f"# {name}: {t / steps / 1e3:.3f} ms per step"
        if name in moved:
            b, _ = moved[name]
            note += f", {b / steps / 1e9:.3f} GB per step, {b / t / 1e6:.2f} TB/s"
        parts.append(f"{note}\n{sources[name].rstrip()}\n")
    return "\n\n".join(parts)


def traffic(times: dict[str, float], counts: dict[str, int],
            kernel_bytes: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
    """(bytes moved, device us) over the profiled steps for each kernel with a byte estimate:
    launches x bytes per launch (the mean where several kernels share a name)."""
    out = {}
    for name, per_launch in kernel_bytes.items():
        if name in times and counts.get(name):
            out[name] = (counts[name] * sum(per_launch) / len(per_launch), times[name])
    return out


def traffic_lines(moved: dict[str, tuple[float, float]], times: dict[str, float], steps: int,
                  peak_tb_s: float | None) -> list[str]:
    """The report's memory-traffic section: the Triton kernels' bytes, time and achieved TB/s."""
    if not moved:
        return []
    triton = [n for n in times if n.startswith("triton_")]
    total_b = sum(b for b, _ in moved.values())
    total_us = sum(t for _, t in moved.values())
    rate = total_b / total_us / 1e6  # bytes / us -> TB/s
    lines = ["", "## Memory traffic of the compiled kernels", "",
             f"{len(moved)} of {len(triton)} Triton kernels have inductor's byte estimate: "
             f"{total_b / steps / 1e9:.2f} GB per step in {total_us / steps / 1e3:.2f} ms, "
             f"{rate:.2f} TB/s"
             + (f" ({rate / peak_tb_s:.0%} of the device's {peak_tb_s} TB/s)" if peak_tb_s
                else ""),
             "", "| kernel | ms per step | GB per step | TB/s |", "|---|---|---|---|"]
    for name, (b, t) in sorted(moved.items(), key=lambda kv: -kv[1][1])[:15]:
        short = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| `{short}` | {t / steps / 1e3:.3f} | {b / steps / 1e9:.3f} | "
                     f"{b / t / 1e6:.2f} |")
    return lines


def report(times: dict[str, float], steps: int, step_s: float, flops_per_step: float,
           peak_tflops: float | None, header: str,
           extra: list[str] | None = None) -> str:
    total = sum(times.values()) or 1.0
    by_family: dict[str, float] = {}
    for name, t in times.items():
        by_family[family(name)] = by_family.get(family(name), 0.0) + t
    lines = [f"# {header}", "",
             f"step {step_s * 1e3:.1f} ms wall; device time {total / steps / 1e3:.1f} ms per "
             f"step over {steps} steps"]
    if peak_tflops:
        achieved = flops_per_step / step_s / 1e12
        lines.append(f"model FLOPs {flops_per_step / 1e12:.2f} T per step: {achieved:.0f} "
                     f"TFLOP/s, MFU {achieved / peak_tflops:.1%}")
    lines += ["", "| family | ms per step | share |", "|---|---|---|"]
    for label, t in sorted(by_family.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {label} | {t / steps / 1e3:.2f} | {t / total:.1%} |")
    lines += ["", "| kernel | family | ms per step | share |", "|---|---|---|---|"]
    for name, t in sorted(times.items(), key=lambda kv: -kv[1])[:25]:
        short = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| `{short}` | {family(name)} | {t / steps / 1e3:.3f} | {t / total:.1%} |")
    return "\n".join(lines + (extra or [])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="bert", choices=["bert", "modernbert"])
    parser.add_argument("--size", default="base", choices=["tiny", "small", "base", "large"])
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="default 256 BERT, 32 ModernBERT (tiny: 4)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="default 128 BERT, 1024 ModernBERT (tiny: 32)")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--eager", action="store_true", help="do not torch.compile")
    parser.add_argument("--compile-mode", default="default")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--unpadded", action="store_true",
                        help="uniform lengths, our padding-free path (default: full rows for "
                             "BERT; ModernBERT always runs so)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--inductor", nargs="*", default=[], metavar="KEY=VALUE",
                        help="torch._inductor.config settings for the compile, e.g. "
                             "coordinate_descent_tuning=True (Python literals)")
    parser.add_argument("--compiled-dropout", default="hash", choices=["hash", "philox"],
                        help="how compiled code draws dropout masks (models/dropout.py; "
                             "default hash, as training runs)")
    parser.add_argument("--trace", action="store_true", help="also write trace.json")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from bertgpu.bench.batches import MODERN_SIZES, make_batches
    from bertgpu.bench.model_runs import Models, _flops_per_token
    from bertgpu.models.dropout import set_compiled_dropout
    from bertgpu.telemetry.flops import gpu_model, peak_tflops

    set_compiled_dropout(args.compiled_dropout)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    tiny = args.size == "tiny"
    modern = args.arch == "modernbert"
    if modern and args.size not in MODERN_SIZES:
        parser.error(f"--size {args.size}: modernbert comes in {', '.join(MODERN_SIZES)}")
    args.unpadded = args.unpadded or modern
    B = args.micro_batch or (4 if tiny else 32 if modern else 256)
    T = args.seq_len or (32 if tiny else 1024 if modern else 128)
    args.out.mkdir(parents=True, exist_ok=True)
    record_bytes = cuda and not args.eager and args.compile_backend == "inductor"
    if args.inductor:
        import ast

        import torch._inductor.config as inductor_config

        for item in args.inductor:
            key, _, value = item.partition("=")
            setattr(inductor_config, key, ast.literal_eval(value))  # a typo raises here
    if record_bytes:
        import torch._inductor.config as inductor_config

        inductor_config.benchmark_kernel = True  # each Triton kernel records its byte estimate
    models = Models(args.arch, args.size, device, ["bertgpu"], False, 0,
                    backend=args.compile_backend)
    ours = models.eager["bertgpu"]
    ours.configure(unpad=args.unpadded)
    model = models.module("bertgpu", not args.eager, args.compile_mode)
    optimizer = models.optimizers["bertgpu"]
    batches = make_batches(4, B, T, models.vocab, "uniform" if args.unpadded else "full", 0,
                           device, mask_rate=0.3 if modern else 0.15, nsp=not modern)
    dtype = torch.bfloat16 if cuda else torch.float32

    def step(i: int) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=cuda):
            loss = model(**batches[i % len(batches)]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    t0 = time.perf_counter()
    try:
        for i in range(args.warmup):
            step(i)
    except Exception as exc:  # noqa: BLE001 - the byte estimates are a bonus, not the profile
        if not record_bytes:
            raise
        # benchmark_kernel changes inductor's code generation: should a torch version fail to
        # compile with it, profile without the traffic section rather than lose the stage
        print(f"compiling with benchmark_kernel failed ({type(exc).__name__}: "
              f"{str(exc).strip()[:200]}); profiling without the kernels' byte estimates",
              flush=True)
        inductor_config.benchmark_kernel = record_bytes = False
        optimizer.zero_grad(set_to_none=True)
        torch._dynamo.reset()
        for i in range(args.warmup):
            step(i)
    sync()
    warm_s = time.perf_counter() - t0
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i)
        sync()
        step_s = (time.perf_counter() - t0) / args.steps
    if args.trace:
        prof.export_chrome_trace(str(args.out / "trace.json"))
    fpt, _ = _flops_per_token(models.config, batches, nsp=not modern)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches) / len(batches)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = peak_tflops(name if cuda else None, "bf16" if cuda else "fp32")
    mode = "eager" if args.eager else f"compiled ({args.compile_mode})"
    if args.inductor:
        mode += f" with {', '.join(args.inductor)}"
    if not args.eager:
        mode += f", {args.compiled_dropout} dropout"
    label = "ModernBERT" if modern else "BERT"
    header = (f"{label}-{args.size} {B} x {T} {'unpadded uniform' if args.unpadded else 'full'}, "
              f"{mode}, {name}, torch {torch.__version__}; warm-up {warm_s:.1f} s")
    events = prof.key_averages()
    times = kernel_times(events, cuda)
    moved = (traffic(times, kernel_counts(events, cuda), triton_kernel_bytes()) if record_bytes
             else {})
    bandwidth = HBM_TB_S.get(gpu_model(name) or "") if cuda else None
    text = report(times, args.steps, step_s, fpt * tokens, peak, header,
                  traffic_lines(moved, times, args.steps, bandwidth))
    (args.out / "profile.md").write_text(text)
    sources = triton_kernel_sources() if cuda and not args.eager else {}
    if sources:
        (args.out / "kernels.py").write_text(kernel_sources_text(times, sources, args.steps,
                                                                 moved))
        for i, path in enumerate(compiled_graph_files()):
            (args.out / f"graph_{i}.py").write_bytes(path.read_bytes())
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
