"""A value out of range names where it was set: the config file, or the command line."""

from __future__ import annotations

import pytest

from bertgpu.config.schema import load_config
from bertgpu.errors import BertgpuError


def test_a_value_from_the_file_names_the_file(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text("[optim]\nlr = -1.0\n\n[schedule]\nwarmup-steps = -3\n")
    with pytest.raises(BertgpuError, match=rf"^{path}: optim.lr = -1.0: expected a positive"):
        load_config(path)
    # the command line wins over the file, and is named when it is the one out of range
    with pytest.raises(BertgpuError, match=r"^command line: optim.lr = -2.0: expected"):
        load_config(path, ["--optim.lr", "-2"])
    # a key the file spells with a dash
    with pytest.raises(BertgpuError, match=rf"^{path}: schedule.warmup_steps = -3: "):
        load_config(path, ["--optim.lr", "1e-4"])


def test_a_model_field_from_the_file_names_the_file(tmp_path):
    path = tmp_path / "model.toml"
    path.write_text("[model]\nhidden_size = 33\nnum_attention_heads = 2\n")
    with pytest.raises(BertgpuError, match=rf"^{path}: model.hidden_size = 33: expected a "
                                           "multiple of num_attention_heads"):
        load_config(path)


def test_a_key_set_nowhere_keeps_config():
    """A default that another setting rules out: no source to name."""
    from bertgpu.config.sections import name_the_source

    err = BertgpuError("config: optim.lr = -1.0: expected a positive number")
    assert name_the_source(err, {"optim": {"name": "lamb"}}, "f.toml", {"train.max_steps"}) is err
    other = BertgpuError("logging.wandb_mode: found 'x', expected one of ...")
    assert name_the_source(other, {"logging": {"wandb_mode": "x"}}, "f.toml", set()) is other
