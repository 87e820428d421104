"""A stop signal to a command that is not training, however early it comes: one line and exit
status 128 + the signal.

The signal is sent by the process to itself at a chosen point (an import hook on `torch`), in
a subprocess: before the fixes the default action killed the interpreter."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_STOP_AT_TORCH = """
import os, signal, sys

class StopAtTorch:
    def find_spec(self, name, path=None, target=None):
        # the seconds a command spends importing it (torch, or the command's module, which
        # no longer imports torch for --help)
        if name in ("torch", "bertgpu.finetune"):
            os.kill(os.getpid(), signal.{sig})
        return None

sys.meta_path.insert(0, StopAtTorch())
from bertgpu.cli import main
sys.argv = ["bertgpu", *sys.argv[1:]]
raise SystemExit(main())
"""


def _run(script: str, *argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize(("sig", "said"), [("SIGINT", "interrupted"),
                                           ("SIGTERM", "stopped by SIGTERM")])
def test_a_stop_while_the_command_imports_torch_is_one_line(sig, said):
    """The command's module was imported before the stop handling began: Ctrl-C while
    `finetune` (whose module imports torch: seconds) started printed a 30-frame
    KeyboardInterrupt traceback and died of SIGINT, SIGTERM killed it without a word."""
    done = _run(_STOP_AT_TORCH.format(sig=sig), "finetune", "--help")
    assert done.returncode == 128 + signal.Signals[sig], done.stderr
    assert done.stderr.splitlines() == [f"bertgpu finetune: {said}"], done.stderr
