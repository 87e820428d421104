"""Process-group setup from torchrun's environment, collective helpers, DDP wrapping.

One process per device. `bertgpu pretrain --nproc 8 ...` re-executes itself under
`torch.distributed.run --standalone` (see `launch_local`), so single-node users never type
torchrun; multi-node users call torchrun themselves::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m bertgpu pretrain configs/bert-base.toml --data data/ --out runs/base

Every helper here is a no-op that returns the local value when no process group is initialised,
so the training loop is written once and runs unchanged on one CPU or on many GPUs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError
from bertgpu.train.setup_signals import stop_ends_setup

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its global rank, the world size, its device."""

    rank: int = 0
    """Global rank of this process (0 is the one that logs and writes files)."""
    world_size: int = 1
    """Number of processes (data-parallel replicas)."""
    local_rank: int = 0
    """Rank within this node; picks the CUDA device."""
    device: str = "cpu"
    """torch device string of this process, e.g. "cuda:3" or "cpu"."""
    backend: str | None = None
    """"nccl", "gloo", or None when running as a single process without a process group."""
    local_world_size: int = 1
    """Processes on this node (torchrun's LOCAL_WORLD_SIZE): the shard group of HSDP."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def is_initialized() -> bool:
    """True when a torch.distributed process group is up."""
    dist = _dist()
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return _dist().get_rank() if is_initialized() else 0


def get_world_size() -> int:
    return _dist().get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """True on global rank 0, or when not distributed."""
    return get_rank() == 0


def _pick_device(device_pref: str, local_rank: int, world_size: int = 1) -> str:
    """The torch device of this process from the configured preference (impl.device).

    "cuda" gives rank `local_rank` the GPU `local_rank % device_count`: a process that sees one
    GPU (Slurm or a launcher setting CUDA_VISIBLE_DEVICES per rank) uses cuda:0 whatever its
    LOCAL_RANK, and more ranks than GPUs share them round-robin. An explicit "cuda:N" is refused
    with several processes: it would put every rank on the same GPU."""
    import torch

    if device_pref == "auto":
        device_pref = "cuda" if torch.cuda.is_available() else "cpu"
    if device_pref == "cuda" or device_pref.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise BertgpuError(f"impl.device {device_pref}: no CUDA device is visible "
                               "to this process")
        count = torch.cuda.device_count()
        if device_pref == "cuda":
            return f"cuda:{local_rank % count}"
        index = device_pref.split(":", 1)[1]
        if not index.isdigit() or int(index) >= count:
            raise BertgpuError(f"impl.device {device_pref}: expected cuda:N with N in [0, {count}) "
                               f"({count} GPU{'s' if count > 1 else ''} visible)")
        if world_size > 1:
            raise BertgpuError(f"impl.device {device_pref}: {world_size} processes would all use "
                               f"GPU {index}; expected impl.device cuda (rank r takes GPU r % "
                               f"{count}) and CUDA_VISIBLE_DEVICES to choose the GPUs")
        return device_pref
    if device_pref == "mps":
        return "mps"
    if device_pref != "cpu":
        raise BertgpuError(f"impl.device {device_pref!r}: expected auto, cpu, cuda, cuda:N or mps")
    return "cpu"


DEFAULT_TIMEOUT_MINUTES = 60.0


def init_distributed(device_pref: str = "auto", timeout_minutes: float | None = None,
                     strategy: str = "ddp") -> DistInfo:
    """Set up the process group from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT); single process without a group when WORLD_SIZE is unset, except with
    `strategy` "fsdp", which needs one: a group of one process (an in-memory store, no port).

    NCCL on CUDA (with `torch.cuda.set_device` on this rank's GPU first, so NCCL and every
    `.cuda()` use it; see `_pick_device`), gloo on CPU. `timeout_minutes` bounds every
    collective wait (default `DEFAULT_TIMEOUT_MINUTES`): long enough for the longest legitimate
    wait (rank 0 writing a large checkpoint or post-processing SQuAD v2 while the others wait),
    short enough that a hung rank ends the job with an error instead of holding the GPUs for
    ever."""
    import torch

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    device = _pick_device(device_pref, local_rank, world_size)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    alone = "WORLD_SIZE" not in os.environ
    if alone and strategy != "fsdp":
        return DistInfo(0, 1, 0, device, None)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist = _dist()
    if not dist.is_initialized():
        from datetime import timedelta

        minutes = DEFAULT_TIMEOUT_MINUTES if timeout_minutes is None else float(timeout_minutes)
        _host["timeout"] = timedelta(minutes=minutes)
        kwargs: dict[str, Any] = {"backend": backend, "rank": rank, "world_size": world_size,
                                  "timeout": _host["timeout"]}
        if alone:
            kwargs["store"] = dist.HashStore()  # a group of one: no rendezvous, no port
        if backend == "nccl":
            # Binds the communicator to this GPU eagerly (torch >= 2.3) and silences the
            # "device id unknown" barrier warning.
            kwargs["device_id"] = torch.device(device)
        from bertgpu.testing import faults
        from bertgpu.train import startup_gate

        with stop_ends_setup(rank):
            faults.delay_setup(rank)  # the test double (testing/faults.py): off unless set
            if not alone:  # every rank's start-up went well, or all stop (train/startup_gate.py)
                kwargs["store"] = startup_gate.store_for_group(rank, world_size, minutes)
            dist.init_process_group(**kwargs)
    return DistInfo(rank, world_size, local_rank, device, backend, local_world)


def destroy() -> None:
    """Tear down the process group (if any), after collecting the garbage that may still hold it.

    Every DDP or FSDP module of this process must be unreachable by now: one that outlives the
    group keeps the group's gloo threads alive into interpreter shutdown, where tearing them down
    aborts the process ("terminate called without an active exception", SIGABRT, in about one run
    in ten on torch 2.13) after the work is done. `process_group` arranges that.
    """
    if is_initialized():
        gc.collect()  # modules in reference cycles (loop <-> engine) go now, not at exit
        _dist().destroy_process_group()
        _host.pop("group", None)
        _host.pop("of", None)


@contextlib.contextmanager
def process_group(device_pref: str = "auto", timeout_minutes: float | None = None,
                  strategy: str = "ddp") -> Iterator[DistInfo]:
    """`init_distributed`, then `destroy` on the way out when this call made the group.

    Build the model, engine and loop in a function called inside the block, not in the block's
    own frame, so they are gone when the group is torn down (see `destroy`). On an exception the
    traceback's finished frames are cleared for the same reason: a traceback keeps the locals of
    every frame it passes through, DDP modules included.
    """
    owns = not is_initialized()
    info = init_distributed(device_pref, timeout_minutes, strategy=strategy)
    try:
        yield info
    except BaseException as e:
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        if owns:
            destroy()


def barrier() -> None:
    if is_initialized():
        _dist().barrier()


# The gloo group of host numbers under NCCL (`host_group`), and the timeout it is made with.
_host: dict[str, Any] = {}


def host_group() -> Any:
    """Where host numbers (counts, clocks, flags) are reduced: the default group under gloo;
    under NCCL a gloo group over the same ranks, made on first use (every rank makes its first
    call at the same point of the run). Through NCCL a host number waits for the GPU: the
    collective queues behind every kernel queued before it (the previous step's backward and
    update), and reading the result back made the host wait for them on every step, then
    queue the next step on an idle GPU. Through gloo it waits only for the other ranks' hosts.
    (Multi-node: gloo picks the interface of the host name, as the preemption checks' group
    does; GLOO_SOCKET_IFNAME sets it.)"""
    dist = _dist()
    if dist.get_backend() != "nccl":
        return None
    world = dist.group.WORLD
    if _host.get("of") is not world:
        _host.update(of=world, group=dist.new_group(backend="gloo", timeout=_host.get("timeout")))
    return _host["group"]


def host_all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum a CPU tensor over ranks in place through `host_group`; returned as is in a world of
    one (with or without a group: an NCCL group of one takes no CPU tensor)."""
    if get_world_size() > 1:
        _dist().all_reduce(t, group=host_group())
    return t


def collective_device() -> torch.device:
    """Where small tensors for collectives must live: the current GPU under NCCL, else CPU."""
    import torch

    if is_initialized() and _dist().get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce(x: Any, op_name: str) -> Any:
    import torch

    if not is_initialized():
        return x
    dist = _dist()
    op = getattr(dist.ReduceOp, op_name)
    if isinstance(x, torch.Tensor):
        dist.all_reduce(x, op=op)
        return x
    if get_world_size() == 1:  # a host number, as `host_all_reduce_sum`
        return x
    # Python scalar: float64 so integer counts up to 2**53 stay exact; a host number.
    t = torch.tensor(float(x), dtype=torch.float64)
    dist.all_reduce(t, op=op, group=host_group())
    value = t.item()
    return int(value) if isinstance(x, int) and not isinstance(x, bool) else value


def all_reduce_sum(x: Any) -> Any:
    """Sum over ranks. A tensor is reduced in place and returned;
    a float/int returns a new value."""
    return _reduce(x, "SUM")


def all_reduce_max(x: Any) -> Any:
    """Max over ranks (same conventions as `all_reduce_sum`)."""
    return _reduce(x, "MAX")


def broadcast_scalar(x: float, src: int = 0) -> float:
    """Rank `src`'s value of `x` on every rank (e.g. the wall clock,
    so all ranks agree on progress)."""
    if get_world_size() == 1:  # a host number, as `host_all_reduce_sum`
        return x
    import torch

    t = torch.tensor(float(x), dtype=torch.float64)
    _dist().broadcast(t, src=src, group=host_group())
    return t.item()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank; `[obj]` without a group."""
    if not is_initialized():
        return [obj]
    everyone: list[Any] = [None] * get_world_size()
    _dist().all_gather_object(everyone, obj)
    return everyone


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's `obj` in rank order on rank 0 (None elsewhere); `[obj]` without a group."""
    if not is_initialized():
        return [obj]
    everyone: list[Any] | None = [None] * get_world_size() if is_main() else None
    _dist().gather_object(obj, everyone, dst=0)
    return everyone


def any_true(flag: bool) -> bool:
    """Collective OR: True on every rank when `flag` is True on at least one."""
    return bool(all_reduce_max(1.0 if flag else 0.0) > 0.0)


def comm_hook_for(name: str, model: torch.nn.Module | None = None) -> tuple[Any, Any]:
    """(keeper, hook) for DDP's `register_comm_hook` over `model`; hook None means DDP's
    built-in all-reduce, keeper None a stateless hook.

    "bf16"/"fp16" halve the bytes (the sum is still divided by world size in full precision
    afterwards); "powersgd" is PowerSGD rank-1 (Vogels et al. 2019; changes the math, for
    bandwidth-starved multi-node only), whose keeper (`powersgd.PowerSGDHook`) holds the state
    that checkpoints save (register `keeper.state` with the hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if name == "none":
        return None, None
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name == "bf16":
        return None, default_hooks.bf16_compress_hook
    if name == "powersgd":
        from bertgpu.train.powersgd import PowerSGDHook

        if model is None:
            raise ValueError("comm_hook_for('powersgd') needs the model")
        keeper = PowerSGDHook(model)
        return keeper, keeper.hook
    raise BertgpuError(f"distributed.comm_hook {name!r}: expected none, bf16, fp16 or powersgd")


def comm_hook_of(model: Any) -> Any:
    """The keeper of the stateful compression hook of a training module (`wrap_ddp`'s, maybe
    compiled): a `powersgd.PowerSGDHook`, else None."""
    return getattr(getattr(model, "_orig_mod", model), "comm_hook_state", None)


class CommTimer:
    """Times DDP's gradient all-reduce through a comm hook wrapped around the configured one.

    DDP calls the hook when a gradient bucket is ready (time r_b) and the bucket's all-reduce
    completes when the hook's future resolves (time d_b). Per synchronising backward,
    `pop_step()` returns max(d) - max(r): from the moment the last bucket was ready (about the end
    of the backward compute) until every all-reduce is done. That is the communication *not*
    hidden behind the backward pass, i.e. what the all-reduce adds to the step, including
    waiting for the slowest rank. It does not count the slowdown of compute that runs
    concurrently with communication, nor the engine's few small collectives (counts, loss, flags).
    no_sync micro-steps call no hook and add nothing. On CUDA the times are CUDA events
    (stream order) read one step late: `pop_step` returns the previous call's, which are
    complete by then (the engine has read that step behind this one's kernels), and `settle`
    the ones it keeps (a log step, which reads its step anyway). Waiting for this step's
    events made the host wait for its backward and all-reduce on every step. On CPU wall-clock
    times, at once.
    """

    def __init__(self, device: Any) -> None:
        self.cuda = getattr(device, "type", str(device)).startswith("cuda")
        self._ready: list[Any] = []
        self._done: list[Any] = []
        self._late: list[tuple[list[Any], list[Any]]] = []  # CUDA: recorded, not read yet

    def _now(self) -> Any:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()  # on the current stream: the hook's compute stream, the future's stream
            return event
        return time.perf_counter()

    def wrap(self, inner: Any) -> Any:
        """A comm hook that records the times around `inner` (a hook function)."""

        # No annotations: DDP checks them, and `from __future__ import annotations` turns them into
        # strings it does not recognise.
        def timed(hook_state, bucket):  # type: ignore[no-untyped-def]
            self._ready.append(self._now())

            def done(fut):  # type: ignore[no-untyped-def]
                self._done.append(self._now())
                return fut.value()

            return inner(hook_state, bucket).then(done)

        return timed

    def pop_step(self) -> float:
        """Exposed all-reduce seconds of the backward(s) since the last call (0.0 if none); on
        CUDA those of the backward(s) before the last call (see the class)."""
        ready, done = self._ready, self._done
        self._ready, self._done = [], []
        if not self.cuda:
            return max(0.0, max(done) - max(ready)) if ready and done else 0.0
        earlier, self._late = self._late, [(ready, done)] if ready and done else []
        return sum(self._exposed(r, d) for r, d in earlier)

    def settle(self) -> float:
        """The seconds `pop_step` keeps for its next call, now (CUDA: waits for them)."""
        earlier, self._late = self._late, []
        return sum(self._exposed(r, d) for r, d in earlier)

    @staticmethod
    def _exposed(ready: list[Any], done: list[Any]) -> float:
        for event in done:
            event.synchronize()
        ref = ready[0]
        last_ready = max(ref.elapsed_time(e) for e in ready)
        last_done = max(ref.elapsed_time(e) for e in done)
        return max(0.0, last_done - last_ready) / 1000.0  # ms -> s


def _no_buffer_sync() -> dict[str, bool]:
    """DDP keyword that stops the buffer broadcast before every forward. Our models' buffers are
    constants (position ids, RoPE tables), identical on every rank by construction: the broadcast
    would add a collective per micro-step, and a fast rank would wait there (unmeasured) instead
    of in the gradient all-reduce. torch >= 2.13 names it forward_sync_buffers."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def wrap_ddp(
    model: torch.nn.Module,
    info: DistInfo,
    bucket_cap_mb: int = 25,
    gradient_as_bucket_view: bool = True,
    comm_hook: str = "none",
    timer: CommTimer | None = None,
) -> torch.nn.Module:
    """Wrap `model` in DistributedDataParallel (returned unchanged when not distributed).

    `comm_hook` compresses the gradient all-reduce (see `comm_hook_for`); `timer` measures the
    exposed all-reduce time around whichever hook is in use (DDP takes a single hook)."""
    if not info.distributed:
        return model
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    keeper, hook = comm_hook_for(comm_hook, model)
    device_ids = [int(info.device.split(":")[1])] if info.device.startswith("cuda:") else None
    ddp = DDP(
        model,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        **_no_buffer_sync(),
    )
    if timer is not None:
        hook = timer.wrap(hook or default_hooks.allreduce_hook)
    if hook is not None:
        ddp.register_comm_hook(getattr(keeper, "state", None), hook)
    ddp.comm_hook_state = keeper  # for reset_comm_hook_state after a skipped step, checkpoints
    return ddp


def reset_comm_hook_state(keeper: Any) -> None:
    """Forget what a stateful compression hook carried over from earlier steps.

    PowerSGD keeps an error-feedback residual and warm-start factors per bucket: after a
    non-finite step they hold NaN/inf and would poison every later step, and after an fp16 loss
    scale change they are in the old scale's units. Cleared, the hook starts again as on its
    first step (fresh random factors, no residual). Stateless hooks (bf16, fp16) have no keeper
    (None)."""
    if keeper is not None:
        keeper.reset()


def resolve_nproc(nproc: str | int) -> int:
    """Number of local processes to launch: "auto" = every visible CUDA device (1 on CPU)."""
    if isinstance(nproc, str):
        if nproc == "auto":
            import torch

            return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1
        try:
            nproc = int(nproc)
        except ValueError:
            raise BertgpuError(f"--nproc {nproc!r}: expected a positive integer or auto") from None
    if nproc < 1:
        raise BertgpuError(f"--nproc {nproc}: expected a positive integer or auto")
    return nproc
