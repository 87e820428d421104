"""`bertgpu glue` counts a finished seed in its table only when this command's number of
processes would train it with the same steps per epoch. An epoch's last, smaller step is left
out when a device would get no sequence of it: SST-2's fixture (3 training sequences) at
global batch 2 takes 2 steps an epoch on 1 process and 1 on 2. A seed trained on one and a seed
trained on the other had made one median under one protocol line, with no word."""

from __future__ import annotations

import pytest
from test_glue_probe_fixes import _sst2_copy
from test_glue_reuse import _run, tiny_init  # noqa: F401 (tiny_init: a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")

ARGS = ("--max_seq_len", "64", "--global_batch_size", "2", "--epochs", "1")


def test_a_seed_trained_on_other_steps_per_epoch_is_refused(tmp_path, tiny_init, capsys,  # noqa: F811
                                                            monkeypatch):
    data, out = _sst2_copy(tmp_path / "g"), tmp_path / "out"
    assert _run(data, tiny_init, out, *ARGS, "--seeds", "1") == 0
    capsys.readouterr()
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets for --nproc 2
    assert _run(data, tiny_init, out, *ARGS, "--seeds", "1", "2") == 2  # old code: trained on
    err = capsys.readouterr().err
    assert "made with 1 process, 2 steps an epoch (now 1 on 2); a table would mix" in err, err
    assert not (out / "SST-2" / "seed_2").exists()


def test_another_number_of_processes_with_the_same_steps_counts():
    from bertgpu import glue_reuse
    from bertgpu.config.finetune import load_finetune_config

    cfg = load_finetune_config(None, ["--global_batch_size", "3"])
    # 3 sequences at batch 3: 1 step an epoch on 1, 2 or 3 processes
    assert glue_reuse._steps_change({"world_size": 1, "train_sequences": 3}, cfg, 3) == []
    assert glue_reuse._steps_change({"world_size": 1, "train_sequences": 4}, cfg, 2) == [
        "1 process, 2 steps an epoch (now 1 on 2)"]
