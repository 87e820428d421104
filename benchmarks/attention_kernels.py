"""Attention kernels side by side on one GPU: forward + backward time of the flash varlen call
the models make (models/flash.py) against torch's SDPA backends, at BERT's and ModernBERT's
shapes, with attention dropout as training runs it.

    PYTHONPATH=src python3 benchmarks/attention_kernels.py              # CUDA
    PYTHONPATH=src python3 benchmarks/attention_kernels.py --smoke      # CPU: the script runs

Rows (each on the same q, k, v, from one fused (B, T, 3, N, D) projection output, bf16):

- `ours (segments)`: `flash.padded_flash`, what a padded or full batch runs on CUDA (each row's
  padding tail a sequence of its own: 2B + 1 offsets);
- `flash varlen (B rows)`: the same kernel over the B rows alone, no empty tail sequences;
- `sdpa flash`, `sdpa cudnn`, `sdpa efficient`: `F.scaled_dot_product_attention` pinned to one
  backend (B, N, T, D);
- at ModernBERT's point also the sliding window (64 each side) through the flash kernel.

A backend that refuses the inputs (dropout, layout, head size) prints why instead of a time.
Times are the median of --iters timed forward + backward calls after --warmup, from CUDA events.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    points = ([(2, 16, 2, 8, None)] if not cuda else
              [(256, 128, 12, 64, None), (32, 512, 12, 64, None), (32, 1024, 12, 64, None),
               (32, 1024, 12, 64, 64)])

    def timed(fn) -> float:
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.iters):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    print(f"# attention forward + backward, {torch.cuda.get_device_name() if cuda else 'cpu'}, "
          f"torch {torch.__version__}, {dtype}, dropout {args.dropout}\n")
    print("| B x T, N x D | window | kernel | ms | TFLOP/s |")
    print("|---|---|---|---|---|")
    for B, T, N, D, window in points:
        for name, ms, flops in point(B, T, N, D, window, args.dropout, device, dtype, timed):
            label = f"{B} x {T}, {N} x {D}"
            rate = f"{flops / ms / 1e9:.0f}" if isinstance(ms, float) else ""
            shown = f"{ms:.3f}" if isinstance(ms, float) else ms
            print(f"| {label} | {window or '-'} | {name} | {shown} | {rate} |", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    return 0


def point(B, T, N, D, window, dropout_p, device, dtype, timed):
    """(kernel, median ms or why it refused, FLOPs) for each kernel at one shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bertgpu.models import flash

    qkv = torch.randn(B, T, 3, N, D, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, T, N, D, device=device, dtype=dtype)
    span = T if window is None else min(T, 2 * window + 1)
    flops = 4 * B * N * T * span * D * 3.5  # forward 2 matmuls, backward 5

    def run_ours():
        q, k, v = qkv.unbind(2)
        cu = flash.segments(None, B, T, device)
        out = flash.padded_flash(q, k, v, cu, dropout_p, window)
        out.view(B, T, N, D).backward(grad)

    def run_rows():
        q, k, v = (t.flatten(0, 1) for t in qkv.unbind(2))
        cu = torch.arange(B + 1, device=device, dtype=torch.int32) * T
        out = flash.flash_varlen(q, k, v, cu, T, dropout_p, window)
        out.view(B, T, N, D).backward(grad)

    def run_sdpa(backend):
        def run():
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (B, N, T, D)
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
            out.transpose(1, 2).backward(grad)
        return run

    rows = [("ours (segments)", run_ours), ("flash varlen (B rows)", run_rows)]
    if window is None:
        rows += [(f"sdpa {name}", run_sdpa(backend)) for name, backend in
                 (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                  ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH))]
    results = []
    for name, fn in rows:
        try:
            results.append((name, timed(fn), flops))
        except Exception as exc:  # noqa: BLE001 - a refusing backend is a result here
            msg = " ".join(str(exc).split())[:120]
            results.append((name, f"refused: {type(exc).__name__}: {msg}", flops))
        qkv.grad = None
    return results


if __name__ == "__main__":
    sys.exit(main())
