"""SIGHUP (a closed terminal) to a command that is not training stops it as SIGTERM does: one
line, exit status 129, its scratch folder and lock file removed. Inside a training loop it
already did (train/preemption.py); elsewhere its default action killed the command silently.

The signal is sent by the process to itself at a chosen point, in a subprocess: before the fix
the default action killed the interpreter."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_HANG_UP_IN_TRAINING = """
import os, signal, sys
import bertgpu.data.wordpiece as wordpiece

def hang_up(*args, **kwargs):  # the terminal closes while the vocabulary trains
    os.kill(os.getpid(), signal.SIGHUP)
    raise AssertionError("SIGHUP did not stop the command")

wordpiece.train_on_copy = hang_up
from bertgpu.cli import main
sys.argv = ["bertgpu", *sys.argv[1:]]
raise SystemExit(main())
"""

_HANG_UP_AT_TORCH = """
import os, signal, sys

class HangUpAtTorch:
    def find_spec(self, name, path=None, target=None):
        # the seconds a command spends importing it (torch, or the command's module, which
        # no longer imports torch for --help)
        if name in ("torch", "bertgpu.finetune"):
            os.kill(os.getpid(), signal.SIGHUP)
        return None

sys.meta_path.insert(0, HangUpAtTorch())
from bertgpu.cli import main
sys.argv = ["bertgpu", *sys.argv[1:]]
raise SystemExit(main())
"""


def _run(script: str, *argv: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          env=env, timeout=120)


def test_a_closed_terminal_stops_the_tokenizer_in_one_line_and_leaves_nothing(tmp_path):
    """SIGHUP outside a training loop met its default action: no line, exit -1, and OUT.tmp
    (with a copy of the corpus) and OUT.bertgpu-lock left beside the output."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"the cat {i} sat on the mat {i % 7}.\n" for i in range(300)))
    out = tmp_path / "tok"
    done = _run(_HANG_UP_IN_TRAINING, "tokenizer", "--corpus", str(corpus), "--out", str(out),
                "--vocab-size", "120")
    assert done.returncode == 128 + signal.SIGHUP, done.stderr
    assert done.stderr.splitlines()[-1] == "bertgpu tokenizer: stopped by SIGHUP", done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_closed_terminal_while_the_command_imports_torch_is_one_line():
    done = _run(_HANG_UP_AT_TORCH, "finetune", "--help")
    assert done.returncode == 128 + signal.SIGHUP, done.stderr
    assert done.stderr.splitlines() == ["bertgpu finetune: stopped by SIGHUP"], done.stderr


def test_sighup_under_nohup_stays_ignored():
    from bertgpu import cli

    before = signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with cli._sigterm_stops():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


_FORK = """
import os, signal
from bertgpu import cli

with cli._sigterm_stops():
    assert signal.getsignal(signal.SIGHUP) is cli._raise_stop
    pid = os.fork()
    if pid == 0:
        os._exit(0 if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL else 1)
    raise SystemExit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_child_gets_sighups_default_action():
    """A closed terminal signals the whole foreground group: the command's handler, inherited
    by `prepare`'s forked pool workers, raised in each of them, a traceback each. They die of it
    quietly, as before the command line handled SIGHUP."""
    done = _run(_FORK)
    assert done.returncode == 0, done.stderr


def test_a_closed_terminal_stops_the_demo_as_sighup(tmp_path, monkeypatch, capsys):
    """The demo's stop line and status said SIGTERM (143) for any stop that was not a Ctrl-C."""
    from bertgpu import demo
    from bertgpu.stops import HungUp

    def stages(args, out, begun):
        begun.append("1. bertgpu tokenizer --vocab-size 8192")
        raise HungUp()

    monkeypatch.setattr(demo, "_check_transformers", lambda: None)
    monkeypatch.setattr(demo, "_run_stages", stages)
    parser = demo.argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert demo.main(parser.parse_args(["--out", str(tmp_path / "d")])) == 128 + signal.SIGHUP
    assert capsys.readouterr().err.startswith(
        "bertgpu demo: stopped by SIGHUP in stage 1 (bertgpu tokenizer); ")
