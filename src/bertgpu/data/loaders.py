"""The micro batches one rank needs for one optimizer step, resumable by global position.

    from bertgpu.data.loaders import PretrainLoader
    from bertgpu.data.masking import MaskingConfig

    loader = PretrainLoader(train, MaskingConfig(mask_rate=0.15), global_batch_size=256,
                            micro_batch_size=32, rank=rank, world_size=world, seed=1234)
    micro_batches = loader.next_step()              # accumulation_steps dicts of torch.long tensors
    state = loader.state_dict()                     # {"position": ..., "seed": ...}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from bertgpu.data.masking import Masker, MaskingConfig, check_seed, positions_to_indices
from bertgpu.data.shards import ShardSet
from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    import torch


# --------------------------------------------------------------------------------------------
# Batches and loaders


def _make_batch(shards: ShardSet, masker: Masker, seed: int, epochs: np.ndarray,
                indices: np.ndarray, static_shapes: bool = False) -> dict[str, torch.Tensor]:
    """Samples (epoch, index) -> one model batch of torch.long tensors (B, T) / (B,).
    `static_shapes`: the metadata's MLM positions padded to the most B rows can get
    (`Masker.most_per_row`), so every batch of B rows has the same shapes."""
    import torch

    raw = shards.get(indices)
    masked, labels = masker.mask_batch(raw["input_ids"], raw["lengths"], seed, epochs, indices,
                                       word_starts=raw.get("word_starts"))
    T = masked.shape[1]
    attention_mask = (np.arange(T)[None, :] < raw["lengths"][:, None]).astype(np.int64)  # (B, T)
    batch = {
        "input_ids": torch.from_numpy(masked),
        "attention_mask": torch.from_numpy(attention_mask),
        "token_type_ids": torch.from_numpy(raw["token_type_ids"]),
        "labels": torch.from_numpy(labels),
    }
    if "nsp_labels" in raw:
        batch["next_sentence_label"] = torch.from_numpy(raw["nsp_labels"])
    capacity = len(indices) * masker.most_per_row(T) if static_shapes else None
    return _with_meta(batch, capacity)


def _with_meta(batch: dict[str, Any], masked_capacity: int | None = None) -> dict[str, Any]:
    """The batch with its host-side `BatchMeta` (padding, unpad indices, MLM rows) under
    "batch_meta": computed here on the CPU (in the worker processes), so the model's forward
    never waits on the device to find them."""
    from bertgpu.batch import batch_meta

    return {**batch, "batch_meta": batch_meta(batch["attention_mask"], batch["labels"],
                                              masked_capacity=masked_capacity)}


class _MicroBatches:
    """Map-style dataset for torch's DataLoader: item j is this rank's j-th micro batch after
    global position `start` (step j // A, micro batch j % A). Each step this rank takes `share`
    samples starting `offset` into the step's window, in micro batches of `micro_batch_size`
    (the last one smaller when the share does not divide; never of one row after a larger one:
    then the one before gives it a row, see `positions`). Picklable for worker processes."""

    def __init__(self, shards: ShardSet, masker: Masker, seed: int, start: int,
                 global_batch_size: int, micro_batch_size: int, offset: int, share: int,
                 static_shapes: bool = False) -> None:
        self.shards, self.masker, self.seed, self.start = shards, masker, seed, start
        self.static_shapes = static_shapes
        self.G, self.m = global_batch_size, micro_batch_size
        self.offset, self.share = offset, share
        self.A = -(-share // micro_batch_size)

    def positions(self, j: int) -> np.ndarray:
        step, micro = divmod(j, self.A)
        first = self.start + step * self.G + self.offset + micro * self.m
        size = min(self.m, self.share - micro * self.m)
        # A share one above a multiple of the micro batch (load balancing's 17 of 16) ended in a
        # micro batch of one row, which a compiled model compiles again for (torch specialises
        # sizes 0 and 1), mid-run: the micro batch before it gives it a row.
        if self.share % self.m == 1 and self.A > 1 and self.m > 2 and micro >= self.A - 2:
            first, size = (first, size - 1) if micro == self.A - 2 else (first - 1, 2)
        return np.arange(first, first + size, dtype=np.int64)

    def __getitem__(self, j: int) -> dict[str, torch.Tensor]:
        epochs, indices = positions_to_indices(self.positions(j), len(self.shards), self.seed)
        return _make_batch(self.shards, self.masker, self.seed, epochs, indices,
                           self.static_shapes)

    def __len__(self) -> int:
        return 1 << 62  # endless: the loader stops asking, not the dataset


def _own_memory(value: Any) -> Any:
    """`value` (a micro batch: a dict of tensors and its `BatchMeta`) with every tensor copied
    out of the shared memory a loader worker sent it in, which then closes its descriptor."""
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _own_memory(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _own_memory(getattr(value, f.name))
                                             for f in dataclasses.fields(value) if f.init})
    return value


def _as_masker(masking: Masker | MaskingConfig, shards: ShardSet) -> Masker:
    if isinstance(masking, Masker):
        return masking
    if isinstance(masking, MaskingConfig):
        return Masker.from_shards(masking, shards)
    raise TypeError(f"expected a Masker or MaskingConfig, got {type(masking).__name__}")


def ignore_stop_signals(worker_id: int) -> None:
    """In a loader worker: ignore SIGTERM, SIGINT and SIGHUP. A scheduler's preemption (SIGTERM
    to every process of the job), Ctrl-C (SIGINT to the terminal's process group) or a closed
    terminal reaches the workers too; if they died of it, the main process would fail with
    "DataLoader worker killed" before it could write its preemption checkpoint. The main process
    decides; the workers end when it closes the loader (or dies, which torch's workers watch
    for)."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal: the main process stops


class PretrainLoader:
    """The micro batches of one rank, one optimizer step at a time, resumable by global position.

    Step s covers global positions [pos, pos + G); rank r takes [pos + r*G/W, pos + (r+1)*G/W),
    cut into `accumulation_steps` micro batches of `micro_batch_size`. The state is the global
    position alone, so a resumed run (any world size or micro batch size) sees the same samples.
    `set_shares([n_0, ..., n_W-1])` (summing to G) gives rank r the n_r samples after those of
    ranks < r instead (load balancing across unequal devices): the same samples per step, split
    differently.
    With `num_workers > 0` a torch DataLoader prepares the next micro batches in worker
    processes while the model computes; the batches are identical to `num_workers=0`.

    `bucket_window=k` (k >= 1; 0 = off) sorts the samples of each window of k micro batches by
    length and cuts every micro batch to its own longest sequence (`bucket_by_length`): the same
    samples with the same masks in the same step, less padding, and, since the engine normalises
    by the step's token count, the same step loss.

    `static_shapes=True` gives every micro batch of a run the same shapes, for CUDA graphs (which
    replay one shape): the MLM positions of the batch metadata are padded to the most the masking
    can give (`BatchMeta.masked_count`); no bucketing then.

    `load_state_dict` refuses a state of another seed (its position counts samples in that seed's
    order) unless `allow_seed_change` (`bertgpu pretrain --allow-data-change`): the loader then
    goes on from that position in its own seed's order and masks.
    """

    def __init__(
        self,
        shards: ShardSet,
        masking: Masker | MaskingConfig,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
        bucket_window: int = 0,
        static_shapes: bool = False,
        allow_seed_change: bool = False,
        compiled: bool = False,
    ) -> None:
        for name, value in (("global_batch_size", global_batch_size),
                            ("micro_batch_size", micro_batch_size), ("world_size", world_size)):
            if not isinstance(value, int) or value <= 0:
                raise BertgpuError(f"{name}: found {value!r}, expected a positive integer")
        if not 0 <= rank < world_size:
            raise BertgpuError(f"rank {rank} is outside [0, {world_size})")
        if global_batch_size % (micro_batch_size * world_size):
            raise BertgpuError(
                f"global_batch_size {global_batch_size} is not divisible by micro_batch_size "
                f"{micro_batch_size} x {world_size} device{'s' if world_size > 1 else ''}; "
                f"expected a multiple of {micro_batch_size * world_size}"
            )
        if len(shards) == 0:
            raise BertgpuError(f"{shards.manifest_path}: split {shards.split!r} has no sequences")
        if num_workers < 0:
            raise BertgpuError(f"num_workers: found {num_workers}, expected >= 0")
        if not isinstance(bucket_window, int) or bucket_window < 0:
            raise BertgpuError(f"bucket_window: found {bucket_window!r}, expected an "
                               "integer >= 0 (0 = off)")
        if static_shapes and bucket_window:
            raise BertgpuError("bucket_window: batches cut to their own longest sequence change "
                               "shape, which static_shapes (CUDA graphs) rules out; expected 0")
        self.bucket_window = bucket_window
        self.static_shapes = static_shapes
        self.shards = shards
        # A compiled model that masks attention guards on `BatchMeta.padded`: the first batch
        # with padding in a run of full ones (or the reverse) compiled it again, mid-run. When
        # the split has any, every batch says padded: one graph (full rows mask nothing).
        self.always_masked = compiled and shards.has_short_rows()
        self.masker = _as_masker(masking, shards)
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed = check_seed(seed)
        self.allow_seed_change = allow_seed_change
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.prefetch_factor = prefetch_factor
        self.position = 0  # global position of the next step's first sample
        self.shares = [global_batch_size // world_size] * world_size  # samples per rank per step
        self._iter: Iterator[dict[str, torch.Tensor]] | None = None

    @property
    def accumulation_steps(self) -> int:
        """Micro batches per optimizer step on this rank: G / (micro x world) with equal shares,
        ceil(share / micro) otherwise."""
        return -(-self.shares[self.rank] // self.micro_batch_size)

    def set_shares(self, shares: list[int]) -> None:
        """Samples per rank per step from the next step on (see the class docstring)."""
        if (len(shares) != self.world_size or sum(shares) != self.global_batch_size
                or any(int(n) < 1 for n in shares)):
            raise BertgpuError(f"shares {shares}: expected {self.world_size} positive numbers "
                               f"summing to the global batch {self.global_batch_size}")
        shares = [int(n) for n in shares]
        if shares != self.shares:
            self.shares = shares
            self._iter = None  # prefetched batches were cut for the old shares

    @property
    def epoch(self) -> int:
        """Epoch of the next step's first sample (position // number of sequences)."""
        return self.position // len(self.shards)

    def repeats_note(self) -> str | None:
        """A global batch larger than the split: every step then holds each sequence more than
        once (with other masks), which the start-up says; None otherwise."""
        n, g = len(self.shards), self.global_batch_size
        if g <= n:
            return None
        return (f"train.global_batch_size {g} > the {n:,} {self.shards.split} sequences of "
                f"{self.shards.data_dir}: each step holds every sequence about "
                f"{g / n:.1f} times (with other masks)")

    def _dataset(self) -> _MicroBatches:
        return _MicroBatches(self.shards, self.masker, self.seed, self.position,
                             self.global_batch_size, self.micro_batch_size,
                             sum(self.shares[: self.rank]), self.shares[self.rank],
                             self.static_shapes)

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's micro batches for the next optimizer step; advances the position by G."""
        A = self.accumulation_steps
        pin = False
        if self.num_workers == 0:
            ds = self._dataset()
            out = [ds[j] for j in range(A)]
            pin = self.pin_memory
        else:
            if self._iter is None:
                import torch.utils.data

                # The dataset starts at the current position; the sampler walks it in order and
                # the DataLoader keeps prefetch_factor x num_workers micro batches in flight.
                loader = torch.utils.data.DataLoader(
                    self._dataset(), batch_size=None, sampler=range(1 << 62),
                    num_workers=self.num_workers, pin_memory=self.pin_memory,
                    prefetch_factor=self.prefetch_factor, worker_init_fn=ignore_stop_signals,
                    # Its own generator: a DataLoader without one draws its workers' base seed from
                    # the global torch RNG, which would shift the dropout stream and break exact
                    # resume (and make num_workers change the result). Batches are deterministic
                    # anyway (order and masks come from the seed, not from this generator).
                    generator=torch.Generator().manual_seed(0),
                )
                self._iter = iter(loader)
            # Each tensor a worker sends keeps a file descriptor open while it lives (torch's
            # file_descriptor sharing): A micro batches held at once took about 9 A of them, and
            # bert-large's accumulation of 4096 ended in "Too many open files". A step of more
            # than one is copied into this process's memory as it arrives (a few kB each).
            out = [next(self._iter) if A == 1 else _own_memory(next(self._iter))
                   for _ in range(A)]
        if self.bucket_window:
            out = bucket_by_length(out, self.bucket_window)
            pin = self.pin_memory  # new tensors: pin them again
        if self.always_masked:
            out = [{**mb, "batch_meta": dataclasses.replace(mb["batch_meta"], padded=True)}
                   for mb in out]
        if pin:
            import torch

            # page-locked memory makes .to(device, non_blocking=True) async
            if torch.cuda.is_available():
                out = [{k: v.pin_memory() for k, v in mb.items()} for mb in out]
        self.position += self.global_batch_size
        return out

    def __iter__(self) -> Iterator[list[dict[str, torch.Tensor]]]:
        while True:
            yield self.next_step()

    def close(self) -> None:
        """Stop the worker processes (they restart on the next `next_step`)."""
        self._iter = None

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        position = state.get("position")
        if not isinstance(position, (int, np.integer)) or position < 0:
            raise BertgpuError(f"data loader state: position: found {position!r}, expected "
                               "an integer >= 0")
        if "seed" in state and int(state["seed"]) != self.seed and not self.allow_seed_change:
            raise BertgpuError(
                f"data loader state: seed: the state's samples were ordered and masked with seed "
                f"{state['seed']}, this loader's seed is {self.seed}; expected seed "
                f"{state['seed']} to resume (another seed changes the sample order), or "
                "allow_seed_change to go on in this seed's order"
            )
        self.position = int(position)
        self._iter = None  # prefetched batches belong to the old position


def iter_eval_batches(
    shards: ShardSet,
    masking: Masker | MaskingConfig,
    batch_size: int,
    seed: int = 0,
    max_batches: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    max_samples: int | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Iterate a split once, in order, with fixed masks (epoch 0), for evaluation.

    Batch k holds samples [k*batch_size, (k+1)*batch_size) (the last may be short) of the first
    `max_samples` (all when None); rank r gets batches r, r + world_size, ... of the first
    `max_batches` (all when None). A sample's mask depends on its index only, never on the batch.
    """
    if batch_size <= 0:
        raise BertgpuError(f"batch_size: found {batch_size}, expected a positive integer")
    masker = _as_masker(masking, shards)
    seed = check_seed(seed)
    n = len(shards) if max_samples is None else min(len(shards), max_samples)
    n_batches = -(-n // batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for k in range(rank, n_batches, world_size):
        indices = np.arange(k * batch_size, min((k + 1) * batch_size, n), dtype=np.int64)
        yield _make_batch(shards, masker, seed, np.zeros_like(indices), indices)


class ValidationLoader:
    """Re-iterable `iter_eval_batches`: `for batch in ValidationLoader(...)` once per evaluation."""

    def __init__(self, shards: ShardSet, masking: Masker | MaskingConfig, batch_size: int,
                 seed: int = 0, max_batches: int | None = None, rank: int = 0,
                 world_size: int = 1) -> None:
        self.shards, self.masker = shards, _as_masker(masking, shards)
        self.batch_size, self.seed, self.max_batches = batch_size, seed, max_batches
        self.rank, self.world_size = rank, world_size

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return iter_eval_batches(self.shards, self.masker, self.batch_size, self.seed,
                                 self.max_batches, self.rank, self.world_size)

    def __len__(self) -> int:
        """Batches this rank yields."""
        n_batches = -(-len(self.shards) // self.batch_size)
        if self.max_batches is not None:
            n_batches = min(n_batches, self.max_batches)
        return len(range(self.rank, n_batches, self.world_size))


def bucket_width(longest: int, width: int) -> int:
    """Padded width of a bucketed micro batch: `longest` rounded up to a multiple of 8 (up to 64)
    or of 64 (above), never above the batch's `width`. Few distinct shapes, so a compiled model
    recompiles a bounded number of times (at most 8 + width / 64) while padding stays small."""
    step = 8 if longest <= 64 else 64
    return min(width, -(-longest // step) * step)


def trim_batch(batch: Mapping[str, Any], round_width: bool = False) -> dict[str, Any]:
    """Cut the T axis to the longest real sequence in the batch (same math, less padding);
    `round_width` keeps `bucket_width` of it instead.

    Works on model batches (torch, with `attention_mask`) and on `ShardSet.get` output (numpy,
    with `lengths`). Every (B, T) entry is cut to (B, L); padded positions carry no labels and
    are masked out of attention, so the loss is unchanged. A "batch_meta" is recomputed.
    """
    if "attention_mask" in batch:
        am = batch["attention_mask"]
        T = am.shape[1]
        L = int(am.sum(1).max()) if am.shape[0] else 0
    elif "lengths" in batch:
        T = batch["input_ids"].shape[1]
        L = int(np.max(np.asarray(batch["lengths"]))) if len(batch["lengths"]) else 0
    else:
        raise KeyError("trim_batch needs 'attention_mask' or 'lengths'")
    L = max(L, 1)
    if round_width:
        L = bucket_width(L, T)
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if getattr(value, "ndim", 0) == 2 and value.shape[1] == T and L < T:
            value = value[:, :L]
            value = (value.contiguous() if hasattr(value, "contiguous")
                     else np.ascontiguousarray(value))
        out[key] = value
    return _with_meta(out) if "batch_meta" in out else out


def bucket_by_length(micro_batches: list[dict[str, torch.Tensor]], window: int,
                     round_width: bool = True) -> list[dict[str, torch.Tensor]]:
    """Less padding with the same samples: sort each window of `window` micro batches by length.

    The samples of micro batches [w*k, (w+1)*k) are pooled, stably sorted by their real length
    (attention_mask row sums, longest first) and dealt back into micro batches of the original
    sizes, each then cut to its own longest sequence by `trim_batch` (rounded up to
    `bucket_width` unless `round_width` is False). Rows move whole (input ids,
    mask, labels, NSP label together), so every sample keeps its mask, and the step holds exactly
    the same samples. Windows never cross a step, so the global order of steps is unchanged.
    """
    import torch

    if window < 1:
        raise BertgpuError(f"bucket_window: found {window}, expected >= 1")
    out: list[dict[str, torch.Tensor]] = []
    for start in range(0, len(micro_batches), window):
        group = micro_batches[start:start + window]
        sizes = [int(mb["input_ids"].shape[0]) for mb in group]
        # (sum sizes, T) / (sum,); the metadata is not a row of samples: trim_batch rebuilds it
        pooled = {k: torch.cat([mb[k] for mb in group]) for k in group[0] if k != "batch_meta"}
        lengths = pooled["attention_mask"].sum(1)  # (n,)
        order = torch.sort(lengths, descending=True, stable=True).indices
        for part in torch.split(order, sizes):
            rows = {k: v.index_select(0, part) for k, v in pooled.items()}
            if "batch_meta" in group[0]:
                rows["batch_meta"] = None
            out.append(trim_batch(rows, round_width))
    return out
