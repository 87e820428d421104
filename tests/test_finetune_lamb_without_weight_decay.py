"""`bertgpu finetune` (and `glue`, which fine-tunes through it) with --optimizer lamb and
--weight_decay 0 says at start-up that the run is AdamW's, as `bertgpu pretrain` does
(train/pretrain_startup.lamb_note): LAMB's trust ratio applies to the groups with weight decay
only. Fine-tuning said nothing, its start-up table "lamb"."""

from __future__ import annotations

import pytest
from test_finetune import FAST, sst2_fixture, tiny_init

from bertgpu.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("decay, warned", [("0", True), ("0.01", False)])
def test_finetune_names_lamb_without_weight_decay(tmp_path, capsys, decay, warned):
    init = tiny_init(tmp_path)
    data = sst2_fixture(tmp_path / "SST-2", n_train=16, n_dev=8)
    assert main(["finetune", "sst2", "--data", str(data), "--init", str(init),
                 "--out", str(tmp_path / "ft"), *FAST, "--epochs", "1",
                 "--optimizer", "lamb", "--weight_decay", decay]) == 0
    err = " ".join(capsys.readouterr().err.split())
    note = ("bertgpu finetune: warning: optimizer lamb with weight_decay 0: LAMB's trust ratio "
            "applies to the parameters with weight decay only")
    assert (note in err) is warned, err  # old code: no such line
    if warned:
        assert "or optimizer adamw" in err and "optim.name" not in err, err
