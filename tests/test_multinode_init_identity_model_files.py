"""The ranks compare their --init models by identity (train/rank_agreement.init_identity), not
by path. A review found the identity taken over every file of the folder: two copies of one
model, one with a README.md or a pytorch_model.bin beside its model.safetensors (which bertgpu
does not read then), were refused as two models. Now only what makes the model counts: the
weights bertgpu loads, config.json, a checkpoint's checksums.json, the tokenizer's files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from bertgpu.train.rank_agreement import init_identity


def _model(folder: Path, seed: int) -> Path:
    folder.mkdir(parents=True)
    torch.manual_seed(seed)
    save_file({"bert.embeddings.word_embeddings.weight": torch.randn(16, 8)},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\n")
    return folder


def test_files_bertgpu_does_not_read_do_not_make_another_model(tmp_path):
    one = _model(tmp_path / "one", 0)
    copy = tmp_path / "copy"
    shutil.copytree(one, copy)
    (copy / "README.md").write_text("# a model card\n")
    torch.save({"unused": torch.zeros(3)}, copy / "pytorch_model.bin")  # beside the safetensors
    (copy / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    assert init_identity(str(copy)) == init_identity(str(one))


def test_other_weights_a_config_or_a_vocabulary_still_make_another_model(tmp_path):
    one = _model(tmp_path / "one", 0)
    assert init_identity(str(_model(tmp_path / "other", 1))) != init_identity(str(one))
    for name, text in (("config.json", '{"model_type": "bert", "hidden_size": 9}'),
                       ("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nb\n")):
        changed = tmp_path / f"changed-{name}"
        shutil.copytree(one, changed)
        (changed / name).write_text(text)
        assert init_identity(str(changed)) != init_identity(str(one)), name


def test_a_sharded_models_shards_count(tmp_path):
    one = tmp_path / "sharded"
    one.mkdir()
    (one / "config.json").write_text("{}")
    for i, seed in enumerate((0, 1)):
        torch.manual_seed(seed)
        save_file({f"w{i}": torch.randn(4)}, str(one / f"model-{i}.safetensors"))
    (one / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w0": "model-0.safetensors", "w1": "model-1.safetensors"}}))
    other = tmp_path / "other"
    shutil.copytree(one, other)
    save_file({"w1": torch.zeros(4)}, str(other / "model-1.safetensors"))
    assert init_identity(str(other)) != init_identity(str(one))
