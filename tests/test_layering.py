"""The package layering docs/ARCHITECTURE.md states, read from the source (lazy imports inside
functions included): packages depend downwards only, so `bertgpu watch` and `bertgpu report`
read runs without importing the training code, and the model never sees the data pipeline."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "bertgpu"

BASE = {"errors", "batch", "fsutil", "__version__"}
"""Top-level modules every package may use: the error type, the loader/model batch contract, the
atomic file helpers (and the package's version)."""

ALLOWED: dict[str, set[str]] = {
    "models": set(),
    "data": {"testing"},  # fault injection (BERTGPU_FAULTS) in prepare's work units
    "testing": set(),
    "config": {"models", "data"},
    "telemetry": {"config", "models"},
    "report": {"config", "telemetry"},
    "train": {"config", "models", "telemetry", "testing"},
    "tasks": {"config", "data", "models", "train"},
}
"""What each sub-package may import besides BASE (bench/ and the top-level commands are wiring:
they may import anything)."""


def _imports(path: Path) -> set[str]:
    """Every bertgpu module `path` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "bertgpu"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "bertgpu":
                found |= {f"bertgpu.{a.name}" for a in node.names}
            elif node.module.startswith("bertgpu."):
                found.add(node.module)
    return found


def _owner(module: str) -> str:
    """The sub-package of `bertgpu.X.Y...`, or the top-level module's name."""
    return module.split(".")[1]


def test_packages_depend_downwards_only():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert set(ALLOWED) | {"bench"} == packages, "a new package: say what it may import"
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if len(rel.parts) == 1 or rel.parts[0] == "bench":
            continue  # commands and benchmarks are wiring
        package = rel.parts[0]
        for target in sorted(_imports(path)):
            owner = _owner(target) if target != "bertgpu" else "bertgpu"
            if owner == package or owner in BASE or owner in ALLOWED[package]:
                continue
            wrong.append(f"{rel} imports {target}")
    assert not wrong, "imports against the layering of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_watch_and_report_do_not_import_training():
    """watch.py and report/ read runs: telemetry and config, never train/ (nor torch's engine)."""
    for path in [SRC / "watch.py", *sorted((SRC / "report").glob("*.py"))]:
        owners = {_owner(t) for t in _imports(path) if t != "bertgpu"}
        assert not owners & {"train", "tasks", "bench"}, (path.name, sorted(owners))
