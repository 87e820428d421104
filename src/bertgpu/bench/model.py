"""`bertgpu bench model`: training-step speed of our models vs transformers', side by side.

For every point of the grid (architecture x size x micro batch x seq len x dtype x lengths) both
models get the same weights, the same optimizer (AdamW, fused on CUDA) and the same batches (ours
with the host-side `BatchMeta` the loader ships; MLM masks drawn as training draws them, a fixed
count per sequence), and the timed steps of every variant (model x compile x padding) alternate
in one process, so the ratios are fair on a noisy machine (model_runs.py). Tokens/s counts real
(non-padding) tokens; MFU uses the architecture's FLOPs per token at each sequence's own length
and `flops.peak_tflops`, which the row records (`peak_tflops`, and `peak_source`: --peak-tflops,
BERTGPU_PEAK_TFLOPS or the table entry, e.g. "table: H100 SXM bf16"). A row says the device,
torch and transformers versions, dtype and compile mode, its ratios against transformers eager
and compiled (`vs_hf_eager`, `vs_hf_compiled`), for an unpadded row against our padded one
(`unpadded_vs_padded`), and `timed_compiles`: timed steps during which torch compiled (0 in a
row to trust).

    bertgpu bench model                          # CPU default: small, B 8, T 128, fp32 (~1 min)
    bertgpu bench model --size base --micro-batch 8 --iters 3 --out results/bench_model.jsonl
    bertgpu bench model --seq-len 512 --padding padded,unpadded --real-lengths uniform,data/
    bertgpu bench model --seq-len 384 --padding padded,unpadded \\
        --real-lengths squad:train-v1.1.json --tokenizer data/   # SQuAD fine-tuning lengths
    bertgpu bench model --arch modernbert --size base --seq-len 1024 --compile on
    bertgpu bench model --preset gpu --out results/h100.jsonl   # the GPU table (see GPU_PRESET)
    bertgpu bench model --preset gpu-smoke       # the same code path, tiny, on the CPU (seconds)
    bertgpu bench model --check-graph            # graph breaks / host syncs / recompiles
    bertgpu bench model --strategy fsdp --size base   # bytes per rank, ddp vs fsdp

Models are built once per (architecture, size) and serve every point of it (unpadding is a
per-instance option set before each step, a compiled wrapper shares the model's parameters and
compiles as training does: one graph per point, see model_runs.py). `--padding unpadded` turns on
our model's unpadding (transformers runs padded: it unpads only with flash-attention-2, not with
SDPA); `--padding
bucketed` is not a model switch: see `PretrainLoader(bucket_window=k)`. Rows are appended to
`--out` (JSONL, or CSV when the name ends in .csv), so runs accumulate.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bertgpu.bench.batches import MODERN_SIZES, SIZES
from bertgpu.bench.cells import append_rows, check_rows_file
from bertgpu.bench.model_runs import ARCHS, COMPILE_MODES, Models, Variant, run_point
from bertgpu.errors import BertgpuError
from bertgpu.report.bench_rows import MODEL_COLUMNS, fmt_model_value

_OURS, _HF = "bertgpu", "transformers"
DEFAULT_SIZE = {"bert": "small", "modernbert": "tiny"}
"""Each architecture's size without --size: the one a CPU times in about a minute (ModernBERT has
no small, and its base takes 22 layers)."""
VARIABLE = "variable"
"""A preset point's lengths: each of `--real-lengths` other than full (default: uniform)."""

GPU_PRESET: list[dict[str, Any]] = [
    # Full-length rows (packed pretraining): ours and transformers, each eager and compiled.
    dict(arch="bert", size="base", micro_batch=128, seq_len=128, lengths="full",
         variants=[Variant(_OURS, False), Variant(_OURS, True), Variant(_HF, False),
                   Variant(_HF, True)]),
    # Variable real lengths: our padded and unpadded paths, eager and compiled, vs transformers.
    dict(arch="bert", size="base", micro_batch=32, seq_len=512, lengths=VARIABLE,
         variants=[Variant(_OURS, False, "padded"), Variant(_OURS, False, "unpadded"),
                   Variant(_OURS, True, "padded"), Variant(_OURS, True, "unpadded"),
                   Variant(_HF, False)]),
    dict(arch="bert", size="large", micro_batch=64, seq_len=128, lengths="full",
         variants=[Variant(_OURS, False), Variant(_OURS, True), Variant(_HF, False)]),
    # ModernBERT-base at its pretraining length, unpadded and compiled, vs transformers'.
    dict(arch="modernbert", size="base", micro_batch=32, seq_len=1024, lengths=VARIABLE,
         variants=[Variant(_OURS, False, "padded"), Variant(_OURS, False, "unpadded"),
                   Variant(_OURS, True, "unpadded"), Variant(_HF, False)]),
]
"""The GPU table, in order: bf16, 6 compiles (our BERT-base at two shapes padded and one
unpadded, transformers' BERT-base, our BERT-large and ModernBERT-base once each)."""

GPU_CHECK_PRESET: list[dict[str, Any]] = [
    dict(arch="bert", size="base", micro_batch=128, seq_len=128, lengths="full",
         variants=[Variant(_OURS, False), Variant(_OURS, True), Variant(_HF, False),
                   Variant(_HF, True)]),
    dict(arch="bert", size="base", micro_batch=32, seq_len=512, lengths=VARIABLE,
         variants=[Variant(_OURS, False, "padded"), Variant(_OURS, False, "unpadded"),
                   Variant(_HF, False)]),
    dict(arch="bert", size="large", micro_batch=64, seq_len=128, lengths="full",
         variants=[Variant(_OURS, False), Variant(_HF, False)]),
    dict(arch="modernbert", size="base", micro_batch=32, seq_len=1024, lengths=VARIABLE,
         variants=[Variant(_OURS, False, "unpadded"), Variant(_OURS, True, "unpadded"),
                   Variant(_HF, False)]),
]
"""The part of GPU_PRESET that fits `make gpu-check`'s 8 minutes with the GPU tests and two
pretraining runs: 3 compiles (ours and transformers' BERT-base at 128 x 128, our ModernBERT-base
unpadded at 1024), padded vs unpadded at 512 eager, BERT-large eager."""

_SMOKE_SHAPES = {128: 16, 512: 32, 1024: 64}


def _smoke_preset() -> list[dict[str, Any]]:
    """GPU_PRESET shrunk: tiny models, micro batch 2, short sequences; the same variants."""
    return [{**p, "size": "tiny", "micro_batch": 2, "seq_len": _SMOKE_SHAPES[p["seq_len"]]}
            for p in GPU_PRESET]


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
    parser.add_argument("--arch", type=_csv_list(str, ARCHS), default=["bert"],
                        help="bert and/or modernbert (sizes tiny and base) (default bert)")
    parser.add_argument("--size", type=_csv_list(str, tuple(SIZES)), default=None,
                        help="model sizes, comma list of tiny, small, base, large (modernbert: "
                             "tiny, base); default: "
                             + ", ".join(f"{s} for {a}" for a, s in DEFAULT_SIZE.items()))
    parser.add_argument("--micro-batch", type=_csv_list(int), default=[8],
                        help="sequences per step (comma list; default: 8)")
    parser.add_argument("--seq-len", type=_csv_list(int), default=[128],
                        help="sequence lengths (comma list; default: 128)")
    parser.add_argument("--dtype", type=_csv_list(str, ("fp32", "bf16")), default=None,
                        help="fp32 and/or bf16 (autocast); default bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--compile", type=_csv_list(str, ("off", "on")), default=["off"],
                        help="torch.compile the models: off, on or off,on (both are rows) "
                             "(default: off)")
    parser.add_argument("--compile-mode", type=_csv_list(str, COMPILE_MODES), default=["default"],
                        help="torch.compile modes of the compiled rows, comma list (a row each, "
                             "side by side): default, reduce-overhead (CUDA graphs), "
                             "max-autotune, max-autotune-no-cudagraphs (default: default)")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend (default inductor; gpu-smoke on a CPU: eager)")
    parser.add_argument("--padding", type=_csv_list(str, ("padded", "unpadded")),
                        default=["padded"],
                        help="padded (both models see the padded batch) and/or unpadded (our model "
                             "gathers the real tokens; transformers stays padded); default: padded")
    parser.add_argument("--real-lengths", type=_csv_list(str), default=None,
                        metavar="full|uniform|DATA_DIR|squad:FILE",
                        help="comma list of sequence-length sources: full (no padding, default), "
                             "uniform (in [T/8, T]), a prepared data folder (its train lengths), "
                             "squad:FILE (SQuAD feature lengths, tokenized with --tokenizer)")
    parser.add_argument("--tokenizer", default=None,
                        help="WordPiece folder (or a data folder holding one) for squad:FILE")
    parser.add_argument("--mask-rate", type=float, default=None,
                        help="MLM rate, a fixed count per sequence (default 0.15 BERT, 0.3 "
                             "ModernBERT, as their recipes)")
    parser.add_argument("--grad-ckpt", action="store_true",
                        help="activation checkpointing in both models")
    parser.add_argument("--dropout", type=float, default=None,
                        help="every dropout probability of both models (BERT's hidden and "
                             "attention, ModernBERT's embedding, attention and MLP); default: "
                             "each architecture's own (BERT 0.1, ModernBERT 0); 0 is the "
                             "recipe of configs/budget-24h.toml")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed steps per variant (default 3 CPU, 10 CUDA; gpu-smoke 1)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps per variant first (default 1 CPU, 3 CUDA); a compiled "
                             "one warms up until a step compiles nothing")
    parser.add_argument("--models", type=_csv_list(str, (_OURS, _HF)), default=[_OURS, _HF],
                        help="which models to time, comma list of bertgpu, transformers "
                             "(default: both)")
    parser.add_argument("--device", default=None,
                        help="cpu or cuda[:N] (default: cuda when available)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak TFLOP/s of one device for MFU (default: the table in "
                             "flops.py; none on CPU)")
    parser.add_argument("--preset", choices=["gpu", "gpu-check", "gpu-smoke"], default=None,
                        help="gpu: BERT-base/large and ModernBERT-base, bf16, ours and "
                             "transformers eager and compiled, padded vs unpadded at real "
                             "lengths (GPU_PRESET); gpu-check: its 3-compile part (make "
                             "gpu-check); gpu-smoke: the gpu rows tiny, in seconds")
    parser.add_argument("--check-graph", action="store_true",
                        help="instead of timing: check that every training micro-step (pretraining "
                             "padded/packed/unpadded, NSP on/off, the task heads) compiles with no "
                             "graph break, runs with no host sync and compiles nothing again on "
                             "the next batches; exit 1 if not (see bench/graph_check.py)")
    parser.add_argument("--strategy", choices=["ddp", "fsdp"], default=None,
                        help="instead of ours vs transformers: parameter + gradient + optimizer "
                             "bytes per rank of ddp and fsdp on --ranks processes, predicted for "
                             "4 and 8 (sharded.py)")
    parser.add_argument("--ranks", default="1,2",
                        help="with --strategy: world sizes to measure (default 1,2)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random weights and batches (default: 0)")
    parser.add_argument("--out", type=Path, default=None,
                        help="append one row per variant and grid point (.jsonl or .csv)")


# --------------------------------------------------------------------------------------------
# The grid


def _variants(args: argparse.Namespace) -> list[Variant]:
    out = []
    for name in args.models:
        for c in args.compile:
            for pad in (args.padding if name == _OURS else ["padded"]):
                for mode in (args.compile_mode if c == "on" else ["default"]):
                    out.append(Variant(name, c == "on", pad, mode))
    return out


def _in_modes(variants: list[Variant], modes: list[str]) -> list[Variant]:
    """A preset's variants with each compiled one once per torch.compile mode."""
    return [replace(v, mode=m) for v in variants for m in (modes if v.compile else [v.mode])]


BERT_POSITIONS = 512  # transformers' BertConfig default, which the BERT sizes keep
MIN_SEQ_LEN = 8  # as `prepare --seq-len`: [CLS], [SEP] and a few tokens to mask


def _sizes(args: argparse.Namespace, arch: str) -> list[str]:
    return args.size or [DEFAULT_SIZE[arch]]


def _grid(args: argparse.Namespace, cuda: bool) -> list[dict[str, Any]]:
    """The points to time, in order (grouped by architecture and size: models built once)."""
    sources = args.real_lengths or ["full"]
    if args.preset is not None:
        variable = [s for s in sources if s != "full"] or ["uniform"]
        preset = {"gpu": GPU_PRESET, "gpu-check": GPU_CHECK_PRESET}.get(args.preset) \
            or _smoke_preset()
        dtype = "bf16" if cuda else "fp32"
        return [{**p, "dtype": dtype, "lengths": s,
                 "variants": _in_modes([v for v in p["variants"] if v.model in args.models],
                                       args.compile_mode)}
                for p in preset for s in (variable if p["lengths"] == VARIABLE else [p["lengths"]])]
    for arch in args.arch:
        sizes = MODERN_SIZES if arch == "modernbert" else SIZES
        bad = [s for s in _sizes(args, arch) if s not in sizes]
        if bad:
            raise BertgpuError(f"--size {bad[0]}: {arch} comes in {', '.join(sizes)}")
        for size in _sizes(args, arch):
            positions = sizes[size].get("max_position_embeddings", BERT_POSITIONS)
            for t in args.seq_len:
                if not MIN_SEQ_LEN <= t <= positions:
                    raise BertgpuError(f"--seq-len {t}: {arch}-{size} takes {MIN_SEQ_LEN} to "
                                       f"{positions} tokens (its max_position_embeddings)")
    for b in args.micro_batch:
        if b < 1:
            raise BertgpuError(f"--micro-batch {b}: expected 1 or more sequences")
    dtypes = args.dtype or (["bf16"] if cuda else ["fp32"])
    return [dict(arch=a, size=s, micro_batch=b, seq_len=t, dtype=d, lengths=n,
                 variants=_variants(args))
            for a in args.arch for s in _sizes(args, a) for b in args.micro_batch
            for t in args.seq_len
            for d in dtypes for n in sources]


def peak_of(device_name: str | None, dtype: str, override: float | None
            ) -> tuple[float | None, str | None]:
    """The peak TFLOP/s of one device that MFU is over, and where it came from
    (`flops.peak_and_source`: "--peak-tflops", the environment variable, or the table entry,
    "table: H100 SXM bf16"); (None, None) when it is unknown (the rows get no MFU). On a
    GPU (`device_name`) fp32 rows run their matrix products on TF32 tensor cores (`main` allows
    them, as training does), so their peak is TF32's, as training's MFU takes it."""
    from bertgpu.telemetry.flops import peak_and_source

    if device_name is not None and dtype == "fp32":
        dtype = "tf32"
    return peak_and_source(device_name, dtype, override)


# --------------------------------------------------------------------------------------------
# Output


COMPACT = [("name", "model"), ("shape", "B x T"), ("lengths", "lengths"), ("padding", "padding"),
           ("compile_mode", "compile"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU"),
           ("vs_hf_eager", "vs HF eager"), ("vs_hf_compiled", "vs HF compiled"),
           ("unpadded_vs_padded", "unpadded/padded"), ("timed_compiles", "timed compiles")]


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]] = MODEL_COLUMNS) -> str:
    """Markdown table of result rows."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt_model_value(k, r.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines)


def format_compact(rows: list[dict[str, Any]]) -> str:
    """The end-of-run table: one line per row, the numbers a reader compares."""
    titles = {"bert": "BERT", "modernbert": "ModernBERT"}
    named = [{**r, "name": f"{titles.get(r['arch'], r['arch'])}-{r['size']} "
                           f"{'ours' if r['model'] == _OURS else 'HF'}",
              "shape": f"{r['micro_batch']} x {r['seq_len']}"} for r in rows]
    return format_table(named, COMPACT)


def _have_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def main(args: argparse.Namespace) -> int:
    if args.check_graph:
        from bertgpu.bench import graph_check

        return graph_check.main(args)
    if args.out is not None:  # (either kind of row may follow the other in a JSONL file)
        check_rows_file(args.out, "model_memory" if args.strategy else "model",
                        ("model", "model_memory"))
    if args.strategy is not None:
        from bertgpu.bench import sharded

        args.size = _sizes(args, "bert")  # it measures BERT
        return sharded.main(args)
    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertgpuError(f"--device {args.device}: CUDA is not available on this machine; "
                           "expected --device cpu")
    if (args.padding and "unpadded" in args.padding and (args.real_lengths or ["full"]) == ["full"]
            and args.preset is None):
        print("note: --real-lengths full has no padding, so unpadded equals padded; try "
              "--real-lengths uniform")
    cuda = device.type == "cuda"
    if args.preset in ("gpu", "gpu-check") and not cuda:
        print("note: --preset gpu is the GPU table (BERT-large, ModernBERT-base at 1024): hours "
              "on a CPU; --preset gpu-smoke runs its rows tiny")
    smoke = args.preset == "gpu-smoke"
    iters = args.iters if args.iters is not None else (1 if smoke else 10 if cuda else 3)
    warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    if iters < 1 or warmup < 0:
        raise BertgpuError(f"--iters {iters} / --warmup {warmup}: expected iters >= 1 "
                           "and warmup >= 0")
    if args.mask_rate is not None and not 0.0 < args.mask_rate < 1.0:
        raise BertgpuError(f"--mask-rate {args.mask_rate}: expected a value in (0, 1)")
    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        raise BertgpuError(f"--dropout {args.dropout}: expected a probability in [0, 1)")
    if _HF in args.models and not _have_transformers():  # before any model is built
        raise BertgpuError(f"--models {','.join(args.models)}: transformers is not installed; "
                           "expected `pip install transformers` (or `pip install "
                           "'bertgpu[demo]'`), or --models bertgpu to time ours alone")
    backend = args.compile_backend or ("eager" if smoke and not cuda else "inductor")
    grid = _grid(args, cuda)  # bad sizes refused before any model is built
    if cuda:
        # fp32 rows: TF32 tensor cores, as training would
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
    header = (f"bertgpu bench model | device {device} ({name}, {torch.get_num_threads()} "
              f"threads) | torch {torch.__version__} | iters {iters} warmup {warmup}"
              + ("" if args.dropout is None else f" | dropout {args.dropout:g}"))
    print(header, flush=True)
    rows: list[dict[str, Any]] = []
    models: Models | None = None
    start = time.perf_counter()
    # the rows of this run, in a file of several (two runs may start within one second)
    run_id = f"{time.strftime('%Y-%m-%dT%H:%M:%S')}-{os.urandom(2).hex()}"
    for point in grid:
        if models is None or (models.arch, models.size) != (point["arch"], point["size"]):
            models = None  # free the previous size first
            if cuda:
                torch.cuda.empty_cache()
            models = Models(point["arch"], point["size"], device, args.models, args.grad_ckpt,
                            args.seed, backend, dropout=args.dropout)
        peak, source = peak_of(name if cuda else None, point["dtype"], args.peak_tflops)
        mask_rate = args.mask_rate or (0.3 if point["arch"] == "modernbert" else 0.15)
        t0 = time.perf_counter()
        new = run_point(models, point["variants"], point["micro_batch"], point["seq_len"],
                        point["dtype"], point["lengths"], device, iters, warmup, peak, args.seed,
                        tokenizer=args.tokenizer, mask_rate=mask_rate, peak_source=source)
        stamp = dict(grad_ckpt=bool(args.grad_ckpt), dropout=models.dropout,
                     device=str(device), device_name=name, torch=torch.__version__,
                     threads=torch.get_num_threads(), preset=args.preset, run_id=run_id,
                     time=time.time(),
                     wall_s=round(time.perf_counter() - t0, 1))
        new = [{**r, **stamp} for r in new]
        rows += new
        print(format_table(new).split("\n", 2)[2] if len(rows) > len(new) else format_table(new),
              flush=True)
        if args.out is not None:
            append_rows(args.out, new)
    print()
    first = rows[0] if rows else {}
    print(f"{name} | torch {torch.__version__} | transformers "
          f"{first.get('transformers') or '-'} | {first.get('dtype', '-')} | "
          f"{time.perf_counter() - start:.0f} s in all")
    print(format_compact(rows))
    peaks = sorted({f"{r['peak_tflops']:g} TFLOP/s ({r['peak_source']})" for r in rows
                    if r["mfu"] is not None})
    if peaks:
        print(f"MFU is over a peak of {', '.join(peaks)} per device")
    if any(r["timed_compiles"] for r in rows):
        print("warning: torch compiled during timed steps of some rows (timed compiles > 0): "
              "their numbers include compile time")
    if args.out is not None:
        print(f"appended {len(rows)} rows to {args.out}")
    return 0
