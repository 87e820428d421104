"""The code passes its own lint rules (pyproject.toml [tool.ruff]: lines within 100 columns,
pycodestyle, pyflakes, isort, bugbear and pyupgrade), so a long line or an unused import fails
the suite, not only a reviewer's eye."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (the dev extra has it: pip install -e .[dev])")
def test_ruff_check_passes():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"ruff check src tests benchmarks:\n{proc.stdout}{proc.stderr}"
