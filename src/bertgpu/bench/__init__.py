"""Benchmarks, each in its own module (only the chosen one is imported):

    bertgpu bench model   [options]   # our BERT / ModernBERT vs transformers' (eager and
                                      # compiled), tokens/s, MFU, memory
    bertgpu bench scaling [options]   # the same short training at 1..N workers, aggregation 1 vs k
    bertgpu bench quality [options]   # recipes under one budget: held-out loss, fine-tuning vs
                                      # random init
    bertgpu bench finetune-scaling [options]   # fine-tuning: workers x aggregation x optimizer,
                                               # speedup, efficiency, dev metric, time to target

Results are printed as a table and appended to a JSONL file so runs accumulate.
"""

from __future__ import annotations

import argparse
import importlib

SUITES = {
    "model": ("bertgpu.bench.model",
              "forward/backward/optimizer time, tokens/s, MFU, peak memory vs transformers"),
    "scaling": ("bertgpu.bench.scaling",
                "tokens/s and scaling efficiency at 1..N workers, aggregation 1 vs k"),
    "quality": ("bertgpu.bench.quality",
                "held-out MLM loss and fine-tuned scores per recipe under one budget, vs a "
                "random-init twin"),
    "finetune-scaling": ("bertgpu.bench.finetune_scaling",
                         "fine-tuning at 1..N workers x aggregation x optimizer: train/load/eval "
                         "time, speedup, efficiency, dev metric, time to target"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("suite", choices=sorted(SUITES),
                        help="; ".join(f"{k}: {v[1]}" for k, v in SUITES.items()))
    parser.add_argument("suite_args", nargs=argparse.REMAINDER,
                        help="the suite's own options (bertgpu bench SUITE --help)")


def main(args: argparse.Namespace) -> int:
    module_name, text = SUITES[args.suite]
    module = importlib.import_module(module_name)
    from bertgpu.cli import OneLineParser

    parser = OneLineParser(prog=f"bertgpu bench {args.suite}", description=text)
    module.add_arguments(parser)
    return int(module.main(parser.parse_args(args.suite_args)) or 0)
