"""A checkpoint folder given where a run folder is expected: `pretrain --out RUN/checkpoints/
step_N` trained a fresh run inside the checkpoint (its config.toml passed for a run's) and
rewrote that config.toml, so the checkpoint failed its checksums and RUN no longer resumed;
`watch` on one waited for a run to start. Both now refuse in one line naming the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from _shards import write_synthetic_shards

from bertgpu import cli
from bertgpu.fsutil import seal, verify_folder
from bertgpu.step_folders import run_of_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.toml")


def a_run_with_a_checkpoint(root: Path) -> tuple[Path, Path]:
    """RUN (config.toml) with a sealed checkpoints/step_4 (config.toml and weights)."""
    run = root / "run"
    step = run / "checkpoints" / "step_4"
    step.mkdir(parents=True)
    (run / "config.toml").write_text("seed = 0\n")
    (step / "config.toml").write_text("seed = 0\n")
    (step / "model.safetensors").write_bytes(b"weights")
    seal(step)
    return run, step


def test_pretrain_refuses_a_checkpoint_folder_as_out(tmp_path, capsys):
    run, step = a_run_with_a_checkpoint(tmp_path)
    data = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32, vocab_size=100)
    before = sorted(p.name for p in step.iterdir())
    assert cli.main(["pretrain", TINY, "--data", str(data), "--out", str(step),
                     "--model.vocab_size", "100", "--train.max_steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{step}: a checkpoint of the run {run}, not a run folder" in err
    assert sorted(p.name for p in step.iterdir()) == before  # nothing written into it
    assert verify_folder(step) is None  # its checksums still hold: RUN still resumes


def test_watch_refuses_a_checkpoint_folder(tmp_path, capsys):
    run, step = a_run_with_a_checkpoint(tmp_path)
    assert cli.main(["watch", str(step), "--once"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{step}: a checkpoint of the run {run}, not a run folder (watch the run: bertgpu " \
           f"watch {run})" in err


@pytest.mark.parametrize("inside", ["checkpoints/step_4", "checkpoints/step_4.tmp",
                                    "checkpoints/step_4.old", "checkpoints/step_4/sub/deeper"])
def test_run_of_checkpoint_finds_the_run(tmp_path, inside):
    run, _ = a_run_with_a_checkpoint(tmp_path)
    assert run_of_checkpoint(run / inside) == run


def test_run_folders_named_like_checkpoints_are_not_checkpoints(tmp_path):
    run, _ = a_run_with_a_checkpoint(tmp_path)
    assert run_of_checkpoint(run) is None
    assert run_of_checkpoint(run / "checkpoints") is None
    assert run_of_checkpoint(run / "hf") is None
    # A run of the user's own called checkpoints/step_1, in a folder with no run's config.toml.
    assert run_of_checkpoint(tmp_path / "mine" / "checkpoints" / "step_1") is None
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "config.toml").write_text("")  # a project's own config.toml
    assert run_of_checkpoint(tmp_path / "proj" / "checkpoints") is None
