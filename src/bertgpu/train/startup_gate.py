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

Each start-up exchanges under an id of its own (`_this_start`): under torchrun with its agent's
store (TORCHELASTIC_USE_AGENT_STORE, torch >= 2.5) the store outlives a restart
(--max-restarts), and keys that never changed were read as the next attempt's (its healthy
ranks stopped on the last attempt's error line). TORCHELASTIC_RESTART_COUNT cannot name the
attempt: each node's agent counts only its own workers' failures (pytorch#108158), so two nodes
can disagree. Rank 0 makes the id; every other rank gets it in answer to a fresh word of its
own, so none takes an earlier attempt's keys for this one.
"""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import Any

from bertgpu.errors import BertgpuError

_said: dict[str, Any] = {"this process": False}  # set its key (once per start-up)
_POLL_S = 0.05


def said() -> bool:
    """Whether this process already told the other ranks how its start-up went."""
    return _said["this process"]


def reset() -> None:
    """A new start-up in this process (a test calling the command again)."""
    _said["this process"] = False
    _said.pop("minutes", None)


def note_timeout(minutes: float) -> None:
    """The config's distributed.timeout_minutes, read before this start-up failed: how long its
    hand-over (cli.py's, once it said the line) waits for the others."""
    _said["minutes"] = float(minutes)


def noted_timeout() -> float | None:
    return _said.get("minutes")


def rendezvous(timeout_minutes: float) -> tuple[Any, int, int]:
    """(store, rank, world size) as `init_process_group` makes them from torchrun's variables."""
    import torch.distributed as dist

    timeout = timedelta(minutes=timeout_minutes)
    store, rank, world = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    return store, rank, world


def exchange(store: Any, rank: int, world: int, line: str | None, timeout_minutes: float
             ) -> tuple[list[str | None], Any]:
    """Every rank's start-up error line (None: it started), in rank order, and `store` under
    this start-up's prefix: sets this rank's `line` and waits up to `timeout_minutes` for every
    other rank's."""
    import torch.distributed as dist

    _said["this process"] = True
    deadline = time.monotonic() + timeout_minutes * 60.0
    gate = dist.PrefixStore(_this_start(dist.PrefixStore("bertgpu/startup", store), rank, world,
                                        deadline), store)
    keys = [f"rank{r}" for r in range(world)]
    gate.set(keys[rank], "" if line is None else "!" + line)
    _wait(gate, keys, deadline)
    lines = [gate.get(k).decode("utf-8", "replace") for k in keys]
    gate.add("read", 1)
    said_lines = [text[1:] if text else None for text in lines]
    if rank == 0 and any(said_lines):  # rank 0 stops now: its store must outlive their reads
        deadline = time.monotonic() + min(60.0, timeout_minutes * 60.0)
        while gate.add("read", 0) < world and time.monotonic() < deadline:
            time.sleep(_POLL_S)
    return said_lines, gate


def _this_start(store: Any, rank: int, world: int, deadline: float) -> str:
    """This start-up's key prefix, the same on every rank and new on each (a store kept from an
    earlier attempt holds that attempt's keys): rank 0 draws it and answers every other rank's
    fresh word ("hello{r}") with "word/id" ("welcome{r}"), again whenever that word changes (it
    may first read an earlier attempt's), until the rank set its key under the id."""
    if rank != 0:
        word = secrets.token_hex(8)
        store.set(f"hello{rank}", word)
        while True:
            _wait(store, [f"welcome{rank}"], deadline)
            said, _, start = store.get(f"welcome{rank}").decode().partition("/")
            if said == word:
                return f"bertgpu/startup/{start}"
            _sleep_until(deadline, f"rank 0's answer to rank {rank}")
    start = secrets.token_hex(8)
    answered: dict[int, bytes] = {}
    waiting = set(range(1, world))
    while waiting:
        for r in sorted(waiting):
            if store.check([f"hello{r}"]):
                word = store.get(f"hello{r}")
                if answered.get(r) != word:
                    store.set(f"welcome{r}", word + b"/" + start.encode())
                    answered[r] = word
            if r in answered and store.check([f"{start}/rank{r}"]):
                waiting.discard(r)
        if waiting:
            _sleep_until(deadline, f"rank {min(waiting)}")
    return f"bertgpu/startup/{start}"


def _wait(store: Any, keys: list[str], deadline: float) -> None:
    store.wait(keys, timedelta(seconds=max(0.001, deadline - time.monotonic())))


def _sleep_until(deadline: float, what: str) -> None:
    import torch.distributed as dist

    if time.monotonic() >= deadline:
        raise dist.DistStoreError(f"start-up: timed out waiting for {what}")
    time.sleep(_POLL_S)


def store_for_group(rank: int, world: int, timeout_minutes: float) -> Any:
    """A healthy rank's store for `init_process_group(store=...)`, once every rank said it
    started (torch's own "default_pg" prefix, as its env:// path makes, under this start-up's:
    gloo read an earlier attempt's addresses from a kept store, "Connection refused"); raises
    the first other rank's start-up error as "rank R stopped at start-up: LINE"."""
    import torch.distributed as dist

    store, _, _ = rendezvous(timeout_minutes)
    lines, gate = exchange(store, rank, world, None, timeout_minutes)
    failed = [(r, text) for r, text in enumerate(lines) if text]
    if failed:
        raise BertgpuError(f"rank {failed[0][0]} stopped at start-up: {failed[0][1]}")
    return dist.PrefixStore("default_pg", gate)


def hand_over(line: str, timeout_minutes: float) -> None:
    """A failing rank's `line` to the others (before it stops), once per start-up."""
    if said():
        return
    store, rank, world = rendezvous(timeout_minutes)
    exchange(store, rank, world, line, timeout_minutes)
