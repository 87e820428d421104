"""Find the largest micro batch that fits on a device, and keep the global batch while using it.

`impl.micro_batch_size = "auto"` means: probe the device with real training steps (forward,
backward, optimizer step) at doubling micro batch sizes until one runs out of memory, binary
search between the last size that fit and the first that did not, then pick the largest divisor
of the per-device batch (global / world) not above it, so the optimizer still sees exactly
`global_batch_size` sequences per step and only the accumulation count changes::

    from bertgpu.train import autobatch
    found = autobatch.find_pretrain_micro_batch(bert_config, seq_len=128, device="cuda",
                                                dtype="bf16", max_batch=global_batch // world)
    micro, accumulation = autobatch.resolve_auto_batch(global_batch, world, found)

On CUDA the probe runs the run's own step: its precision (bf16/fp16 autocast, fp16's loss
scaler), its optimizer (LAMB's moments and temporaries included) and activation checkpointing. It
catches out-of-memory errors, including cuBLAS / cuDNN workspace allocation failures, which
surface as RuntimeErrors (`is_out_of_memory`), and counts a step whose peak allocation exceeds
`memory_limit_bytes` (by default 92% of the card: the real run also holds DDP buckets, the data
pipeline's pinned batches and allocator fragmentation) as not fitting; the peak statistics are
reset afterwards, so the run's memory metrics start clean. With several ranks every rank probes
and all agree on the smallest size; when a probe fails on any rank, every rank stops with the
same message instead of waiting in a collective. On the CPU an out-of-memory is the OS killing
the process, so nothing is probed: the size comes from `estimate_train_bytes` against a memory
limit (half the machine's RAM by default). Tests use the same search with a `fits(batch) -> bool`
callable that simulates a limit.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

from bertgpu.errors import BertgpuError

CUDA_MEMORY_FRACTION = 0.92  # of total device memory a probed step may peak at
# RuntimeError texts of allocation failures that are not torch.cuda.OutOfMemoryError: cuBLAS and
# cuDNN allocate their handles and workspaces outside the caching allocator.
OOM_MESSAGES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                "CUBLAS_STATUS_NOT_INITIALIZED")


def search_largest(fits: Callable[[int], bool], start: int = 1, max_batch: int = 4096) -> int:
    """Largest b in [1, max_batch] with fits(b), assuming fits is monotone (True up to some size).

    Doubles from `start` until a size fails or `max_batch` is reached, then binary searches the
    gap: about 2 log2(answer) probes. Raises BertgpuError when even 1 does not fit.
    """
    if max_batch < 1 or start < 1:
        raise BertgpuError(f"micro batch search: start {start} and max {max_batch} must be >= 1")
    b = min(start, max_batch)
    good, bad = 0, max_batch + 1
    while b <= max_batch:
        if fits(b):
            good = b
            if b == max_batch:
                return b
            b = min(2 * b, max_batch)
        else:
            bad = b
            break
    if good == 0:  # `start` itself failed: search below it
        lo, hi = 0, bad
    else:
        lo, hi = good, bad
    while hi - lo > 1:  # invariant: fits(lo) (or lo == 0), not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    if lo == 0:
        raise BertgpuError(
            "micro batch search: even a micro batch of 1 sequence does not fit in memory; expected "
            "a smaller model, a shorter seq_len, bf16, or activation checkpointing "
            "(train.grad_ckpt)")
    return lo


def estimate_train_bytes(config: Any, micro_batch: int, seq_len: int, dtype_bytes: int = 4,
                         grad_ckpt: bool = False, flash_attention: bool = True,
                         optimizer: str = "adamw") -> int:
    """Rough bytes of one pretraining step of the model `config` describes, by its architecture's
    own estimate (`models/<name>/cost.py`: parameters, gradients and optimizer moments, the
    activations kept for backward, the MLM logits)."""
    from bertgpu.models.build import spec_of_config

    return spec_of_config(config).train_bytes(config, micro_batch, seq_len, dtype_bytes, grad_ckpt,
                                              flash_attention, optimizer)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for a device allocation failure: torch's OutOfMemoryError, or a RuntimeError from
    cuBLAS / cuDNN (a handle or workspace they could not allocate) or the CUDA runtime."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OOM_MESSAGES)


def attempt(step_fn: Callable[[int], Any], batch: int) -> bool:
    """Run `step_fn(batch)`: True when it ran, False when it ran out of memory (any other error
    propagates)."""
    try:
        step_fn(batch)
    except Exception as exc:  # noqa: BLE001 - classified, re-raised unless it is an OOM
        if not is_out_of_memory(exc):
            raise
        return False  # leave the except block first: its traceback holds the step's tensors
    return True


def probe_fits(step_fn: Callable[[int], Any], device: Any = None,
               memory_limit_bytes: int | None = None) -> Callable[[int], bool]:
    """fits(batch): run `step_fn(batch)` (one full training step at that micro batch) on a CUDA
    device and report whether it ran without running out of memory and within the limit."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda")
    if dev.type != "cuda":
        raise BertgpuError(f"probe_fits: device {dev} cannot be probed (an out-of-memory there is "
                           "fatal); use estimate_train_bytes with a memory limit instead")
    if memory_limit_bytes is None:
        memory_limit_bytes = int(CUDA_MEMORY_FRACTION
                                 * torch.cuda.get_device_properties(dev).total_memory)

    def fits(batch: int) -> bool:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        ran = attempt(lambda b: (step_fn(b), torch.cuda.synchronize(dev)), batch)
        peak = torch.cuda.max_memory_allocated(dev)
        gc.collect()
        torch.cuda.empty_cache()
        return ran and peak <= memory_limit_bytes

    return fits


def find_micro_batch(step_fn: Callable[[int], Any] | None = None, device: Any = None,
                     seq_len: int = 128, start: int = 8, max_batch: int = 4096,
                     memory_limit_bytes: int | None = None,
                     fits: Callable[[int], bool] | None = None, config: Any = None,
                     dtype_bytes: int = 4, grad_ckpt: bool = False,
                     optimizer: str = "adamw") -> int:
    """The largest micro batch (sequences of `seq_len`) whose training step fits.

    The test of a size is, in order of precedence: `fits(batch)` when given (tests simulate a
    memory limit this way); on CUDA `probe_fits(step_fn, device, memory_limit_bytes)`; otherwise
    `estimate_train_bytes(config, batch, seq_len, ...) <= memory_limit_bytes` (default: half of
    the machine's RAM).
    """
    if fits is None:
        import torch

        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type == "cuda" and step_fn is not None:
            fits = probe_fits(step_fn, dev, memory_limit_bytes)
        elif config is not None:
            limit = memory_limit_bytes if memory_limit_bytes is not None else _ram_bytes() // 2
            flash = dev.type == "cuda"

            def fits(batch: int) -> bool:
                return estimate_train_bytes(config, batch, seq_len, dtype_bytes, grad_ckpt, flash,
                                            optimizer) <= limit
        else:
            raise BertgpuError("find_micro_batch: expected fits=, a CUDA device with "
                               "step_fn=, or config=")
    return search_largest(fits, start=start, max_batch=max_batch)


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def pretrain_step_fn(model: Any, optimizer: Any, seq_len: int, device: Any,
                     dtype: str = "fp32", with_nsp: bool = True) -> Callable[[int], None]:
    """step_fn(batch): one synthetic pretraining step (full-length sequences, 15% MLM labels) in
    the run's precision: forward under autocast (bf16 / fp16), backward (through fp16's loss
    scaler), optimizer step, grads freed. It changes the weights: probe a throw-away model, not
    the one you will train."""
    import torch

    from bertgpu.batch import batch_meta

    dev = torch.device(device)
    vocab = int(model.config.vocab_size)  # a compiled model forwards attributes to the original
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
    scaler = torch.amp.GradScaler(dev.type) if dtype == "fp16" else None

    def step(batch: int) -> None:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(5, vocab, (batch, seq_len), generator=g)
        labels = torch.where(torch.rand(batch, seq_len, generator=g) < 0.15, ids,
                             torch.full_like(ids, -100))
        b: dict[str, Any] = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 token_type_ids=torch.zeros_like(ids), labels=labels)
        if with_nsp:
            b["next_sentence_label"] = torch.randint(0, 2, (batch,), generator=g)
        b["batch_meta"] = batch_meta(b["attention_mask"], labels)  # as the loader ships it
        b = {k: v.to(dev) for k, v in b.items()}
        with torch.autocast(dev.type, dtype=half or torch.bfloat16, enabled=half is not None):
            loss = model(**b).loss
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            optimizer.step()  # even after an overflow (the scaler would skip): its state must exist
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def find_pretrain_micro_batch(config: Any, seq_len: int, device: Any, dtype: str = "bf16",
                              with_nsp: bool = True, grad_ckpt: bool = False, compile: bool = False,
                              start: int = 8, max_batch: int = 4096,
                              memory_limit_bytes: int | None = None,
                              optimizer: str = "adamw") -> int:
    """`find_micro_batch` for the pretraining model of `config` (a BertConfig or ModernBertConfig)
    trained with `optimizer` in `dtype` ("fp32", "bf16", "fp16") on `device`; the smallest answer
    over all ranks.

    Collective when a process group is up: call it on every rank. On CUDA it builds a throw-away
    model and optimizer, probes real steps, frees them and resets the peak memory statistics;
    call it before building the model you train. Elsewhere it answers from
    `estimate_train_bytes`. When the search fails on any rank (nothing fits, or an error), every
    rank raises the same BertgpuError."""
    error: str | None = None
    found = 0
    try:
        found = _probe_pretrain(config, seq_len, device, dtype, with_nsp, grad_ckpt, compile, start,
                                max_batch, memory_limit_bytes, optimizer)
    except Exception as exc:  # noqa: BLE001 - every rank must reach the agreement below
        error = str(exc) if isinstance(exc, BertgpuError) else f"{type(exc).__name__}: {exc}"
    return agree_on_micro_batch(found, error)


def _probe_pretrain(config: Any, seq_len: int, device: Any, dtype: str, with_nsp: bool,
                    grad_ckpt: bool, compile: bool, start: int, max_batch: int,
                    memory_limit_bytes: int | None, optimizer: str) -> int:
    import torch

    from bertgpu.train.optim import build_optimizer

    dev = torch.device(device)
    if dev.type != "cuda":
        return find_micro_batch(None, dev, seq_len, start, max_batch, memory_limit_bytes,
                                config=config, dtype_bytes=4 if dtype == "fp32" else 2,
                                grad_ckpt=grad_ckpt, optimizer=optimizer)
    model = probe_model(config, with_nsp, grad_ckpt).to(dev).train()
    opt = build_optimizer(model, optimizer, 1e-4)
    run = torch.compile(model) if compile else model
    try:
        return find_micro_batch(pretrain_step_fn(run, opt, seq_len, dev, dtype, with_nsp), dev,
                                seq_len, start, max_batch, memory_limit_bytes)
    finally:
        del run, model, opt
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)  # the run's memory metrics must not show the probe


def probe_model(config: Any, with_nsp: bool, grad_ckpt: bool) -> Any:
    """A fresh pretraining model of `config`'s architecture (BertConfig or ModernBertConfig), as
    the run builds it: NSP head for BERT when `with_nsp`, activation checkpointing if asked."""
    from bertgpu.models.build import build_model, spec_of_config

    spec = spec_of_config(config)
    model = build_model(config.to_dict(), "pretraining",
                        with_nsp=with_nsp if spec.has_nsp else None)
    model.configure(gradient_checkpointing=grad_ckpt)
    return model


def agree_on_micro_batch(found: int, error: str | None) -> int:
    """Collective: the smallest `found` over ranks; if any rank has an `error`, BertgpuError on
    every rank naming the (lowest) failing rank and its message. Without a process group: `found`,
    or the error."""
    from bertgpu.train import distributed

    if not distributed.is_initialized():
        if error is not None:
            raise BertgpuError(f"automatic micro batch size: {error}")
        return found
    import torch.distributed as dist

    reports: list[Any] = [None] * distributed.get_world_size()
    dist.all_gather_object(reports, (found, error))  # one collective: sizes and errors together
    failed = [(rank, err) for rank, (_, err) in enumerate(reports) if err is not None]
    if failed:
        rank, err = failed[0]
        others = (f" (and {len(failed) - 1} more rank{'s' if len(failed) > 2 else ''})"
                  if len(failed) > 1 else "")
        raise BertgpuError("automatic micro batch size: the probe failed on rank "
                           f"{rank}{others}: {err}")
    return min(size for size, _ in reports)


def resolve_auto_batch(global_batch: int, world: int, found_micro: int) -> tuple[int, int]:
    """(micro, accumulation) with micro the largest divisor of global/world that is <= found_micro,
    so micro x accumulation x world == global_batch exactly."""
    if global_batch <= 0 or world <= 0 or found_micro <= 0:
        raise BertgpuError(f"auto micro batch: global batch {global_batch}, world {world} and "
                           f"found micro batch {found_micro} must all be positive")
    if global_batch % world:
        raise BertgpuError(f"train.global_batch_size {global_batch} is not divisible by the "
                           f"{world} devices; expected a multiple of {world}")
    per_device = global_batch // world
    micro = max(d for d in range(1, min(per_device, found_micro) + 1) if per_device % d == 0)
    return micro, per_device // micro


__all__ = ["search_largest", "estimate_train_bytes", "is_out_of_memory", "attempt", "probe_fits",
           "find_micro_batch", "pretrain_step_fn", "find_pretrain_micro_batch", "probe_model",
           "agree_on_micro_batch", "resolve_auto_batch"]
