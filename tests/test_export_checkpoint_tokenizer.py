"""`bertgpu export` takes the tokenizer a checkpoint holds when its run's tokenizer/ is not
beside it (`--init`'s rule): a checkpoint folder copied out of its run, or a run whose tokenizer/
was removed, was exported with config.json and model.safetensors only, and transformers 5 built an
empty 5-token tokenizer from the export (fill-mask returned '')."""

from __future__ import annotations

import json
import shutil

import pytest
from _export_run import VOCAB, tiny_run

from bertgpu import fsutil
from bertgpu.cli import main as cli


@pytest.fixture
def run(tmp_path):
    return tiny_run(tmp_path / "run")


def _exported_tokenizer(out):
    assert (out / "vocab.txt").read_text(encoding="utf-8") == VOCAB
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["model_max_length"] == 512  # the model's positions (BertConfig's default)


def test_a_checkpoint_copied_out_of_its_run_exports_its_own_tokenizer(run, tmp_path, capsys):
    copied = shutil.copytree(run / "checkpoints" / "step_10", tmp_path / "copied" / "step_10")
    out = tmp_path / "ex-copied"
    assert cli(["export", str(copied), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"exported {copied} (step 10) -> {out}\n"
    assert captured.err == ""  # no "no tokenizer to export with it"
    _exported_tokenizer(out)


def test_a_run_whose_tokenizer_folder_was_removed_exports_the_checkpoints_copy(run, tmp_path,
                                                                              capsys):
    shutil.rmtree(run / "tokenizer")
    for given in (run, run / "checkpoints" / "step_10"):
        out = tmp_path / f"ex-{given.name}"
        assert cli(["export", str(given), "--out", str(out)]) == 0
        assert capsys.readouterr().err == ""
        _exported_tokenizer(out)


def test_a_checkpoint_without_tokenizer_files_is_still_exported_with_a_warning(run, tmp_path,
                                                                               capsys):
    copied = shutil.copytree(run / "checkpoints" / "step_10", tmp_path / "ck")
    for name in ("vocab.txt", "tokenizer_config.json"):
        (copied / name).unlink()
    fsutil.seal(copied, "step 10")
    assert cli(["export", str(copied), "--out", str(tmp_path / "ex")]) == 0
    assert capsys.readouterr().err == (
        f"bertgpu export: warning: {copied}: no tokenizer to export with it (it is not in a run's "
        "checkpoints/ folder, beside the run's tokenizer/, and it holds no tokenizer files); the "
        "export has no tokenizer files\n")
    assert sorted(p.name for p in (tmp_path / "ex").iterdir()) == ["config.json",
                                                                  "model.safetensors"]
