"""The code passes its own lint rules (pyproject.toml [tool.ruff]: lines within 100 columns,
pycodestyle, pyflakes, isort, bugbear and pyupgrade), so a long line or an unused import fails
the suite, not only a reviewer's eye. The ruff of the dev extra is pinned (a new release's rules
would otherwise fail CI with no code change), and the check leaves no cache in the checkout."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                    reason="ruff is not installed (the dev extra has it: pip install -e .[dev])")
def test_ruff_check_passes():
    pinned = re.findall(r'"ruff==([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert len(pinned) == 1, "pyproject.toml's dev extra pins ruff to one version (ruff==X)"
    version = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True,
                             text=True, timeout=60, check=True).stdout.split()[-1]
    assert version == pinned[0], (f"ruff {version} is installed, the dev extra pins "
                                  f"{pinned[0]}: pip install -e .[dev]")
    cache = ROOT / ".ruff_cache"
    had_cache = cache.exists()
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "src", "tests",
                           "benchmarks"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"ruff check src tests benchmarks:\n{proc.stdout}{proc.stderr}"
    assert had_cache or not cache.exists(), "the lint test left .ruff_cache in the checkout"
