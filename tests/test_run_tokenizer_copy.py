"""RUN_DIR/tokenizer is the shards' tokenizer whole: every checkpoint and the export take their
tokenizer files from it. A copy cut short by a full disk was kept for ever (copied only when
absent) and the export then could not be loaded by transformers."""

from __future__ import annotations

import filecmp
import shutil

import pytest
from _shards import write_synthetic_shards

from bertgpu.tasks.pretraining import PretrainData, copy_tokenizer


@pytest.fixture
def data(tmp_path):
    return PretrainData(write_synthetic_shards(tmp_path / "data", n_train=8, n_val=2, seq_len=16,
                                               vocab_size=99), None, None)


def _same(a, b) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return (names == sorted(p.name for p in b.iterdir())
            and not filecmp.cmpfiles(a, b, names, shallow=False)[1])


def test_a_copy_cut_short_is_copied_again(data, tmp_path):
    run = tmp_path / "run"
    copy_tokenizer(data, run)
    src, dst = data.train.tokenizer_dir, run / "tokenizer"
    assert _same(src, dst)
    cut = next(p for p in sorted(dst.iterdir()) if p.stat().st_size > 10)
    cut.write_bytes(cut.read_bytes()[:5])  # what a full disk left
    with pytest.warns(UserWarning, match="replaced by the tokenizer of .*their files differed"):
        copy_tokenizer(data, run)
    assert _same(src, dst)
    assert not (run / "tokenizer.tmp").exists() and not (run / "tokenizer.old").exists()


def test_a_copy_that_fails_leaves_no_tokenizer_folder(data, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    def full(src, dst, **kw):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(shutil, "copyfile", full)  # what copytree's copy2 calls
    with pytest.raises(OSError, match="No space left"):
        copy_tokenizer(data, run)
    assert not (run / "tokenizer").exists()  # nothing a later run would take as whole
    monkeypatch.undo()
    copy_tokenizer(data, run)  # the same run again, space freed
    assert _same(data.train.tokenizer_dir, run / "tokenizer")


def test_an_oserror_without_errno_is_no_crash_and_copytrees_error_is_one_line():
    """shutil.Error (copytree's collected errors) is an OSError with errno None: the CLI's
    one-line error for file-system errors crashed on it (os.strerror(None): TypeError)."""
    from bertgpu.cli import place_error

    err = shutil.Error([("data/tok/tokenizer.json", "run/tokenizer/tokenizer.json",
                         "[Errno 28] No space left on device")])
    assert place_error(err) == ("run/tokenizer/tokenizer.json: [Errno 28] No space left on "
                                "device (copying data/tok/tokenizer.json; 1 file(s) not copied)")
    assert place_error(OSError("a message, no errno")) is None  # a bug's traceback, as before


def test_a_tokenizer_link_is_replaced_by_a_copy_and_its_target_left_alone(data, tmp_path):
    other = tmp_path / "elsewhere"
    shutil.copytree(data.train.tokenizer_dir, other)
    (other / "vocab.txt").write_text("[PAD]\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "tokenizer").symlink_to(other)
    copy_tokenizer(data, run)
    assert not (run / "tokenizer").is_symlink() and _same(data.train.tokenizer_dir,
                                                           run / "tokenizer")
    assert sorted(p.name for p in other.iterdir()) == sorted(
        p.name for p in data.train.tokenizer_dir.iterdir())  # no scratch mark left in it
    assert not (run / "tokenizer.old").exists()
