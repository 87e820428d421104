"""How many batch shapes a run's loader makes: the distinct MLM label counts and real-token counts
of its micro batches, what CUDA graphs (impl.compile_mode reduce-overhead) would record a graph
for each of, with and without the loader's static shapes. (The real-token count changes only the
shapes of padding-free batches, which runs under CUDA graphs do not use: they run padded.)

    PYTHONPATH=src python3 benchmarks/batch_shapes.py benchmarks/data/wiki-128 --micro-batch 256
    PYTHONPATH=src python3 benchmarks/batch_shapes.py benchmarks/data/wiki-1024 --micro-batch 32 \\
        --mask-rate 0.3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def shapes(data: Path, micro_batch: int, steps: int, mask_rate: float,
           static: bool) -> tuple[list[int], list[int]]:
    """(sorted distinct MLM-position lengths, sorted distinct real-token counts) over `steps`
    micro batches of the train split."""
    from bertgpu.data.loaders import PretrainLoader
    from bertgpu.data.masking import MaskingConfig
    from bertgpu.data.shards import ShardSet

    loader = PretrainLoader(ShardSet(data, "train"), MaskingConfig(mask_rate=mask_rate),
                            global_batch_size=micro_batch, micro_batch_size=micro_batch,
                            static_shapes=static)
    masked, tokens = set(), set()
    for _ in range(steps):
        (batch,) = loader.next_step()
        masked.add(batch["batch_meta"].masked.numel())
        tokens.add(int(batch["attention_mask"].sum()))
    loader.close()
    return sorted(masked), sorted(tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="a prepared shard set")
    parser.add_argument("--micro-batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--mask-rate", type=float, default=0.15)
    args = parser.parse_args(argv)
    print(f"{args.data}: {args.steps} micro batches of {args.micro_batch}, "
          f"mask rate {args.mask_rate}")
    for static in (False, True):
        masked, tokens = shapes(args.data, args.micro_batch, args.steps, args.mask_rate, static)
        print(f"  static_shapes {str(static):<5}  MLM positions: {len(masked)} lengths "
              f"({masked[0]}-{masked[-1]});  real tokens: {len(tokens)} counts "
              f"({tokens[0]}-{tokens[-1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
