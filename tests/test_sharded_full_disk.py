"""A sharded (fsdp) checkpoint on a full disk: torch's zip writer turns ENOSPC into a
RuntimeError ("unexpected pos 704 vs 598") inside DCP's CheckpointException, and the one line
said "CheckpointException ranks:dict_keys([0, 1])" where a single process says the disk is full,
the space it needs and which checkpoint is intact."""

from __future__ import annotations

from bertgpu import fsutil
from bertgpu.train.checkpointer import ShardedCheckpoints
from bertgpu.train.distributed import DistInfo

ZIP_WRITER = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def _checkpoints(tmp_path) -> ShardedCheckpoints:
    ck = object.__new__(ShardedCheckpoints)  # only what `_failure` reads
    ck.info, ck.run_dir = DistInfo(), tmp_path
    (tmp_path / "checkpoints").mkdir()
    return ck


def test_a_failed_write_on_a_disk_without_room_says_the_disk_is_full(tmp_path, monkeypatch):
    ck = _checkpoints(tmp_path)
    final = tmp_path / "checkpoints" / "step_30"
    monkeypatch.setattr(fsutil, "free_bytes", lambda path: 17_900_000)
    err = ck._failure(RuntimeError(ZIP_WRITER), final, final.with_name("step_30.tmp"), 23_000_000)
    assert (f"{final.parent}: cannot write step_30: No space left on device (needs about "
            in str(err))
    assert "free space and re-run the same command" in str(err)


def test_a_failed_write_with_room_keeps_its_own_message(tmp_path, monkeypatch):
    ck = _checkpoints(tmp_path)
    final = tmp_path / "checkpoints" / "step_30"
    monkeypatch.setattr(fsutil, "free_bytes", lambda path: 10**12)
    err = ck._failure(RuntimeError(ZIP_WRITER), final, final.with_name("step_30.tmp"), 23_000_000)
    assert str(err) == f"{final.parent}: cannot write step_30: {ZIP_WRITER}"
