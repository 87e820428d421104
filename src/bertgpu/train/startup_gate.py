"""Before the process group: every rank of a launched job says, through the rendezvous store,
whether its start-up failed, and all stop with the first failure's line.

A rank that fails before the group exists (an argparse error, a config that does not parse on
one node, a held run-folder lock, `--impl.device cuda` on a node without a GPU) used to hand its
line over by joining the process group and all-gathering it. That meant making a group of the
same backend as the healthy ranks': with no config (cfg None) it joined on device "auto", NCCL
on a GPU node of a `--impl.device cpu` job whose other ranks made gloo groups, and one with no
GPU could not join an NCCL job at all; either way the others waited out
distributed.timeout_minutes. The rendezvous store (torch's own, from `env://`: rank 0's TCPStore
or torchrun's agent store) needs no device and no backend, so here every rank, healthy or not,
sets its key (empty, or its error line) and reads everyone's before `init_process_group` is
called on the same store. A failing rank 0, which hosts the store, stays until every rank has
read it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from bertgpu.errors import BertgpuError

_said = {"this process": False}  # this process has set its key (once per start-up)


def said() -> bool:
    """Whether this process already told the other ranks how its start-up went."""
    return _said["this process"]


def reset() -> None:
    """A new start-up in this process (a test calling the command again)."""
    _said["this process"] = False


def rendezvous(timeout_minutes: float) -> tuple[Any, int, int]:
    """(store, rank, world size) as `init_process_group` makes them from torchrun's variables."""
    import torch.distributed as dist

    timeout = timedelta(minutes=timeout_minutes)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    return store, rank, world


def exchange(store: Any, rank: int, world: int, line: str | None, timeout_minutes: float
             ) -> list[str | None]:
    """Every rank's start-up error line (None: it started), in rank order: sets this rank's
    `line` and waits up to `timeout_minutes` for every other rank's."""
    import torch.distributed as dist

    _said["this process"] = True
    gate = dist.PrefixStore("bertgpu/startup", store)
    keys = [f"rank{r}" for r in range(world)]
    gate.set(keys[rank], "" if line is None else "!" + line)
    gate.wait(keys, timedelta(minutes=timeout_minutes))
    lines = [gate.get(k).decode("utf-8", "replace") for k in keys]
    gate.add("read", 1)
    said_lines = [text[1:] if text else None for text in lines]
    if rank == 0 and any(said_lines):  # rank 0 stops now: its store must outlive their reads
        deadline = time.monotonic() + min(60.0, timeout_minutes * 60.0)
        while gate.add("read", 0) < world and time.monotonic() < deadline:
            time.sleep(0.05)
    return said_lines


def store_for_group(rank: int, world: int, timeout_minutes: float) -> Any:
    """A healthy rank's store for `init_process_group(store=...)`, once every rank said it
    started (torch's own "default_pg" prefix, as its env:// path makes); raises the first other
    rank's start-up error as "rank R stopped at start-up: LINE"."""
    import torch.distributed as dist

    store, _, _ = rendezvous(timeout_minutes)
    failed = [(r, text) for r, text in enumerate(exchange(store, rank, world, None,
                                                          timeout_minutes)) if text]
    if failed:
        raise BertgpuError(f"rank {failed[0][0]} stopped at start-up: {failed[0][1]}")
    return dist.PrefixStore("default_pg", store)


def hand_over(line: str, timeout_minutes: float) -> None:
    """A failing rank's `line` to the others (before it stops), once per start-up."""
    if said():
        return
    store, rank, world = rendezvous(timeout_minutes)
    exchange(store, rank, world, line, timeout_minutes)
