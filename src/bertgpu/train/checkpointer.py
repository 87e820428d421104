"""How the model and the optimizer of a run go into its checkpoints and come back.

The loop (train/loop.py) decides when to save and what the train state holds; a checkpointer
writes it, one per strategy (`make_checkpointer`), into `RUN_DIR/checkpoints/step_N/`:

- `FullCheckpoints` (ddp, or one process; train/full_checkpoints.py): rank 0 writes
  model.safetensors and train_state.pt with the optimizer's state dict
  (`checkpoint.save_checkpoint`), in place or, from a host copy, in the background.
- `ShardedCheckpoints` (fsdp): every rank writes its shards of the weights and of the optimizer
  state with torch.distributed.checkpoint (DCP: `.metadata`, `__R_0.distcp`) into `step_N.tmp/`;
  rank 0 adds train_state.pt (no optimizer), seals the folder (checksums over every file,
  COMPLETE) once every rank's files are written, and renames it into place. In the background
  (`checkpoint.async_save`) the shards are copied to CPU memory (the only time training waits:
  the stall, logged) and written by a background thread while training goes on; sealing and
  renaming happen in the background too, after the write completed, so a crash during the write
  leaves the previous checkpoint the newest complete one. A failed background write stops every
  rank at the next step (the loop passes `failed` in the step's signals).

`make_checkpointer` decides once, for every rank alike, whether checkpoints are written in the
background: `checkpoint.async_save` and a host copy that fits in memory (train/hostcopy.py).

`restore` reads any checkpoint into any model: a sharded one into a sharded model (resharded by
DCP to this world size) or into a plain one (full tensors), a full one into a plain model or
into a sharded one (each rank keeps its shard). So a ddp run resumes as fsdp and back, at any
world size.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from bertgpu.errors import BertgpuError
from bertgpu.models import layout
from bertgpu.testing import faults
from bertgpu.train import distributed, sharding
from bertgpu.train.checkpoint import (
    _RESERVED,
    STATE_FILE,
    _prune,
    _save_failed,
    _torch_save,
    check_free_space,
    checkpoint_dir,
    disk_full,
    is_sharded_checkpoint,
    list_checkpoints,
)
from bertgpu.train.continued import optimizer_state_mismatch
from bertgpu.train.full_checkpoints import FullCheckpoints, Pending, Written, agree, first_line

MODEL_KEY, OPTIM_KEY = (
    "model",
    "optim",
)  # the two trees of a DCP checkpoint: "model.<fqn>", "optim..."


class ShardedCheckpoints:
    """fsdp runs: DCP shards from every rank, sealed by rank 0 (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        info: distributed.DistInfo,
        keep_last: int,
        background: bool,
        timeout_minutes: float,
        note: str = "",
    ) -> None:
        self.run_dir, self.info, self.keep_last = Path(run_dir), info, keep_last
        self.background, self.note = background, note
        self.last_write_s: float | None = None  # the last save, copy and write, for estimates
        self._stall_s = 0.0
        self.failed = False
        self.error: BertgpuError | None = None
        self._pending: Pending | None = None
        self._group = self._executor = None
        if background:
            import datetime

            import torch.distributed as dist

            # The background write's collectives (plans, results) need a group of their own: on
            # the training group they would interleave with the step's collectives. Gloo also
            # gives NCCL runs the CPU backend DCP's async save requires.
            self._group = dist.new_group(
                backend="gloo", timeout=datetime.timedelta(minutes=timeout_minutes)
            )
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertgpu-ckpt")

    # -- saving ------------------------------------------------------------------------------------
    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any] | None,
        files: dict[str, str],
        background: bool = False,
    ) -> Path | None:
        """Collective. Writes step N's shards (in the background when asked and configured);
        returns the final folder once written, None while a background write goes on."""
        import torch.distributed.checkpoint as dcp

        self.wait()
        background = background and self.background
        t0 = time.perf_counter()
        final = checkpoint_dir(self.run_dir, step)
        tmp = final.with_name(final.name + ".tmp")
        agree(self._prepare(tmp) if self.info.is_main else None, f"{tmp}: preparing it")
        tree = _dcp_state(model, optimizer)
        needed = int(distributed.all_reduce_sum(_local_bytes(tree)))
        error, future = None, None
        try:
            if self.info.is_main:
                check_free_space(self.run_dir, needed)
            if background:
                future = dcp.async_save(
                    tree, storage_writer=_Writer(tmp, step), process_group=self._group
                )
            else:
                dcp.save(tree, storage_writer=_Writer(tmp, step))
            if self.info.is_main:
                _write_rank0_files(tmp, state or {}, files)
        except (Exception, _checkpoint_exception()) as exc:
            error = self._failure(exc, final, tmp, needed)
        agree(error, f"{self.run_dir}: the checkpoint of step {step}")
        if future is None:  # written: rank 0 seals and renames, the others learn how it went
            seal_error = None
            if self.info.is_main:
                try:
                    self._seal(tmp, final, step, needed, None)
                except BertgpuError as exc:
                    seal_error = exc
            agree(seal_error, f"{self.run_dir}: sealing the checkpoint of step {step}")
            self.last_write_s = time.perf_counter() - t0
            return final
        if self.info.is_main:  # seal after the write, in the background as well
            future = self._executor.submit(self._seal, tmp, final, step, needed, future)
        self._stall_s = time.perf_counter() - t0
        self._pending = Pending(step, time.perf_counter(), future)
        return None

    def _prepare(self, tmp: Path) -> BertgpuError | None:
        try:
            if tmp.exists():  # left over from a crash
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        except OSError as exc:
            return BertgpuError(
                f"{tmp}: cannot create the checkpoint folder: {exc.strerror or exc}"
            )
        return None

    def _seal(self, tmp: Path, final: Path, step: int, needed: int, write: Future | None) -> Path:
        """Rank 0, after every rank's shards are written (DCP's save returns on rank 0 only after
        gathering every rank's results): checksums, COMPLETE, rename, prune. In the background
        thread for an async save; a failure removes `tmp` and raises BertgpuError."""
        from bertgpu import fsutil

        try:
            if write is not None:
                write.result()
            for path in sorted(tmp.glob("*.distcp")) + [tmp / ".metadata"]:
                faults.check_write(path)
            fsutil.seal(tmp, note=f"step {step}", after_write=faults.check_write)
            fsutil.replace_dir(tmp, final, between=faults.between_renames)
        except (Exception, _checkpoint_exception()) as exc:
            raise self._failure(exc, final, tmp, needed) from None
        if self.keep_last > 0:
            _prune(self.run_dir, final, step, self.keep_last)
        return final

    def _failure(self, exc: BaseException, final: Path, tmp: Path, needed: int) -> BertgpuError:
        if self.info.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, BertgpuError):
            return exc
        os_error = _os_error(exc) or disk_full(final.parent, needed)
        if os_error is not None:
            return _save_failed(self.run_dir, final, os_error, needed)
        return BertgpuError(f"{final.parent}: cannot write {final.name}: {first_line(exc)}")

    # -- the background write --------------------------------------------------------------------
    def poll(self) -> Written | None:
        """This rank, between steps: the background write that just finished, if any. A failure
        sets `failed` (the loop shares it in the next step's signals) and keeps the error."""
        p = self._pending
        if p is None or not p.future.done():
            return None
        return self._collect()

    def wait(self) -> Written | None:
        """Collective: finish the background write, if any; raise on every rank if it failed."""
        done = self._collect() if self._pending is not None else None
        if self.background:
            agree(self.error, f"{self.run_dir}: a background checkpoint write")
        return done

    def _collect(self) -> Written | None:
        p, self._pending = self._pending, None
        assert p is not None
        try:
            p.future.result()
        except (Exception, _checkpoint_exception()) as exc:
            self.error = (
                exc
                if isinstance(exc, BertgpuError)
                else BertgpuError(
                    f"{self.run_dir}: the background write of step {p.step} failed: "
                    f"{first_line(exc)}"
                )
            )
            self.failed = True
            return None
        written = Written(p.step, time.perf_counter() - p.started)
        self.last_write_s = self._stall_s + written.write_s
        return written

    def settle(self, before_step: int) -> None:
        """This rank, no collective: let a background write of a checkpoint older than
        `before_step` finish (its outcome stays for `poll` and `wait`)."""
        p = self._pending
        if p is not None and p.step < before_step:
            try:
                p.future.result()
            except (Exception, _checkpoint_exception()):
                pass  # reported by poll / wait

    def pending(self) -> tuple[int, float] | None:
        """(step, seconds since it started) of the write in flight on this rank, if any."""
        p = self._pending
        return None if p is None else (p.step, time.perf_counter() - p.started)

    def failure(self) -> BertgpuError:
        """The error to stop with once some rank's background write failed."""
        return self.error or BertgpuError(
            f"{self.run_dir}: a background checkpoint write failed on "
            "another rank (its error names the cause)"
        )


def make_checkpointer(
    model: torch.nn.Module,
    info: distributed.DistInfo,
    run_dir: Path,
    keep_last: int,
    async_save: bool,
    timeout_minutes: float,
) -> FullCheckpoints | ShardedCheckpoints:
    """The checkpointer of this model's strategy (collective: every rank learns whether the
    checkpoints are written in the background; a sharded model's background writes also get a
    process group of their own). `note` says how, for the start-up table."""
    from bertgpu.fsutil import human_bytes
    from bertgpu.train.hostcopy import available_bytes, estimate_host_bytes, fits_in_memory

    sharded = sharding.is_sharded(model)
    # ddp: rank 0 alone copies the whole state; fsdp: every rank of a node copies its shards.
    copies = info.local_world_size if sharded else int(info.is_main)
    needed, free = estimate_host_bytes(model) * copies, available_bytes()
    fits = not distributed.any_true(not fits_in_memory(needed, free))
    background = async_save and fits
    if not async_save:
        note = "written in place (checkpoint.async_save false)"
    elif background:
        note = f"written in the background (host copy about {human_bytes(needed)}"
        note += ", pinned)" if torch.cuda.is_available() and info.device.startswith("cuda") else ")"
    else:
        note = (f"written in place: a host copy of about {human_bytes(needed)} would not fit in "
                f"{human_bytes(free or 0)} of available memory")
    if sharded:
        return ShardedCheckpoints(run_dir, info, keep_last, background, timeout_minutes, note)
    return FullCheckpoints(run_dir, info, keep_last, background, note)


# ---------------------------------------------------------------------------------------------
# Restoring


def restore(
    path: Path,
    model_state: dict[str, torch.Tensor],
    train_state: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
) -> None:
    """Load a checkpoint's weights and optimizer state into `model` (the unwrapped module,
    sharded or not) and `optimizer`; collective when either side is sharded. The optimizer keeps
    its own hyperparameters (this run's betas, eps, weight decay, its fused or foreach kernel):
    torch's load_state_dict put the saved ones back, so a resume with another weight decay said
    so and config.toml held it, while the steps used the old one."""
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    _restore(path, model_state, train_state, model, optimizer)
    for group, own in zip(optimizer.param_groups, hyper, strict=True):
        group.update(own)


def _restore(path: Path, model_state: dict[str, torch.Tensor], train_state: dict[str, Any],
             model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    if is_sharded_checkpoint(path):
        _load_dcp(path, model, optimizer)
        return
    model_state = layout.model_state(model, model_state)  # the file's HF layout -> ours
    if sharding.is_sharded(model):
        _check_keys(path, model, model_state)
        _load_full_into_sharded(model, optimizer, model_state, train_state["optimizer"])
    else:
        _check_keys(path, model, model_state)
        problem = optimizer_state_mismatch(train_state["optimizer"], optimizer)
        if problem is not None:  # torch would load moments of another shape, to fail later
            raise BertgpuError(
                f"{path}: its optimizer state does not match the configured model ({problem}); a "
                "checkpoint of another model, or of a bertgpu with another parameter layout "
                "(separate query/key/value, an unpadded vocabulary): --init PATH continues from "
                "its weights")
        model.load_state_dict(model_state, strict=False)
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        optimizer.load_state_dict(train_state["optimizer"])


def _check_keys(path: Path, model: torch.nn.Module, model_state: dict[str, torch.Tensor]) -> None:
    own = set(model.state_dict())
    missing = sorted(own - set(model_state))
    unexpected = sorted(set(model_state) - own)
    if unexpected or [k for k in missing if "decoder" not in k]:  # tied decoders are stored once
        raise BertgpuError(
            f"{path}: checkpoint does not match the configured model (missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}); was the model changed?"
        )


def _load_dcp(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """DCP -> model and optimizer: the template (this rank's shapes: shards or full tensors) is
    filled from whichever ranks' files hold the pieces, so the world size may change."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    tree = _dcp_state(model, optimizer)
    try:
        dcp.load(tree, storage_reader=dcp.FileSystemReader(str(path)))
    except (Exception, _checkpoint_exception()) as exc:
        raise BertgpuError(
            f"{path}: checkpoint does not match the configured model ({dcp_mismatch(exc)}); "
            "was the model changed?"
        ) from None
    set_state_dict(
        model, optimizer, model_state_dict=tree[MODEL_KEY], optim_state_dict=tree[OPTIM_KEY]
    )


def dcp_mismatch(exc: BaseException) -> str:
    """The line of a failed DCP load that names what does not fit ("Missing key ...", "Size
    mismatch ..."), else its first line."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return next((line for line in lines if "Missing key" in line or "Size mismatch" in line),
                lines[0]).strip()


def _load_full_into_sharded(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optim_state: dict[str, Any],
) -> None:
    """A ddp checkpoint (whole tensors; optimizer state keyed by parameter index) into a sharded
    model: every rank keeps its shard of each tensor."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, model_state, options=full)
    set_optimizer_state_dict(
        model,
        optimizer,
        optim_by_name(model, optimizer, optim_state),
        options=StateDictOptions(full_state_dict=True),
    )


def optim_by_name(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> dict[str, Any]:
    """torch's optimizer state dict (parameters numbered in the order of the optimizer's groups)
    keyed by parameter name instead, the form `set_optimizer_state_dict` takes. Both strategies
    build the optimizer over `model.named_parameters()` in the same order."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    return {
        "state": {order[int(i)]: s for i, s in state["state"].items()},
        "param_groups": [
            {**g, "params": [order[int(i)] for i in g["params"]]} for g in state["param_groups"]
        ],
    }


# ---------------------------------------------------------------------------------------------
# Helpers


def _checkpoint_exception() -> type[BaseException]:
    """DCP's CheckpointException (a BaseException: `except Exception` misses it)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _os_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failed write (DCP wraps each rank's in CheckpointException.failures)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        for wrapped in getattr(e, "failures", {}).values():
            stack.append(wrapped[0] if isinstance(wrapped, tuple) else wrapped)
        stack += [e.__cause__, e.__context__]
    return None


def _dcp_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """{"model": ..., "optim": ...} by parameter name: this rank's shards for a sharded model."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}


def _local_bytes(tree: Any) -> int:
    """Bytes of this rank's share of a state tree (a DTensor's local shard)."""
    total, stack = 0, [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            local = x.to_local() if hasattr(x, "to_local") else x
            total += local.numel() * local.element_size()
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


def _write_rank0_files(tmp: Path, state: dict[str, Any], files: dict[str, str]) -> None:
    """train_state.pt (no optimizer: its shards are in the DCP files) and the extra files."""
    _torch_save(state, tmp / STATE_FILE)
    faults.check_write(tmp / STATE_FILE)
    for name, content in files.items():
        if "/" in name or name.startswith(".") or name in _RESERVED:
            raise ValueError(f"extra checkpoint file name {name!r} is not allowed")
        data = content.encode("utf-8") if isinstance(content, str) else content
        (tmp / name).write_bytes(data)
        faults.check_write(tmp / name)


_WRITER: type | None = None


def _Writer(path: Path, step: int) -> Any:  # noqa: N802 - reads as the class it makes
    """DCP's file writer with the test double's slow filesystem (testing/faults.py); the class is
    made on first use so that importing this module does not import torch.distributed."""
    global _WRITER
    if _WRITER is None:
        from torch.distributed.checkpoint import FileSystemWriter

        class Writer(FileSystemWriter):
            step = 0

            def write_data(self, plan: Any, planner: Any) -> Any:
                self.fs = faults.slow_files(self.fs, self.step)
                return super().write_data(plan, planner)

        _WRITER = Writer
    writer = _WRITER(str(path))
    writer.step = step
    return writer


__all__ = [
    "FullCheckpoints",
    "ShardedCheckpoints",
    "Written",
    "list_checkpoints",
    "make_checkpointer",
    "optim_by_name",
    "restore",
]
