"""Re-running `bertgpu pretrain` on a run folder whose checkpoints are gone: a run that finished
(or left its export hf/) is refused in one line and left as it was; a run that stopped before
its first checkpoint (a crash, a preemption, an error) produced no model and starts over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _shards import write_synthetic_shards
from test_pretrain import _args  # the tiny model and run of the pretraining tests
from test_pretrain_rerun import _folder

from bertgpu.cli import main
from bertgpu.errors import BertgpuError
from bertgpu.telemetry.records import read_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    return write_synthetic_shards(tmp_path_factory.mktemp("data") / "d", n_train=96, n_val=16,
                                  seq_len=32, vocab_size=100)


def _records(run: Path, *records: dict) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.toml").write_text("[train]\nmax_steps = 4\n", encoding="utf-8")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records),
                                       encoding="utf-8")


_TRAIN = [{"step": s, "kind": "train", "loss": 4.0} for s in (1, 2, 3)]


@pytest.mark.timeout(120)
def test_a_finished_run_without_checkpoints_is_refused_and_left_as_it_was(
        shards: Path, tmp_path: Path, capsys) -> None:
    """Its checkpoints removed to free disk, the same command (or a larger max_steps) used to
    train from step 0 from random weights, cutting metrics.jsonl, replacing config.toml and
    overwriting hf/, with exit 0 and no word. Also with --nproc (before any worker starts)."""
    run = tmp_path / "r"
    common = ["--checkpoint.every_steps", "2"]
    assert main(_args(shards, run, "--train.max_steps", "4", *common)) == 0
    shutil.rmtree(run / "checkpoints")
    before = _folder(run)
    for extra in (["--train.max_steps", "4"], ["--train.max_steps", "8"],
                  ["--train.max_steps", "8", "--nproc", "2"]):
        capsys.readouterr()
        assert main(_args(shards, run, *common, *extra)) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err == (f"bertgpu pretrain: error: {run}: holds a run that finished at step 4 "
                       "(max_steps, its end record in metrics.jsonl) and its Hugging Face export "
                       "hf/, but no checkpoint to resume from (checkpoints/ is empty or gone); "
                       "restore its checkpoints/ to train on, or give another --out (or remove "
                       f"{run}) to start over"), err
        assert _folder(run) == before, extra
    shutil.rmtree(run / "hf")  # the end record alone says it finished
    assert main(_args(shards, run, *common, "--train.max_steps", "8")) == 2
    assert "finished at step 4 (max_steps, its end record in metrics.jsonl), but no " \
        in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_run_stopped_before_its_first_checkpoint_starts_over(shards: Path, tmp_path: Path,
                                                               capsys) -> None:
    """A crash (train records, no end record), a preemption or an error before the first
    checkpoint left no model: the same command starts over, as it always did."""
    for name, ending in (("crashed", []),
                         ("preempted", [{"step": 3, "kind": "info", "event": "end",
                                         "reason": "preempted"}]),
                         ("error", [{"step": 3, "kind": "info", "event": "end",
                                     "reason": "error", "error": "RuntimeError: boom"}])):
        run = tmp_path / name
        _records(run, {"step": 0, "kind": "info", "event": "start"}, *_TRAIN, *ending)
        assert main(_args(shards, run, "--train.max_steps", "2",
                          "--checkpoint.every_steps", "0")) == 0, name
        assert "resumed" not in capsys.readouterr().out
        ends = [r for r in read_metrics(run) if r.get("event") == "end"]
        assert ends[-1]["reason"] == "max_steps" and ends[-1]["step"] == 2, name


def test_an_export_without_checkpoints_is_never_overwritten(tmp_path: Path) -> None:
    """hf/ is a model the run produced, whatever metrics.jsonl says (a preempted extension of a
    finished run, a metrics file removed): the run is not started over on top of it."""
    from bertgpu.train.run_folder import check_resumable

    run = tmp_path / "r"
    _records(run, *_TRAIN, {"step": 3, "kind": "info", "event": "end", "reason": "preempted"})
    (run / "hf").mkdir()
    (run / "hf" / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(BertgpuError, match=r"holds a run that trained to step 3 and its Hugging "
                                           r"Face export hf/, but no checkpoint"):
        check_resumable(run)
    (run / "metrics.jsonl").unlink()
    with pytest.raises(BertgpuError, match=r"holds a run and its Hugging Face export hf/, but"):
        check_resumable(run)
