"""A diverged run's message says what to try in the keys of the command that ran it, and does
not advise clipping that is already on."""

from __future__ import annotations

import re
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.cli import main
from bertgpu.train.readback import FINETUNING_ADVICE, StepNumbers, diverged_message

FIXTURES = Path(__file__).parent / "fixtures" / "glue"


def test_pretraining_advice_names_its_keys_and_clips_only_when_off():
    numbers = StepNumbers(losses={"mlm": float("nan")}, extras={}, grad_norm=float("nan"),
                          skipped=True)
    off = diverged_message(3, 7, numbers, 1e-3, "fp16", grad_clip=0.0)
    assert ("try train.precision bf16 (fp16 overflows), lower optim.lr, a longer warm-up "
            "(schedule.warmup_steps), train.grad_clip 1.0; resume from the last checkpoint") in off
    on = diverged_message(3, 7, numbers, 1e-3, "bf16", grad_clip=1.0)
    assert on.endswith("try lower optim.lr, a longer warm-up (schedule.warmup_steps); resume "
                       "from the last checkpoint")


def test_a_diverged_fine_tuning_names_its_own_options(tmp_path, capsys, monkeypatch, one_thread):
    words = sorted({w for p in (FIXTURES / "SST-2").rglob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]",
                                        p.read_text(encoding="utf-8").lower())})
    init = _tiny_init.tiny_init(tmp_path, [*SPECIAL, *words])
    monkeypatch.setenv("BERTGPU_FAULTS", "nonfinite_rank=0@step=1-")
    rc = main(["finetune", "sst2", "--data", str(FIXTURES), "--init", str(init), "--out",
               str(tmp_path / "ft"), "--epochs", "3", "--global_batch_size", "1",
               "--max_nonfinite_steps", "2", "--grad_clip", "0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    line = err.strip().splitlines()[-1]
    assert "training diverged: 2 steps in a row" in line, line
    assert line.endswith("try lower --lr, a longer warm-up (--warmup_fraction), --grad_clip 1.0; "
                         "run it again"), line
    assert FINETUNING_ADVICE["warmup"] in line and "schedule." not in line


@pytest.mark.parametrize("key", sorted(FINETUNING_ADVICE))
def test_the_fine_tuning_keys_are_options_finetune_takes(key):
    from bertgpu.config.finetune import load_finetune_config

    option = FINETUNING_ADVICE[key]
    if not option.startswith("--"):
        return
    value = {"--precision": "bf16"}.get(option, "0.1")
    load_finetune_config(None, [option, value])  # an unknown key would raise
