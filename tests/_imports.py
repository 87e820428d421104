"""The bertgpu modules a source file imports, read from its syntax tree, for the import-rule tests
(test_layering.py, test_registry.py): absolute and relative imports, at module level, inside
functions or under TYPE_CHECKING, and modules loaded by name (`importlib.import_module` of a
string: models/build.py's ARCHITECTURES, an architecture's `model_module`, the command tables).

A module loaded by name is found as the string itself: any string constant in the file that is
the dotted name of a module of the package counts as an import of it, wherever the string is
used (a table, a dataclass field, a call), since that is how those loads name their targets. A
relative `import_module(".x", package)` resolves against the file's own package."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def is_module(name: str, src: Path = SRC) -> bool:
    """True when the dotted `name` is a module or package under `src`."""
    base = src.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def module_name(path: Path, src: Path = SRC) -> str:
    """`src/bertgpu/data/x.py` -> "bertgpu.data.x" (a package's __init__.py: the package)."""
    parts = list(path.resolve().relative_to(src.resolve()).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: Path, src: Path) -> str:
    """The package a relative import in `path` starts from (level 1)."""
    name = module_name(path, src)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _relative(base: str, level: int, module: str | None) -> str:
    """`from ..x import y` in package `base` -> the absolute name of `..x`."""
    parts = base.split(".")
    if level - 1 >= len(parts):
        raise ValueError(f"relative import beyond the top of {base!r}")
    root = ".".join(parts[: len(parts) - (level - 1)])
    return f"{root}.{module}" if module else root


def imports(path: Path, src: Path = SRC, top: str = "bertgpu") -> set[str]:
    """Every `top` module `path` imports: for `from M import a`, M.a when it is a module (else M;
    `from bertgpu import X` is always bertgpu.X, as the package re-exports nothing else)."""
    package = _package(path, src)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = _relative(package, node.level, node.module) if node.level else node.module
            if module is None:
                continue
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if module == top or is_module(sub, src) else module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(f"{top}.") and is_module(node.value, src):
                found.add(node.value)  # a module named by string, for importlib
        elif (isinstance(node, ast.Call) and node.args
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and isinstance(node.args[0], ast.Constant)
              and str(node.args[0].value).startswith(".")):
            name = str(node.args[0].value)
            level = len(name) - len(name.lstrip("."))
            found.add(_relative(package, level, name.lstrip(".") or None))
    return {m for m in found if m == top or m.startswith(f"{top}.")}
