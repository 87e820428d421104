"""The batch-over-the-set warning (tasks/finetune_output.warn_batch_over_set) names a batch that
trains as said. A review found it named ones that cannot run: 10 training sequences with
--micro_batch_size 16 on one device suggested "--global_batch_size 10 or smaller", which
check_batch refuses (not a multiple of 16); 3 sequences on 4 devices suggested
"--global_batch_size 0 or smaller" and said "every step holds all 3" while warn_left_out says
they are left out."""

from __future__ import annotations

import re
import warnings

import pytest
from test_finetune_world_size import _job

from bertgpu.config.finetune import check_batch, load_finetune_config
from bertgpu.tasks.finetune_output import warn_batch_over_set, warn_left_out

pytestmark = pytest.mark.usefixtures("one_thread", "no_faults")


def _cfg(*flags: str):
    return load_finetune_config(None, ["--lr", "1e-4", *flags])


def _suggested(n: int, world: int, *flags: str) -> list[str]:
    """The flags the warning names for `n` sequences on `world` devices."""
    with pytest.warns(UserWarning) as seen:
        warn_batch_over_set(_job(n), _cfg(*flags), 1e-4, world)
    [message] = [str(w.message) for w in seen]
    return re.search(r"; (--global_batch_size .*) or smaller trains", message).group(1).split()


@pytest.mark.parametrize(("n", "world", "flags"), [
    (10, 1, ("--global_batch_size", "32", "--micro_batch_size", "16")),
    (10, 2, ("--global_batch_size", "64", "--micro_batch_size", "16")),
    (7, 2, ("--global_batch_size", "64", "--micro_batch_size", "8")),
    (50, 2, ("--global_batch_size", "64", "--micro_batch_size", "8")),
    (51, 2, ("--global_batch_size", "64")),
    (5, 4, ("--global_batch_size", "8")),
])
def test_the_suggested_batch_is_one_check_batch_takes_and_fits_the_set(n, world, flags):
    words = _suggested(n, world, *flags)
    cfg = _cfg(*flags, *words)
    micro, accumulation = check_batch(cfg, world)  # raises on a batch it refuses
    assert 0 < cfg.global_batch_size <= n and micro * world * accumulation <= n, words


def test_the_suggestion_with_a_micro_batch_over_the_set_names_a_smaller_one():
    assert _suggested(10, 1, "--global_batch_size", "32", "--micro_batch_size", "16") == [
        "--global_batch_size", "10", "--micro_batch_size", "10"]


def test_fewer_sequences_than_devices_are_warned_about_once_as_left_out():
    cfg = _cfg("--global_batch_size", "8")
    with pytest.warns(UserWarning) as seen:
        warn_left_out(_job(3), cfg.global_batch_size, 4)
        warn_batch_over_set(_job(3), cfg, 1e-4, 4)
    [message] = [str(w.message) for w in seen]
    assert "left out" in message and "--global_batch_size 0" not in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_batch_over_set(_job(3), cfg, 1e-4, 4)
