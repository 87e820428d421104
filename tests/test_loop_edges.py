"""Edges of the training step, the loop and the pretraining task that the other tests leave
open: a loss term with no items, per-rank dropout seeds, the MLM accuracies, resumed counters,
torchrun's LOCAL_WORLD_SIZE default and the start-up table's batch arithmetic."""

from __future__ import annotations

import copy
import hashlib
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _shards import write_synthetic_shards
from _tiny import TINY
from _toy import ToyPretrain, count_fn, loss_fn, make_batch
from test_loop import make_loop

from bertgpu.train import distributed
from bertgpu.train.engine import Engine, seed_dropout

pytestmark = pytest.mark.usefixtures("one_thread")


# -- the engine ------------------------------------------------------------------------------------
def test_a_step_with_no_masked_tokens_anywhere_still_updates_the_weights():
    """A step whose MLM term has no items at all (no masked token on any rank) must train on its
    other terms, not divide 0 by 0 and be skipped as non-finite (several in a row would stop the
    run as diverged)."""
    torch.manual_seed(0)
    model = ToyPretrain()
    engine = Engine(model, torch.optim.AdamW(model.parameters(), lr=1e-2), max_nonfinite_steps=1)
    batch = make_batch(4, seed=0)
    batch["labels"] = torch.full_like(batch["labels"], -100)  # nothing to predict
    assert count_fn(batch) == {"mlm": 0, "nsp": 4}
    before = copy.deepcopy(model.state_dict())
    res = engine.train_step([batch], loss_fn, count_fn)
    assert not res.skipped and engine.skipped_steps == 0
    assert math.isfinite(res.loss) and math.isfinite(res.grad_norm)
    assert res.losses["mlm"] == 0.0 and res.loss == pytest.approx(res.losses["nsp"])
    assert not torch.equal(model.nsp.weight, before["nsp.weight"])  # the NSP term trained


def test_dropout_seeds_differ_between_ranks_and_repeat_per_rank():
    """Data-parallel ranks must draw different dropout noise from one run seed (the same masks
    on every rank would waste the extra replicas' regularisation), each rank reproducibly."""
    seed_dropout(7, 0)
    rank0 = torch.rand(8)
    seed_dropout(7, 1)
    rank1 = torch.rand(8)
    seed_dropout(7, 1)
    again = torch.rand(8)
    assert not torch.equal(rank0, rank1)
    assert torch.equal(rank1, again)


# -- the pretraining task --------------------------------------------------------------------------
@pytest.fixture
def pretrain_task(tmp_path: Path):
    """A PretrainTask over a synthetic MLM-only shard set (8 validation sequences) and a tiny
    BERT, on the CPU, single process."""
    import contextlib

    from bertgpu.data.masking import MaskingConfig
    from bertgpu.models.build import build_model
    from bertgpu.tasks.pretraining import PretrainData, PretrainTask

    data = PretrainData(write_synthetic_shards(tmp_path / "data", n_train=16, n_val=8,
                                               seq_len=16, vocab_size=99), None, None)
    assert not data.with_nsp and data.val is not None
    torch.manual_seed(0)
    model = build_model({"architecture": "bert", **TINY, "max_position_embeddings": 32},
                        "pretraining", with_nsp=False)
    return PretrainTask(data, model, SimpleNamespace(micro_batch_size=3), MaskingConfig(),
                        MaskingConfig(), seed=0, run_dir=tmp_path / "run", eval_sequences=0,
                        autocast=contextlib.nullcontext, info=distributed.DistInfo())


def test_validation_mlm_accuracy_is_correct_over_masked_tokens(pretrain_task):
    """val_mlm_acc is the share of masked validation tokens predicted right (a fraction in
    [0, 1]), not the correct count divided by another count (such as the NSP pairs, none here)."""
    from bertgpu.data.loaders import iter_eval_batches

    task = pretrain_task
    correct = masked = 0.0
    task.model.eval()
    with torch.no_grad():
        for batch in iter_eval_batches(task.data.val, task.eval_masking, 3, seed=0):
            out = task._eval_forward(batch)
            correct += float(out.mlm_correct)
            masked += float(out.mlm_count)
    assert masked > 0
    result = task.evaluate(step=1, train_loss=None)
    assert 0.0 <= result["val_mlm_acc"] <= 1.0
    assert result["val_mlm_acc"] == pytest.approx(correct / masked)
    assert "val_nsp_acc" not in result


def test_logged_mlm_accuracy_is_over_masked_tokens_not_all_tokens(pretrain_task):
    """The training log's mlm_acc divides the correct predictions by the masked tokens of the
    step, not by every real token of it."""
    res = SimpleNamespace(step=1, losses={"mlm": 2.0}, extras={"_mlm_correct": 5.0},
                          counts={"mlm": 10, "tokens": 100, "sequences": 2})
    scalars = pretrain_task.log_scalars(res)
    assert scalars["mlm_acc"] == pytest.approx(0.5)
    assert scalars["mlm_loss"] == 2.0


# -- the loop --------------------------------------------------------------------------------------
def test_a_resumed_run_counts_sequences_seen_from_its_checkpoint(tmp_path):
    """After a resume the loop's sequences_seen (behind the examples/s rates) is the
    checkpoint's sequence count, not its token count."""
    first, _, _ = make_loop(tmp_path / "run", max_steps=2, checkpoint_every=2)
    first.run()
    assert (first.sequences_seen, first.tokens_seen) == (16, 96)  # 2 steps x 8 rows x 6 tokens
    again, _, _ = make_loop(tmp_path / "run", max_steps=2, checkpoint_every=2)
    assert again.engine.step == 2
    assert again.sequences_seen == 16 and again.tokens_seen == 96


# -- distributed set-up ----------------------------------------------------------------------------
def test_local_world_size_defaults_to_the_world_size(monkeypatch):
    """Without torchrun's LOCAL_WORLD_SIZE every process is taken to be on one node (HSDP's
    shard group is the whole world), not alone on its node."""

    class GroupAlreadyUp:  # the caller set up the process group: nothing to join
        @staticmethod
        def is_initialized() -> bool:
            return True

    monkeypatch.setattr(distributed, "_dist", lambda: GroupAlreadyUp)
    for key, value in {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    info = distributed.init_distributed("cpu")
    assert info == distributed.DistInfo(1, 4, 1, "cpu", "gloo", 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert distributed.init_distributed("cpu").local_world_size == 2


# -- the start-up table ----------------------------------------------------------------------------
def test_startup_table_batch_arithmetic():
    """The start-up table shows the per-device batch as micro batch x accumulation and the
    tokens per step as global batch x sequence length (not the micro batch, not sequences)."""
    from bertgpu.config.schema import load_config
    from bertgpu.train.pretrain_startup import startup_rows

    class Split:
        seq_len, objective = 128, "mlm"

        def __len__(self) -> int:
            return 1000

    cfg = load_config(None, ["--train.global_batch_size", "16",
                                "--impl.micro_batch_size", "4"])
    data = SimpleNamespace(dir=Path("data"), train=Split())
    info = distributed.DistInfo(0, 2, 0, "cpu", "gloo", 2)
    rows = dict(startup_rows(cfg, data, torch.nn.Linear(2, 2), 1e-4, micro=4, accumulation=2,
                             info=info))
    assert rows["micro batch per device"] == "4" and rows["accumulation steps"] == "2"
    assert rows["batch per device per step"] == "8"
    assert rows["devices"] == "2" and rows["global batch (sequences/step)"] == "16"
    assert rows["tokens per step (at most)"] == "2,048"


def test_the_data_identity_reads_the_manifest_once_not_every_step(pretrain_task, monkeypatch):
    """The preemption snapshot takes the task's state before every step: the identity of the
    shard set (the manifest's sha256) is read when the task is made, not hashed again each
    step (1.8 ms a step for a 3 MB manifest, more on a shared file system)."""
    reads = []
    read_bytes = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self) or read_bytes(self))
    first = pretrain_task.data_identity()
    assert all(pretrain_task.data_identity() == first for _ in range(5))
    assert reads == []
    assert first["manifest_sha256"] == hashlib.sha256(
        pretrain_task.data.train.manifest_path.read_bytes()).hexdigest()
