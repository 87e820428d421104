"""Running `bertgpu pretrain` end to end on a tiny synthetic shard set: in a subprocess
(`bertgpu`), or in this process where nothing kills it (`bertgpu_here`: a fresh interpreter's
torch import is most of a tiny run's time)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
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


def bertgpu_started(argv: list[str], faults: str = "") -> subprocess.Popen:
    """`bertgpu ARGV` started in a fresh interpreter and a session of its own, for a test that
    signals or kills it (the process group included): stderr piped, stdout dropped, warnings off
    (a test reads its last lines), and no WORLD_SIZE, so `--nproc` launches its ranks."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", "BERTGPU_FAULTS": faults}
    env.pop("WORLD_SIZE", None)
    return subprocess.Popen([sys.executable, "-m", "bertgpu", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@contextlib.contextmanager
def _captured_fds() -> Iterator[list[str]]:
    """Everything written to file descriptors 1 and 2 (this process's prints and its children's
    inherited streams) while inside; the two texts are in the list on leaving."""
    out: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds, saved_streams = (os.dup(1), os.dup(2)), (sys.stdout, sys.stderr)
    with tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        streams = [open(fd, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)
                   for fd in (1, 2)]
        sys.stdout, sys.stderr = streams
        try:
            yield out
        finally:
            for stream in streams:
                # flushed, not closed: a handler that kept it writes on to file descriptor 1 or 2
                stream.flush()
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds, strict=True):
                os.dup2(saved, fd)
                os.close(saved)
            for f in (o, e):
                f.seek(0)
                out.append(f.read().decode("utf-8", errors="replace"))


def _fresh_interpreter_warnings() -> None:
    """Warnings as a fresh `python` shows them, on stderr (pytest's own filters would keep
    DeprecationWarnings and record the rest for its summary instead of printing them)."""
    warnings.resetwarnings()
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                     ResourceWarning):
        warnings.simplefilter("ignore", category)

    def show(message, category, filename, lineno, file=None, line=None):
        (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno,
                                                          line))

    warnings.showwarning = show


def bertgpu_here(argv: list[str], faults: str = "") -> subprocess.CompletedProcess:
    """`bertgpu(argv, faults)` run by this process's `bertgpu.cli.main`: the same exit status,
    stdout and stderr (file descriptors 1 and 2, so `--nproc` workers' output too), one torch
    thread as the subprocesses have (OMP_NUM_THREADS=1; fp32 sums then come out bitwise alike).
    A fault that kills (kill_rank, kill_replace) only with `--nproc N`: it fires in a worker,
    not in this process."""
    import torch

    from bertgpu.cli import main
    from bertgpu.testing import faults as fault_plan

    assert "kill_" not in faults or "--nproc" in argv, "a kill runs in a subprocess (or workers)"
    env = {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "BERTGPU_FAULTS": faults,
           "TORCHELASTIC_RESTART_COUNT": "", "BERTGPU_RESTART_COUNT": "", "WORLD_SIZE": ""}
    before = {k: os.environ.get(k) for k in env}
    threads = torch.get_num_threads()
    try:
        for k, v in env.items():
            if v:
                os.environ[k] = v
            else:
                os.environ.pop(k, None)
        torch.set_num_threads(1)
        fault_plan.reset()
        texts: list[str] = []
        try:
            with _captured_fds() as texts, warnings.catch_warnings():
                _fresh_interpreter_warnings()
                try:
                    rc = main(list(argv))
                except SystemExit as exc:  # argparse's errors end a command this way
                    rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            sys.stderr.write("".join(texts))  # what it printed, for pytest's failure report
            raise
    finally:
        fault_plan.reset()
        torch.set_num_threads(threads)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return subprocess.CompletedProcess(["bertgpu", *argv], rc, texts[0], texts[1])


def e2e_shards(tmp_path_factory) -> Path:
    """The shard set every `args` run uses (the same bytes in every module that writes it)."""
    from bertgpu.data.synthetic import write_synthetic_shards

    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


_REFERENCE_RUNS: dict[int, Path] = {}


def reference_run(shards: Path, tmp_path_factory, nproc: int = 1) -> Path:
    """The folder of the `args(shards, ...)` run that never failed, on `nproc` processes (with
    dropout on, each rank has its own noise stream), made once per test session for every module
    that compares with it (their `e2e_shards` are the same bytes): under pytest-xdist, once for
    all the session's workers (the first to need it makes it, under a lock, in their common
    temporary folder; a failed one is made again by the next)."""
    if nproc in _REFERENCE_RUNS:
        return _REFERENCE_RUNS[nproc]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.getbasetemp().parent / f"e2e-reference-nproc{nproc}"
        folder.mkdir(exist_ok=True)
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if not (folder / "made").exists():
                _make_reference(shards, folder / "run", nproc)
                (folder / "made").touch()
        _REFERENCE_RUNS[nproc] = folder / "run"
    else:
        run = tmp_path_factory.mktemp("ref") / "run"
        _make_reference(shards, run, nproc)
        _REFERENCE_RUNS[nproc] = run
    return _REFERENCE_RUNS[nproc]


def _make_reference(shards: Path, run: Path, nproc: int) -> None:
    shutil.rmtree(run, ignore_errors=True)  # what a failed attempt left
    done = bertgpu_here(args(shards, run, *(["--nproc", str(nproc)] if nproc > 1 else [])))
    assert done.returncode == 0, done.stderr[-2000:]


def train_records(run: Path) -> dict[int, dict]:
    """The train records of a run's metrics.jsonl, by step."""
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in recs if r["kind"] == "train"}


def final_weights(run: Path) -> dict:
    return load_file(str(run / "hf" / "model.safetensors"))


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
