"""Config edge cases: integer and bool parsing, fixed-length tuples, range checks, the
checkpoint.keep_last default, and the `--init` words of a continued run."""

from __future__ import annotations

import pytest

from bertgpu.config.continued import init_asked, word_value
from bertgpu.config.overrides import parse_text
from bertgpu.config.render import format_help
from bertgpu.config.schema import PretrainConfig, load_config
from bertgpu.errors import BertgpuError


def write(tmp_path, text: str):
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_fractional_integer_override_is_refused():
    """`--train.max_steps 2.5` must be an error, not silently truncated to 2 steps."""
    with pytest.raises(BertgpuError, match=r"train\.max_steps = 2\.5: expected an integer"):
        load_config(None, ["--train.max_steps", "2.5"])
    assert load_config(None, ["--train.max_steps", "2e3"]).train.max_steps == 2000


def test_toml_bool_for_an_integer_key_is_refused(tmp_path):
    """`max_steps = true` in a TOML file must be refused, not read as 1 step."""
    with pytest.raises(BertgpuError, match=r"train\.max_steps = true: expected an integer"):
        load_config(write(tmp_path, "[train]\nmax_steps = true\n"), [])


def test_betas_of_one_are_refused():
    """optim.betas 0.9,1.0 must be refused: a beta of 1 makes Adam's bias correction divide
    by zero."""
    with pytest.raises(BertgpuError, match=r"optim\.betas = \(0\.9, 1\.0\): expected two "
                                           r"numbers in \[0, 1\)"):
        load_config(None, ["--optim.betas", "0.9,1.0"])


def test_three_betas_are_refused_by_the_parser():
    """A fixed-length tuple key such as optim.betas must refuse extra comma-separated values
    where they are typed, naming how many it takes."""
    with pytest.raises(BertgpuError, match=r"command line: optim\.betas = 0\.9,0\.98,0\.5: "
                                           r"expected 2 comma-separated values"):
        load_config(None, ["--optim.betas", "0.9,0.98,0.5"])
    with pytest.raises(ValueError):
        parse_text("0.9,0.98,0.5", tuple[float, float])


def test_log_every_zero_steps_is_refused():
    """--train.log_every_steps 0 must be refused (logging every 0 steps makes no sense)."""
    with pytest.raises(BertgpuError, match=r"train\.log_every_steps = 0: expected 1 or more"):
        load_config(None, ["--train.log_every_steps", "0"])


def test_keep_last_defaults_to_three():
    """Without a setting a run keeps its 3 newest checkpoints, as --help-config says."""
    assert PretrainConfig().checkpoint.keep_last == 3
    assert load_config(None, []).checkpoint.keep_last == 3
    lines = [line for line in format_help(PretrainConfig()).splitlines()
             if "--checkpoint.keep_last " in line]
    assert lines and "default 3" in lines[0]


@pytest.mark.parametrize(("word", "value"), [
    ("yes", True), ("on", True), ("true", True), ("1", True),
    ("no", False), ("off", False), ("false", False), ("0", False),
])
def test_bool_words_on_the_command_line(word, value):
    """yes/no and on/off must read as booleans on the command line, like true/false."""
    assert parse_text(word, bool) is value
    assert parse_text(word.upper(), bool) is value


def test_init_none_cancels_the_recipe_init():
    """`--init none` must cancel a recipe's `init`, so the run starts from scratch."""
    assert init_asked({"init": "runs/a"}, ["--init", "none"]) is None
    assert init_asked({"init": "runs/a"}, ["--init="]) is None
    assert init_asked({"init": "runs/a"}, []) == "runs/a"
    assert init_asked({}, ["--init", "runs/b"]) == "runs/b"


def test_init_without_a_value_does_not_take_the_next_option():
    """`--init` followed by another option has no value: the next option is not read as the
    init path."""
    assert word_value(["--init", "--train.max_steps", "5"], "init") is None
    assert word_value(["--init", "runs/a", "--train.max_steps", "5"], "init") == "runs/a"


def test_command_line_warmup_fraction_replaces_a_files_warmup_steps(tmp_path):
    """A recipe's warmup_steps silently outranked `--schedule.warmup_fraction` given on the
    command line: the run warmed up for the file's steps. The line's one wins; both on the line
    is an error; in one file (a run's config.toml holds both) warmup_steps still wins."""
    recipe = write(tmp_path, "[schedule]\nwarmup_steps = 100\nwarmup_fraction = 0.3\n")
    from_file = load_config(recipe, [])
    assert (from_file.schedule.warmup_steps, from_file.schedule.warmup_fraction) == (100, 0.3)
    asked = load_config(recipe, ["--schedule.warmup-fraction", "0.1"])
    assert (asked.schedule.warmup_steps, asked.schedule.warmup_fraction) == (None, 0.1)
    assert load_config(recipe, ["--schedule.warmup_steps=7"]).schedule.warmup_steps == 7
    with pytest.raises(BertgpuError, match=r"warmup_steps and --schedule\.warmup_fraction are "
                                           r"both given"):
        load_config(None, ["--schedule.warmup_steps", "5", "--schedule.warmup_fraction", "0.2"])
