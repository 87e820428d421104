"""Compiled dropout, side by side: BERT's residual sublayer (dropout of a projection's output,
plus the residual, LayerNorm) forward + backward with the mask drawn in bulk (`random_bits16`,
what a compiled model runs on CUDA) against inductor's own in-kernel random numbers.

    PYTHONPATH=src python3 benchmarks/dropout_kernels.py            # CUDA, BERT-base 256 x 128
    PYTHONPATH=src python3 benchmarks/dropout_kernels.py --smoke    # CPU: the script runs

Both variants compile the same function; the in-kernel one calls `F.dropout`, the bulk one
`models.dropout.bits_dropout`. Times are the median of --iters calls of --repeat sublayers (a
BERT-base step has 25 dropout sites) after --warmup, from CUDA events; the dropped fraction of
each is printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--rows", type=int, default=256 * 128)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--p", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=12)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from bertgpu.models.dropout import bits_dropout

    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    rows, hidden = (64, 32) if args.smoke else (args.rows, args.hidden)
    p = args.p

    def sublayers(drop):
        def run(h, residual, weight, bias):
            x = residual
            for _ in range(args.repeat):
                x = F.layer_norm(drop(h) + x, (hidden,), weight, bias).to(dtype)
            return x
        return run

    drops = {"in-kernel (F.dropout)": lambda t: F.dropout(t, p, training=True),
             "bulk bits (random_bits16)": lambda t: bits_dropout(t, p)}
    variants = {name: sublayers(drop) for name, drop in drops.items()}
    h = torch.randn(rows, hidden, device=device, dtype=dtype, requires_grad=True)
    residual = torch.randn(rows, hidden, device=device, dtype=dtype, requires_grad=True)
    weight = torch.ones(hidden, device=device, requires_grad=True)
    bias = torch.zeros(hidden, device=device, requires_grad=True)
    grad = torch.randn(rows, hidden, device=device, dtype=dtype)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    print(f"# compiled dropout + residual + LayerNorm, {rows} x {hidden}, p {p}, x{args.repeat}, "
          f"{torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__}\n")
    print("| variant | compile s | ms (fwd + bwd) | dropped |")
    print("|---|---|---|---|")
    for name, fn in variants.items():
        compiled = torch.compile(fn)
        t0 = time.perf_counter()
        compiled(h, residual, weight, bias).backward(grad)
        sync()
        compile_s = time.perf_counter() - t0
        for _ in range(args.warmup):
            compiled(h, residual, weight, bias).backward(grad)
        times = []
        for _ in range(args.iters):
            sync()
            t0 = time.perf_counter()
            compiled(h, residual, weight, bias).backward(grad)
            sync()
            times.append((time.perf_counter() - t0) * 1e3)
        probe = torch.ones(rows, hidden, device=device, dtype=dtype)
        draw = drops[name]
        dropped = float((torch.compile(lambda t, d=draw: d(t))(probe) == 0).float().mean())
        print(f"| {name} | {compile_s:.1f} | {statistics.median(times):.3f} | {dropped:.4f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
