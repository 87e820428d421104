"""Atomic, prunable checkpoints: `RUN_DIR/checkpoints/step_N/`.

A checkpoint folder holds::

    model.safetensors   weights (no pickle), tied tensors stored once each under every name
    train_state.pt      optimizer, engine, loader cursor, schedule clock, RNG states (plain tensors,
                        numbers, lists and dicts only, so it loads with torch.load(weights_only=True))
    config.toml, config.json, ...   any extra files the caller passes
    COMPLETE            written last: its presence means every other file is whole

Everything is written into `step_N.tmp/`, flushed to disk, and renamed into place with one
`os.replace`, so a crash or preemption mid-write leaves the previous checkpoint as the latest and
a half-written folder is never loaded (`latest_checkpoint` ignores `*.tmp` and folders without
`COMPLETE`). Re-running the same command resumes from the latest one.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from bertgpu.errors import BertgpuError
from bertgpu.fsutil import replace_dir

CHECKPOINTS = "checkpoints"
MODEL_FILE = "model.safetensors"
STATE_FILE = "train_state.pt"
COMPLETE = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d+)$")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Makes the rename itself durable; not possible on every platform (Windows), hence best effort.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _plain_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, each with storage of its own (safetensors refuses shared memory,
    e.g. the tied word-embedding / MLM-decoder weight)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone()  # shared with an earlier tensor, or a view into a larger buffer
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def checkpoint_dir(run_dir: str | os.PathLike[str], step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step}"


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = _STEP_RE.match(entry.name)
        if m and entry.is_dir() and (entry / COMPLETE).is_file() and (entry / STATE_FILE).is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete `step_N` folder of a run, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model_state: Mapping[str, torch.Tensor],
    train_state: Mapping[str, Any],
    extra_files: Mapping[str, str | bytes] | None = None,
    keep_last: int = 3,
) -> Path:
    """Write `RUN_DIR/checkpoints/step_N/` atomically, then keep only the `keep_last` newest
    (keep_last <= 0 keeps all). Returns the final folder. Call on rank 0 only."""
    from safetensors.torch import save_file

    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():  # left over from a crash
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)

    save_file(_plain_tensors(model_state), str(tmp / MODEL_FILE), metadata={"format": "pt"})
    torch.save(dict(train_state), tmp / STATE_FILE)
    for name, content in (extra_files or {}).items():
        if os.sep in name or name in (MODEL_FILE, STATE_FILE, COMPLETE):
            raise ValueError(f"extra checkpoint file name {name!r} is not allowed")
        data = content.encode("utf-8") if isinstance(content, str) else content
        (tmp / name).write_bytes(data)
    (tmp / COMPLETE).write_text(f"step {step}\n", encoding="utf-8")
    for f in tmp.iterdir():
        _fsync_file(f)
    _fsync_dir(tmp)

    replace_dir(tmp, final)  # the same step may be saved again (e.g. the end of a resumed run)
    _fsync_dir(final.parent)

    if keep_last > 0:
        for _, path in list_checkpoints(run_dir)[:-keep_last]:
            if path != final:
                shutil.rmtree(path, ignore_errors=True)
    return final


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model_state, train_state) of a checkpoint folder, on CPU. Refuses pickles that contain
    anything but tensors and plain containers (torch.load with weights_only=True)."""
    from safetensors.torch import load_file

    folder = Path(path)
    model_path, state_path = folder / MODEL_FILE, folder / STATE_FILE
    for p in (model_path, state_path):
        if not p.is_file():
            raise BertgpuError(f"{folder}: not a complete checkpoint ({p.name} is missing)")
    try:
        model_state = load_file(str(model_path), device="cpu")
    except Exception as exc:  # safetensors raises its own error types
        raise BertgpuError(f"{model_path}: unreadable safetensors file ({exc})") from None
    try:
        train_state = torch.load(state_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BertgpuError(
            f"refusing to load {state_path}: not a plain tensor checkpoint ({first})"
        ) from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise BertgpuError(f"{state_path}: unreadable checkpoint state ({exc})") from None
    if not isinstance(train_state, dict):
        raise BertgpuError(f"{state_path}: expected a dict of training state, found {type(train_state).__name__}")
    return model_state, train_state


def rng_state() -> dict[str, Any]:
    """Python, numpy (global) and torch CPU/CUDA generator states as plain values and tensors,
    so they survive `torch.load(weights_only=True)`."""
    import numpy as np

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what `rng_state()` captured (CUDA only when present in both)."""
    import numpy as np

    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = list(state["cuda"])[: torch.cuda.device_count()]
        for i, s in enumerate(cuda_states):
            torch.cuda.set_rng_state(s.cpu(), i)
