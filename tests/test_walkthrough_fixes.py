"""What a new user's walkthrough of the README ran into (a review, this round): a missing data
folder named as missing instead of by the files not found in it, and `bertgpu glue`'s
--data-dir given to `finetune` or `pretrain` answered with the plain "unknown key data_dir"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertgpu import cli
from bertgpu.data.manifest import Manifest
from bertgpu.errors import BertgpuError
from bertgpu.tasks.glue import find_split_file

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_shard_set_folder_is_named_as_missing(tmp_path):
    with pytest.raises(BertgpuError, match=rf"^{tmp_path / 'nodata'}: does not exist \(expected "
                                           r"a shard set"):
        Manifest.read(tmp_path / "nodata" / "manifest.json")
    (tmp_path / "empty").mkdir()  # a folder without the file still names the file
    with pytest.raises(BertgpuError, match="manifest.json: no manifest.json found"):
        Manifest.read(tmp_path / "empty" / "manifest.json")


def test_a_missing_glue_folder_is_named_as_missing(tmp_path):
    with pytest.raises(BertgpuError, match=rf"^{tmp_path / 'nodata'}: does not exist \(expected "
                                           r"the GLUE data folder, with SST-2/train.tsv in it\)"):
        find_split_file(tmp_path / "nodata", "sst2", "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertgpuError, match="no train file for GLUE task SST-2: looked in"):
        find_split_file(tmp_path / "empty", "sst2", "train")


@pytest.mark.parametrize("command", [
    ["finetune", "sst2", "--init", "runs/base", "--out", "ft"],
    ["pretrain", str(ROOT / "configs" / "tiny.toml"), "--out", "run"]])
def test_glues_data_dir_elsewhere_says_what_to_write(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main([*command, "--data-dir", "glue"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("unknown key data_dir (--data-dir is bertgpu glue's option; here the "
                        "data folder is --data DIR)"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
