"""Two pretraining config rules no suite pinned: `model.architecture` on the command line beats
the recipe's (README: "Any key can be overridden on the command line"; load_config: "the command
line winning"), and the masking rates lie in the open interval (0, 1) that their error names
(a rate of 1 masks every token: nothing left to predict from; 0 trains nothing)."""

from __future__ import annotations

import pytest

from bertgpu.config import schema
from bertgpu.errors import BertgpuError


@pytest.mark.parametrize(("recipe", "line", "config_class"),
                         [("bert", ["--model.architecture", "modernbert"], "ModernBertConfig"),
                          ("modernbert", ["--model.architecture=bert"], "BertConfig")])
def test_the_command_lines_architecture_beats_the_recipes(tmp_path, recipe, line, config_class):
    path = tmp_path / "recipe.toml"
    path.write_text(f'[model]\narchitecture = "{recipe}"\n')
    assert schema.load_config(str(path), []).model.architecture == recipe
    cfg = schema.load_config(str(path), line)
    assert cfg.model.architecture == line[-1].rpartition("=")[2]
    assert type(cfg.model).__name__ == config_class


@pytest.mark.parametrize("key", ["data.mask_rate", "data.eval_mask_rate"])
@pytest.mark.parametrize("value", ["1.0", "0"])
def test_a_mask_rate_of_0_or_1_is_refused_in_one_line(tmp_path, key, value):
    shown = float(value)
    with pytest.raises(BertgpuError, match=rf"^command line: {key} = {shown}: expected a number "
                                           r"in \(0, 1\)$"):
        schema.load_config(None, [f"--{key}", value])
    section, name = key.split(".")
    path = tmp_path / "recipe.toml"
    path.write_text(f"[{section}]\n{name} = {shown}\n")
    with pytest.raises(BertgpuError, match=rf"^{path}: {key} = {shown}: expected a number"):
        schema.load_config(str(path), [])


@pytest.mark.parametrize("key", ["data.mask_rate", "data.eval_mask_rate"])
def test_mask_rates_just_inside_the_interval_are_taken(key):
    for value in ("0.001", "0.999"):
        cfg = schema.load_config(None, [f"--{key}", value])
        assert getattr(cfg.data, key.split(".")[1]) == float(value)
