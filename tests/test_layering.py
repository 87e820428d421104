"""The package layering docs/ARCHITECTURE.md states, read from the source (lazy imports inside
functions included): packages depend downwards only, so `bertgpu watch` and `bertgpu report`
read runs without importing the training code, and the model never sees the data pipeline.
Relative imports and modules loaded by name (importlib) count as imports (tests/_imports.py)."""

from __future__ import annotations

from pathlib import Path

from _imports import imports

SRC = Path(__file__).resolve().parents[1] / "src" / "bertgpu"

BASE = {"errors", "batch", "fsutil", "locks", "step_folders", "__version__"}
"""Top-level modules every package may use: the error type, the loader/model batch contract, the
atomic file helpers, the output locks and the checkpoint folders built on them (and the
package's version)."""

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
        for target in sorted(imports(path)):
            owner = _owner(target) if target != "bertgpu" else "bertgpu"
            if owner == package or owner in BASE or owner in ALLOWED[package]:
                continue
            wrong.append(f"{rel} imports {target}")
    assert not wrong, "imports against the layering of docs/ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_watch_and_report_do_not_import_training():
    """watch.py and report/ read runs: telemetry and config, never train/ (nor torch's engine)."""
    for path in [SRC / "watch.py", *sorted((SRC / "report").glob("*.py"))]:
        owners = {_owner(t) for t in imports(path) if t != "bertgpu"}
        assert not owners & {"train", "tasks", "bench"}, (path.name, sorted(owners))


def test_the_reader_sees_relative_lazy_and_by_name_imports(tmp_path):
    """What the rules above rely on: `from ..train import engine`, a lazy `from .. import train`
    and `importlib.import_module("bertgpu.train.loop")` (a string in a table) all count."""
    pkg = tmp_path / "bertgpu"
    for name in ("__init__", "errors", "data/__init__", "data/x", "data/y", "train/__init__",
                 "train/engine", "train/loop"):
        (pkg / f"{name}.py").parent.mkdir(parents=True, exist_ok=True)
        (pkg / f"{name}.py").touch()
    (pkg / "data" / "x.py").write_text(
        "import importlib\n"
        "from . import y\n"
        "from ..train import engine\n"
        "from ..errors import BertgpuError\n"
        "LOADERS = {'loop': 'bertgpu.train.loop', 'text': 'bertgpu.train.loop is slow'}\n"
        "def f():\n"
        "    from .. import train\n"
        "    return importlib.import_module(LOADERS['loop']), train\n")
    assert imports(pkg / "data" / "x.py", src=tmp_path) == {
        "bertgpu.data.y", "bertgpu.train.engine", "bertgpu.errors", "bertgpu.train",
        "bertgpu.train.loop"}
    (pkg / "data" / "__init__.py").write_text("from .x import f\nfrom .. import errors\n")
    assert imports(pkg / "data" / "__init__.py", src=tmp_path) == {"bertgpu.data.x",
                                                                   "bertgpu.errors"}
    # and on the real tree: the architectures that models/build.py loads by name
    assert {"bertgpu.models.bert", "bertgpu.models.modernbert"} <= imports(
        SRC / "models" / "build.py")
