"""Benchmarks, each in its own module:

    bertgpu bench model   [options]   # our BertForPreTraining vs transformers', tokens/s, MFU, memory
    bertgpu bench scaling [options]   # the same short training at 1..N workers, aggregation 1 vs k

Results are printed as a table and appended to a JSONL file so runs accumulate.
"""

from __future__ import annotations

import argparse
import importlib

SUITES = {
    "model": ("bertgpu.bench_model", "forward/backward/optimizer time, tokens/s, MFU, peak memory vs transformers"),
    "scaling": ("bertgpu.bench_scaling", "tokens/s and scaling efficiency at 1..N workers, aggregation 1 vs k"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="suite", required=True, metavar="SUITE")
    for name, (module_name, text) in SUITES.items():
        p = sub.add_parser(name, help=text, description=text)
        importlib.import_module(module_name).add_arguments(p)


def main(args: argparse.Namespace) -> int:
    return int(importlib.import_module(SUITES[args.suite][0]).main(args) or 0)
