"""Where the host waits for the GPU in steady training: a `bertgpu` command run in this process
with torch's CUDA sync debug mode on from step --from, each synchronising CUDA call counted
with the step it came in and the first frame of bertgpu's own code that made it.

    PYTHONPATH=src python3 benchmarks/step_syncs.py --from 10 -- pretrain configs/bert-base.toml \\
        --data benchmarks/data/wiki-128 --out /tmp/run-syncs --train.max_steps 40

The loop waits for the device only to evaluate, checkpoint, re-share the batch and end
(docs/ARCHITECTURE.md, "The engine"): every other step should count 0. A step is the time from
its `_train_step` to the next one's (its log record, evaluation and checkpoint included). On a
machine without CUDA torch reports nothing and the script says so; the CPU tests check the same
paths with a forced late read (tests/test_loop.py, tests/test_engine.py).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYNC_WARNING = "called a synchronizing CUDA operation"  # torch.cuda.set_sync_debug_mode("warn")


def first_own_frame(stack: list[traceback.FrameSummary], package: Path) -> str:
    """file:line of the innermost frame in the bertgpu package at `package` (not a checkout's
    .venv, whose path may hold "bertgpu" too), else of the innermost frame."""
    for frame in reversed(stack):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(package):
            return f"bertgpu/{path.relative_to(package).as_posix()}:{frame.lineno}"
    return f"{stack[-1].filename}:{stack[-1].lineno}" if stack else "?"


class SyncCounter:
    """Counts sync warnings by step (the one the loop is in) and by the code that made them."""

    def __init__(self, start: int, package: Path) -> None:
        self.start, self.package = start, package
        self.step = 0
        self.first: int | None = None  # the first step counted (a resumed run's may be later)
        self.by_step: collections.Counter[int] = collections.Counter()
        self.by_place: collections.Counter[str] = collections.Counter()

    def showwarning(self, message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if SYNC_WARNING not in str(message):
            print(warnings.formatwarning(message, category, filename, lineno, line),
                  file=sys.stderr, end="")
            return
        self.by_step[self.step] += 1
        self.by_place[first_own_frame(traceback.extract_stack()[:-1], self.package)] += 1

    def summary(self, last_step: int) -> list[str]:
        first = self.first if self.first is not None else self.start
        steps = range(first, last_step + 1)
        hit = [s for s in steps if self.by_step[s]]
        total = sum(self.by_step[s] for s in steps)
        which = f" (steps {', '.join(map(str, hit))})" if hit else ""
        lines = [f"step_syncs: steps {first}-{last_step}: {total} synchronising calls in "
                 f"{len(hit)} of {len(steps)} steps{which}"]
        lines += [f"  {n:5d}  {place}" for place, n in self.by_place.most_common(15)]
        return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="start", type=int, default=10,
                        help="count from this step on (after compiling; default 10)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the bertgpu command and its arguments, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the bertgpu command after --")

    import torch

    import bertgpu
    from bertgpu import cli
    from bertgpu.train import loop as loop_mod

    counter = SyncCounter(args.start, Path(bertgpu.__file__).resolve().parent)
    cuda = torch.cuda.is_available()
    train_step = loop_mod.Loop._train_step

    def counted_step(self, w, result):  # noqa: ANN001, ANN202
        counter.step = self.engine.step + 1
        if counter.first is None and counter.step >= args.start:  # a resumed run: its first
            counter.first = counter.step
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
        return train_step(self, w, result)

    loop_mod.Loop._train_step = counted_step
    # the CLI's own one-line warnings would take bertgpu's sync warnings before the counter
    as_lines, cli._warnings_as_lines = cli._warnings_as_lines, lambda prog: contextlib.nullcontext()
    previous = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = counter.showwarning
            rc = cli.main(command)
    finally:
        cli._warnings_as_lines = as_lines
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = previous
        loop_mod.Loop._train_step = train_step
    if not cuda:
        print("step_syncs: no CUDA device: torch reports no synchronising call to count")
    elif counter.first is None:
        print(f"step_syncs: the run ended at step {counter.step}, before --from {args.start}")
    else:
        print("\n".join(counter.summary(counter.step)))
    return rc


if __name__ == "__main__":
    sys.exit(main())
