"""A unit run again to hold another count of validation documents (--validation-docs with
--skip-bad) removes every file named for it first, not only those its record names: a run of it
cut off before its record (SIGKILL, Ctrl-C, a failed upload) had left shards and a .part that no
record named, which stayed in the sealed set beside the new ones, and the .part made every later
prepare to that --out refuse it ("holds ... which prepare did not write")."""

from __future__ import annotations

import fsspec
import pytest

from bertgpu.data.output import WorkFolder

UNIT5 = ["train-00005-00000.input_ids.npy", "train-00005-00001.lengths.npy",
         "train-00005-00002.lengths.npy.part", "validation-00005-00000.input_ids.npy"]
OTHERS = ["train-00015-00000.input_ids.npy", "train-00050-00000.lengths.npy", "manifest.json"]


def test_forget_removes_the_unrecorded_files_of_its_unit_only(tmp_path):
    work = WorkFolder(tmp_path / "out")
    folder = tmp_path / "out.tmp"
    (folder / "units").mkdir(parents=True)
    for name in [*UNIT5, *OTHERS]:
        (folder / name).write_bytes(b"x")
    work.forget(5)  # no record of unit 5: its run was cut off before it
    assert sorted(p.name for p in folder.iterdir()) == sorted(["units", *OTHERS])  # old: all


@pytest.mark.parametrize("recorded", [False, True])
def test_forget_in_a_store(recorded):
    memory, root = fsspec.filesystem("memory"), "/forget-probe/out"
    try:
        for name in [*UNIT5, *OTHERS, *(["units/00005.json"] if recorded else [])]:
            memory.pipe_file(f"{root}/{name}", b"{}")
        WorkFolder("memory://forget-probe/out").forget(5)
        left = sorted(p[len(root) + 1:] for p in memory.find(root))
        assert left == sorted(OTHERS)
    finally:
        memory.rm("/forget-probe", recursive=True)
