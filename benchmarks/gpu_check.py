"""The GPU checks of one lease, in one command: `make gpu-check` (or this script).

    GPU_CHECK_OUT=results/h100 PYTHONPATH=src python3 benchmarks/gpu_check.py
    GPU_CHECK_OUT=/tmp/smoke PYTHONPATH=src python3 benchmarks/gpu_check.py --smoke   # on a CPU

Stages, in order, each in its own process group under its own time limit (`timeout -k`'s job: a
hang or a crash costs that stage, never the next ones), each with its log under GPU_CHECK_OUT:

1. `pytest -m gpu` on the files with CUDA tests (kernels against references, compile, no host
   sync, fused optimizers, NCCL DDP, FSDP on one GPU);
2. `bertgpu bench model --preset gpu-check`: ours vs transformers (eager and compiled), MFU,
   padded vs unpadded at real lengths, ModernBERT-base (the 3-compile part of `--preset gpu`,
   whose 6 compiles would not leave time for the rest);
3. a 60-step `bertgpu pretrain` of bert-base and of modern-base on the shard sets kept in
   benchmarks/data (real Wikipedia text, the bert-base-uncased vocabulary; prepared by
   `benchmarks/make_gpu_shards.py`), compiled, with TORCH_LOGS=recompiles: its steady tokens/s,
   compile seconds and recompiles;
4. `benchmarks/checkpoint_stall.py --device cuda --size base`: the training-thread stall of a
   background checkpoint against a synchronous one.

Extra stages, run only when named (`--only profile "compile modes"`), for what to try next:
`profile` and `profile modernbert` (benchmarks/gpu_profile.py: BERT-base 256 x 128 and
ModernBERT-base 32 x 1024 unpadded, compiled, device time by kernel family and the compiled
kernels' achieved memory bandwidth), `profile philox dropout` (the BERT-base profile with
`--compiled-dropout philox`, inductor's own dropout, to set beside `profile`'s hash dropout),
`profile pointwise autotune` (the BERT-base profile with inductor's `max_autotune_pointwise`:
the GELU and LayerNorm kernels move 2.6-3.3 TB/s of the H200's 4.8), `compile modes`
(`bench model` at the BERT-base point with torch.compile's default mode beside reduce-overhead,
i.e. CUDA graphs), `hf compiled` (BERT-base 128 x 128, ours and transformers compiled: the 1.5x
target), `dropout off` (the same point, ours, `--dropout 0`: configs/budget-24h.toml's recipe),
`modernbert compiled` (ModernBERT-base 32 x 1024 unpadded, compiled: the 40% target),
`unpadded compiled`
(BERT-base 32 x 512 at uniform real lengths, our padded and unpadded paths compiled: the default
bench stage times them eager), `bert-large compiled` (BERT-large 64 x 128, ours compiled: the
50% MFU target), `pretrain cuda graphs` (the bert-base run with
`--impl.compile_mode reduce-overhead`), `optimizer step` (benchmarks/optim_step.py on CUDA: one
LAMB and AdamW step on BERT-base's parameters, each variant), `pretrain bert-base adamw` (the
bert-base run with the bench's fused AdamW in place of LAMB: the optimizer's share of the run's
gap to the bench), `pretrain syncs` (benchmarks/step_syncs.py: the bert-base run with torch's
CUDA sync debug mode from step 10, each wait for the GPU by step and line), `saved bytes`
(`bench model --check-graph --dtype bf16` on CUDA: what the compiled step keeps for backward,
padded and padding-free), and `attention kernels`
(benchmarks/attention_kernels.py: our flash call against cuDNN's varlen call and SDPA's
backends, forward + backward at BERT's and ModernBERT's shapes).

The default stages took 547 s on an H200 (their limits add up to 685 s, the extra ones' to
1680 s; a command may run 10 minutes and a lease holds about 15 in all, start-up included), with
the machine's own torch (2.11 or later) and transformers, no network. `--only` runs the named
stages in the order named (a misspelt name stops the script before anything runs), and
`--budget-s` (default 570, one device call) starts a stage only while its whole limit fits in
what is left of the call, so one call can list stages by priority and end in time. A lease after
the default stages have run once fits two calls back to back (the second within what `status`
leaves):

    --only "hf compiled" "dropout off" "modernbert compiled"
    --budget-s "$LEFT" --only profile "profile modernbert"

torch.compile's max-autotune-no-cudagraphs is not a stage: on an H200 at BERT-base 256 x 128,
cuBLAS beat every Triton template on 8 of the 11 matrix-product shapes (the best template ran
at 68-90% of cuBLAS's speed), each shape took about 9 s to autotune, and the stage had not
finished in 300 s (`bench model ... --compile-mode default,max-autotune-no-cudagraphs`).

The last lines printed are a summary table (also summary.md), then each bench stage's
table. `--smoke` runs the same stages at toy sizes (pytest collects and skips, `--preset
gpu-smoke`, tiny models for a few steps) so the script itself is tested on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE_CALL_S = 570.0
"""The default --budget-s: a command on a lent GPU may run 600 s, and the start-up and the
summary need a little of it."""
DATA = ROOT / "benchmarks" / "data"

# The files no GPU run has reached yet first (a stage cut at its limit loses the last ones).
GPU_TESTS = ["tests/test_fsdp_gpu.py", "tests/test_preemption.py", "tests/test_gpu_flash.py",
             "tests/test_gpu.py", "tests/test_modernbert.py"]


def stages(smoke: bool, out: Path) -> list[dict]:
    py = sys.executable
    common = ["--train.log_every_steps", "10", "--train.eval_every_steps", "0",
              "--train.eval_sequences", "256", "--checkpoint.every_steps", "0"]
    if smoke:
        small = ["--model.num_hidden_layers", "1", "--model.hidden_size", "64",
                 "--model.num_attention_heads", "2", "--model.intermediate_size", "128",
                 "--train.max_steps", "3", "--train.global_batch_size", "4",
                 "--impl.micro_batch_size", "4", "--impl.num_workers", "0",
                 "--impl.compile", "false", "--train.precision", "fp32"]
        bert_args = small + ["--train.log_every_steps", "1"]
        modern_args = small + ["--train.log_every_steps", "1", "--model.local_attention", "16",
                               "--model.global_attn_every_n_layers", "1"]
    else:
        bert_args = ["--train.max_steps", "60", "--train.global_batch_size", "256",
                     "--impl.micro_batch_size", "256", "--impl.compile", "true"]
        modern_args = ["--train.max_steps", "60", "--train.global_batch_size", "32",
                       "--impl.micro_batch_size", "32", "--impl.compile", "true"]
    pretrain = [py, "-m", "bertgpu", "pretrain"]
    # the bench stages' points, ours only; in --smoke one tiny eager point for both
    tiny_point = ["--size", "tiny", "--micro-batch", "2", "--seq-len", "16", "--iters", "1",
                  "--warmup", "0", "--compile-backend", "eager", "--models", "bertgpu"]
    # one BERT-base point for the compile-mode stages
    bench_point = tiny_point if smoke else ["--size", "base", "--micro-batch", "256",
                                            "--seq-len", "128", "--models", "bertgpu",
                                            "--iters", "6"]
    # BERT-base at seq 512 and real (uniform) lengths: our padded and unpadded paths compiled,
    # the 1.3x target (the default bench stage runs this point eager only)
    unpadded_point = tiny_point if smoke else ["--size", "base", "--micro-batch", "32",
                                               "--seq-len", "512", "--models", "bertgpu",
                                               "--iters", "10"]
    base_point = tiny_point if smoke else ["--size", "base", "--micro-batch", "128",
                                           "--seq-len", "128", "--iters", "10"]
    modern_point = ["--arch", "modernbert", *tiny_point] if smoke else [
        "--arch", "modernbert", "--size", "base", "--micro-batch", "32", "--seq-len", "1024",
        "--models", "bertgpu", "--iters", "6"]
    large_point = tiny_point if smoke else ["--size", "large", "--micro-batch", "64",
                                            "--seq-len", "128", "--models", "bertgpu",
                                            "--iters", "6"]
    return [
        # 37 tests took under 125 s at stop 28; the CUDA-graph, static-shape and FSDP tests
        # added since (none yet run on a GPU) compile or launch runs of their own
        dict(name="pytest -m gpu", limit=240,
             cmd=[py, "-m", "pytest", "-m", "gpu", "-vv", "-p", "no:cacheprovider", "-rfE",
                  "--timeout", "120", *GPU_TESTS]),
        dict(name="bench model", limit=120 if smoke else 210,
             cmd=[py, "-m", "bertgpu", "bench", "model", "--preset",
                  "gpu-smoke" if smoke else "gpu-check", "--out", str(out / "bench.jsonl")]),
        dict(name="pretrain bert-base", limit=90, run=out / "run-bert",
             cmd=[*pretrain, "configs/bert-base.toml", "--data", str(DATA / "wiki-128"),
                  "--out", str(out / "run-bert"), *common, *bert_args]),
        dict(name="pretrain modern-base", limit=100, run=out / "run-modern",
             cmd=[*pretrain, "configs/modern-base.toml", "--data", str(DATA / "wiki-1024"),
                  "--out", str(out / "run-modern"), *common, *modern_args]),
        dict(name="checkpoint stall", limit=60 if smoke else 45,
             cmd=[py, "benchmarks/checkpoint_stall.py", "--device", "cpu" if smoke else "cuda",
                  "--size", "tiny" if smoke else "base", "--out", str(out / "stall")]),
        # Extra stages, run only when named in --only: the next measurements of issue 24.
        # the profile itself took 50 s on an H200 (a 36 s warm-up), and its process then took
        # over 10 s to exit: 60 s cut it
        dict(name="profile", limit=120 if smoke else 90, extra=True,
             cmd=[py, "benchmarks/gpu_profile.py", "--out", str(out / "profile"),
                  *(["--size", "tiny", "--device", "cpu", "--compile-backend", "eager",
                     "--steps", "2", "--warmup", "1"] if smoke else [])]),
        # the same profile with inductor's in-kernel Philox dropout instead of the hash of
        # each element's index that is compiled dropout's default (models/dropout.py)
        dict(name="profile philox dropout", limit=120 if smoke else 90, extra=True,
             cmd=[py, "benchmarks/gpu_profile.py", "--compiled-dropout", "philox", "--out",
                  str(out / "profile-philox"),
                  *(["--size", "tiny", "--device", "cpu", "--compile-backend", "eager",
                     "--steps", "2", "--warmup", "1"] if smoke else [])]),
        # pointwise and reduction kernels autotuned (block sizes, warps) by inductor
        dict(name="profile pointwise autotune", limit=120 if smoke else 130, extra=True,
             cmd=[py, "benchmarks/gpu_profile.py", "--inductor", "max_autotune_pointwise=True",
                  "--out", str(out / "profile-pointwise"),
                  *(["--size", "tiny", "--device", "cpu", "--compile-backend", "eager",
                     "--steps", "2", "--warmup", "1"] if smoke else [])]),
        dict(name="profile modernbert", limit=120 if smoke else 100, extra=True,
             cmd=[py, "benchmarks/gpu_profile.py", "--arch", "modernbert", "--out",
                  str(out / "profile-modern"),
                  *(["--size", "tiny", "--device", "cpu", "--compile-backend", "eager",
                     "--steps", "2", "--warmup", "1"] if smoke else [])]),
        dict(name="compile modes", limit=120 if smoke else 150, extra=True,
             cmd=[py, "-m", "bertgpu", "bench", "model", *bench_point, "--compile", "on",
                  "--compile-mode", "default,reduce-overhead", "--out",
                  str(out / "modes.jsonl")]),
        # BERT-base at the 128 x 128, ours against transformers compiled (1.5x target)
        dict(name="hf compiled", limit=130, extra=True,
             cmd=[py, "-m", "bertgpu", "bench", "model", *base_point, "--compile", "on",
                  "--out", str(out / "hf.jsonl")]),
        # the same point without dropout (configs/budget-24h.toml's recipe), ours only
        dict(name="dropout off", limit=100, extra=True,
             cmd=[py, "-m", "bertgpu", "bench", "model", *base_point, "--compile", "on",
                  "--models", "bertgpu", "--dropout", "0", "--out", str(out / "nodrop.jsonl")]),
        # ModernBERT-base at 1024 unpadded, compiled: the 40% target
        dict(name="modernbert compiled", limit=110, extra=True,
             cmd=[py, "-m", "bertgpu", "bench", "model", *modern_point, "--compile", "on",
                  "--padding", "unpadded", "--real-lengths", "uniform", "--out",
                  str(out / "modern.jsonl")]),
        dict(name="unpadded compiled", limit=120, extra=True,
             cmd=[py, "-m", "bertgpu", "bench", "model", *unpadded_point, "--compile", "on",
                  "--padding", "padded,unpadded", "--real-lengths", "uniform", "--out",
                  str(out / "unpadded.jsonl")]),
        # BERT-large compiled, ours only: the 50% MFU target (the default bench stage
        # times BERT-large eager only)
        dict(name="bert-large compiled", limit=180, extra=True,
             cmd=[py, "-m", "bertgpu", "bench", "model", *large_point, "--compile", "on",
                  "--out", str(out / "large.jsonl")]),
        # what the compiled step keeps for backward, measured where the flash kernel runs
        # (padded and padding-free; the CPU audit of `make test` sees the padded layout only)
        dict(name="saved bytes", limit=120, extra=True, grep="saved for backward:",
             cmd=[py, "-m", "bertgpu", "bench", "model", "--check-graph", "--dtype", "bf16",
                  "--device", "cpu" if smoke else "cuda"]),
        # attention kernels side by side (ours, cuDNN's varlen call, SDPA's flash, cuDNN and
        # efficient backends), forward + backward at BERT's and ModernBERT's shapes: 30 s of GPU
        # time on an H200, plus a child process per shape for the cuDNN varlen rows
        dict(name="attention kernels", limit=120, extra=True,
             cmd=[py, "benchmarks/attention_kernels.py",
                  *(["--smoke", "--iters", "2", "--warmup", "1"] if smoke else [])]),
        # one optimizer step on BERT-base's parameters, LAMB's and AdamW's variants side by
        # side: LAMB's step at accumulation 1 is a pass-count question (memory-bound)
        dict(name="optimizer step", limit=60, extra=True,
             cmd=[py, "benchmarks/optim_step.py", "--out", str(out / "optim_step.jsonl"),
                  *(["--size", "tiny", "--rounds", "1"] if smoke
                    else ["--device", "cuda", "--rounds", "20"])]),
        # the pretrain stage with the bench's optimizer (fused AdamW) instead of the config's
        # LAMB: how much of the gap between the run and the bench the optimizer step makes
        dict(name="pretrain bert-base adamw", limit=90, run=out / "run-adamw", extra=True,
             cmd=[*pretrain, "configs/bert-base.toml", "--data", str(DATA / "wiki-128"),
                  "--out", str(out / "run-adamw"), *common, *bert_args,
                  "--optim.name", "adamw"]),
        # the bert-base run in one process with torch's CUDA sync debug mode on from step 10:
        # every call that made the host wait for the GPU, by step and by the line that made it
        dict(name="pretrain syncs", limit=100, extra=True, grep="step_syncs:",
             cmd=[py, "benchmarks/step_syncs.py", "--from", "10", "--", "pretrain",
                  "configs/bert-base.toml", "--data", str(DATA / "wiki-128"),
                  "--out", str(out / "run-syncs"), *common, *bert_args]),
        dict(name="pretrain cuda graphs", limit=90, run=out / "run-graphs", extra=True,
             torch_logs="recompiles,cudagraphs",
             cmd=[*pretrain, "configs/bert-base.toml", "--data", str(DATA / "wiki-128"),
                  "--out", str(out / "run-graphs"), *common, *bert_args,
                  "--impl.compile_mode", "reduce-overhead"]),
    ]


def run_stage(stage: dict, out: Path) -> dict:
    """Run one stage in its own process group; kill the group at its limit."""
    log = out / (stage["name"].replace(" ", "_").replace("-", "_") + ".log")
    env = dict(os.environ, PYTHONUNBUFFERED="1", TORCH_LOGS=stage.get("torch_logs", "recompiles"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                        os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    with open(log, "w") as f:
        f.write("$ " + " ".join(stage["cmd"]) + "\n")
        f.flush()
        proc = subprocess.Popen(stage["cmd"], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=stage["limit"])
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = "timeout"
    return dict(name=stage["name"], rc=rc, seconds=round(time.perf_counter() - t0, 1), log=log,
                run=stage.get("run"))


def run_numbers(run: Path, log: Path) -> str:
    """Steady tokens/s, MFU and compile seconds of a pretraining run (its metrics.jsonl), and the
    recompiles dynamo logged (TORCH_LOGS=recompiles) and, with TORCH_LOGS=cudagraphs, the CUDA
    graphs recorded."""
    rows = []
    metrics = run / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    train = [r for r in rows if "tokens_per_s" in r]
    text = log.read_text(errors="replace") if log.exists() else ""
    recompiles = text.count("Recompiling function")
    if not train:
        return f"no training record; recompiles {recompiles}"
    first, last = train[0], train[-1]
    compile_s = max((r.get("compile_s") or 0.0) for r in train)
    parts = [f"first interval {first['tokens_per_s']:,.0f} tok/s",
             f"last {last['tokens_per_s']:,.0f} tok/s"]
    if last.get("mfu") is not None:
        parts.append(f"MFU {last['mfu']:.1%}")
    parts += [f"compile {compile_s:.1f} s", f"recompiles {recompiles}"]
    recordings = text.count("Recording function")  # TORCH_LOGS=cudagraphs: one per CUDA graph
    if recordings:
        parts.append(f"CUDA graph recordings {recordings}")
    return ", ".join(parts)


def bench_table(log: Path) -> str:
    """The last table a `bench model` stage printed (its caption line and rows), from its log."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    end = max((i for i, ln in enumerate(lines) if ln.startswith("|")), default=-1)
    if end < 0:
        return ""
    start = end
    while start > 0 and lines[start - 1].startswith("|"):
        start -= 1
    caption = lines[start - 1:start] if start > 0 and lines[start - 1].strip() else []
    return "\n".join(caption + lines[start:end + 1])


def select(all_stages: list[dict], only: list[str] | None) -> list[dict]:
    """The stages to run, in order: the default ones as listed, or exactly those named in
    `only`, in the order named (most wanted first, for a lease that may run out). A name that is
    no stage is an error, before anything runs: a typo must not cost a lease."""
    if not only:
        return [s for s in all_stages if not s.get("extra")]
    by_name = {s["name"]: s for s in all_stages}
    unknown = [n for n in only if n not in by_name]
    if unknown:
        raise SystemExit(f"gpu_check.py --only: no stage {', '.join(map(repr, unknown))}; the "
                         f"stages are {', '.join(map(repr, by_name))}")
    return [by_name[n] for n in dict.fromkeys(only)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="toy sizes, for a CPU")
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only these stages, by name, in this order (the extra stages "
                             "run only so: " + ", ".join(
                                 s["name"] for s in stages(False, Path(".")) if s.get("extra"))
                             + ")")
    parser.add_argument("--budget-s", type=float, default=DEVICE_CALL_S,
                        help="seconds this call may take: a stage starts only if its limit "
                             "still fits (a later, shorter one may), the rest are listed as "
                             f"skipped (default {DEVICE_CALL_S:.0f}: one device call; 0 = none)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = Path(os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT") or "gpu_check_out")
    chosen = select(stages(args.smoke, out), args.only)  # a misspelt name stops here
    out.mkdir(parents=True, exist_ok=True)
    info = subprocess.run([sys.executable, "-c",
                           "import torch, platform; print(torch.__version__, "
                           "torch.cuda.get_device_name() if torch.cuda.is_available() "
                           "else platform.processor() or 'cpu')"],
                          capture_output=True, text=True).stdout.strip()
    print(f"gpu-check: torch {info}; results in {out}", flush=True)
    results = []
    for stage in chosen:
        elapsed = time.perf_counter() - start
        if args.budget_s and elapsed + stage["limit"] > args.budget_s:
            results.append(dict(name=stage["name"], rc="skipped", seconds=0.0, log=None,
                                run=None, bench=False,
                                note=f"its {stage['limit']} s limit did not fit the "
                                     f"{args.budget_s - elapsed:.0f} s left of --budget-s"))
            print(f"  {stage['name']:<22} skipped: {results[-1]['note']}", flush=True)
            continue
        r = run_stage(stage, out)
        note = run_numbers(r["run"], r["log"]) if r["run"] else ""
        if stage.get("grep"):  # the lines of its log that carry the stage's numbers
            text = r["log"].read_text(errors="replace") if r["log"].exists() else ""
            note = "; ".join(" ".join(ln.split()) for ln in text.splitlines()
                             if stage["grep"] in ln)
        # pytest at -vv (addopts has -q): one line per test, kept if the stage is cut
        if stage["name"].startswith("pytest"):
            lines = [ln for ln in r["log"].read_text(errors="replace").splitlines() if "::" in ln]
            counts = {w: sum(f" {w}" in ln for ln in lines)
                      for w in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
            failed = [ln.split(" ")[0] for ln in lines if " FAILED" in ln or " ERROR" in ln]
            note = ", ".join(f"{n} {w.lower()}" for w, n in counts.items() if n)
            note += "".join(f"; {t}" for t in failed[:6])
        r["note"] = note
        r["bench"] = stage["cmd"][1:4] == ["-m", "bertgpu", "bench"]
        results.append(r)
        print(f"  {r['name']:<22} rc={r['rc']!s:<8} {r['seconds']:>6.1f} s  {note}", flush=True)
    lines = [f"# gpu-check: torch {info}", "", "| stage | rc | seconds | numbers |",
             "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['rc']} | {r['seconds']} | {r['note']} |" for r in results]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    # each bench stage's table too: the summary and these are what a short lease reads back
    for r in results:
        table = bench_table(r["log"]) if r["bench"] else ""
        if table:
            print(f"\n## {r['name']}\n\n{table}")
    for folder in ("profile", "profile-philox", "profile-pointwise", "profile-modern"):
        profile = out / folder / "profile.md"
        if profile.exists():
            print(profile.read_text())
    return 0 if all(r["rc"] in (0, "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
