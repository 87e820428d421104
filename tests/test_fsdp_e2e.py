"""`bertgpu pretrain --distributed.strategy fsdp` end to end on CPU (gloo, 2 processes): the same
weights as ddp; sharded checkpoints that a SIGKILL and a re-run continue bitwise; ddp -> fsdp ->
ddp resumes across strategies and world sizes; a background (async) write that overlaps the steps
and leaves the previous checkpoint the newest complete one when a crash hits it; a full disk
during a sharded save; `bertgpu export` of a sharded checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _e2e import TINY, assert_bitwise_equal, bertgpu, bertgpu_here, final_weights
from _shards import write_synthetic_shards

from bertgpu.telemetry.records import read_metrics

STEPS = 12
FSDP = ("--distributed.strategy", "fsdp")


def args(data: Path, out: Path, *extra: str) -> list[str]:
    # Dropout off and a constant lr: runs that differ only in how the work is split compare.
    return [
        "pretrain",
        TINY,
        "--data",
        str(data),
        "--out",
        str(out),
        "--model.vocab_size",
        "100",
        "--model.hidden_size",
        "32",
        "--model.intermediate_size",
        "64",
        "--model.max_position_embeddings",
        "64",
        "--model.hidden_dropout_prob",
        "0",
        "--model.attention_probs_dropout_prob",
        "0",
        "--train.global_batch_size",
        "8",
        "--impl.micro_batch_size",
        "2",
        "--train.log_every_steps",
        "1",
        "--train.eval_every_steps",
        "4",
        "--train.eval_sequences",
        "4",
        "--schedule.decay",
        "constant",
        "--schedule.warmup_steps",
        "0",
        "--impl.num_workers",
        "0",
        "--train.max_steps",
        str(STEPS),
        "--checkpoint.every_steps",
        "4",
        "--checkpoint.keep_last",
        "0",
        *extra,
    ]


def run_ok(argv: list[str], faults: str = "") -> str:
    done = bertgpu_here(argv, faults=faults)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5, msg=k)


def last_line(text: str) -> str:
    return [line for line in text.strip().splitlines() if line.strip()][-1]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(
        tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16, seq_len=32, vocab_size=100
    )


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    """The uninterrupted references: 12 steps on 2 processes, ddp and fsdp (accumulation 2)."""
    out = {}
    for strategy in ("ddp", "fsdp"):
        run = tmp_path_factory.mktemp(strategy) / "run"
        run_ok(args(shards, run, "--nproc", "2", "--distributed.strategy", strategy))
        out[strategy] = run
    return out


@pytest.mark.timeout(400)
def test_fsdp_equals_ddp_and_writes_sharded_checkpoints(runs, tmp_path):
    close(final_weights(runs["fsdp"]), final_weights(runs["ddp"]))
    # The logged loss and gradient norm of every step too: AdamW with clipping barely moves the
    # weights differently for a gradient off by a constant factor, the norm shows it.
    logs = {
        s: [r for r in read_metrics(runs[s] / "metrics.jsonl") if r["kind"] == "train"]
        for s in runs
    }
    assert len(logs["fsdp"]) == len(logs["ddp"]) == STEPS
    for a, b in zip(logs["fsdp"], logs["ddp"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a, b)
    ckpt = runs["fsdp"] / "checkpoints" / "step_12"
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == [
        ".metadata",
        "COMPLETE",
        "__0_0.distcp",
        "__1_0.distcp",
        "checksums.json",
        "config.json",
        "config.toml",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "train_state.pt",
        "vocab.txt",
    ]
    assert set(json.loads((ckpt / "checksums.json").read_text())["files"]) == set(names) - {
        "COMPLETE",
        "checksums.json",
    }
    state = torch.load(ckpt / "train_state.pt", weights_only=True)
    assert "optimizer" not in state and state["world_size"] == 2 and state["step"] == STEPS
    # `bertgpu export` gathers the shards whole: the same weights as the end-of-run export.
    run_ok(["export", str(runs["fsdp"]), "--out", str(tmp_path / "hf")])
    from safetensors.torch import load_file

    assert_bitwise_equal(
        load_file(str(tmp_path / "hf" / "model.safetensors")), final_weights(runs["fsdp"])
    )
    train = [r for r in read_metrics(runs["fsdp"] / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))


@pytest.mark.timeout(400)
def test_sigkill_and_rerun_equal_the_uninterrupted_run(shards, runs, tmp_path):
    run = tmp_path / "run"
    killed = bertgpu_here(args(shards, run, "--nproc", "2", *FSDP), faults="kill_rank=1@step=7")
    assert killed.returncode != 0
    assert last_line(killed.stderr).endswith(
        f"resumes from step 4 ({run / 'checkpoints' / 'step_4'})"
    )
    out = run_ok(args(shards, run, "--nproc", "2", *FSDP))
    assert "resumed from" in out and "step_4" in out
    assert_bitwise_equal(final_weights(runs["fsdp"]), final_weights(run))


@pytest.mark.timeout(500)
def test_ddp_to_fsdp_to_ddp_at_other_world_sizes(shards, runs, tmp_path):
    """ddp (2 ranks) to step 4, fsdp (2 ranks) to step 8, ddp on 1 process to the end."""
    run = tmp_path / "run"
    run_ok(args(shards, run, "--nproc", "2", "--train.max_steps", "4"))
    assert (run / "checkpoints" / "step_4" / "model.safetensors").is_file()
    out = run_ok(args(shards, run, "--nproc", "2", "--train.max_steps", "8", *FSDP))
    assert "resumed from" in out and "step_4" in out
    assert (run / "checkpoints" / "step_8" / ".metadata").is_file()
    out = run_ok(args(shards, run))
    assert "resumed from" in out and "step_8" in out
    close(final_weights(run), final_weights(runs["ddp"]))
    steps = [
        r["step"]
        for r in read_metrics(run / "metrics.jsonl", drop_superseded=True)
        if r["kind"] == "train"
    ]
    assert steps == list(range(1, STEPS + 1))


def test_resume_optimizer_reads_an_fsdp_checkpoints_moments(runs, shards, tmp_path):
    """`--init RUN --resume-optimizer` from a sharded run: the moments come from its DCP files
    (they failed as "cannot read its optimizer state ('optimizer')"), the same as the ddp run's
    of the same steps, on one process."""
    from bertgpu import pretrain
    from bertgpu.config import schema
    from bertgpu.train.distributed import DistInfo

    moments = {}
    for strategy, run in runs.items():
        words = args(shards, tmp_path / strategy)[2:] + ["--init", str(run), "--resume-optimizer"]
        loop = pretrain.build(schema.load_config(TINY, words), DistInfo())
        opt = loop.engine.optimizer
        names = {id(p): n for n, p in loop.model.named_parameters()}
        moments[strategy] = {
            f"{names[id(p)]}.{key}": opt.state[p][key].detach().clone()
            for g in opt.param_groups for p in g["params"] for key in ("exp_avg", "exp_avg_sq")
        }
        steps = {float(opt.state[p]["step"]) for g in opt.param_groups for p in g["params"]}
        assert steps == {float(STEPS)}, (strategy, steps)
        assert "weights and optimizer state" in dict(loop.startup_rows)["init"]
        loop.task.close()
    assert len(moments["fsdp"]) == len(moments["ddp"]) > 0
    close(moments["fsdp"], moments["ddp"])
    assert any(v.abs().sum() > 0 for v in moments["fsdp"].values())


@pytest.mark.timeout(400)
def test_resume_optimizer_from_a_ddp_run_into_an_fsdp_one(runs, shards, tmp_path):
    """Whole moments (a ddp checkpoint) into a sharded run: fused AdamW failed on them ("mixed
    torch.Tensor and DTensor"); now each rank takes its shards and trains as one process does."""
    init = ["--init", str(runs["ddp"]), "--resume-optimizer", "--train.max_steps", "3"]
    run_ok(args(shards, tmp_path / "fsdp", *init, "--nproc", "2", *FSDP))
    run_ok(args(shards, tmp_path / "one", *init))
    logs = {r: [x for x in read_metrics(tmp_path / r / "metrics.jsonl") if x["kind"] == "train"]
            for r in ("fsdp", "one")}
    assert len(logs["fsdp"]) == len(logs["one"]) == 3
    for a, b in zip(logs["fsdp"], logs["one"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), (a, b)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), (a, b)


@pytest.mark.timeout(500)
def test_async_save_overlaps_the_steps_and_survives_a_crash_during_the_write(
    shards, runs, tmp_path
):
    """Every shard file waits 3 s after its first bytes (slow_write): the write of step 4 goes on
    while steps 5.. train; rank 0 dies at step 9 in the middle of step 8's shard file, which is
    left cut: step_4 stays the newest complete checkpoint and the re-run ends bitwise equal to
    the run that never failed."""
    run = tmp_path / "run"
    extra = ("--nproc", "2", *FSDP, "--checkpoint.async_save", "true")
    killed = bertgpu_here(args(shards, run, *extra), faults="slow_write=3,kill_rank=0@step=9")
    assert killed.returncode != 0 and "SIGKILL rank 0 at step 9" in killed.stderr
    records = read_metrics(run / "metrics.jsonl")
    started = next(r for r in records if r.get("event") == "checkpoint" and r["step"] == 4)
    written = next(
        r for r in records if r.get("event") == "checkpoint_written" and r["saved_step"] == 4
    )
    assert started["background"] and started["stall_s"] < written["write_s"]
    during = [
        r["step"]
        for r in records
        if r["kind"] == "train" and started["time"] <= r["time"] <= written["time"]
    ]
    assert 5 in during, (started, written, during)  # training went on while the files were written
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["step_4", "step_8.tmp"], names
    # rank 0's shard of step 8 is on disk, cut: some bytes, fewer than step 4's same tensors
    cut = run / "checkpoints" / "step_8.tmp" / "__0_0.distcp"
    whole = (run / "checkpoints" / "step_4" / "__0_0.distcp").stat().st_size
    assert 0 < cut.stat().st_size < whole, (cut.stat().st_size, whole)
    assert not (cut.parent / ".metadata").exists()
    again = bertgpu_here(args(shards, run, *extra))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "step_8.tmp: removed" in again.stdout and "resumed from" in again.stdout
    assert_bitwise_equal(final_weights(runs["fsdp"]), final_weights(run))


@pytest.mark.timeout(400)
def test_disk_full_during_a_sharded_save_then_rerun(shards, runs, tmp_path):
    """One process with strategy fsdp (a group of one). A save writes train_state.pt, config.toml,
    config.json, the tokenizer's four files, the shard file, .metadata, checksums.json and
    COMPLETE: the 19th write is the shard file of the second checkpoint (step 8)."""
    run = tmp_path / "run"
    failed = bertgpu(args(shards, run, *FSDP), faults="enospc_write=19")
    assert failed.returncode == 2
    line = last_line(failed.stderr)
    assert "No space left on device" in line and "step_8" in line and "step_4 is intact" in line, (
        line
    )
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_4"]
    run_ok(args(shards, run, *FSDP))
    close(final_weights(run), final_weights(runs["ddp"]))
