"""The `bertgpu` front door: how a command's own warnings reach the user."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r'''
import sys, types, warnings
from bertgpu import cli
from bertgpu.models import hf_io

def main(args):
    warnings.warn_explicit("run/checkpoints/step_3: 2 weights initialised fresh", UserWarning,
                           hf_io.__file__, 256)
    warnings.warn_explicit("from elsewhere", UserWarning, "/site-packages/other.py", 7)
    return 0

fake = types.ModuleType("fake_command")
fake.add_arguments = lambda parser: None
fake.main = main
sys.modules["fake_command"] = fake
cli.COMMANDS["fake"] = ("fake_command", "a command for this test")
shown = warnings.showwarning
assert cli.main(["fake"]) == 0 and warnings.showwarning is shown
'''


def test_own_warnings_are_one_line_and_others_keep_their_form():
    """A warning from bertgpu's code (a fresh head, a label set that looks numeric) prints as
    one `bertgpu CMD: warning: ...` line, not Python's file:line plus the calling source line;
    a third party's keeps Python's form, and Python's display is back after the command."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "bertgpu fake: warning: run/checkpoints/step_3: 2 weights initialised fresh",
        "/site-packages/other.py:7: UserWarning: from elsewhere"]


def test_own_warnings_are_said_by_rank_0_alone():
    """In a job of several processes every rank reads the same data and raised the same warning
    (a dev set past max_seq_len, skipped malformed rows): it was printed once per rank."""
    import os

    for rank, expected in (("0", ["bertgpu fake: warning: run/checkpoints/step_3: 2 weights "
                                  "initialised fresh"]), ("1", [])):
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "RANK": rank})
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.splitlines() == [*expected,
                                            "/site-packages/other.py:7: UserWarning: from "
                                            "elsewhere"], rank


def test_an_output_path_that_is_a_file_is_one_line_and_the_file_is_kept(tmp_path, capsys):
    """--out naming a file (or a path through one) stops every command that writes a folder
    before any work, with one line naming it. With real inputs `finetune` and `prepare
    --overwrite` used to replace the user's file with their output folder, `pretrain`, `glue` and
    `demo` to raise a traceback, `bench model` to raise one after all its measurements."""
    import re

    import _tiny_init
    from _shards import write_synthetic_shards

    from bertgpu import cli

    root = Path(__file__).parent
    glue_data = root / "fixtures" / "glue"
    words = sorted({w for f in glue_data.rglob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", f.read_text().lower())})
    init = _tiny_init.tiny_init(tmp_path / "m", [*_tiny_init.SPECIAL, *words])
    shards = write_synthetic_shards(tmp_path / "shards", n_train=16, n_val=8, seq_len=32,
                                    vocab_size=100)
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    commands = {
        "pretrain": ["pretrain", str(root.parent / "configs" / "tiny.toml"), "--data",
                     str(shards), "--out", str(afile), "--model.vocab_size", "100",
                     "--train.max_steps", "1"],
        "finetune": ["finetune", "sst2", "--data", str(glue_data), "--init", str(init),
                     "--out", str(afile), "--epochs", "1"],
        "glue": ["glue", "--data-dir", str(glue_data), "--tasks", "sst2", "--init", str(init),
                 "--out", str(afile), "--epochs", "1"],
        "report": ["report", str(init), "--out", str(afile / "report")],
        "bench model": ["bench", "model", "--size", "tiny", "--out", str(afile / "rows.jsonl")],
        "bench scaling": ["bench", "scaling", "--workers", "1", "--out", str(afile)],
        "bench finetune-scaling": ["bench", "finetune-scaling", "--out", str(afile)],
        "bench quality": ["bench", "quality", "--out", str(afile)],
        "prepare --overwrite": ["prepare", "--corpus", str(root.parent / "README.md"),
                                "--tokenizer", str(init), "--out", str(afile), "--overwrite"],
        "tokenizer": ["tokenizer", "--corpus", str(root.parent / "README.md"),
                      "--out", str(afile / "tok")],
        "demo": ["demo", "--out", str(afile), "--fresh"],
    }
    for name, argv in commands.items():
        assert cli.main(argv) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{afile}: exists and is not a folder" in err, (
            name, err)
        assert afile.read_text() == "mine", name


def test_bad_inputs_with_nproc_are_one_line_before_any_worker_starts(tmp_path, capsys):
    """With --nproc 2 a missing init, data folder or shard set used to surface inside both
    workers, under torch's failure report (about 45 lines); each is now one line, and no worker
    starts."""
    import _tiny_init

    from bertgpu import cli

    root = Path(__file__).parent
    missing = str(tmp_path / "absent")
    init = str(_tiny_init.tiny_init(tmp_path / "m", [*_tiny_init.SPECIAL, "a"]))
    cases = {
        "pretrain, no shard set": (["pretrain", str(root.parent / "configs" / "tiny.toml"),
                                    "--data", missing, "--out", str(tmp_path / "r"),
                                    "--impl.micro_batch_size", "16"],
                                   f"{missing}: does not exist (expected a shard set"),
        "finetune, no init": (["finetune", "sst2", "--data", str(root / "fixtures" / "glue"),
                               "--init", missing, "--out", str(tmp_path / "f")], "absent"),
        "finetune, no GLUE files": (["finetune", "sst2", "--data", missing, "--init", init,
                                     "--out", str(tmp_path / "f")],
                                    f"{missing}: does not exist (expected the GLUE data folder"),
        "glue, no init": (["glue", "--data-dir", str(root / "fixtures" / "glue"), "--init",
                           missing, "--out", str(tmp_path / "g")], "absent"),
    }
    for name, (argv, message) in cases.items():
        assert cli.main([*argv, "--nproc", "2"]) == 2, name
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, (name, err)


def test_max_restarts_without_a_launcher_is_a_note(monkeypatch, capsys):
    """`--max-restarts 2` without `--nproc` (or with one process, or under torchrun) restarts
    nothing: it used to be ignored without a word; a negative count is refused."""
    import types

    from bertgpu import cli

    fake = types.ModuleType("fake_trainer")
    fake.LAUNCHES_WORKERS = True
    fake.add_arguments = lambda parser: None
    fake.check_before_launch = lambda args, n: None
    fake.main = lambda args: 0
    monkeypatch.setitem(sys.modules, "fake_trainer", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_trainer", "a command for this test"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for words, why in ((["--max-restarts", "2"], "without --nproc"),
                       (["--max-restarts=2", "--nproc", "1"],
                        "with --nproc 1, which runs one process here")):
        assert cli.main(["fake", *words]) == 0
        assert capsys.readouterr().err.splitlines() == [
            f"bertgpu fake: warning: --max-restarts 2 is ignored {why}; restarts need --nproc N "
            "with N > 1"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["fake", "--max-restarts", "1"]) == 0
    assert "ignored under torchrun (give torchrun's own --max-restarts)" in capsys.readouterr().err
    assert cli.main(["fake"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(["fake", "--max-restarts", "-1"]) == 2
    assert capsys.readouterr().err.strip() == ("bertgpu fake: error: --max-restarts -1: expected 0 "
                                               "or more")


def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path):
    """`bertgpu prepare ... | head -1`: once head exited, the next summary line raised
    BrokenPipeError, a traceback and exit status 1 after the shard set was written. Now the command
    stops quietly with 141 (128 + SIGPIPE), as a tool killed by SIGPIPE does."""
    import os

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here.\nAnother one there.\n\n" * 20, encoding="utf-8")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        proc = subprocess.run([sys.executable, "-m", "bertgpu", "tokenizer", "--corpus",
                               str(corpus), "--vocab-size", "30", "--out", str(tmp_path / "tok")],
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr
    assert (tmp_path / "tok" / "vocab.txt").is_file()


def _fake_command(monkeypatch, main) -> None:
    import types

    from bertgpu import cli

    fake = types.ModuleType("fake_command")
    fake.add_arguments = lambda parser: None
    fake.main = main
    monkeypatch.setitem(sys.modules, "fake_command", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", ("fake_command", "a command for this test"))


def test_the_file_system_refusing_a_path_is_one_line_and_a_bug_keeps_its_traceback(
        monkeypatch, capsys):
    """An --out on a read-only mount, a full quota, a path through a file: export, report,
    finetune, glue, tokenizer and prepare each printed a PermissionError (or OSError)
    traceback. The file system's answer about a path is now `PATH: STRERROR; what to do`, exit
    2; an OSError that is no such answer (a bad descriptor, no path) is a bug and propagates."""
    import errno

    import pytest

    from bertgpu import cli

    raised: list[OSError] = []

    def main(args):
        raise raised[-1]

    _fake_command(monkeypatch, main)
    for exc, said in (
            (PermissionError(errno.EACCES, "Permission denied", "out/x.tmp"),
             "out/x.tmp: Permission denied; expected a place this user may write"),
            (OSError(errno.EPERM, "Operation not permitted", "out"),
             "out: Operation not permitted; expected a place this user may write"),
            (OSError(errno.EROFS, "Read-only file system", "/mnt/ro/out"),
             "/mnt/ro/out: Read-only file system; expected a place on a writable file "
             "system"),
            (OSError(errno.ENOSPC, "No space left on device", "out/a.bin"),
             "out/a.bin: No space left on device; free space on that file system"),
            (OSError(errno.EDQUOT, "Disk quota exceeded", "out/a.bin"),
             "out/a.bin: Disk quota exceeded; free space within the quota"),
            (NotADirectoryError(errno.ENOTDIR, "Not a directory", "notes.txt/out"),
             "notes.txt/out: Not a directory; a part of this path is a file"),
            (OSError(errno.EACCES, "Permission denied", "a.tmp", None, "a"),
             "a.tmp -> a: Permission denied;")):
        raised.append(exc)
        assert cli.main(["fake"]) == 2, exc
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith(f"bertgpu fake: error: {said}"), err
    for bug in (OSError(errno.EBADF, "Bad file descriptor", "x"),  # ours, not the user's
                PermissionError(errno.EACCES, "Permission denied"),  # no path to name
                FileNotFoundError(errno.ENOENT, "No such file or directory", "our/own/file")):
        raised.append(bug)
        with pytest.raises(type(bug)):
            cli.main(["fake"])


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this user may not make folders in: a mode 555 one, or, for root (whom modes do
    not stop), /sys, where even root may not."""
    import errno

    mine = tmp_path / "read_only"
    mine.mkdir()
    mine.chmod(0o555)
    for place in (mine, Path("/sys")):
        try:
            (place / "bertgpu-probe").mkdir()
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                return place
        else:
            (place / "bertgpu-probe").rmdir()
    import pytest

    pytest.skip("no folder here refuses this user's mkdir")


def test_an_output_place_this_user_may_not_write_is_one_line(tmp_path, capsys):
    """The commands of the probe (pretrain had its own line already): one line naming the place,
    exit 2, nothing written."""
    import re

    import _tiny_init
    from _shards import write_synthetic_shards

    from bertgpu import cli

    place = _unwritable_folder(tmp_path)
    try:
        root = Path(__file__).parent
        glue_data = root / "fixtures" / "glue"
        words = sorted({w for f in glue_data.rglob("*.tsv")
                        for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", f.read_text().lower())})
        init = str(_tiny_init.tiny_init(tmp_path / "m", [*_tiny_init.SPECIAL, *words]))
        shards = write_synthetic_shards(tmp_path / "shards", n_train=16, n_val=8, seq_len=32,
                                        vocab_size=100)
        run = tmp_path / "run"
        assert cli.main(["pretrain", str(root.parent / "configs" / "tiny.toml"), "--data",
                         str(shards), "--out", str(run), "--model.vocab_size", "100",
                         "--model.hidden_size", "32", "--model.intermediate_size", "64",
                         "--model.max_position_embeddings", "64", "--train.max_steps", "1",
                         "--train.global_batch_size", "4", "--impl.micro_batch_size", "4",
                         "--train.eval_every_steps", "0", "--impl.num_workers", "0"]) == 0
        capsys.readouterr()
        corpus = tmp_path / "c.txt"
        corpus.write_text("hello world.\n\nanother doc.\n", encoding="utf-8")
        out = place / "bertgpu-test" / "out"
        commands = {
            "export": ["export", str(run), "--out", str(out)],
            "report": ["report", str(run), "--out", str(out)],
            "finetune": ["finetune", "sst2", "--data", str(glue_data), "--init", init, "--out",
                         str(out), "--epochs", "1"],
            "glue": ["glue", "--data-dir", str(glue_data), "--tasks", "sst2", "--init", init,
                     "--out", str(out), "--epochs", "1"],
            "tokenizer": ["tokenizer", "--corpus", str(corpus), "--vocab-size", "200", "--out",
                          str(out)],
            "prepare": ["prepare", "--corpus", str(corpus), "--tokenizer", init, "--out",
                        str(out)],
        }
        for name, argv in commands.items():
            assert cli.main(argv) == 2, name
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1, (name, err)
            assert err.startswith(f"bertgpu {name}: error: {place / 'bertgpu-test'}"), (name, err)
            assert not (place / "bertgpu-test").exists(), name
    finally:
        (tmp_path / "read_only").chmod(0o755)


def _every_parser():
    """(prog, parser) of every command and bench suite, built as cli.py and bench build them."""
    import argparse
    import importlib

    from bertgpu import bench, cli

    for name, (module_name, text) in cli.COMMANDS.items():
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=f"bertgpu {name}", description=text)
        module.add_arguments(parser)
        if getattr(module, "LAUNCHES_WORKERS", False):
            cli._add_launch_arguments(parser)
        yield f"bertgpu {name}", parser
    for suite, (module_name, text) in bench.SUITES.items():
        parser = argparse.ArgumentParser(prog=f"bertgpu bench {suite}", description=text)
        importlib.import_module(module_name).add_arguments(parser)
        yield f"bertgpu bench {suite}", parser


def test_every_option_has_help_and_says_its_default():
    """`bench model --seed` had no help at all, and demo, the bench suites, --nproc,
    --max-restarts and prepare --seed hid their defaults. Every option has a help text, and one
    with a default that is something (not None, False or an empty list) says "default" in it,
    as the others do in words (`--help` shows no defaults by itself)."""
    import argparse

    missing, silent = [], []
    for prog, parser in _every_parser():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"{prog} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(where)
            elif (action.default is not None and action.default is not False
                  and action.default not in (argparse.SUPPRESS, [], "")
                  and "default" not in action.help):
                silent.append(f"{where} (default {action.default!r})")
    assert not missing, f"options without help: {missing}"
    assert not silent, f"options whose help hides their default: {silent}"


def test_report_help_says_which_folder_it_replaces():
    """`report --out` said "replaced if it exists", but any folder other than an earlier report
    (or an empty one) is refused."""
    help_ = dict(_every_parser())["bertgpu report"].format_help()
    assert "replaced if it exists" not in help_
    assert "an earlier report, which is replaced; any other folder is refused" in " ".join(
        help_.split())


class _Writes:
    """A stderr that records each write call (what the pipe would get, system call by call,
    under PYTHONUNBUFFERED)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_an_error_line_is_one_write(tmp_path, monkeypatch):
    """Workers of a job share the launcher's pipe and print the same error at once: with the
    line and its newline written apart, two ranks' lines interleaved into one ("...at least
    6bertgpu tokenizer: error: ...") that the launcher could not de-duplicate."""
    from bertgpu import cli

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a sentence.\n", encoding="utf-8")
    err = _Writes()
    monkeypatch.setattr(sys, "stderr", err)
    code = cli.main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "-1",
                     "--out", str(tmp_path / "t")])
    assert code == 2
    assert [c for c in err.calls if c] == [
        "bertgpu tokenizer: error: --vocab-size -1: too small; expected at least 6\n"]
    err.calls.clear()
    assert cli.main(["no-such-command"]) == 2
    assert len(err.calls) == 1 and err.calls[0].endswith("\n"), err.calls


def test_a_folder_the_file_system_will_not_create_is_one_line(tmp_path, capsys):
    """`--out /proc/x/tok`: /proc exists but refuses mkdir with ENOENT, which used to end in a
    traceback. ENOENT on the way to a path the user typed (or its scratch `OUT.tmp`) is one
    line; on a file of our own it stays a bug with its traceback."""
    import errno

    from bertgpu import cli

    def enoent(path):
        return FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))

    out = tmp_path / "p" / "tok"
    argv = ["--corpus", "c.txt", "--out", str(out)]
    for where in (tmp_path / "p", out, out.with_name("tok.tmp")):
        line = cli.place_error(enoent(where), argv)
        assert line is not None and line.startswith(f"{where}: No such file"), line
    assert cli.place_error(enoent(out), [f"--out={out}"]) is not None
    assert cli.place_error(enoent(out / "checkpoints" / "step_1" / "model.pt"), argv) is None
    assert cli.place_error(enoent(tmp_path / "other"), argv) is None
    if Path("/proc/self").is_dir():
        corpus = tmp_path / "c.txt"
        corpus.write_text("hello world.\n\nanother doc.\n", encoding="utf-8")
        assert cli.main(["tokenizer", "--corpus", str(corpus), "--vocab-size", "200",
                         "--out", "/proc/bertgpu-test/tok"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("bertgpu tokenizer: error: /proc/bertgpu-test"), err
        assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("argv", [["prepare", "--seq-len", "abc"], ["export", "--step", "x"],
                                  ["bench", "model", "--bogus"], ["bench", "nosuch"]])
def test_an_option_argparse_refuses_is_one_line(argv, capsys):
    """argparse printed its whole usage (up to 16 lines) before the error; like every other
    error of bertgpu's it is one line, pointing at --help, exit 2."""
    from bertgpu import cli

    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "usage" not in err, err
    assert err.startswith("bertgpu ") and err.endswith(" --help)"), err
