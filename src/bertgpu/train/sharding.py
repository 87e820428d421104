"""Sharded training with PyTorch's own FSDP2 (`torch.distributed.fsdp.fully_shard`).

With `[distributed] strategy = "fsdp"` every rank holds 1/N of the parameters, of the gradients
and of the optimizer state (Zhao et al. 2023, "PyTorch FSDP"; ZeRO stage 3): each encoder layer
is its own unit (all-gathered just before its forward and backward, freed after), the root unit
holds what is left (embeddings, heads; the tied MLM decoder stays one parameter). The model
knows nothing of this: the architecture's spec names its layers (`Architecture.layers`).

    model = build_model(...).to(device)
    wrap_fsdp(model, info, spec.layers(model), precision="bf16")   # in place: DTensor parameters
    optimizer = build_optimizer(model, ...)                         # built after sharding

- bf16: `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: the all-gather moves bf16,
  the gradient reduce-scatter sums in fp32, the sharded master weights stay fp32.
- `cpu_offload`: `CPUOffloadPolicy`: shards, gradients and optimizer state live in CPU memory;
  the optimizer step runs on the CPU.
- `shard_within_node` (HSDP): a 2-D mesh (nodes x ranks per node): shard inside a node, replicate
  across nodes, so the all-gathers stay on the fast links.
- Gradient accumulation (`accumulating`): the micro-steps before the last one neither reduce
  gradients nor reshard parameters (FSDP2's `set_requires_gradient_sync` and `set_reshard_after_*`,
  the analogue of DDP's no_sync): the parameters are all-gathered once in the first forward and
  kept, the gradients accumulate unsharded, and the last micro-step reduce-scatters once. The
  collectives of a step are then the same whatever the number of micro-steps of a rank, which
  load balancing (unequal micro-step counts) needs.

FSDP averages gradients over ranks, as DDP does: the engine multiplies the loss by the world
size in both cases, so DP=2 equals DP=1 with accumulation 2 (tested against a DDP run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bertgpu.errors import BertgpuError
from bertgpu.train import distributed
from bertgpu.train.distributed import CommTimer, DistInfo

if TYPE_CHECKING:
    import torch


def is_sharded(model: Any) -> bool:
    """True when `model` (or the module a torch.compile wrapper holds) is an FSDP2 module."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without distributed support
        return False
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)


def fsdp_policies(precision: str, cpu_offload: bool) -> dict[str, Any]:
    """`fully_shard` keywords for a training precision: bf16 all-gathers bf16 parameters and
    reduces gradients in fp32; fp32 and fp16 (autocast with its loss scaler) keep fp32
    parameters, as DDP does; `cpu_offload` adds `CPUOffloadPolicy`."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {}
    if precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
    if cpu_offload:
        # Pinned host memory makes the copies to and from the GPU asynchronous (CUDA only).
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return kwargs


def fsdp_mesh(info: DistInfo, shard_within_node: bool) -> Any:
    """The device mesh: 1-D over every rank, or (nodes, ranks per node) for HSDP."""
    from torch.distributed.device_mesh import init_device_mesh

    device_type = "cuda" if info.device.startswith("cuda") else "cpu"
    if not shard_within_node:
        return init_device_mesh(device_type, (info.world_size,))
    per_node = info.local_world_size
    if per_node < 1 or info.world_size % per_node:
        raise BertgpuError(
            f"distributed.shard_within_node: {info.world_size} ranks do not split into "
            f"nodes of {per_node} (LOCAL_WORLD_SIZE); expected the same number per node"
        )
    return init_device_mesh(
        device_type, (info.world_size // per_node, per_node), mesh_dim_names=("replicate", "shard")
    )


def wrap_fsdp(
    model: torch.nn.Module,
    info: DistInfo,
    layers: Sequence[torch.nn.Module],
    *,
    precision: str = "fp32",
    cpu_offload: bool = False,
    shard_within_node: bool = False,
) -> torch.nn.Module:
    """Shard `model` in place: `fully_shard` on every layer, then on the root. Needs a process
    group (one process has a group of one: `init_distributed(..., strategy="fsdp")`). Build the
    optimizer afterwards: the parameters are replaced by sharded DTensors."""
    from torch.distributed.fsdp import fully_shard

    if not info.distributed:
        raise BertgpuError(
            "distributed.strategy fsdp: no process group; expected the run started by "
            "init_distributed(..., strategy='fsdp') or under torchrun"
        )
    if not layers:
        raise BertgpuError(
            f"distributed.strategy fsdp: {type(model).__name__} has no layers to shard"
        )
    kwargs = {"mesh": fsdp_mesh(info, shard_within_node), **fsdp_policies(precision, cpu_offload)}
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def wrap_model(model: torch.nn.Module, info: DistInfo, dist: Any, *, precision: str = "fp32",
               timer: CommTimer | None = None) -> torch.nn.Module:
    """The training module of `dist.strategy` (a `[distributed]` section): `wrap_ddp`'s wrapper
    (the model itself on one process), or the model sharded in place by FSDP2 (one unit per
    layer of its architecture's spec, then the root)."""
    if dist.strategy == "fsdp":
        from bertgpu.models.build import spec_of_config

        layers = spec_of_config(model.config).layers(model)
        return wrap_fsdp(model, info, layers, precision=precision, cpu_offload=dist.cpu_offload,
                         shard_within_node=dist.shard_within_node)
    return distributed.wrap_ddp(model, info, bucket_cap_mb=dist.bucket_cap_mb,
                                gradient_as_bucket_view=dist.gradient_as_bucket_view,
                                comm_hook=dist.comm_hook, timer=timer)


def accumulating(model: Any, on: bool) -> None:
    """Before each micro-step: `on` for every micro-step but the last of an optimizer step (no
    gradient reduction, parameters kept unsharded after forward and backward), off for the last
    (reduce-scatter the accumulated gradients, reshard). The root keeps FSDP's own default after
    forward (not resharded: its backward follows at once)."""
    root = getattr(model, "_orig_mod", model)
    root.set_requires_gradient_sync(not on)
    root.set_reshard_after_backward(not on)
    from torch.distributed.fsdp import FSDPModule

    for module in root.modules():
        if module is not root and isinstance(module, FSDPModule):
            module.set_reshard_after_forward(not on, recurse=False)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full (unsharded) weights of a sharded model on rank 0, in CPU memory, one
    tensor gathered at a time; {} on the other ranks. A plain model's own state dict."""
    if not is_sharded(model):
        return dict(model.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(getattr(model, "_orig_mod", model), options=options)


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def _tensor_bytes(tensors: Any) -> int:
    """Bytes of this rank's part of every distinct tensor (tied parameters counted once)."""
    import torch

    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        t = _local(t)
        if not isinstance(t, torch.Tensor) or (t.data_ptr(), t.numel()) in seen:
            continue
        seen.add((t.data_ptr(), t.numel()))
        total += t.numel() * t.element_size()
    return total


def local_state_bytes(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """This rank's bytes of parameters, gradients (as they are now: call after a backward) and
    optimizer state, read from the tensors themselves (a DTensor's local shard)."""
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [
        v for s in (optimizer.state.values() if optimizer is not None else []) for v in s.values()
    ]
    return {
        "params": _tensor_bytes(params),
        "grads": _tensor_bytes(grads),
        "optimizer": _tensor_bytes(states),
    }


__all__ = [
    "accumulating",
    "fsdp_mesh",
    "fsdp_policies",
    "full_state_dict",
    "is_sharded",
    "local_state_bytes",
    "wrap_fsdp",
]
