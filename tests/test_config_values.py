"""Configuration values a probe found accepted or crashing: infinities (a timeout of inf was an
OverflowError on every rank; a weight decay of inf an all-NaN model, exported), a timeout past
what a timedelta holds, a TOML date (a TypeError while building the error), and one key given
under two spellings (the later, or the one applied later, won without a word)."""

from __future__ import annotations

import pytest

from bertgpu.config import schema
from bertgpu.config.finetune import load_finetune_config
from bertgpu.errors import BertgpuError


@pytest.mark.parametrize("key", ["distributed.timeout_minutes", "optim.weight_decay",
                                 "optim.eps", "schedule.power", "checkpoint.grace_s",
                                 "checkpoint.every_minutes", "train.grad_clip"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_number_that_is_not_finite_is_refused(key, value):
    with pytest.raises(BertgpuError, match=rf"^command line: {key} = {value}: expected a finite "
                                           "number$"):
        schema.load_config(None, [f"--{key}", value])


def test_a_timeout_past_a_timedelta_is_refused_in_both_commands():
    with pytest.raises(BertgpuError, match=r"distributed\.timeout_minutes = 10000000000000\.0: "
                                           r"expected a positive number, at most 1e\+09"):
        schema.load_config(None, ["--distributed.timeout_minutes", "1e13"])
    with pytest.raises(BertgpuError, match=r"timeout_minutes .*at most 1e\+09"):
        load_finetune_config(None, ["--timeout_minutes", "1e13"])
    assert schema.load_config(None, ["--distributed.timeout_minutes", "1e9"]) is not None


def test_a_toml_date_is_named_not_a_traceback(tmp_path):
    recipe = tmp_path / "c.toml"
    recipe.write_text("[train]\nbudget_hours = 1979-05-27\n")
    with pytest.raises(BertgpuError, match=r'c\.toml: train\.budget_hours = "1979-05-27": '
                                           "expected a number or none"):
        schema.load_config(str(recipe), [])


def test_one_key_under_two_spellings_is_refused(tmp_path):
    recipe = tmp_path / "c.toml"
    recipe.write_text("[train]\nmax_steps = 3\nmax-steps = 4\n")
    with pytest.raises(BertgpuError, match=r"c\.toml: train\.max_steps and train\.max-steps are "
                                           "one key, given twice; expected it once"):
        schema.load_config(str(recipe), [])
    with pytest.raises(BertgpuError, match=r"--data /b and --data\.dir /a set one key "
                                           r"\(data\.dir\) twice; expected one value"):
        schema.load_config(None, ["--data=/b", "--data.dir", "/a"])
    # dashes for underscores are one spelling: the later wins, as ever (a wrapper passes
    # --max_seq_len and its user --max-seq-len)
    cfg = schema.load_config(None, ["--train.max_steps", "3", "--train.max-steps", "4"])
    assert cfg.train.max_steps == 4

