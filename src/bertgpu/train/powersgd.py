"""PowerSGD (`distributed.comm_hook = "powersgd"`) with a state that checkpoints and resumes.

torch's `PowerSGDState` carries, per rank, the iteration count (the first `start_powerSGD_iter`
steps all-reduce uncompressed), the error-feedback residual of every gradient bucket (what
compression lost, added back at the next step) and the low-rank factors P and Q (Q warm-starts the
next step). A run resumed without them starts over: 10 uncompressed steps, then no residuals and
new factors, so it leaves the path of the run that was never interrupted.
`PowerSGDHook.state_dict()` saves them and `load_state_dict()` restores them; the loop gathers
every rank's into the checkpoint (train/loop_state.py).

Buckets are keyed by DDP's bucket index, and DDP rebuilds its buckets after a process's first
step in the order the gradients arrived: the layout of a resumed process's first step is not the
one the state was saved under. So the state is saved per parameter (by name), and this hook
re-cuts it whenever a bucket's parameters differ from those it was stored under: at a resume, and
at the rebuild after it. Each parameter's residual, P and Q are the same numbers in any bucket
(the compression works tensor by tensor and sums elementwise), so a resumed run continues exactly.

A parameter with nothing stored (the first compressed step, or the first after a reset: a skipped
step or an fp16 scale change) starts per parameter too: a zero residual and a fresh Q drawn from a
generator seeded by its name and the iteration count, the same on every rank. torch's hook draws
one seed per bucket from the state's generator and fills the bucket's Qs in their order there; the
checkpoint of a skipped step holds no factors, and the resumed process's first step, in the other
layout, drew other Qs than the run that went on. Handed every bucket's factors, torch's hook only
orthogonalizes Q, as it does a fresh one, and never draws (the generator is still saved and
restored, so checkpoints keep their format).

On gloo (CPU) each bucket's collectives end before the next bucket's begin. torch's hook chains
three all-reduces per bucket in callbacks, which gloo runs on its own threads as each one
completes: with several buckets the ranks then issued them in different orders, and the first
compressed step died of a "collective mismatch" (SIGABRT). NCCL's callbacks run in order on the
calling thread; there the hook is left asynchronous.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

_KINDS = ("error", "p", "q")  # the residual, then the P and Q factors, of each parameter


class PowerSGDHook:
    """torch's PowerSGD hook (rank 1, from the 10th step on) over `model`'s parameters, its state
    re-cut per bucket layout; register `self.hook` with `self.state`."""

    def __init__(self, model: torch.nn.Module) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

        self.state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                 start_powerSGD_iter=10)
        self._inner = powerSGD_hook.powerSGD_hook
        self._names = {id(p): n for n, p in model.named_parameters()}
        self._layouts: dict[int, tuple[tuple[str, torch.Size], ...]] = {}  # bucket -> its tensors
        self._pool: dict[str, dict[str, torch.Tensor]] = {}  # name -> kind -> its piece
        self._in_order: bool | None = None  # wait for each bucket (gloo): set at the first call

    # No annotations on the hook: DDP checks them (see distributed.CommTimer.wrap).
    def hook(self, state, bucket):  # type: ignore[no-untyped-def]
        """Before torch's hook: the bucket's state in the layout DDP uses now."""
        index = bucket.index()
        layout = tuple((self._names[id(p)], g.shape)
                       for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True))
        if self._layouts.get(index) != layout:
            # DDP calls buckets in index order and finishes a step's before the next step: the
            # buckets before this one kept their layout and are done, the others are not used yet.
            for other in [b for b in self._layouts if b >= index]:
                self._to_pool(other)
            self._layouts[index] = layout
        # Compressing, or with pieces waiting in the pool: the bucket's memory, every piece.
        if index not in state.p_memory_dict and (state.iter >= state.start_powerSGD_iter
                                                 or self._pool):
            self._from_pool(index, layout, bucket.buffer())
        if self._in_order is None:
            import torch.distributed as dist

            self._in_order = (dist.is_initialized()
                              and dist.get_backend(state.process_group) == "gloo")
        future = self._inner(state, bucket)
        if self._in_order:  # see the module docstring
            future.wait()
        return future

    def reset(self) -> None:
        """Forget the residuals and factors (after a non-finite step or an fp16 scale change:
        distributed.reset_comm_hook_state); the iteration count goes on."""
        for memory in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
            memory.clear()
        self._layouts.clear()
        self._pool.clear()

    # -- per bucket <-> per parameter -------------------------------------------------------------
    def _pieces(self, layout: tuple[tuple[str, torch.Size], ...]
                ) -> dict[str, list[tuple[str, int]]]:
        """kind -> (name, length) of each piece, in the order the bucket's memory holds them:
        the residual is the bucket's flat gradient; P and Q hold the compressed tensors grouped
        by matrix shape in first-seen order, as torch's hook lays them out (no batching)."""
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

        s = self.state
        pieces: dict[str, list[tuple[str, int]]] = {"error": [], "p": [], "q": []}
        groups: dict[tuple[int, int], list[tuple[str, int, int]]] = {}
        for name, shape in layout:
            numel = shape.numel()
            pieces["error"].append((name, numel))
            n = shape[0] if len(shape) else 1
            m = numel // n if n else 0
            rank = min(n, m, s.matrix_approximation_rank)
            if _should_compress(n, m, rank, s.min_compression_rate)[0]:
                groups.setdefault((n, m), []).append((name, n * rank, m * rank))
        for members in groups.values():
            for name, p_len, q_len in members:
                pieces["p"].append((name, p_len))
                pieces["q"].append((name, q_len))
        return pieces

    def _memories(self) -> dict[str, dict[int, torch.Tensor]]:
        s = self.state
        return {"error": s.error_dict, "p": s.p_memory_dict, "q": s.q_memory_dict}

    def _split(self, index: int, layout: tuple[tuple[str, torch.Size], ...], pop: bool
               ) -> list[tuple[str, str, torch.Tensor]]:
        """(name, kind, piece) of bucket `index`'s residual and factors cut per parameter (views;
        `pop` takes them out of torch's state). A memory of another size is left out."""
        out = []
        for kind, pieces in self._pieces(layout).items():
            memory = self._memories()[kind]
            flat = memory.pop(index, None) if pop else memory.get(index)
            if flat is None or flat.numel() != sum(n for _, n in pieces):
                continue
            for (name, _), piece in zip(pieces, flat.split([n for _, n in pieces]), strict=True):
                out.append((name, kind, piece))
        return out

    def _to_pool(self, index: int) -> None:
        """Bucket `index`'s residual and factors into per-parameter pieces."""
        for name, kind, piece in self._split(index, self._layouts.pop(index), pop=True):
            self._pool.setdefault(name, {})[kind] = piece

    def _from_pool(self, index: int, layout: tuple[tuple[str, torch.Size], ...],
                   like: torch.Tensor) -> None:
        """Bucket `index`'s residual and factors from the pool, on `like`'s device and dtype; a
        parameter without its piece starts afresh (see the module docstring). Every bucket gets
        its factors, empty ones too: torch's hook would draw Qs of its own for a bucket without."""
        for kind, pieces in self._pieces(layout).items():
            parts = []
            for name, n in pieces:
                kinds = self._pool.get(name, {})
                part = kinds.pop(kind, None)
                if not kinds:
                    self._pool.pop(name, None)
                if part is None or part.numel() != n:
                    part = self._fresh_q(name, n) if kind == "q" else torch.zeros(n)
                parts.append(part.to(device=like.device, dtype=like.dtype))
            joined = torch.cat(parts) if parts else like.new_zeros(0)
            self._memories()[kind][index] = joined

    def _fresh_q(self, name: str, numel: int) -> torch.Tensor:
        """A fresh Q for parameter `name`: its own seed at this iteration, on every rank alike,
        in any bucket layout (torch's hook orthogonalizes it)."""
        digest = hashlib.sha256(f"{self.state.iter} {name}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        return torch.randn(numel, generator=generator)

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's state as plain values and CPU tensors (`torch.load(weights_only=True)`),
        per parameter; between steps only (no bucket in flight)."""
        s = self.state
        pool = {name: dict(kinds) for name, kinds in self._pool.items()}
        for index, layout in self._layouts.items():
            for name, kind, piece in self._split(index, layout, pop=False):
                pool.setdefault(name, {})[kind] = piece
        name, keys, pos, has_gauss, cached = s.rng.get_state(legacy=True)
        return {
            "iter": int(s.iter),
            "rng": [str(name), torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss),
                    float(cached)],
            "stats": [int(s.total_numel_before_compression),
                      int(s.total_numel_after_compression), int(s.next_stats_report)],
            "params": {n: {k: t.detach().to("cpu", copy=True) for k, t in kinds.items()}
                       for n, kinds in pool.items() if kinds},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A `state_dict()` of this rank; each bucket takes its pieces at its next call."""
        import numpy as np

        self.reset()
        s = self.state
        s.iter = int(state["iter"])
        name, keys, pos, has_gauss, cached = state["rng"]
        s.rng.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss),
                         float(cached)))
        before, after, report = state["stats"]
        s.total_numel_before_compression, s.total_numel_after_compression = before, after
        s.next_stats_report = report
        self._pool = {n: {k: t for k, t in kinds.items() if k in _KINDS}
                      for n, kinds in state["params"].items()}
