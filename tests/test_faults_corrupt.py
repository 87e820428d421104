"""Damaged and interrupted checkpoints: checksums catch a truncated or changed file, resume falls
back to the previous good checkpoint with a warning naming what is wrong, a crash between the
renames of a folder replacement is repaired at start-up, `keep_last = 1` never leaves a moment
without a good checkpoint, and `export --step` / `load_pretrained` use the same definition."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
from _tiny import TINY

from bertgpu import fsutil
from bertgpu.cli import main as cli
from bertgpu.errors import BertgpuError
from bertgpu.testing import faults
from bertgpu.train import checkpoint as ckpt


@pytest.fixture(autouse=True)
def no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()


def weights(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"emb.weight": torch.randn(50, 8, generator=g), "norm.bias": torch.randn(8, generator=g)}


def save(run, step: int, keep_last: int = 0):
    return ckpt.save_checkpoint(run, step, weights(step),
                                {"step": step, "m": torch.full((50,), float(step))},
                                extra_files={"config.toml": f"step = {step}\n"},
                                keep_last=keep_last)


def damage(path, how: str) -> str:
    """Damage a checkpoint folder; returns the words the warning must contain."""
    model, state = path / ckpt.MODEL_FILE, path / ckpt.STATE_FILE
    if how == "truncated":
        size = model.stat().st_size
        os.truncate(model, size - 100)
        return f"model.safetensors is truncated ({size - 100:,} bytes, {size:,} recorded)"
    if how == "changed":
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
        state.write_bytes(bytes(data))
        return "train_state.pt fails its sha256 checksum"
    if how == "missing":
        model.unlink()
        return "model.safetensors is missing"
    if how == "bad checksums.json":
        (path / fsutil.CHECKSUMS).write_text("{not json", encoding="utf-8")
        return "checksums.json is unreadable"
    if how == "unreadable pickle":  # garbage that its checksums vouch for: only loading finds it
        os.truncate(state, state.stat().st_size // 2)
        (path / fsutil.COMPLETE).unlink()
        fsutil.seal(path)
        return "train_state.pt: unreadable checkpoint state"
    raise ValueError(how)


@pytest.mark.parametrize("how",
                         ["truncated", "changed", "missing", "bad checksums.json",
                          "unreadable pickle"])
def test_resume_falls_back_past_a_damaged_newest(tmp_path, how):
    for step in (10, 20, 30):
        save(tmp_path, step)
    words = damage(tmp_path / "checkpoints" / "step_30", how)
    with pytest.warns(UserWarning) as caught:
        path, model_state, train_state = ckpt.resume_checkpoint(tmp_path)
    assert path.name == "step_20" and train_state["step"] == 20
    assert torch.equal(model_state["emb.weight"], weights(20)["emb.weight"])
    [w] = caught
    assert str(w.message).startswith(f"{tmp_path / 'checkpoints' / 'step_30'}: skipped, ")
    assert words in str(w.message) and str(w.message).endswith("; trying the previous checkpoint")
    if how != "unreadable pickle":  # the cheap check (no loading) sees everything but that
        with pytest.warns(UserWarning, match="step_30: skipped"):
            assert ckpt.latest_checkpoint(tmp_path).name == "step_20"
        assert words in ckpt.checkpoint_problem(tmp_path / "checkpoints" / "step_30")


def test_good_checkpoints_verify_silently(tmp_path):
    save(tmp_path, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ckpt.resume_checkpoint(tmp_path)[0].name == "step_10"
        assert ckpt.checkpoint_problem(tmp_path / "checkpoints" / "step_10") is None
    record = json.loads((tmp_path / "checkpoints" / "step_10" / fsutil.CHECKSUMS).read_text())
    assert sorted(record["files"]) == ["config.toml", "model.safetensors", "train_state.pt"]
    assert (ckpt.resume_checkpoint(tmp_path / "empty") is None
            and ckpt.latest_checkpoint(tmp_path / "empty") is None)


def test_every_checkpoint_damaged_is_an_error_not_a_fresh_start(tmp_path):
    save(tmp_path, 10)
    save(tmp_path, 20)
    damage(tmp_path / "checkpoints" / "step_10", "changed")
    damage(tmp_path / "checkpoints" / "step_20", "truncated")
    with pytest.warns(UserWarning), pytest.raises(BertgpuError) as err:
        ckpt.resume_checkpoint(tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'checkpoints'}: no good checkpoint (step_20: "
                          "model.safetensors is truncated")
    assert "; step_10: train_state.pt fails its sha256 checksum" in msg and "\n" not in msg


def test_checkpoint_without_checksums_still_loads(tmp_path):
    """Written before checksums existed: COMPLETE is all there is to check."""
    path = save(tmp_path, 10)
    (path / fsutil.CHECKSUMS).unlink()
    assert (ckpt.checkpoint_problem(path) is None
            and ckpt.resume_checkpoint(tmp_path)[2]["step"] == 10)


def test_incomplete_and_half_written_folders(tmp_path):
    path = save(tmp_path, 10)
    half = shutil.copytree(path, path.with_name("step_20.tmp"))
    incomplete = shutil.copytree(path, path.with_name("step_30"))
    (incomplete / fsutil.COMPLETE).unlink()
    assert [p.name for _, p in ckpt.list_checkpoints(tmp_path)] == ["step_10"]
    assert not fsutil.is_complete(half) and not fsutil.is_complete(incomplete)
    assert ckpt.checkpoint_problem(half) == "half-written (its save was interrupted)"
    assert (ckpt.checkpoint_problem(incomplete)
            == "incomplete (no COMPLETE marker: its save did not finish)")


# ---------------------------------------------------------------------------------------------
# The folder replacement and the start-up recovery


def test_crash_between_the_renames_is_recovered(tmp_path):
    """A real SIGKILL between "old aside" and "new in" (BERTGPU_FAULTS=kill_replace=1) while a
    resumed run saves its last step again, with keep_last = 1."""
    run = tmp_path / "run"
    code = ("import sys, torch\n"
            "from bertgpu.train.checkpoint import save_checkpoint\n"
            "w = {'w': torch.arange(4.0)}\n"
            "save_checkpoint(sys.argv[1], 10, w, {'step': 10, 'copy': 'first'}, keep_last=1)\n"
            "save_checkpoint(sys.argv[1], 10, w, {'step': 10, 'copy': 'second'}, keep_last=1)\n")
    env = {**os.environ, faults.ENV: "kill_replace=1"}
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    proc = subprocess.run([sys.executable, "-c", code, str(run)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    root = run / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_10.old", "step_10.tmp"]
    # Even before the repair the old copy counts as step 10: there is no moment without one.
    assert ckpt.list_checkpoints(run) == [(10, root / "step_10.old")]
    assert ckpt.recover_checkpoints(run) == [
        f"{root / 'step_10'}: restored from step_10.old (a replacement was interrupted)",
        f"{root / 'step_10.tmp'}: removed (a save was interrupted)",
    ]
    assert sorted(p.name for p in root.iterdir()) == ["step_10"]
    path, model_state, train_state = ckpt.resume_checkpoint(run)
    assert path == root / "step_10" and train_state["copy"] == "first"
    assert torch.equal(model_state["w"], torch.arange(4.0))
    assert ckpt.recover_checkpoints(run) == []  # nothing left to do


def test_recovery_removes_stale_leftovers(tmp_path):
    root = tmp_path / "checkpoints"
    new = save(tmp_path, 10)
    shutil.copytree(new, root / "step_10.old")  # crash after "new in", before "remove old"
    junk = root / "step_5.old"  # an incomplete .old with no step_5: nothing to restore
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"partial")
    (root / "notes").mkdir()  # not ours: left alone
    lines = ckpt.recover_checkpoints(tmp_path)
    assert lines == [f"{root / 'step_10.old'}: removed (left over from a replacement)",
                     f"{root / 'step_5.old'}: removed (left over from a replacement)"]
    assert sorted(p.name for p in root.iterdir()) == ["notes", "step_10"]
    assert ckpt.recover_checkpoints(tmp_path / "nowhere") == []


def test_keep_last_1_never_leaves_a_moment_without_a_good_checkpoint(tmp_path, monkeypatch):
    """Every rename and removal is intercepted: before and after each, the run has a complete
    checkpoint that verifies and loads."""
    checks = []

    def assert_resumable(when: str) -> None:
        found = ckpt.list_checkpoints(tmp_path)
        assert found, f"no complete checkpoint {when}"
        assert ckpt.checkpoint_problem(found[-1][1]) is None, when
        ckpt.load_checkpoint(found[-1][1])
        checks.append(when)

    real_replace, real_remove, real_rmtree = os.replace, fsutil.remove_dir, shutil.rmtree

    def replace(src, dst):
        assert_resumable(f"before replace {src}")
        real_replace(src, dst)
        assert_resumable(f"after replace {dst}")

    def remove(folder):
        assert_resumable(f"before removing {folder}")
        real_remove(folder)
        assert_resumable(f"after removing {folder}")

    def rmtree(path, *args, **kwargs):
        assert_resumable(f"before rmtree {path}")
        real_rmtree(path, *args, **kwargs)
        assert_resumable(f"after rmtree {path}")

    save(tmp_path, 1, keep_last=1)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(fsutil, "remove_dir", remove)
    monkeypatch.setattr(fsutil.shutil, "rmtree", rmtree)
    for step in (2, 3, 3):  # new steps, then the same step again (a replacement)
        save(tmp_path, step, keep_last=1)
    monkeypatch.undo()
    assert [p.name for _, p in ckpt.list_checkpoints(tmp_path)] == ["step_3"]
    assert sum(c.startswith("before replace") for c in checks) == 4  # 3 renames in + 1 aside
    assert sum(c.startswith("before removing") for c in checks) == 2  # step_1, step_2


def test_pruning_keeps_checkpoints_newer_than_the_save(tmp_path):
    """After falling back past a damaged step_30, saving step_21 prunes older ones only; the
    run's own save of step 30 later replaces the damaged folder."""
    for step in (10, 20, 30):
        save(tmp_path, step)
    damage(tmp_path / "checkpoints" / "step_30", "truncated")
    save(tmp_path, 21, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [20, 21, 30]
    save(tmp_path, 30, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [21, 30]
    assert ckpt.checkpoint_problem(tmp_path / "checkpoints" / "step_30") is None


def test_keep_last_counts_only_good_checkpoints(tmp_path):
    """Start-up skipped a damaged step_20 and resumed from step_15; saves of 18 and 21 with
    keep_last = 2 then kept the damaged step_20 beside step_21 and removed the good step_15 and
    step_18, so a damaged step_21 as well left no good checkpoint at all."""
    root = tmp_path / "checkpoints"
    for step in (15, 20):
        save(tmp_path, step)
    words = damage(root / "step_20", "changed")  # same size: only start-up's checksums see it
    with pytest.warns(UserWarning, match="step_20: skipped"):
        assert ckpt.resume_checkpoint(tmp_path)[0].name == "step_15"
    save(tmp_path, 18, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [15, 18, 20]  # newer: left as is
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save(tmp_path, 21, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [18, 21]
    [w] = caught
    assert str(w.message).startswith(f"{root / 'step_20'}: removed, damaged: {words}")
    assert str(w.message).endswith("; checkpoint.keep_last counts good checkpoints only")
    damage(root / "step_21", "truncated")  # the same failing disk: step_18 is still there
    with pytest.warns(UserWarning, match="step_21: skipped"):
        assert ckpt.resume_checkpoint(tmp_path)[0].name == "step_18"


def test_keep_last_removes_a_truncated_older_checkpoint_before_a_good_one(tmp_path):
    """A checkpoint cut short after start-up looked at it (or older than the one resumed from,
    which start-up never reads) is found by its recorded sizes at the next save."""
    for step in (10, 20, 30):
        save(tmp_path, step)
    damage(tmp_path / "checkpoints" / "step_20", "truncated")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save(tmp_path, 40, keep_last=3)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10, 30, 40]
    [w] = caught
    assert "step_20: removed, damaged: model.safetensors is truncated" in str(w.message)


def test_a_damaged_step_saved_again_is_not_taken_for_the_damaged_one(tmp_path):
    """Start-up's findings are remembered by the folder's seal (COMPLETE), not its name: the run's
    own later save of the same step is a good checkpoint, counted and kept."""
    for step in (10, 20):
        save(tmp_path, step)
    damage(tmp_path / "checkpoints" / "step_20", "changed")
    with pytest.warns(UserWarning, match="step_20: skipped"):
        assert ckpt.resume_checkpoint(tmp_path)[0].name == "step_10"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save(tmp_path, 20, keep_last=2)  # replaces the damaged folder
        save(tmp_path, 30, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [20, 30]
    assert ckpt.checkpoint_problem(tmp_path / "checkpoints" / "step_20") is None


# ---------------------------------------------------------------------------------------------
# One definition for export --step and load_pretrained


@pytest.fixture
def run(tmp_path):
    """A run folder with two real (tiny BERT) checkpoints, 10 and 20."""
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.hf_export import hf_config

    run = tmp_path / "run"
    for step in (10, 20):
        torch.manual_seed(step)
        model = BertForPreTraining(BertConfig(**TINY), with_nsp=False)
        ckpt.save_checkpoint(run, step, model.state_dict(), {"step": step},
                             extra_files={"config.json": json.dumps(hf_config(model))})
    return run


def word_embeddings(folder, rows: int | None = None) -> torch.Tensor:
    """The word embeddings of a folder's model.safetensors; `rows`: the first ones only (a
    checkpoint's table has the model's padding rows past the vocabulary, an export's has not)."""
    from safetensors.torch import load_file

    table = load_file(str(folder / "model.safetensors"))["bert.embeddings.word_embeddings.weight"]
    return table[:rows]


def test_export_step_refuses_incomplete_or_damaged(run, tmp_path, capsys):
    root = run / "checkpoints"
    shutil.copytree(root / "step_20", root / "step_30")
    (root / "step_30" / fsutil.COMPLETE).unlink()  # a save that never finished
    out = tmp_path / "hf"
    assert cli(["export", str(run), "--step", "30", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (f"bertgpu export: error: {root / 'step_30'}: cannot export: incomplete "
                   "(no COMPLETE marker: its save did not finish)\n")
    assert not out.exists()

    assert cli(["export", str(run), "--step", "40", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"bertgpu export: error: {run}: has no checkpoint step_40 "
                                       "under checkpoints/ (complete ones: 10, 20)\n")
    damage(root / "step_20", "truncated")
    assert cli(["export", str(run), "--step", "20", "--out", str(out)]) == 2
    assert "step_20: cannot export: model.safetensors is truncated" in capsys.readouterr().err
    assert not out.exists()
    # the list of complete steps left out the damaged one (it named 20 as complete)
    assert cli(["export", str(run), "--step", "40", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"bertgpu export: error: {run}: has no checkpoint step_40 "
                                       "under checkpoints/ (complete ones: 10; damaged: 20)\n")

    assert cli(["export", str(run), "--step", "10", "--out", str(out)]) == 0
    assert torch.equal(word_embeddings(out), word_embeddings(root / "step_10", TINY["vocab_size"]))


def test_export_latest_skips_a_damaged_newest(run, tmp_path):
    from bertgpu.export import export

    damage(run / "checkpoints" / "step_20", "changed")
    with pytest.warns(UserWarning,
                      match="step_20: skipped, train_state.pt fails its sha256 checksum"):
        export(run, tmp_path / "hf")
    assert torch.equal(word_embeddings(tmp_path / "hf"),
                       word_embeddings(run / "checkpoints" / "step_10", TINY["vocab_size"]))


def test_export_takes_a_checkpoint_folder(run, tmp_path, capsys):
    """`export RUN/checkpoints/step_20` said "has no complete checkpoint under checkpoints/",
    though --init takes a checkpoint folder: it is exported, verified as `--step` verifies one,
    with its run's tokenizer (RUN/tokenizer, two levels up, as for --init)."""
    from bertgpu.export import export_step

    root = run / "checkpoints"
    (run / "tokenizer").mkdir()
    vocab = "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                      + [f"w{i}" for i in range(TINY["vocab_size"] - 5)]) + "\n"
    (run / "tokenizer" / "vocab.txt").write_text(vocab, encoding="utf-8")
    out = tmp_path / "hf"
    assert cli(["export", str(root / "step_10"), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"exported {root / 'step_10'} (step 10) -> {out}\n"
    assert (out / "vocab.txt").read_text(encoding="utf-8") == vocab
    assert torch.equal(word_embeddings(out), word_embeddings(root / "step_10", TINY["vocab_size"]))

    assert cli(["export", str(root / "step_20"), "--step", "10", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"bertgpu export: error: --step 10: given with the checkpoint folder {root / 'step_20'}; "
        "expected either a run folder and --step, or a checkpoint folder alone\n")
    assert cli(["export", str(root / "step_20"), "--out", str(root / "hf")]) == 2
    assert capsys.readouterr().err.startswith(f"bertgpu export: error: {root / 'hf'}: inside ")
    words = damage(root / "step_20", "truncated")
    assert cli(["export", str(root / "step_20"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"bertgpu export: error: {root / 'step_20'}: cannot export: "
                                       f"{words}\n")
    assert (out / "vocab.txt").is_file()  # the earlier export is left as it was

    good = shutil.copytree(root / "step_10", tmp_path / "ck")  # its step: COMPLETE says it
    with pytest.warns(UserWarning, match=r"ck: no tokenizer to export with it \(it is not in a "
                                         r"run's checkpoints/ folder"):
        assert export_step(good, tmp_path / "hf_ck") == (tmp_path / "hf_ck", 10)
    assert not (tmp_path / "hf_ck" / "vocab.txt").exists()


def test_export_of_a_run_whose_checkpoints_are_all_damaged_says_what_export_can_do(
        run, tmp_path, capsys):
    """It ended with pretraining's "move the damaged folders away to start afresh"."""
    from bertgpu.models.hf_io import load_pretrained

    root = run / "checkpoints"
    damage(root / "step_10", "changed")
    damage(root / "step_20", "truncated")
    assert cli(["export", str(run), "--out", str(tmp_path / "hf")]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"bertgpu export: error: {root}: no good checkpoint (step_20: ")
    assert last.endswith("; nothing of this run can be exported")
    with pytest.warns(UserWarning), pytest.raises(BertgpuError) as err:
        load_pretrained(run)  # --init RUN
    assert str(err.value).endswith("); expected a run with a good checkpoint, or a good "
                                   "checkpoint folder")


def test_load_pretrained_uses_the_same_definition(run):
    from bertgpu.models.hf_io import load_pretrained, resolve_checkpoint_folder

    root = run / "checkpoints"
    assert resolve_checkpoint_folder(run) == root / "step_20"
    shutil.copytree(root / "step_20", root / "step_30")
    (root / "step_30" / fsutil.COMPLETE).unlink()  # has config.json, but never finished
    shutil.copytree(root / "step_20", root / "step_40.tmp")
    with pytest.warns(UserWarning, match=r"step_30: skipped, incomplete"):
        assert resolve_checkpoint_folder(run) == root / "step_20"
    with pytest.raises(BertgpuError, match=r"step_30: not a usable checkpoint: incomplete"):
        load_pretrained(root / "step_30")
    with pytest.raises(BertgpuError, match=r"step_40.tmp: not a usable checkpoint: half-written"):
        load_pretrained(root / "step_40.tmp")
    damage(root / "step_20", "truncated")
    with pytest.warns(UserWarning, match="step_20: skipped, model.safetensors is truncated"):
        model = load_pretrained(run, head="masked_lm")
    assert torch.equal(model.bert.embeddings.word_embeddings.weight,
                       word_embeddings(root / "step_10"))


def test_a_newer_unsealed_checkpoint_is_named_not_skipped_silently(run, tmp_path, capsys):
    """A step_N without COMPLETE (not a save's .tmp: a damaged or hand-copied folder) newer than
    the checkpoint used was passed over without a word by export, resume and --init; export did
    not say which step it wrote. When it is the only one, that is an error, not a fresh start."""
    root = run / "checkpoints"
    shutil.copytree(root / "step_20", root / "step_30")
    (root / "step_30" / fsutil.COMPLETE).unlink()
    out = tmp_path / "hf"
    assert cli(["export", str(run), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert (f"{root / 'step_30'}: skipped, incomplete (no COMPLETE marker: its save did not "
            "finish); trying the previous checkpoint") in captured.err
    assert captured.out == f"exported {run} (step 20) -> {out}\n"
    for name in ("step_10", "step_20"):
        shutil.rmtree(root / name)
    with pytest.raises(BertgpuError, match=r"no good checkpoint \(step_30: incomplete"), \
            pytest.warns(UserWarning):
        ckpt.latest_checkpoint(run)


def test_init_from_a_copied_checkpoint_is_verified(run, tmp_path):
    """A checkpoint folder copied out of its run was taken as --init without its checksums: a
    flipped byte or a missing COMPLETE went unnoticed."""
    from bertgpu.models.hf_io import load_pretrained

    copy = shutil.copytree(run / "checkpoints" / "step_20", tmp_path / "ck")
    damage(copy, "changed")
    with pytest.raises(BertgpuError, match=r"ck: not a usable checkpoint: train_state.pt fails"):
        load_pretrained(copy)
    unsealed = shutil.copytree(run / "checkpoints" / "step_10", tmp_path / "ck2")
    (unsealed / fsutil.COMPLETE).unlink()
    with pytest.raises(BertgpuError, match=r"ck2: not a usable checkpoint: incomplete"):
        load_pretrained(unsealed)
    load_pretrained(shutil.copytree(run / "checkpoints" / "step_10", tmp_path / "ck3"))


def test_export_never_writes_over_a_checkpoint(run, tmp_path, capsys):
    """`export --out RUN/checkpoints/step_20` replaced a complete checkpoint with an export
    (a checkpoint holds a config.json, so it passed for an earlier export)."""
    root = run / "checkpoints"
    for out in (root / "step_20", root / "hf", tmp_path / "copy"):
        if out.name == "copy":
            shutil.copytree(root / "step_10", out)
        assert cli(["export", str(run), "--step", "10", "--out", str(out)]) == 2
        assert len(capsys.readouterr().err.splitlines()) == 1
    assert ckpt.checkpoint_problem(root / "step_20") is None
    assert ckpt.checkpoint_problem(tmp_path / "copy") is None


def test_a_failed_fine_tuning_does_not_warn_of_damage_twice_nor_hide_its_error(tmp_path):
    """After a failed re-run of a fine-tuning whose newest checkpoint is damaged, the clean-up of
    OUT.tmp looked for checkpoints again: "... skipped, model.safetensors is truncated" printed a
    second time, and with every checkpoint damaged its "no good checkpoint" error would have
    replaced the run's own. It is quiet now, and OUT.tmp with its checkpoints is kept."""
    from bertgpu.tasks.finetune_output import discard_unresumable

    out = tmp_path / "ft"
    work = fsutil.make_scratch(tmp_path / "ft.tmp", out)
    step = work / "checkpoints" / "step_5"
    step.mkdir(parents=True)
    (step / "model.safetensors").write_bytes(b"x" * 2000)
    fsutil.seal(step)
    with open(step / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        discard_unresumable(work, out)
    assert step.is_dir()
    shutil.rmtree(work / "checkpoints")
    discard_unresumable(work, out)  # nothing to resume from: a half-written output goes
    assert not work.exists()
