"""Quality per unit of compute: what a recipe turns a budget into, measured the same way for each.

    bertgpu bench quality                          # CPU: tiny vs modern-tiny, Wikipedia sample
    bertgpu bench quality --recipe configs/bert-base.toml --recipe configs/modern-base.toml \\
        --corpus corpus/*.jsonl --budget-minutes 120 --glue glue_data --seeds 1 2 3 \\
        --out bench_out/q
    bertgpu bench quality --tokens 20000000 ...    # a token budget instead of wall-clock
    bertgpu bench quality --project                # the GPU projection of modern-budget-24h only

1. One WordPiece tokenizer and one shard set (`--corpus`, default the Wikipedia sample in gensim's
   test data), shared by every recipe, so the held-out sequences are the same; or `--data DIR`.
2. Each `--recipe` pretrains from scratch under the same budget: `--budget-minutes` of wall-clock
   (`train.budget_hours`: the schedule follows elapsed time, the run stops at the budget) or
   `--tokens` (as many steps as that many tokens take). Evaluation time counts in the budget.
3. Held-out MLM loss and accuracy masked at 15% (`data.eval_mask_rate`) on the whole validation
   split with the same seed, so the same sequences and masks for every recipe, whatever its
   training mask rate; read from the runs' eval records (metrics.jsonl), with the curve.
4. Fine-tuning of each run's export and of its randomly initialised twin (same architecture,
   fresh weights: the floor) on labelled sets: the demo's polarity and Lee similarity sets
   (`tasks/demo_sets.py`), or a GLUE folder (`--glue DIR`), once per `--seeds`; the median,
   min-max and spread over seeds, read from each run's results.json (bench/downstream.py: a seed
   finished before from the same export's weights and settings is kept).

A stop signal (SIGTERM, Ctrl-C) during a fine-tuning run ends the command with one line naming
the run, its step and folder, exit status 143 (130 for SIGINT), and no output written; the same
command goes on from there (the pretraining runs are measured again).

Writes OUT/quality.jsonl (appended, rows described in report/quality.py), OUT/quality.md (this
run's tables) and OUT/quality.png (validation loss against wall-clock and tokens per recipe);
`bertgpu report OUT/quality.jsonl` renders the same. The runs stay under OUT/runs and OUT/finetune.

`--project` computes tokens per second and per budget for a GPU recipe from FLOPs per token
(telemetry/flops.py), the GPU's peak and an assumed MFU, beside published token counts (`project`).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bertgpu.bench import cells
from bertgpu.bench.downstream import (
    RunStopped,
    compare_downstream,
    quiet,
    read_score,
    set_overrides,
    spread_row,
    stopped,
)
from bertgpu.config.sections import seed_number
from bertgpu.errors import BertgpuError

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_RECIPES = ("configs/tiny.toml", "configs/modern-tiny.toml")
DEMO_SETS = ("polarity", "lee")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", action="append",
                        help="TOML recipe (repeat; default: configs/tiny.toml and "
                             "configs/modern-tiny.toml)")
    parser.add_argument("--corpus", action="append",
                        help="corpus file or folder (repeat; default: the Wikipedia sample in "
                             "gensim's test data)")
    parser.add_argument("--data",
                        help="an existing shard set (skips the tokenizer and prepare steps)")
    parser.add_argument("--vocab-size", type=cells.positive(int), default=None,
                        help="WordPiece vocabulary (default: the smallest model.vocab_size "
                             "of the recipes)")
    parser.add_argument("--seq-len", type=int, default=128,
                        help="tokens per sequence of the shard set (default: 128)")
    parser.add_argument("--validation-fraction", type=cells.open_fraction, default=0.05,
                        help="share of the corpus held out for the held-out loss (default: 0.05)")
    parser.add_argument("--budget-minutes", type=cells.positive(float), default=3.0,
                        help="wall-clock budget per recipe (default: 3)")
    parser.add_argument("--tokens", type=cells.positive(int), default=None,
                        help="token budget per recipe instead of minutes")
    parser.add_argument("--eval-every", type=cells.positive(int), default=None,
                        help="evaluate every N steps: points of the curve (default: the recipe's)")
    parser.add_argument("--seeds", type=seed_number, nargs="+", default=[0, 1, 2],
                        help="fine-tuning seeds (default: 0 1 2)")
    parser.add_argument("--sets", nargs="+", default=list(DEMO_SETS), choices=DEMO_SETS,
                        help="the demo's labelled sets to fine-tune on, without --glue "
                             "(default: polarity lee)")
    parser.add_argument("--glue",
                        help="GLUE folder: fine-tune on its tasks instead of the demo's sets")
    parser.add_argument("--glue-tasks", nargs="+", help="GLUE tasks (default: all nine)")
    parser.add_argument("--ft", action="append", default=[], metavar="KEY=VALUE",
                        help="fine-tuning override for every run, e.g. --ft lr=1e-4 (repeatable)")
    parser.add_argument("--set", dest="sets_", action="append", default=[], metavar="KEY=VALUE",
                        help="pretraining override for every recipe, e.g. --set "
                             "train.precision=bf16")
    parser.add_argument("--skip-finetune", action="store_true",
                        help="pretraining and held-out loss only")
    parser.add_argument("--pretrain-seed", type=seed_number, default=0,
                        help="seed of every recipe: initialisation, data order, masks (default: 0)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    parser.add_argument("--threads", type=cells.positive(int), default=None,
                        help="CPU threads of every run (default: torch's; 1 is steadier on a "
                             "shared machine)")
    parser.add_argument("--out", default="bench_out/quality",
                        help="results folder (default: bench_out/quality)")
    parser.add_argument("--project", action="store_true",
                        help="print the GPU projection and exit (its rows are appended to "
                             "OUT/quality.jsonl and its table written to OUT/projection.md; a "
                             "measured run's quality.md and plot are left as they are)")
    parser.add_argument("--project-recipe", default="configs/modern-budget-24h.toml",
                        help="recipe of the projection (default: "
                             "configs/modern-budget-24h.toml)")
    parser.add_argument("--gpu", default="H100 SXM",
                        help="GPU of the projection, a telemetry/flops.py PEAK_TFLOPS key "
                             "(default: H100 SXM)")
    parser.add_argument("--mfu", type=cells.positive(), default=0.40,
                        help="assumed model FLOPs utilisation (default: 0.4)")
    parser.add_argument("--hours", type=cells.positive(), default=24.0,
                        help="budget of the projection, hours (default: 24)")


def _kv(items: list[str], flag: str) -> list[str]:
    for item in items:
        if "=" not in item:
            raise BertgpuError(f"{flag} {item!r}: expected KEY=VALUE")
    return ["--" + item for item in items]


def resolve_recipe(path: str) -> Path:
    """A recipe path as given, or relative to the source tree (configs/... from anywhere)."""
    for candidate in (Path(path), ROOT / path):
        if candidate.is_file():
            return candidate
    raise BertgpuError(f"{path}: recipe not found (expected a TOML file)")


def _names(recipes: list[Path]) -> list[str]:
    stems = [r.stem for r in recipes]
    return [s if stems.count(s) == 1 else f"{s}-{i + 1}" for i, s in enumerate(stems)]


# --------------------------------------------------------------------------------------------
# 1-3: shared data, pretraining under one budget, held-out loss


def shared_data(args: argparse.Namespace, out: Path, vocab_size: int) -> Path:
    """The tokenizer and shard set every recipe trains on (rebuilt each run:
    the corpus may differ)."""
    if args.data:
        return Path(args.data)
    from bertgpu.data.corpus import WIKI_SAMPLE, gensim_test_data
    from bertgpu.data.prepare import prepare
    from bertgpu.data.tokenizer import train_tokenizer

    corpus = [Path(c) for c in args.corpus] if args.corpus else [gensim_test_data(WIKI_SAMPLE)]
    tok, data = out / "tokenizer", out / "data"
    for folder in (tok, data):
        shutil.rmtree(folder, ignore_errors=True)
    print(f"bench quality: tokenizer ({vocab_size:,} WordPieces) and shards ({args.seq_len} "
          f"tokens) from {', '.join(c.name for c in corpus)}", flush=True)
    train_tokenizer(corpus, tok, vocab_size=vocab_size)
    prepare(corpus, tok, data, seq_len=args.seq_len, objective="mlm",
            validation_fraction=args.validation_fraction)
    return data


def pretrain_overrides(args: argparse.Namespace, data_dir: Path, run_dir: Path, cfg: Any,
                       seq_len: int) -> list[str]:
    """What every recipe gets: the shared data, the budget, one log line per step (the curve's
    tokens), the whole validation split at 15% with the same seed, no intermediate checkpoints."""
    words = [f"--data={data_dir}", f"--out={run_dir}", f"--seed={args.pretrain_seed}",
             "--train.log_every_steps=1", "--train.eval_sequences=0", "--data.eval_mask_rate=0.15",
             "--checkpoint.every_steps=0", "--checkpoint.every_minutes=none",
             "--checkpoint.keep_last=1", f"--impl.device={args.device}"]
    if args.tokens:
        steps = math.ceil(args.tokens / (cfg.train.global_batch_size * seq_len))
        words += [f"--train.max_steps={steps}", "--train.budget_hours=none"]
    else:
        words += [f"--train.budget_hours={args.budget_minutes / 60.0!r}", "--train.max_steps=0"]
    if args.eval_every:
        words.append(f"--train.eval_every_steps={args.eval_every}")
    return [*words, *_kv(args.sets_, "--set")]


def read_run(run_dir: Path) -> dict[str, Any]:
    """The numbers of one pretraining run, from its metrics.jsonl and its export's config.json."""
    from bertgpu.models.build import architecture_of, build_model
    from bertgpu.models.hf_io import read_config
    from bertgpu.models.shared import num_parameters
    from bertgpu.telemetry.records import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl", drop_superseded=True)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("val_mlm_loss") is not None]
    if not train or not evals:
        raise BertgpuError(f"{run_dir / 'metrics.jsonl'}: no train or eval records; did "
                           "the run fail?")
    tokens = {r["step"]: r.get("tokens_seen") for r in train}
    curve = [{"step": e["step"], "elapsed_s": e["elapsed_s"], "tokens_seen": tokens.get(e["step"]),
              "val_mlm_loss": e["val_mlm_loss"], "val_mlm_acc": e.get("val_mlm_acc")}
             for e in evals]
    fields = read_config(run_dir / "hf")
    return {"architecture": architecture_of(fields),
            "params": num_parameters(build_model(fields, "masked_lm")),
            "steps": train[-1]["step"], "tokens_seen": train[-1].get("tokens_seen"),
            "wall_s": train[-1]["elapsed_s"], "val_mlm_loss": evals[-1]["val_mlm_loss"],
            "val_mlm_acc": evals[-1].get("val_mlm_acc"), "curve": curve}


def pretrain_all(args: argparse.Namespace, recipes: list[Path], names: list[str], cfgs: list[Any],
                 data_dir: Path, out: Path, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Pretrain every recipe (`cfgs`: each loaded with the --set overrides) under the budget."""
    from bertgpu import pretrain
    from bertgpu.config import schema
    from bertgpu.data.shards import ShardSet

    seq_len = ShardSet(data_dir, "train").seq_len
    val = ShardSet(data_dir, "validation")
    rows = []
    for recipe, name, given in zip(recipes, names, cfgs, strict=True):
        run_dir = out / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)  # a leftover run would be resumed, not measured
        cfg = schema.load_config(recipe,
                                 pretrain_overrides(args, data_dir, run_dir, given, seq_len))
        log = out / "runs" / f"{name}.log"
        print(f"bench quality: pretraining {name} ({recipe}, {base['budget']}); console in {log}",
              flush=True)
        with quiet(log):
            pretrain.run(cfg)
        row = {**base, "kind": "pretrain", "name": name, "recipe": str(recipe),
               "run_dir": str(run_dir), "eval_mask_rate": cfg.data.eval_mask_rate,
               "val_sequences": len(val), **read_run(run_dir)}
        print(f"bench quality: {name}: {row['steps']} steps, {row['tokens_seen']:,} tokens, val "
              f"MLM loss {row['val_mlm_loss']:.3f} (accuracy {row['val_mlm_acc']:.1%})", flush=True)
        rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# 4: fine-tuning, pretrained vs random init, over seeds (the demo's sets: bench/downstream.py)


def compare_glue(inits: dict[str, Path], glue_dir: str, tasks: list[str] | None, seeds: list[int],
                 out: Path, extra: list[str]) -> list[dict[str, Any]]:
    """As `compare_downstream` on a GLUE folder through `bertgpu glue` (its lr and epochs by model
    size unless --ft sets them); each task's score per seed from its results.json."""
    from bertgpu import glue

    rows = []
    for name, hf in inits.items():
        for label, init, config_from in (("pretrained", hf, None), ("random", "random", hf)):
            folder = out / name / label / "glue"
            shutil.rmtree(folder, ignore_errors=True)
            with quiet(folder.with_suffix(".log")):
                summary = glue.run(glue_dir, init, folder, tasks=tasks, seeds=seeds,
                                   overrides=extra, config_from=config_from,
                                   skip_missing=tasks is None)
            # glue.run does not say which task and seed stopped: its folder is named
            stopped(summary, f"{name}/{label}/glue", folder,
                    "the GLUE runs of bench quality start over (their folder is cleared)")
            for task in summary["tasks"]:
                read = [read_score(folder / task / f"seed_{s}") for s in seeds]
                scores = [s for s, _ in read]
                rows.append({"kind": "finetune", "name": name, "init": label, "task": task,
                             "scored_like": task, "metric": read[0][1], "seeds": list(seeds),
                             "scores": scores, **spread_row(scores),
                             "dirs": [str(folder / task / f"seed_{s}") for s in seeds]})
    return rows


# --------------------------------------------------------------------------------------------
# GPU projection

# Published pretraining token counts to set a projection beside.
PUBLISHED_TOKENS = (
    ("BERT-base", "16 TPU chips x 4 days", 256 * (900_000 * 128 + 100_000 * 512),
     "Devlin et al. 2019: 1M steps of 256 sequences, 90% at 128 tokens and 10% at 512 (the paper's "
     "'128,000 tokens per batch' counts every step at 512: 128B)"),
    ("ModernBERT-base", "8 H100 GPUs", 2.0e12, "Warner et al. 2024: trained on 2 trillion tokens"),
)
# Cramming publishes its budget (24 h on one RTX A6000), not a token count: we compute one the
# same way as ours, for its final shape (arch bert-c5: 16 layers x 768, a GELU-GLU FFN of
# 768 -> 3072 -> halves -> 1536 -> 768, i.e. the weights of a plain 768 -> 2304 -> 768 FFN;
# vocabulary 32768, 128 tokens, 15% masked: train bert-o3).
CRAMMING_SHAPE = {"hidden_size": 768, "num_hidden_layers": 16, "num_attention_heads": 12,
                  "intermediate_size": 2304, "vocab_size": 32768}


def project(recipe: Path, gpu: str, mfu: float, hours: float,
            seq_len: int = 128) -> list[dict[str, Any]]:
    """Tokens a recipe would see in `hours` on one `gpu` at `mfu`: tokens/s = mfu x peak (bf16)
    / training FLOPs per token (telemetry/flops.py, the MLM head at the recipe's mask rate); and the
    rows to compare it with (published counts, Cramming computed the same way on its GPU)."""
    from bertgpu.config import overrides, schema
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.build import model_config
    from bertgpu.telemetry import flops

    if not 0 < mfu <= 1:
        raise BertgpuError(f"--mfu {mfu}: expected a fraction in (0, 1]")
    if gpu not in flops.PEAK_TFLOPS or "bf16" not in flops.PEAK_TFLOPS[gpu]:
        raise BertgpuError(f"--gpu {gpu!r}: expected one of "
                           f"{', '.join(k for k, v in flops.PEAK_TFLOPS.items() if 'bf16' in v)}")
    cfg = schema.load_config(recipe)

    def row(model: str, shape: Any, mask_rate: float, on: str, h: float) -> dict[str, Any]:
        fpt = flops.flops_per_token_from_config(shape, seq_len, mlm_fraction=mask_rate,
                                                with_nsp=False)
        per_s = mfu * flops.PEAK_TFLOPS[on]["bf16"] * 1e12 / fpt
        return {"kind": "projection", "model": model, "hardware": f"1 {on}, {h:g} h",
                "tokens": per_s * h * 3600, "tokens_per_s": per_s, "flops_per_token": fpt,
                "mfu": mfu, "seq_len": seq_len,
                "source": f"computed: {mfu:.0%} MFU x {flops.PEAK_TFLOPS[on]['bf16']:g} TFLOP/s "
                          f"(bf16 peak) / {fpt / 1e9:.3g} GFLOP per token (telemetry/flops.py)"}

    rows = [row(f"{recipe.stem} (ours)", model_config(overrides.config_to_dict(cfg.model)),
                cfg.data.mask_rate, gpu, hours),
            row("Cramming (crammed BERT)", BertConfig.from_dict(CRAMMING_SHAPE), 0.15,
                "RTX A6000", 24.0)]
    rows[-1]["source"] += "; Cramming publishes the budget (24 h, one RTX A6000), not a token count"
    rows += [{"kind": "projection", "model": m, "hardware": hw, "tokens": n,
              "source": f"published: {s}"}
             for m, hw, n, s in PUBLISHED_TOKENS]
    return rows


# --------------------------------------------------------------------------------------------
# Output


def write_outputs(rows: list[dict[str, Any]], out: Path, command: str,
                  projection: bool = False) -> str:
    """Append the rows to quality.jsonl, write quality.md and quality.png; returns the markdown.
    A `projection` (`--project`: no measurement, no curve) writes projection.md instead: it
    replaced the measured run's quality.md beside that run's plot."""
    from bertgpu.report.quality import curve_plot, quality_blocks
    from bertgpu.report.render import render_markdown

    cells.mark_bench_folder(out, "quality")
    cells.append_jsonl(out / "quality.jsonl", rows)
    md = (f"# bertgpu bench quality\n\n`{command}`\n\n"
          + render_markdown(quality_blocks(rows, None, "quality")))
    if projection:
        cells.write_atomic(out / "projection.md", md)
        return md
    cells.write_atomic(out / "quality.md", md)
    with contextlib.suppress(ImportError):  # matplotlib is the report extra
        png = curve_plot(rows, out, "quality.tmp.png")
        if png:
            os.replace(out / png, out / "quality.png")
    return md


def main(args: argparse.Namespace) -> int:
    from bertgpu.config import schema

    out = Path(args.out)
    cells.check_bench_folder(out, "quality",
                             ["quality.jsonl", "quality.md", "quality.png", "projection.md"])
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    command = "bertgpu " + " ".join(sys.argv[1:])
    if args.project:
        rows = [{"bench": "quality", "run_id": stamp, **r}
                for r in project(resolve_recipe(args.project_recipe), args.gpu, args.mfu,
                                 args.hours, args.seq_len)]
        print(write_outputs(rows, out, command.strip(), projection=True))
        return 0
    if not args.seeds or len(set(args.seeds)) != len(args.seeds):
        raise BertgpuError(f"--seeds {' '.join(map(str, args.seeds))}: expected distinct seeds")
    recipes = [resolve_recipe(r) for r in (args.recipe or DEFAULT_RECIPES)]
    names = _names(recipes)
    # typos fail before any work
    cfgs = [schema.load_config(r, _kv(args.sets_, "--set")) for r in recipes]
    check_finetune_options(args)
    vocab = args.vocab_size or min(c.model.vocab_size for c in cfgs)
    budget = f"{args.tokens:,} tokens" if args.tokens else f"{args.budget_minutes:g} min wall-clock"
    corpus = "the Wikipedia sample (gensim test data)" if not (args.corpus or args.data) else \
        ", ".join(args.corpus or [args.data])
    import torch

    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        base = {"bench": "quality", "run_id": stamp, "budget": budget, "corpus": corpus,
                "device": _device(args.device), "threads": torch.get_num_threads()}
        rows = run_bench(args, recipes, names, cfgs, out, vocab, base)
    except RunStopped as e:  # not an error: the stopped run kept its checkpoint; no output
        sys.stderr.write(f"bertgpu bench quality: stopped by {e.signal_name} in {e}; run the "
                         f"same command again to go on: {e.again}\n")
        sys.stderr.flush()
        return e.status
    finally:
        torch.set_num_threads(threads)
    md = write_outputs(rows, out, command.strip())
    print(md)
    print(f"wrote {out / 'quality.jsonl'}, {out / 'quality.md'}, {out / 'quality.png'}")
    return 0


def check_finetune_options(args: argparse.Namespace) -> None:
    """run_bench uses --ft, --glue and --glue-tasks only after every recipe has pretrained for
    its whole budget: their mistakes fail here, before any work, as --set's do."""
    from bertgpu.config.finetune import load_finetune_config
    from bertgpu.glue import _find_tasks
    from bertgpu.tasks import glue as glue_tasks

    extra = _kv(args.ft, "--ft")
    for word in extra:
        if word.lstrip("-").split("=")[0].replace("-", "_") in ("seed", "train.seed"):
            raise BertgpuError(f"--ft {word[2:]}: the fine-tuning seeds are --seeds N [N ...]")
    for name in [None] if args.glue else args.sets:
        try:
            load_finetune_config(None, set_overrides(name, extra))
        except BertgpuError as e:
            raise BertgpuError(f"--ft: {e}") from None
    if args.glue_tasks and not args.glue:
        raise BertgpuError("--glue-tasks: only with --glue DIR (without it the demo's sets, "
                           "--sets, are fine-tuned on)")
    if args.glue and not Path(args.glue).is_dir():
        raise BertgpuError(f"--glue {args.glue}: not a folder (expected a GLUE folder: CoLA/, "
                           "SST-2/, ...)")
    if args.glue and args.glue_tasks:  # as compare_glue: the tasks named must all be there
        for task in map(glue_tasks.get_task, args.glue_tasks):
            for split in ("train", *task.dev_splits):
                glue_tasks.find_split_file(args.glue, task, split)
    elif args.glue:  # all nine, those there
        _find_tasks(args.glue, list(glue_tasks.TASKS.values()), skip_missing=True)


def run_bench(args: argparse.Namespace, recipes: list[Path], names: list[str], cfgs: list[Any],
              out: Path, vocab: int, base: dict[str, Any]) -> list[dict[str, Any]]:
    """Steps 1-4 of the module docstring; the rows of quality.jsonl."""
    cells.mark_bench_folder(out, "quality")  # (shared_data replaces its tokenizer/ and data/)
    data_dir = shared_data(args, out, vocab)
    rows = pretrain_all(args, recipes, names, cfgs, data_dir, out, base)
    if not args.skip_finetune:
        inits = {r["name"]: Path(r["run_dir"]) / "hf" for r in rows}
        extra = _kv(args.ft, "--ft")
        ft = (compare_glue(inits, args.glue, args.glue_tasks, args.seeds, out / "finetune", extra)
              if args.glue
              else compare_downstream(inits, args.sets, args.seeds, out / "finetune", extra))
        rows += [{**base, **r} for r in ft]
    return rows


def _device(device: str) -> str:
    import platform

    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"
