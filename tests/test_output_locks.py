"""One command at a time writes an output (locks.py): two `finetune` runs into one --out
trained together (the second deleted the first's OUT.tmp or resumed from its live checkpoint;
both said they were done over an output without its metrics.jsonl), two `prepare` runs died on
each other's files. A second command into the same --out is now refused in one line naming the
first, and leaves its output alone."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest
from _text_fixtures import pydoc_documents, write_sentences
from _tiny_init import SPECIAL, tiny_init

from bertgpu.cli import main as cli_main
from bertgpu.errors import BertgpuError
from bertgpu.locks import output_lock

GLUE = Path(__file__).parent / "fixtures" / "glue"


def test_a_second_lock_is_refused_naming_the_first_and_the_lock_goes_at_the_end(tmp_path):
    out = tmp_path / "new" / "deeper" / "out"
    holder = f"(pid {os.getpid()} on {socket.gethostname()})"
    with output_lock(out, "bertgpu finetune"):
        assert (out.parent / "out.bertgpu-lock").read_text() == (
            f"{os.getpid()} {socket.gethostname()} bertgpu finetune\n")
        with pytest.raises(BertgpuError) as info:
            with output_lock(out, "bertgpu glue"):
                pass
        assert str(info.value) == (f"{out}: another bertgpu finetune {holder} is writing this "
                                   "output; wait for it to end or stop it, or give another --out")
        with output_lock(tmp_path / "other", "bertgpu finetune"):  # another output: free
            pass
    assert not (tmp_path / "new").exists()  # the lock and the folders made for it are gone
    (out.parent).mkdir(parents=True)
    (out.parent / "out.bertgpu-lock").write_text("123 gone-host bertgpu glue\n")  # SIGKILL: no lock
    with output_lock(out, "bertgpu prepare"):
        pass
    assert not (out.parent / "out.bertgpu-lock").exists()
    with output_lock(out, "bertgpu prepare", hold=False), output_lock(out, "bertgpu prepare"):
        pass  # the other ranks of a job take no lock
    with output_lock("memory://bucket/out", "bertgpu prepare"):
        pass  # a store has no locks


def test_every_command_that_writes_through_out_tmp_takes_the_lock(tmp_path, capsys):
    corpus = write_sentences(tmp_path / "corpus.txt", pydoc_documents(20))
    glue = str(GLUE)
    words = sorted({w for f in GLUE.rglob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", f.read_text().lower())})
    init = str(tiny_init(tmp_path / "m", [*SPECIAL, *words]))
    commands = {
        "tokenizer": ["--corpus", str(corpus), "--vocab-size", "200"],
        "prepare": ["--corpus", str(corpus), "--tokenizer", init, "--workers", "1"],
        "finetune": ["sst2", "--data", glue, "--init", init, "--epochs", "1"],
        "glue": ["--data-dir", glue, "--tasks", "sst2", "--init", init, "--epochs", "1"],
    }
    for name, argv in commands.items():
        out = tmp_path / name
        with output_lock(out, "bertgpu finetune"):
            assert cli_main([name, *argv, "--out", str(out)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"bertgpu {name}: error: {out}: another bertgpu finetune (pid "), err
        assert err.count("\n") == 1, err
        assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "m"], name


def test_a_launcher_refuses_a_locked_output_before_starting_workers(tmp_path, capsys,
                                                                   monkeypatch):
    """finetune and glue with --nproc started the launcher and every worker (seconds) before the
    workers' rank 0 found the output locked."""
    from bertgpu.locks import check_free

    out = tmp_path / "ft"
    check_free(out, "bertgpu finetune")  # no lock file: free, and nothing made
    assert list(tmp_path.iterdir()) == []
    with output_lock(out, "bertgpu glue"):
        with pytest.raises(BertgpuError, match=r"ft: another bertgpu glue \(pid \d+ on "):
            check_free(out, "bertgpu finetune")
        with monkeypatch.context() as worker:  # a worker of a job: its rank 0 holds the lock
            worker.setenv("WORLD_SIZE", "2")
            check_free(out, "bertgpu finetune")
        for name, argv in (("finetune", ["sst2", "--data", str(GLUE), "--init", "none"]),
                           ("glue", ["--data-dir", str(GLUE), "--init", "none"])):
            assert cli_main([name, *argv, "--out", str(out), "--nproc", "2"]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"bertgpu {name}: error: {out}: another bertgpu glue"), err


def test_a_read_only_place_another_tools_lock_file_and_a_linked_output(tmp_path):
    """Three holes a review found: a re-run on a read-only mount (nothing to do) failed on the
    lock file it could not make; `OUT.lock`, the name the lock had, is uv's and poetry's (an
    --out named uv emptied and deleted uv.lock); an output given through a link took another
    lock than the same output by name."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):  # root writes anyway: a place that refuses is faked
            from unittest import mock

            def refuse(path, *args, **kwargs):
                raise PermissionError(13, "Permission denied", str(path))

            with mock.patch("bertgpu.locks.os.open", refuse):
                with output_lock(ro / "shards", "bertgpu prepare"):
                    pass
        else:
            with output_lock(ro / "shards", "bertgpu prepare"):
                pass
    finally:
        ro.chmod(0o755)
    foreign = tmp_path / "uv.bertgpu-lock"
    foreign.write_text('[[package]]\nname = "torch"\n')
    with pytest.raises(BertgpuError, match="uv.bertgpu-lock: a file bertgpu did not write"):
        with output_lock(tmp_path / "uv", "bertgpu tokenizer"):
            pass
    assert foreign.read_text() == '[[package]]\nname = "torch"\n'
    (tmp_path / "uv.lock").write_text("kept")
    with output_lock(tmp_path / "uv2", "bertgpu tokenizer"):
        pass
    assert (tmp_path / "uv.lock").read_text() == "kept"
    (tmp_path / "real" / "out").mkdir(parents=True)
    (tmp_path / "outlink").symlink_to(tmp_path / "real" / "out")
    with output_lock(tmp_path / "real" / "out", "bertgpu finetune"):
        with pytest.raises(BertgpuError, match="another bertgpu finetune"):
            with output_lock(tmp_path / "outlink", "bertgpu glue"):
                pass



def test_a_link_where_the_lock_goes_is_refused_never_followed(tmp_path):
    # A dangling link read as "the file system refuses to create this folder"; one to a file
    # had that file locked, written and then the link removed.
    (tmp_path / "a.bertgpu-lock").symlink_to(tmp_path / "nowhere" / "x")
    target = tmp_path / "empty"
    target.write_text("")
    (tmp_path / "b.bertgpu-lock").symlink_to(target)
    for name in ("a", "b"):
        with pytest.raises(BertgpuError, match=rf"{name}.bertgpu-lock: a link bertgpu did not "
                                               rf"make, where it keeps the lock of .*/{name}; "):
            with output_lock(tmp_path / name, "bertgpu finetune"):
                pass
        assert (tmp_path / f"{name}.bertgpu-lock").is_symlink()
    assert target.read_text() == ""
