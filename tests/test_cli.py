"""The `bertgpu` front door: how a command's own warnings reach the user."""

from __future__ import annotations

import subprocess
import sys

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
