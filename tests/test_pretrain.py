"""End-to-end pretraining on a synthetic shard set: resume exactness, preemption, bad input."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _shards import write_synthetic_shards
from safetensors.torch import load_file

from bertgpu.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")

# In-process runs of a tiny model: one intra-op thread (on a busy 2-core machine spinning threads
# make each step seconds slower); the subprocesses below get OMP_NUM_THREADS=1 for the same reason.
pytestmark = pytest.mark.usefixtures("one_thread")


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "pretrain", TINY, "--data", str(data), "--out", str(out),
        "--model.vocab_size", "100", "--model.hidden_size", "32", "--model.intermediate_size", "64",
        "--model.max_position_embeddings", "64",
        "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
        "--train.log_every_steps", "1", "--train.eval_every_steps", "0",
        "--train.eval_sequences", "8", "--checkpoint.keep_last", "0", *extra,
    ]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _final_weights(run: Path) -> dict:
    steps = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return load_file(str(steps[-1] / "model.safetensors"))


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k  # bitwise: same values, no tolerance


def test_sigkill_and_rerun_is_bitwise_identical(shards: Path, tmp_path: Path) -> None:
    # Long enough (a few seconds) that the kill below always lands mid-run, at whatever step the
    # subprocess has reached by then; checkpoints every 8 steps, kept (keep_last 0).
    steps = "300"
    ref = tmp_path / "ref"
    assert main(_args(shards, ref, "--train.max_steps", steps,
                      "--checkpoint.every_steps", "8")) == 0

    # The same run in a subprocess, killed with SIGKILL right after some checkpoint appears.
    run = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bertgpu", *_args(shards, run, "--train.max_steps", steps,
                                                    "--checkpoint.every_steps", "8")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run / "checkpoints" / "step_16").exists():
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (run / "checkpoints" / "step_16").exists(), "the run never reached its second checkpoint"
    assert not (run / "hf").exists(), "the killed run should not have finished"

    # Re-running the same command resumes from the latest complete checkpoint.
    assert main(_args(shards, run, "--train.max_steps", steps,
                      "--checkpoint.every_steps", "8")) == 0
    _assert_bitwise_equal(_final_weights(ref), _final_weights(run))
    _assert_bitwise_equal(load_file(str(ref / "hf" / "model.safetensors")),
                          load_file(str(run / "hf" / "model.safetensors")))


def test_sigterm_writes_a_checkpoint_before_exiting(shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "preempted"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "bertgpu", *_args(shards, run, "--train.max_steps", "100000",
                                                    "--checkpoint.every_steps", "0")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while (time.monotonic() < deadline
           and not (metrics.exists() and metrics.read_text().count("\n") >= 3)):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    ckpts = list((run / "checkpoints").glob("step_*"))
    assert len(ckpts) == 1 and (ckpts[0] / "COMPLETE").exists()


def test_resume_continues_and_does_not_repeat_steps(shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "r"
    assert main(_args(shards, run, "--train.max_steps", "3", "--checkpoint.every_steps", "0")) == 0
    assert main(_args(shards, run, "--train.max_steps", "5", "--checkpoint.every_steps", "0")) == 0
    import json

    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--train.max_stepz", "3"], "train.max_stepz"),
        (["--train.global_batch_size", "10", "--impl.micro_batch_size", "4"], "multiple of"),
        (["--model.vocab_size", "50"], "vocab"),
        (["--model.max_position_embeddings", "16"], "seq"),
    ],
)
def test_bad_configs_give_one_line_errors(shards: Path, tmp_path: Path, capsys, extra,
                                          message) -> None:
    rc = main(_args(shards, tmp_path / "bad", "--train.max_steps", "2", *extra))
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "bad" / "checkpoints").exists()


def test_shards_from_another_tokenizer_are_refused_on_resume(shards: Path, tmp_path: Path,
                                                             capsys) -> None:
    run = tmp_path / "r"
    assert main(_args(shards, run, "--train.max_steps", "2")) == 0
    other = write_synthetic_shards(tmp_path / "other", n_train=32, n_val=8, seq_len=32,
                                   vocab_size=99)
    rc = main(_args(other, run, "--train.max_steps", "4"))
    err = capsys.readouterr().err
    assert rc == 2 and "tokenizer" in err, err


def test_another_model_is_refused_on_resume_and_the_run_is_left_as_it_was(
        shards: Path, tmp_path: Path, capsys) -> None:
    """Resuming with another model shape (or head count, which keeps every shape) is one line
    naming what differs, and so is another data seed; nothing is written: the run's config.toml
    still describes its checkpoints. A changed dropout is a legitimate resume."""
    run = tmp_path / "r"
    assert main(_args(shards, run, "--train.max_steps", "2")) == 0
    config = (run / "config.toml").read_text()
    metrics = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    for change, message in ((["--model.hidden_size", "16"], "hidden_size 32 there, 16 here"),
                            (["--model.num_attention_heads", "4"],
                             "num_attention_heads 2 there, 4 here"),
                            (["--seed", "7"], "trained with seed 0 and this command gives seed 7")):
        rc = main(_args(shards, run, "--train.max_steps", "4", *change))
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and message in err, err
        if "--seed" not in change:
            assert "step_2" in err and "--out" in err, err
        assert (run / "config.toml").read_text() == config, change
        assert (run / "metrics.jsonl").read_text() == metrics, change
    # with --nproc, refused before any worker starts (not once per rank under torch's report)
    rc = main(_args(shards, run, "--train.max_steps", "4", "--model.hidden_size", "16",
                    "--nproc", "2"))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "hidden_size 32 there, 16 here" in err, err
    assert main(_args(shards, run, "--train.max_steps", "3",
                      "--model.hidden_dropout_prob", "0")) == 0


def test_resume_with_another_global_batch_continues(shards: Path,
                                                    tmp_path: Path) -> None:
    """The loader's state is a global position, so a run may resume with a larger global batch
    (the checkpoint's per-rank batch shares, summing to the old one, are measured again)."""
    import json

    run = tmp_path / "r"
    assert main(_args(shards, run, "--train.max_steps", "2")) == 0
    assert main(_args(shards, run, "--train.max_steps", "3", "--train.global_batch_size",
                      "16")) == 0
    train = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    seen = [r["tokens_seen"] for r in train]
    assert seen[2] - seen[1] == 2 * (seen[1] - seen[0])  # 16 sequences of 32 tokens, not 8


def test_rerunning_a_finished_run_says_so_and_changes_nothing(shards: Path, tmp_path: Path,
                                                              capsys) -> None:
    """The same command again after a run ended at max_steps: one line, no evaluation or export
    of the same weights again, metrics.jsonl as it was; a larger max_steps trains on."""
    run = tmp_path / "r"
    assert main(_args(shards, run, "--train.max_steps", "2")) == 0
    metrics = (run / "metrics.jsonl").read_text()
    export = (run / "hf" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(_args(shards, run, "--train.max_steps", "2")) == 0
    out = capsys.readouterr().out
    assert f"{run}: finished at step 2 (train.max_steps 2); nothing to train" in out, out
    assert len(out.strip().splitlines()) == 1, out
    assert (run / "metrics.jsonl").read_text() == metrics
    assert (run / "hf" / "model.safetensors").stat().st_mtime_ns == export
    assert main(_args(shards, run, "--train.max_steps", "3")) == 0
    assert "done: step 3" in capsys.readouterr().out


def test_a_warm_up_longer_than_the_run_is_a_warning(shards: Path, tmp_path: Path,
                                                    capsys) -> None:
    assert main(_args(shards, tmp_path / "r", "--train.max_steps", "2",
                      "--schedule.warmup_steps", "5")) == 0
    assert ("bertgpu pretrain: warning: schedule.warmup_steps 5 >= train.max_steps 2: the warm-up "
            "takes the whole run") in capsys.readouterr().err


def _losses(run: Path) -> list[float]:
    import json

    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "train"]


def test_padding_free_paths_train_the_same_model(tmp_path: Path) -> None:
    """unpad and length bucketing change speed, not math: same per-step losses as the plain run
    (variable-length data, dropout off so the runs are comparable)."""
    data = write_synthetic_shards(tmp_path / "var", n_train=64, n_val=8, seq_len=32, vocab_size=100,
                                  variable_lengths=True)
    common = ["--train.max_steps", "4", "--model.hidden_dropout_prob", "0",
              "--model.attention_probs_dropout_prob", "0"]
    assert main(_args(data, tmp_path / "plain", *common)) == 0
    assert main(_args(data, tmp_path / "fast", *common, "--impl.unpad", "true",
                      "--impl.bucket_window", "2")) == 0
    assert _losses(tmp_path / "plain") == pytest.approx(_losses(tmp_path / "fast"), rel=1e-4)


def test_auto_micro_batch_keeps_the_global_batch(shards: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "auto"
    assert main(_args(shards, run, "--train.max_steps", "2",
                      "--impl.micro_batch_size", "auto")) == 0
    out = capsys.readouterr().out
    assert "micro_batch_size auto:" in out and "global batch (sequences/step)  8" in out
    assert re.search(r"^ +compute +cpu, fp32, eager, padded batches$", out, re.M), out


def test_tokens_seen_counts_real_tokens_not_padding(tmp_path: Path) -> None:
    import json

    import numpy as np

    from bertgpu.data.masking import positions_to_indices
    from bertgpu.data.shards import ShardSet

    data = write_synthetic_shards(tmp_path / "var", n_train=40, n_val=8, seq_len=32, vocab_size=100,
                                  variable_lengths=True)
    run = tmp_path / "r"
    assert main(_args(data, run, "--train.max_steps", "3", "--seed", "5")) == 0
    shards = ShardSet(data, "train")
    _, idx = positions_to_indices(np.arange(3 * 8), len(shards), 5)  # 3 steps x global batch 8
    expected = int(shards.get(idx)["lengths"].sum())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    seen = [r["tokens_seen"] for r in records if r["kind"] == "train"][-1]
    assert seen == expected < 3 * 8 * 32


def test_the_startup_table_says_how_the_model_computes() -> None:
    """The start-up table's compute row, as resolved for the device: compile mode and CUDA
    graphs, and padded or padding-free batches (impl.unpad "auto": padded under CUDA graphs,
    which replay one shape, with the MLM rows padded to one shape too)."""
    from types import SimpleNamespace

    from bertgpu.config.schema import load_config
    from bertgpu.train.pretrain_startup import compute_text as _compute_text

    graphs = load_config(None, ["--impl.compile_mode", "reduce-overhead", "--train.precision",
                                "bf16"])
    assert _compute_text(graphs, SimpleNamespace(device="cuda:0")) == (
        "cuda:0, bf16, torch.compile (reduce-overhead, CUDA graphs), padded batches, MLM rows "
        "padded to one shape")
    assert _compute_text(graphs, SimpleNamespace(device="cpu")) == (
        "cpu, bf16, eager, padded batches")
    cfg = load_config(None, ["--impl.compile_mode", "max-autotune-no-cudagraphs",
                             "--train.precision", "bf16"])
    assert _compute_text(cfg, SimpleNamespace(device="cuda:0")) == (
        "cuda:0, bf16, torch.compile (max-autotune-no-cudagraphs), padding-free batches")
    cfg = load_config(None, ["--impl.compile", "true", "--impl.unpad", "true"])
    assert _compute_text(cfg, SimpleNamespace(device="cpu")) == (
        "cpu, fp32, torch.compile (default), padding-free batches")


def test_the_startup_table_names_the_device_once(shards: Path, tmp_path: Path, capsys) -> None:
    """Pretraining's compute row names the device and precision; the loop's generic device row
    repeated them ("compute  cpu, fp32, ..." and "device  cpu x 1 (fp32)")."""
    assert main(_args(shards, tmp_path / "r", "--train.max_steps", "1")) == 0
    table = capsys.readouterr().out.split("\n\n")[0]
    labels = [line.strip().split("  ")[0] for line in table.splitlines()]
    assert "compute" in labels and "devices" in labels
    assert "device" not in labels, table
    # what the losses measure: the masking (it was only in config.toml)
    assert "  masking  " in table and "15% of the tokens (validation 15%)" in table, table


def test_the_validation_loss_does_not_depend_on_the_micro_batch(shards: Path, tmp_path: Path):
    """`train.eval_batches` counted micro batches, so the same weights scored 8.610, 8.606 and
    8.617 with micro batches of 32, 8 and 16 x 2 devices: an [impl] setting changed a result.
    `train.eval_sequences` counts sequences; 12 is not a multiple of either micro batch here."""
    from bertgpu.telemetry.records import read_metrics

    def val_loss(micro: str, data: Path = shards) -> float:
        out = tmp_path / f"micro{micro}-{data.name}"
        assert main(_args(data, out, "--train.max_steps", "2", "--impl.micro_batch_size", micro,
                          "--train.eval_sequences", "12", "--model.hidden_dropout_prob", "0",
                          "--model.attention_probs_dropout_prob", "0")) == 0
        evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
        return evals[-1]["val_mlm_loss"]

    eight = val_loss("8")
    assert eight == pytest.approx(val_loss("4"), rel=1e-6)
    # ... and covers the first 12 sequences, no more: the loss of a run whose validation split
    # holds only those 12 (the same training data and masks: a mask depends on the index only).
    # Both runs above also agreed when the limit was ignored and all 16 were scored.
    assert eight == pytest.approx(val_loss("8", _first_validation_sequences(shards, 12,
                                                                             tmp_path / "val12")),
                                  rel=1e-6)


def _first_validation_sequences(data: Path, n: int, to: Path) -> Path:
    """A copy of the shard set `data` whose validation split is its first `n` sequences (one
    shard, as write_synthetic_shards writes it)."""
    import json
    import shutil

    import numpy as np

    shutil.copytree(data, to)
    manifest = json.loads((to / "manifest.json").read_text(encoding="utf-8"))
    val = manifest["splits"]["validation"]
    (shard,) = val["shards"]
    for field in ("input_ids", "lengths"):
        path = to / f"{shard['name']}.{field}.npy"
        np.save(path, np.load(path)[:n])
    tokens = int(np.load(to / f"{shard['name']}.lengths.npy").sum())
    for key, drop in (("sequences", val["sequences"] - n), ("tokens", val["tokens"] - tokens)):
        manifest["counts"][key] -= drop
    manifest["counts"]["documents"] -= val["sequences"] - n
    val.update(sequences=n, tokens=tokens)
    shard.update(sequences=n, tokens=tokens)
    (to / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return to


def test_the_old_eval_batches_key_says_what_replaced_it(shards: Path, tmp_path: Path, capsys):
    assert main(_args(shards, tmp_path / "r", "--train.eval_batches", "2")) == 2
    assert ("command line: train.eval_batches is now train.eval_sequences (validation sequences "
            "per evaluation" in capsys.readouterr().err)
