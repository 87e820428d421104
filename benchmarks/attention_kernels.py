"""Attention kernels side by side on one GPU: forward + backward time of the flash varlen call
the models make (models/flash.py) against torch's SDPA backends and cuDNN's varlen kernel, at
BERT's and ModernBERT's shapes, with attention dropout as training runs it.

    PYTHONPATH=src python3 benchmarks/attention_kernels.py              # CUDA
    PYTHONPATH=src python3 benchmarks/attention_kernels.py --smoke      # CPU: the script runs

Rows (each on the same q, k, v, from one fused (B, T, 3, N, D) projection output, bf16):

- `ours (segments)`: `flash.padded_flash`, what a padded or full batch runs on CUDA (each row's
  padding tail a sequence of its own: 2B + 1 offsets);
- `flash varlen (B rows)`: the same kernel over the B rows alone, no empty tail sequences;
- `cudnn varlen (segments)`, `cudnn varlen (B rows)`: cuDNN's packed-rows kernel
  (`aten._cudnn_attention_forward` / `_cudnn_attention_backward` with cum_seq offsets, the call
  nested-tensor SDPA and `varlen_attn` make for their cuDNN backend) over the same 2B + 1 and
  B + 1 offsets. Its ragged offsets assume dense (tokens, N, D) rows, so q, k, v are made
  contiguous first (flash takes the strided views of the fused projection): those three copies
  are in its time, as a model would pay them. No sliding window: skipped at ModernBERT's point;
- `sdpa flash`, `sdpa cudnn`, `sdpa efficient`: `F.scaled_dot_product_attention` pinned to one
  backend (B, N, T, D);
- at ModernBERT's point also the sliding window (64 each side) through the flash kernel.

A backend that refuses the inputs (dropout, layout, head size) prints why instead of a time.
Times are the median of --iters timed forward + backward calls after --warmup, from CUDA events.

The cuDNN rows also say whether the call is right: their last column is the max |difference| of
the output and of dq, dk, dv from `flash varlen (B rows)` on the same q, k, v and grad_out, with
dropout 0 (the rows are full, so the segments' empty tails change nothing), each followed by the
largest |value| of flash's tensor: bf16 rounding alone leaves about 1% of that, a wrong call
(wrong rows, scale or offsets) the order of the value itself, or nan.

The cuDNN rows run in a child process per shape: until pytorch/pytorch#186142 (June 2026) torch's
cuDNN varlen backward took the longest sequence from query.size(2), the head size for packed
rows, and sized cuDNN's dQ accumulator by it (an illegal memory access, the PR reports, which
poisons the process's CUDA context). A crash so costs the cuDNN rows of its shape only (they
print how the child ended), not the rest of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDNN_ROWS = ("cudnn varlen (segments)", "cudnn varlen (B rows)")
CHILD_TIMEOUT_S = 60
"""A cuDNN child that takes longer (normally 5-10 s: torch's import, cuDNN's graph builds) is
killed and its rows say so."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--cudnn-point", default=None, help=argparse.SUPPRESS)  # B,T,N,D: child
    args = parser.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    timed = timer(cuda, args.warmup, args.iters)
    if args.cudnn_point:  # the child process of `cudnn_rows`: one JSON line per row
        B, T, N, D = (int(x) for x in args.cudnn_point.split(","))
        for name, ms, check in cudnn_point(B, T, N, D, args.dropout, device, dtype, timed):
            print(json.dumps(dict(name=name, ms=ms, check=check)), flush=True)
        return 0
    points = ([(2, 16, 2, 8, None)] if not cuda else
              [(256, 128, 12, 64, None), (32, 512, 12, 64, None), (32, 1024, 12, 64, None),
               (32, 1024, 12, 64, 64)])

    print(f"# attention forward + backward, {torch.cuda.get_device_name() if cuda else 'cpu'}, "
          f"torch {torch.__version__}, {dtype}, dropout {args.dropout}\n")
    print("| B x T, N x D | window | kernel | ms | TFLOP/s | max abs diff to flash varlen "
          "(B rows), dropout 0 |")
    print("|---|---|---|---|---|---|")
    for B, T, N, D, window in points:
        rows = [(name, ms, "") for name, ms in point(B, T, N, D, window, args.dropout, device,
                                                      dtype, timed)]
        rows[2:2] = cudnn_rows(B, T, N, D, window, args)
        flops = attention_flops(B, T, N, D, window)
        for name, ms, check in rows:
            label = f"{B} x {T}, {N} x {D}"
            rate = f"{flops / ms / 1e9:.0f}" if isinstance(ms, float) else ""
            shown = f"{ms:.3f}" if isinstance(ms, float) else ms
            print(f"| {label} | {window or '-'} | {name} | {shown} | {rate} | {check} |",
                  flush=True)
        if cuda:
            torch.cuda.empty_cache()
    return 0


def timer(cuda: bool, warmup: int, iters: int):
    """fn -> median ms of `iters` calls after `warmup` ones (CUDA events on CUDA)."""
    import torch

    def timed(fn) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(iters):
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

    return timed


def attention_flops(B, T, N, D, window) -> float:
    """FLOPs of one attention forward + backward: forward 2 matmuls, backward 5."""
    span = T if window is None else min(T, 2 * window + 1)
    return 4 * B * N * T * span * D * 3.5


def point(B, T, N, D, window, dropout_p, device, dtype, timed):
    """(kernel, median ms or why it refused) for each kernel at one shape."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bertgpu.models import flash

    qkv = torch.randn(B, T, 3, N, D, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, T, N, D, device=device, dtype=dtype)

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
            results.append((name, timed(fn)))
        except Exception as exc:  # noqa: BLE001 - a refusing backend is a result here
            msg = " ".join(str(exc).split())[:120]
            results.append((name, f"refused: {type(exc).__name__}: {msg}"))
        qkv.grad = None
    return results


def cudnn_rows(B, T, N, D, window, args) -> list[tuple[str, float | str, str]]:
    """The cuDNN varlen rows at one shape, (kernel, median ms or why not, check), measured by
    `cudnn_point` in a child process of this script: a crash there (an illegal memory access
    poisons the process's CUDA context) ends the child, not this table."""
    if window is not None:
        return [(name, "skipped: cuDNN's varlen call has no sliding window", "")
                for name in CUDNN_ROWS]
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cudnn-point", f"{B},{T},{N},{D}",
           "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--dropout", str(args.dropout), *(["--smoke"] if args.smoke else [])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
        ended = f"exited {rc}" if rc >= 0 else f"killed by signal {-rc}"
    except subprocess.TimeoutExpired as exc:
        stdout, stderr = (s.decode(errors="replace") if isinstance(s, bytes) else s or ""
                          for s in (exc.stdout, exc.stderr))
        ended = f"timed out after {CHILD_TIMEOUT_S} s"
    found = {}
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("name") in CUDNN_ROWS:
            found[row["name"]] = (row["name"], row["ms"], row["check"])
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    why = f"failed: the cuDNN child process {ended}" + (f": {last[:160]}" if last else "")
    return [found.get(name, (name, why, "")) for name in CUDNN_ROWS]


def first_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message (cuDNN's and torch's checks put
    the reason there and a C++ trace after it)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:160] if lines else ''}"


def cudnn_varlen():
    """`apply(q, k, v, cu_seqlens, max_len, dropout_p) -> out`: cuDNN's varlen attention over
    packed rows, q, k, v and out (R, N, D) dense, `cu_seqlens` (S + 1,) int32, forward by
    `aten._cudnn_attention_forward` and backward by `aten._cudnn_attention_backward` with the
    forward's logsumexp and philox seed and offset, in the op's schema order as torch's own
    callers pass them (nested-tensor SDPA, the forward op's autograd formula; not `varlen_attn`'s
    disabled cuDNN branch, which passes flash's order). The scale is left to the op: 1 / sqrt(D),
    as the flash call's."""
    import torch

    class CudnnVarlen(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu, max_len, dropout_p):
            # (output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
            #  philox_offset, debug_attn_mask)
            out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._cudnn_attention_forward(
                q, k, v, None, cu, cu, max_len, max_len, True, float(dropout_p), False, False,
                scale=None)
            ctx.save_for_backward(q, k, v, out, lse, seed, offset, cu)
            ctx.max_len, ctx.dropout_p = max_len, float(dropout_p)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse, seed, offset, cu = ctx.saved_tensors
            dq, dk, dv = torch.ops.aten._cudnn_attention_backward(
                grad_out.contiguous(), q, k, v, out, lse, seed, offset, None, cu, cu,
                ctx.max_len, ctx.max_len, ctx.dropout_p, False, scale=None)
            return dq, dk, dv, None, None, None

    return CudnnVarlen.apply


def cudnn_point(B, T, N, D, dropout_p, device, dtype, timed):
    """(kernel, median ms or why it refused, check) for the cuDNN varlen rows at one shape,
    timed as `flash varlen (B rows)` is (the same fused qkv leaf, grad and backward); the check
    is the max |difference| from the flash call at dropout 0."""
    import torch

    from bertgpu.models import flash

    if device.type != "cuda":
        return [(name, "refused: needs CUDA (cuDNN attention has no CPU kernel)", "")
                for name in CUDNN_ROWS]
    qkv = torch.randn(B, T, 3, N, D, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn(B, T, N, D, device=device, dtype=dtype)
    offsets = {CUDNN_ROWS[0]: flash.segments(None, B, T, device),
               CUDNN_ROWS[1]: torch.arange(B + 1, device=device, dtype=torch.int32) * T}
    attend = cudnn_varlen()

    def run(cu):
        def fn():
            q, k, v = (t.flatten(0, 1).contiguous() for t in qkv.unbind(2))
            out = attend(q, k, v, cu, T, dropout_p)
            out.reshape(B, T, N, D).backward(grad)
        return fn

    times = {}
    for name, cu in offsets.items():
        try:
            times[name] = timed(run(cu))
        except (RuntimeError, NotImplementedError) as exc:
            times[name] = f"refused: {first_line(exc)}"
        qkv.grad = None

    checks = {}
    try:
        q, k, v = (t.detach().flatten(0, 1).contiguous().requires_grad_()
                   for t in qkv.unbind(2))
        g = grad.flatten(0, 1)
        ref = flash.flash_varlen(q, k, v, offsets[CUDNN_ROWS[1]], T, 0.0)
        ref = (ref, *torch.autograd.grad(ref, (q, k, v), g))
    except (RuntimeError, NotImplementedError) as exc:
        ref = f"no flash reference: {first_line(exc)}"
    for name, cu in offsets.items():
        if isinstance(ref, str):
            checks[name] = ref
            continue
        try:
            out = attend(q, k, v, cu, T, 0.0)
            got = (out, *torch.autograd.grad(out, (q, k, v), g))
            checks[name] = " ".join(
                f"{what} {(a.float() - b.float()).abs().max().item():.1e} "
                f"(of {b.float().abs().max().item():.1e})"
                for what, a, b in zip(("out", "dq", "dk", "dv"), got, ref, strict=True))
        except (RuntimeError, NotImplementedError) as exc:
            checks[name] = f"check failed: {first_line(exc)}"
    return [(name, times[name], checks[name]) for name in CUDNN_ROWS]


if __name__ == "__main__":
    sys.exit(main())
