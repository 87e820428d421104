"""`bertgpu COMMAND --help` builds its parser without importing torch: `finetune --help` took
about 1.5 s (its module imported the task modules at its top, and they torch) where
`pretrain --help` takes 0.1 s. Torch comes with the run, not with its options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bertgpu.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]

_HELP = """
import sys
from bertgpu.cli import main

try:
    main([sys.argv[1], "--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
else:
    raise AssertionError("--help did not exit")
imported = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not imported, f"{sys.argv[1]} --help imported torch"
"""


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_does_not_import_torch(command):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _HELP, command], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr  # old code: "finetune --help imported torch"
    assert f"usage: bertgpu {command}" in done.stdout
