"""Fine-tuning across world sizes: a checkpoint written on 2 processes resumes on 1 (a step's
sequences and math do not depend on the number of devices, as in pretraining), unless the number
of devices changes the steps per epoch; and the batch error names the settings the user gave."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import _tiny_init
import numpy as np
import pytest
import torch
from _e2e import bertgpu_here
from test_finetune import VOCAB, sst2_fixture

from bertgpu.config.finetune import check_batch, load_finetune_config
from bertgpu.errors import BertgpuError
from bertgpu.tasks.finetune_output import resumable, run_identity
from bertgpu.tasks.finetuning import Encoded, Job
from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread", "no_faults")


def _no_dropout_init(root: Path) -> Path:
    """The tiny init with every dropout off (attention's too), so that 1 and 2 processes train
    the same model: each rank draws its own dropout noise."""
    init = _tiny_init.tiny_init(root, VOCAB)
    config = json.loads((init / "config.json").read_text(encoding="utf-8"))
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (init / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return init


@pytest.mark.timeout(240)
def test_a_two_process_checkpoint_resumes_on_one_process(tmp_path):
    """The review's case: `finetune sst2 ... --nproc 2` stopped at step 9, re-run on 1 process,
    warned "its checkpoint (step_9) is of another run (world_size 2 -> 1); starting over" and
    trained from step 1 again. Now it resumes at step 9 and ends where an uninterrupted
    1-process run ends (dropout off: per-step losses, metrics and weights to float tolerance)."""
    from safetensors.torch import load_file

    init = _no_dropout_init(tmp_path)
    sst2_fixture(tmp_path / "SST-2", n_train=64, n_dev=16)  # 8 steps per epoch on 1 or 2
    args = ["finetune", "sst2", "--data", str(tmp_path / "SST-2"), "--init", str(init),
            "--epochs", "2", "--global_batch_size", "8", "--max_seq_len", "32", "--lr", "3e-3",
            "--log_every_steps", "1", "--checkpoint_every_steps", "3",
            "--checkpoint_async_save", "false"]  # step 9's checkpoint is complete at the kill
    ref, out = tmp_path / "ref", tmp_path / "ft"
    done = bertgpu_here([*args, "--out", str(ref)])
    assert done.returncode == 0, done.stderr[-2000:]

    killed = bertgpu_here([*args, "--out", str(out), "--nproc", "2"], faults="kill_rank=0@step=10")
    assert killed.returncode != 0
    assert "re-running the same command resumes from step 9" in killed.stderr
    again = bertgpu_here([*args, "--out", str(out)])
    assert again.returncode == 0, again.stderr[-2000:]
    assert "another run" not in again.stderr
    assert f"resumed from {out}.tmp/checkpoints/step_9 (step 9," in again.stdout

    # One metrics.jsonl: the 2-process run's steps 1-9, then the 1-process run's from step 10.
    records = read_metrics(out)
    starts = [(r["step"], r["world_size"]) for r in records if r.get("event") == "start"]
    assert starts == [(0, 2), (9, 1)]
    losses = {r["step"]: r["loss"] for r in read_metrics(ref) if r["kind"] == "train"}
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 17)) == sorted(losses)
    assert [r["loss"] for r in train] == pytest.approx([losses[s] for s in range(1, 17)],
                                                       rel=1e-5, abs=1e-6)
    a, b = (json.loads((p / "results.json").read_text()) for p in (ref, out))
    assert b["steps"] == a["steps"] == 16 and b["world_size"] == 1
    assert [e["metrics"] for e in b["epochs"]] == [e["metrics"] for e in a["epochs"]]
    assert [e["train_loss"] for e in b["epochs"]] == pytest.approx(
        [e["train_loss"] for e in a["epochs"]], rel=1e-5)
    wa, wb = (load_file(str(p / "model" / "model.safetensors")) for p in (ref, out))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5, msg=k)


def _job(n_train: int) -> Job:
    ids = [np.array([2, 5 + i % 7, 3]) for i in range(n_train)]
    train = Encoded(ids, [np.zeros(3, dtype=np.int64) for _ in ids],
                    targets={"labels": np.arange(n_train) % 2})
    return Job("SST-2", "classification", 2, train, [], lambda metrics: 0.0)


def _checkpoint(tmp_path: Path, identity: str) -> Path:
    folder = tmp_path / "ft.tmp" / "checkpoints" / "step_24"
    folder.mkdir(parents=True)
    (folder / "finetune.json").write_text(identity, encoding="utf-8")
    return folder


FIELDS = {"task": "SST-2", "init": "runs/base"}
CONFIG = {"global_batch_size": 8, "lr": 1e-3, "micro_batch_size": None, "log_every_steps": 5}


def test_another_world_size_resumes_unless_it_changes_the_steps_per_epoch(tmp_path):
    """64 sequences in batches of 8: 8 steps per epoch on 1 or 2 devices, resumed. 65: the 65th
    sequence is a step of its own on 1 device (9 steps) but not on 2 (8 steps: a device would
    get none), so every later step's sequences and the schedule's length move: it starts over,
    naming the world size and the steps."""
    ckpt = _checkpoint(tmp_path / "a", run_identity(FIELDS, CONFIG, _job(64), 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resumable(ckpt.parents[1], ckpt, run_identity(FIELDS, CONFIG, _job(64), 1))
        assert resumable(ckpt.parents[1], ckpt, run_identity(FIELDS, CONFIG, _job(64), 4))

    ckpt = _checkpoint(tmp_path / "b", run_identity(FIELDS, CONFIG, _job(65), 2))
    with pytest.warns(UserWarning, match=r"ft.tmp: its checkpoint \(step_24\) is of another run "
                                         r"\(world_size 2 -> 1, which makes 8 -> 9 steps per "
                                         r"epoch \(an epoch's last, smaller step is taken only "
                                         r"when every device gets a sequence of it\)\); "
                                         r"starting over$"):
        assert not resumable(ckpt.parents[1], ckpt, run_identity(FIELDS, CONFIG, _job(65), 1))
    # another setting as well: both are named; the steps that follow from it alone are not
    other = {**CONFIG, "global_batch_size": 16}
    with pytest.warns(UserWarning, match=r"\(global_batch_size 8 -> 16\); starting over$"):
        assert not resumable(ckpt.parents[1], ckpt, run_identity(FIELDS, other, _job(65), 2))


def test_a_checkpoint_of_an_earlier_version_resumes_at_its_own_world_size(tmp_path):
    """finetune.json without steps_per_epoch (written before they were stored): resumed at the
    world size it names, which made the same steps; at another one it cannot be told."""
    identity = json.loads(run_identity(FIELDS, CONFIG, _job(64), 2))
    del identity["steps_per_epoch"]
    ckpt = _checkpoint(tmp_path, json.dumps(identity, sort_keys=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resumable(ckpt.parents[1], ckpt, run_identity(FIELDS, CONFIG, _job(64), 2))
    with pytest.warns(UserWarning, match=r"\(world_size 2 -> 1 \(a checkpoint of an earlier "
                                         r"version, which does not say its steps per epoch\)\)"):
        assert not resumable(ckpt.parents[1], ckpt, run_identity(FIELDS, CONFIG, _job(64), 1))


def test_the_batch_error_names_the_micro_batch_only_when_it_was_given():
    """`--global_batch_size 7 --nproc 2` said "not divisible by --micro_batch_size 3 x 2 devices",
    a micro batch the user never gave (3 = 7 // 2). Both errors name settings that divide, as
    pretrain's do (they said only "a multiple of 6")."""
    derived = load_finetune_config(None, ["--global_batch_size", "7"])
    with pytest.raises(BertgpuError) as err:
        check_batch(derived, 2)
    assert str(err.value) == ("--global_batch_size 7 is not divisible by --nproc 2 (each device "
                              "takes an equal share of every step); expected a multiple of 2, "
                              "e.g. --global_batch_size 6 or 8")
    with pytest.raises(BertgpuError, match=r"^--global_batch_size 1 is not divisible by --nproc "
                                           r"4 .*; expected a multiple of 4, e.g. "
                                           r"--global_batch_size 4$"):
        check_batch(load_finetune_config(None, ["--global_batch_size", "1"]), 4)
    given = load_finetune_config(None, ["--global_batch_size", "7", "--micro_batch_size", "3"])
    with pytest.raises(BertgpuError) as err:
        check_batch(given, 2)
    assert str(err.value) == ("--global_batch_size 7 is not divisible by --micro_batch_size 3 x "
                              "2 devices = 6; expected a global batch that the 2 devices share "
                              "equally (a multiple of 2) in whole micro batches, e.g. "
                              "--global_batch_size 6, --global_batch_size 8 --micro_batch_size 2, "
                              "or a multiple of 6 for micro batch 3: --global_batch_size 6 or 12")
    shared = load_finetune_config(None, ["--global_batch_size", "12", "--micro_batch_size", "8"])
    with pytest.raises(BertgpuError, match=r"expected a micro batch that divides the 4 sequences "
                                           r"per device, e.g. --micro_batch_size 4, or"):
        check_batch(shared, 3)
    assert check_batch(derived, 1) == (7, 1)
    assert check_batch(load_finetune_config(None, ["--global_batch_size", "8"]), 2) == (4, 1)


def test_the_cli_says_it_in_one_line_before_launching(tmp_path, capsys):
    from bertgpu.cli import main

    init = _tiny_init.tiny_init(tmp_path, VOCAB)
    out = tmp_path / "fx"
    assert main(["finetune", "sst2", "--data", str(tmp_path / "glue"), "--init", str(init),
                 "--epochs", "1", "--out", str(out), "--global_batch_size", "7",
                 "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].endswith(
        "error: --global_batch_size 7 is not divisible by --nproc 2 (each device takes an equal "
        "share of every step); expected a multiple of 2, e.g. --global_batch_size 6 or 8")
    assert "Traceback" not in err and "--micro_batch_size" not in err
    assert not out.exists() and not out.with_name("fx.tmp").exists()


def test_sequences_no_step_takes_are_warned_about():
    """65 sequences in batches of 8 on 2 devices: the 65th is a step of its own on one device,
    none on two (a device would get nothing), so two devices train fewer sequences per epoch:
    said at start-up now (a 3-sequence set trained 4 steps on 1 process and 2 on 2, silently)."""
    from bertgpu.tasks.finetune_output import warn_left_out

    with pytest.warns(UserWarning, match=r"^SST-2: the last 1 of 65 training sequences of each "
                                         r"epoch are left out: a step takes at least one per "
                                         r"device \(2\); a global_batch_size that leaves none, or "
                                         r"fewer devices, keeps them$"):
        warn_left_out(_job(65), 8, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_left_out(_job(65), 8, 1)  # one device takes it
        warn_left_out(_job(66), 8, 2)  # one each
        warn_left_out(_job(64), 8, 2)
        warn_left_out(_job(65), 8, 2, say=False)  # the other ranks


def test_fewer_training_sequences_than_devices_says_what_would_do():
    """It said "SST-2: 2 training sequences for 3 devices" and no more."""
    from bertgpu.tasks.finetuning import steps_per_epoch

    with pytest.raises(BertgpuError, match=r"^SST-2: 2 training sequences for 3 devices; expected "
                                           r"at least one per device \(--nproc 2 or fewer\)$"):
        steps_per_epoch(_job(2), 12, 3)
