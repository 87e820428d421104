"""Only bertgpu's own folders are ever deleted.

Commands that build their output as OUT.tmp and swap it in (renaming an old OUT to OUT.old) used
to delete whatever stood at OUT.tmp or OUT.old, and `prepare --overwrite`, `export`, `report`,
`finetune` and `demo --fresh` replaced any folder given as --out: a project folder, corpus
included, was lost. Each now refuses a folder that is not its own, in one line, before any work,
and leaves it as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertgpu import cli, fsutil
from bertgpu.errors import BertgpuError

ROOT = Path(__file__).parent
CORPUS = ROOT.parent / "README.md"


def _user_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "notes.md").write_text("mine")
    return path


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    import _tiny_init

    return _tiny_init.tiny_init(tmp_path_factory.mktemp("m"), [*_tiny_init.SPECIAL, "the", "a"])


def _commands(init: Path, out: Path, run: Path) -> dict[str, list[str]]:
    return {
        "prepare": ["prepare", "--corpus", str(CORPUS), "--tokenizer", str(init), "--out",
                    str(out), "--overwrite"],
        "tokenizer": ["tokenizer", "--corpus", str(CORPUS), "--vocab-size", "200", "--out",
                      str(out)],
        "export": ["export", str(run), "--out", str(out)],
        "report": ["report", str(init), "--out", str(out)],
        "finetune": ["finetune", "sst2", "--data", str(ROOT / "fixtures" / "glue"), "--init",
                     str(init), "--out", str(out), "--epochs", "1"],
    }


def test_a_user_folder_given_as_out_is_refused_and_kept(init, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    out = _user_folder(tmp_path / "project")
    commands = _commands(init, out, run)
    commands["demo --fresh"] = ["demo", "--out", str(out), "--fresh"]
    expected = {"tokenizer": "already exists and is not empty"}
    for name, argv in commands.items():
        assert cli.main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, (name, err)
        assert f"{out}: " + expected.get(name, "a folder that is not") in err, (name, err)
        assert sorted(p.name for p in out.iterdir()) == ["notes.md"], name
        assert (out / "notes.md").read_text() == "mine", name


def test_the_current_folder_as_out_is_refused_by_every_command_that_swaps_it_in(
        init, tmp_path, capsys, monkeypatch):
    """`--out .` was a ValueError traceback ("PosixPath('.') has an empty name") in finetune,
    report and export; prepare and tokenizer already said this in one line."""
    run = tmp_path / "run"
    run.mkdir()
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    commands = _commands(init, Path("."), run)
    commands["demo --fresh"] = ["demo", "--out", ".", "--fresh"]
    for name, argv in commands.items():
        assert cli.main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert err.endswith("error: --out .: is the current folder, which would be replaced; "
                            "expected a new folder elsewhere (e.g. a name inside it)"), (name, err)
        assert len(err.splitlines()) == 1 and list(here.iterdir()) == [], name


@pytest.mark.parametrize("suffix", [".tmp", ".old"])
def test_a_user_folder_beside_out_is_refused_and_kept(init, tmp_path, capsys, suffix):
    """OUT.tmp and OUT.old are where these commands build and set aside their output; a folder
    of the user's under either name used to be deleted (prepare, even without --overwrite)."""
    run = tmp_path / "run"
    run.mkdir()
    out = tmp_path / "mydata"
    beside = _user_folder(tmp_path / f"mydata{suffix}")
    for name, argv in _commands(init, out, run).items():
        assert cli.main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, (name, err)
        assert f"{beside}: exists and was not made by bertgpu" in err, (name, err)
        assert (beside / "notes.md").read_text() == "mine", name
        assert not out.exists(), name


def test_an_interrupted_runs_scratch_is_still_cleaned(init, tmp_path):
    """What bertgpu left itself (a killed run's OUT.tmp, a crash's OUT.old) is still removed."""
    from bertgpu.data.tokenizer import train_tokenizer

    out = tmp_path / "tok"
    fsutil.make_scratch(out.with_name("tok.tmp"), out)
    (out.with_name("tok.tmp") / "corpus.txt").write_text("half")
    old = fsutil.make_scratch(out.with_name("tok.old"), out)
    train_tokenizer([CORPUS], out, vocab_size=200)
    assert (out / "vocab.txt").is_file() and not (out / fsutil.SCRATCH_MARK).exists()
    assert not out.with_name("tok.tmp").exists()
    # a crash between an earlier run's renames left OUT.old: superseded once a new OUT is in place
    assert not old.exists()


@pytest.mark.parametrize("cut", range(1, 7))
def test_a_scratch_folder_cut_while_it_is_removed_is_still_bertgpus(tmp_path, monkeypatch, cut):
    """A kill while bertgpu removes its own OUT.tmp (a re-run starting afresh, an export's
    scratch): `shutil.rmtree` deletes in listing order, so the mark could go first and the
    partial folder left was refused by every later run as "not made by bertgpu". The mark now
    goes last; a kill at any of the deletions leaves a folder the next run removes."""
    import os

    out, scratch = tmp_path / "out", tmp_path / "out.tmp"
    fsutil.make_scratch(scratch, out)
    for name in ("a", "m", "z", "0"):
        (scratch / name).write_text("x")
    (scratch / "sub").mkdir()
    (scratch / "sub" / "f").write_text("x")
    calls, real, real_scandir = [], os.unlink, os.scandir

    def unlink(path, *args, **kwargs):  # the cut-th deletion is a kill
        calls.append(path)
        if len(calls) == cut:
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    class MarkFirst:  # a listing order with the mark first (file systems list in hash order)
        def __init__(self, *args, **kwargs):
            self.it = real_scandir(*args, **kwargs)
            self.entries = sorted(self.it, key=lambda e: e.name != fsutil.SCRATCH_MARK)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.it.close()

        def __iter__(self):
            return iter(self.entries)

        def close(self):
            self.it.close()

    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(os, "scandir", MarkFirst)
    with pytest.raises(KeyboardInterrupt):
        fsutil.make_scratch(scratch, out)
    monkeypatch.undo()
    fsutil.make_scratch(scratch, out)  # the next run
    assert sorted(p.name for p in scratch.iterdir()) == [fsutil.SCRATCH_MARK]


def test_an_empty_folder_a_kill_left_as_scratch_is_taken(tmp_path):
    """A kill between a scratch folder's mkdir and its mark left it empty and unmarked: nothing
    of anyone's is in it, so the next run takes it (a folder with files is still refused)."""
    out, scratch = tmp_path / "out", tmp_path / "out.tmp"
    scratch.mkdir()
    assert fsutil.is_scratch(fsutil.make_scratch(scratch, out))
    _user_folder(tmp_path / "out.old")
    with pytest.raises(BertgpuError, match=r"out.old: exists and was not made by bertgpu"):
        fsutil.make_scratch(tmp_path / "out.old", out)


def test_replace_dir_marks_the_old_folder_and_refuses_a_users(tmp_path):
    final = tmp_path / "out"
    final.mkdir()
    (final / "a").write_text("1")
    seen = []
    tmp = fsutil.make_scratch(tmp_path / "out.tmp", final)
    (tmp / "a").write_text("2")
    fsutil.replace_dir(tmp, final, between=lambda: seen.append(
        fsutil.is_scratch(tmp_path / "out.old")))
    assert seen == [True] and (final / "a").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in final.iterdir()) == ["a"]
    _user_folder(tmp_path / "out.old")
    tmp = fsutil.make_scratch(tmp_path / "out.tmp", final)
    with pytest.raises(BertgpuError, match=r"out.old: exists and was not made by bertgpu"):
        fsutil.replace_dir(tmp, final)
    assert (tmp_path / "out.old" / "notes.md").read_text() == "mine"
    assert (final / "a").read_text() == "2"


@pytest.mark.parametrize("layout", ["out inside the corpus", "corpus inside out"])
def test_prepare_and_tokenizer_refuse_an_output_that_overlaps_the_corpus(init, tmp_path, capsys,
                                                                          layout):
    """An output inside the corpus folder was read back as corpus on a rerun (and a killed run's
    finished units were deleted); a corpus inside --out --overwrite was deleted."""
    corpus = _user_folder(tmp_path / "corpus")
    (corpus / "text.txt").write_text(CORPUS.read_text())
    out = corpus / "data" if layout == "out inside the corpus" else corpus
    argvs = [["prepare", "--corpus", str(corpus / "text.txt" if out == corpus else corpus),
              "--tokenizer", str(init), "--out", str(out), "--overwrite"],
             ["tokenizer", "--corpus", str(corpus), "--vocab-size", "200", "--out", str(out)]]
    for argv in argvs:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        if out == corpus:  # refused as a folder of the user's first
            assert "not empty" in err or "not a shard set" in err, err
        else:
            assert f"{out}: overlaps the input {corpus}" in err, err
        assert sorted(p.name for p in corpus.iterdir()) == ["notes.md", "text.txt"]


def test_export_replaces_only_an_earlier_export(init, tmp_path, capsys):
    """`export --out DIR` replaced any folder holding a file named config.json: a project's
    config.json (an editor's settings) was enough, and .git, sources and notes went with it; so
    was a clone of a model repository. An earlier export (a model's config.json, no folder or
    hidden entry) is still replaced."""
    import json
    import shutil

    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.hf_export import is_model_folder, save_pretrained

    run = tmp_path / "run"
    run.mkdir()
    project = _user_folder(tmp_path / "project")
    (project / "config.json").write_text('{"editor": "vim"}')
    (project / ".git").mkdir()
    assert cli.main(["export", str(run), "--out", str(project)]) == 2
    assert f"{project}: a folder that is not" in capsys.readouterr().err
    assert sorted(p.name for p in project.iterdir()) == [".git", "config.json", "notes.md"]
    assert not is_model_folder(project)
    model = init / "config.json"
    clone = tmp_path / "hub-clone"  # a model repository's clone: its .git is kept
    shutil.copytree(init, clone)
    (clone / ".git").mkdir()
    assert not is_model_folder(clone)
    earlier = tmp_path / "exported"
    shutil.copytree(init, earlier)
    assert is_model_folder(earlier)
    cfg = BertConfig(**{k: v for k, v in json.loads(model.read_text()).items()
                        if k in ("vocab_size", "hidden_size", "num_hidden_layers",
                                 "num_attention_heads", "intermediate_size",
                                 "max_position_embeddings")})
    again = save_pretrained(BertForPreTraining(cfg, with_nsp=False), earlier, tokenizer=init)
    assert again == earlier and is_model_folder(earlier)


@pytest.mark.parametrize("case", ["new output", "between the renames", "before them"])
def test_a_kill_around_the_final_renames_leaves_what_the_same_command_takes(init, tmp_path,
                                                                            monkeypatch, case):
    """replace_dir took OUT.tmp's mark off before its renames: a kill at the rename of a new
    output left a whole, unmarked OUT.tmp, which the same command then refused as "not made by
    bertgpu"; a kill between the renames of a replacement left OUT.old and that OUT.tmp, no OUT;
    one before them left OUT marked, refused as not a shard set. Now OUT.tmp is marked until it
    is OUT, and an OUT left marked is whole: the same command takes each state."""
    import os
    import shutil

    from bertgpu.data.output import is_shard_set

    argv = _commands(init, tmp_path / "data", tmp_path)["prepare"]
    argv[argv.index("--out") + 1] = str(tmp_path / "made")
    assert cli.main(argv) == 0
    out, tmp = tmp_path / "data", tmp_path / "data.tmp"
    if case != "new output":
        shutil.copytree(tmp_path / "made", out)
    fsutil.make_scratch(tmp, out)
    shutil.copytree(tmp_path / "made", tmp, dirs_exist_ok=True)  # a whole new set, in flight

    real, calls = os.replace, []
    kill_at = {"new output": 1, "between the renames": 2, "before them": 1}[case]

    class Killed(BaseException):  # SIGKILL: nothing after it runs
        pass

    def replace(src, dst):
        calls.append(1)
        if len(calls) == kill_at:
            raise Killed
        real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Killed):
        fsutil.replace_dir(tmp, out, replaces=is_shard_set)
    monkeypatch.setattr(os, "replace", real)
    assert fsutil.is_scratch(tmp)  # the whole new folder is still bertgpu's to remove
    argv[argv.index("--out") + 1] = str(out)
    assert cli.main(argv) == 0  # the same command again
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("data")) == ["data"]
    assert not (out / fsutil.SCRATCH_MARK).exists()
    # a kill after the new folder's rename, before its mark went: OUT is whole and is replaced
    (out / fsutil.SCRATCH_MARK).touch()
    assert cli.main(argv) == 0 and not (out / fsutil.SCRATCH_MARK).exists()
