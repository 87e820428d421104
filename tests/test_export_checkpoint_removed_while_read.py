"""A run that saves a checkpoint every step with keep_last 1 removes the one an export (or
`--init RUN`) is reading: export crashed with a FileNotFoundError traceback from the checksum of
a file of the removed checkpoint, or said the checkpoint was "incomplete (no COMPLETE marker:
its save did not finish)" of one that had been complete. The newest checkpoint is now picked
again, with a one-line note; a checkpoint named by the user that is removed is a one-line error.
The run is simulated deterministically: its next save happens at the moment the export reads."""

from __future__ import annotations

from pathlib import Path

import torch
from _export_run import save_step, tiny_model, tiny_run, word_embeddings
from _tiny import TINY

from bertgpu import fsutil
from bertgpu.cli import main as cli
from bertgpu.models import hf_io

REMOVED = "removed while being read (a running pretraining deletes its older checkpoints as it " \
          "saves newer ones: checkpoint.keep_last)"


def _save_when_hashing(monkeypatch, run, step, folder_name):
    """The run saves `step` (keep_last 1, removing the others) when the export starts to hash a
    file of checkpoint `folder_name`."""
    real = fsutil.file_sha256
    saved = []

    def file_sha256(path, sync=False):
        if not saved and Path(path).parent.name == folder_name:
            saved.append(save_step(run, step, keep_last=1))
        return real(path, sync)

    monkeypatch.setattr(fsutil, "file_sha256", file_sha256)
    return saved


def _exported_step(out, step):
    table = tiny_model(step).bert.embeddings.word_embeddings.weight[: TINY["vocab_size"]]
    assert torch.equal(word_embeddings(out), table)


def test_a_checkpoint_removed_while_it_is_verified_gives_way_to_the_newest(tmp_path, capsys,
                                                                          monkeypatch):
    run = tiny_run(tmp_path / "run", steps=(24,))
    saved = _save_when_hashing(monkeypatch, run, 25, "step_24")
    out = tmp_path / "hf"
    assert cli(["export", str(run), "--out", str(out)]) == 0
    assert saved and not (run / "checkpoints" / "step_24").exists()
    captured = capsys.readouterr()
    assert captured.out == f"exported {run} (step 25) -> {out}\n"
    assert captured.err == (f"bertgpu export: warning: {run / 'checkpoints' / 'step_24'}: "
                            f"{REMOVED}; exporting the newest checkpoint now\n")
    _exported_step(out, 25)
    assert (out / "vocab.txt").is_file()


def test_a_checkpoint_removed_after_it_was_verified_gives_way_to_the_newest(tmp_path, capsys,
                                                                           monkeypatch):
    """Verified good, then removed before its weights were read: it was "not a usable checkpoint:
    incomplete (no COMPLETE marker ...)"."""
    run = tiny_run(tmp_path / "run", steps=(24,))
    real = hf_io.load_pretrained
    saved = []

    def load_pretrained(path, *args, **kwargs):
        if not saved:
            saved.append(save_step(run, 25, keep_last=1))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(hf_io, "load_pretrained", load_pretrained)
    out = tmp_path / "hf"
    assert cli(["export", str(run), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"exported {run} (step 25) -> {out}\n"
    assert f"step_24: {REMOVED}; exporting the newest checkpoint now\n" in captured.err
    _exported_step(out, 25)


def test_a_checkpoint_the_user_named_that_is_removed_is_a_one_line_error(tmp_path, capsys,
                                                                         monkeypatch):
    run = tiny_run(tmp_path / "run", steps=(24,))
    _save_when_hashing(monkeypatch, run, 25, "step_24")
    out = tmp_path / "hf"
    assert cli(["export", str(run), "--step", "24", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"bertgpu export: error: {run / 'checkpoints' / 'step_24'}: "
                                       f"{REMOVED}\n")
    assert not out.exists()


def test_init_of_a_run_takes_the_newest_checkpoint_when_one_is_removed(tmp_path, monkeypatch,
                                                                        recwarn):
    """`finetune --init RUN` resolves the run's newest checkpoint this way."""
    run = tiny_run(tmp_path / "run", steps=(24,))
    _save_when_hashing(monkeypatch, run, 25, "step_24")
    assert hf_io.resolve_checkpoint_folder(run) == run / "checkpoints" / "step_25"
    assert [str(w.message) for w in recwarn] == [
        f"{run / 'checkpoints' / 'step_24'}: {REMOVED}; taking the newest checkpoint now"]
