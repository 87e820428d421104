"""Host copies of a training state, for checkpoints written in the background.

A background checkpoint must not see training change the tensors while it writes them, so the
training thread first copies the state into host memory: that copy is the only time training
waits (the stall). `HostCopy` keeps the buffers from one checkpoint to the next (the next save
waits for the previous write, so they are free again), in pinned memory for CUDA tensors: every
device-to-host copy is then asynchronous and one synchronisation ends them all.

Whether the copy fits is decided once, at start-up (`fits_in_memory`): the copy of the weights
and the optimizer state must take at most half of the memory available to this process (the
kernel's MemAvailable, capped by a cgroup v2 limit in containers).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

_FRACTION = 0.5  # of the available memory a host copy may take


class HostCopy:
    """Reusable host buffers for a state tree (see the module docstring)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def copy(self, tree: Any) -> Any:
        """`tree` (dicts, lists, tuples, tensors and plain values) with every tensor replaced by
        its host copy and every container copied, so that nothing the writer thread holds is an
        object training goes on changing. Tensors that share storage (tied weights) share one
        copy. Returns after one synchronisation per CUDA device."""
        seen: dict[tuple[Any, ...], torch.Tensor] = {}
        devices: set[torch.device] = set()
        out = self._walk(tree, (), seen, devices)
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
        return out

    def _walk(self, x: Any, path: tuple[Any, ...], seen: dict[tuple[Any, ...], torch.Tensor],
              devices: set[torch.device]) -> Any:
        if isinstance(x, torch.Tensor):
            return self._tensor(x.detach(), path, seen, devices)
        if isinstance(x, dict):
            return {k: self._walk(v, (*path, k), seen, devices) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            items = [self._walk(v, (*path, i), seen, devices) for i, v in enumerate(x)]
            return items if isinstance(x, list) else tuple(items)
        return x  # numbers, strings, None: immutable

    def _tensor(self, t: torch.Tensor, path: tuple[Any, ...],
                seen: dict[tuple[Any, ...], torch.Tensor], devices: set[torch.device]
                ) -> torch.Tensor:
        alias = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
                 t.stride(), t.dtype)
        if t.numel() and alias in seen:
            return seen[alias]
        cuda = t.device.type == "cuda"
        buf = self._buffers.get(path)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
            self._buffers[path] = buf
        buf.copy_(t, non_blocking=cuda)
        if cuda:
            devices.add(t.device)
        seen[alias] = buf
        return buf


def estimate_host_bytes(model: torch.nn.Module) -> int:
    """Bytes of a host copy of `model`'s state and of an Adam-type optimizer's (two fp32 moments
    per trainable parameter); this rank's shards for a sharded model. Tied tensors count once."""
    seen, total = set(), 0
    for t in model.state_dict().values():
        local = t.to_local() if hasattr(t, "to_local") else t
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape))
        if key not in seen:
            seen.add(key)
            total += local.numel() * local.element_size()
    for p in model.parameters():
        if p.requires_grad:
            local = p.to_local() if hasattr(p, "to_local") else p
            total += 2 * 4 * local.numel()
    return total


def available_bytes() -> int | None:
    """Memory this process may still use: MemAvailable, capped by a cgroup v2 limit (a
    container's); None where neither can be read."""
    found = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if found is None:
        try:
            found = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            found = None
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            left = int(limit) - int((cgroup / "memory.current").read_text())
            found = left if found is None else min(found, left)
    except (OSError, ValueError):
        pass
    return found


def fits_in_memory(needed: int, available: int | None) -> bool:
    """A host copy of `needed` bytes fits when it takes at most half of what is available
    (unknown availability: assume it fits)."""
    return available is None or needed <= _FRACTION * available


__all__ = ["HostCopy", "available_bytes", "estimate_host_bytes", "fits_in_memory"]
