"""Running `bertgpu pretrain` end to end in subprocesses on a tiny synthetic shard set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")
STEPS = 12


def args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", TINY, "--data", str(data), "--out", str(out),
            "--model.vocab_size", "100", "--model.hidden_size", "32",
            "--model.intermediate_size", "64", "--model.max_position_embeddings", "64",
            "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
            "--train.log_every_steps", "1", "--train.eval_every_steps", "0",
            "--train.eval_sequences", "8", "--train.max_steps", str(STEPS),
            "--checkpoint.every_steps", "4", "--checkpoint.keep_last", "0", *extra]


def bertgpu(argv: list[str], faults: str = "", **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    env.pop("BERTGPU_FAULTS", None)
    if faults:
        env["BERTGPU_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "bertgpu", *argv], env=env, capture_output=True,
                          text=True, timeout=240, check=False, **popen)


def e2e_shards(tmp_path_factory) -> Path:
    """The shard set every `args` run uses (the same bytes in every module that writes it)."""
    from bertgpu.data.synthetic import write_synthetic_shards

    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


_REFERENCE_RUNS: dict[int, Path] = {}


def reference_run(shards: Path, tmp_path_factory, nproc: int = 1) -> Path:
    """The folder of the `args(shards, ...)` run that never failed, on `nproc` processes (with
    dropout on, each rank has its own noise stream), made once per test session for every module
    that compares with it (their `e2e_shards` are the same bytes)."""
    if nproc not in _REFERENCE_RUNS:
        run = tmp_path_factory.mktemp("ref") / "run"
        done = bertgpu(args(shards, run, *(["--nproc", str(nproc)] if nproc > 1 else [])))
        assert done.returncode == 0, done.stderr[-2000:]
        _REFERENCE_RUNS[nproc] = run
    return _REFERENCE_RUNS[nproc]


def final_weights(run: Path) -> dict:
    return load_file(str(run / "hf" / "model.safetensors"))


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
