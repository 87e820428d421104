"""LAMB with optim.weight_decay 0 trains as AdamW: the trust ratio applies to the groups with
weight decay only (NVIDIA's FusedLAMB rule, train/optim.py). A probe's two 10-step runs, LAMB
and AdamW at weight decay 0, exported weights 1.9e-8 apart, while the start-up table said
"lamb" and nothing else. Now a start-up warning says so."""

from __future__ import annotations

import pytest
from test_run_status import _args

from bertgpu.cli import main
from bertgpu.data.synthetic import write_synthetic_shards

pytestmark = pytest.mark.usefixtures("one_thread")


def test_lamb_without_weight_decay_is_named_at_start_up(tmp_path, capsys):
    data = write_synthetic_shards(tmp_path / "d", n_train=32, n_val=8, seq_len=32, vocab_size=100)
    assert main(_args(data, tmp_path / "run", "--train.max_steps", "1",
                      "--optim.name", "lamb", "--optim.weight_decay", "0")) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert ("bertgpu pretrain: warning: optim.name lamb with optim.weight_decay 0: LAMB's trust "
            "ratio applies to the parameters with weight decay only") in err, err


@pytest.mark.parametrize("name, decay", [("lamb", 0.01), ("adamw", 0.0)])
def test_no_warning_otherwise(name, decay):
    from types import SimpleNamespace

    from bertgpu.train.pretrain_startup import lamb_note

    assert lamb_note(SimpleNamespace(name=name, weight_decay=decay)) is None
