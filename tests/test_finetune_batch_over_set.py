"""A fine-tuning global batch larger than the training set: every step holds the whole set, not
the batch the start-up table, results.json and the GLUE protocol name, and an lr scaled by
--lr_scaling is scaled for that batch. A 50-row train.csv with --global_batch_size 64
--lr_scaling linear --reference_batch_size 32 said "global batch 64" and "lr 0.0002" without a
word (pretraining warns alike). Now one warning at start-up, naming the numbers; the lr stays as
configured (results do not change silently). `glue` says it once per task, not once per seed."""

from __future__ import annotations

import warnings

import _tiny_init
import pytest
from test_classify import VOCAB, write_csv
from test_finetune_world_size import _job
from test_glue_cli import tiny_init  # noqa: F401 (the fixture)
from test_glue_protocol_line import _glue

from bertgpu.cli import main
from bertgpu.config.finetune import load_finetune_config, peak_lr

pytestmark = pytest.mark.usefixtures("one_thread", "no_faults")


def _cfg(*flags: str):
    return load_finetune_config(None, ["--lr", "1e-4", *flags])


def test_a_batch_larger_than_the_set_is_warned_about_with_its_numbers():
    from bertgpu.tasks.finetune_output import warn_batch_over_set

    cfg = _cfg("--global_batch_size", "64", "--lr_scaling", "linear",
               "--reference_batch_size", "32")
    with pytest.warns(UserWarning) as seen:
        warn_batch_over_set(_job(50), cfg, peak_lr(cfg), 1)
    assert [str(w.message) for w in seen] == [
        "SST-2: --global_batch_size 64 > the 50 training sequences: every step holds all 50 of "
        "them, not 64, and the lr 0.0002 (0.0001 x linear scaling from batch 32) is scaled for a "
        "batch of 64; --global_batch_size 50 or smaller trains at the batch it names"]
    # no scaling rule: no lr to speak of; 2 devices: a batch they share equally
    with pytest.warns(UserWarning, match=r"^SST-2: --global_batch_size 64 > the 51 training "
                                         r"sequences: every step holds all 51 of them, not 64; "
                                         r"--global_batch_size 50 or smaller trains at"):
        warn_batch_over_set(_job(51), _cfg("--global_batch_size", "64"), 1e-4, 2)
    with pytest.warns(UserWarning, match=r"--global_batch_size 48 or smaller"):
        warn_batch_over_set(_job(50), _cfg("--global_batch_size", "64", "--micro_batch_size",
                                           "8"), 1e-4, 2)


def test_a_batch_the_set_fills_is_not_warned_about():
    from bertgpu.tasks.finetune_output import warn_batch_over_set

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (64, 65, 500):
            cfg = _cfg("--global_batch_size", "64", "--lr_scaling", "linear",
                       "--reference_batch_size", "32")
            warn_batch_over_set(_job(n), cfg, peak_lr(cfg), 1)
        cfg = _cfg("--global_batch_size", "64")
        warn_batch_over_set(_job(50), cfg, 1e-4, 1, say=False)  # the other ranks


@pytest.mark.timeout(240)
def test_finetune_says_it_once_and_keeps_the_lr(tmp_path, capsys):
    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    train, dev = write_csv(tmp_path / "train.csv", 50, 0), write_csv(tmp_path / "dev.csv", 8, 1)
    base = ["finetune", "classify", "--train-file", str(train), "--dev-file", str(dev),
            "--init", str(init), "--max_seq_len", "32", "--epochs", "1", "--lr", "1e-4",
            "--lr_scaling", "linear", "--reference_batch_size", "32"]
    assert main([*base, "--global_batch_size", "64", "--out", str(tmp_path / "big")]) == 0
    out = capsys.readouterr()
    said = [line for line in out.err.splitlines() if "training sequences: every step" in line]
    assert said == ["bertgpu finetune: warning: classify: --global_batch_size 64 > the 50 "
                    "training sequences: every step holds all 50 of them, not 64, and the lr "
                    "0.0002 (0.0001 x linear scaling from batch 32) is scaled for a batch of 64; "
                    "--global_batch_size 50 or smaller trains at the batch it names"]
    assert "0.0002 (adamw" in out.out  # the lr as configured
    assert main([*base, "--global_batch_size", "50", "--out", str(tmp_path / "fits")]) == 0
    assert "training sequences: every step" not in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_glue_says_it_once_per_task_not_per_seed(tmp_path, tiny_init, capsys):  # noqa: F811
    assert _glue(tiny_init, tmp_path / "glue", "rte", "--global_batch_size", "8",
                 "--seeds", "1", "2") == 0
    said = [line for line in capsys.readouterr().err.splitlines()
            if "training sequences: every step" in line]
    assert said == ["bertgpu glue: warning: RTE: --global_batch_size 8 > the 2 training "
                    "sequences: every step holds all 2 of them, not 8; --global_batch_size 2 or "
                    "smaller trains at the batch it names"]
