"""--skip-bad's count names what it skipped: a broken link or a folder is not a file."""

from __future__ import annotations

import os

import pytest

from bertgpu.data.sources import no_documents, resolve_inputs
from bertgpu.errors import BertgpuError


def test_a_skipped_broken_link_is_counted_as_an_input_not_a_file(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "a.txt")
    skipped: list = []
    with pytest.raises(BertgpuError, match=r"\(1 input skipped by --skip-bad; the first: .*a "
                                           r"broken symbolic link"):
        resolve_inputs([tmp_path], skipped)


def test_skipped_files_are_counted_as_files(tmp_path):
    files = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for f in files:
        f.write_bytes(b"\xff\xfe")
    err = no_documents([(str(f), f"{f}: not UTF-8") for f in files], "text to tokenize")
    assert "(2 files skipped by --skip-bad; the first: " in str(err)
