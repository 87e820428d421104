"""The resolved configuration written out: `dump_toml` (a run's and a checkpoint's config.toml,
which reads back to the same config) and `format_help` (the `--help-config` list of every key
with its type, default and help text). Reading and overriding are `overrides.py`'s."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from bertgpu.config.overrides import _hints, _is_section, _type_name, help_of


def _toml_value(v: Any) -> str:
    if v is None:
        return '"none"'  # read back as None by optional fields
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dump_toml(cfg: Any) -> str:
    """TOML text of a dataclass config: top-level keys, then one [table] per section. A None
    value is written as "none" so the file reads back to the same config."""
    top: list[str] = []
    tables: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            lines = [f"[{f.name}]"]
            lines += [f"{g.name} = {_toml_value(getattr(value, g.name))}"
                      for g in dataclasses.fields(value)]
            tables.append("\n".join(lines))
        else:
            top.append(f"{f.name} = {_toml_value(value)}")
    return "\n\n".join(["\n".join(top)] + tables if top else tables) + "\n"


def format_help(schema: Any, prefix: str = "") -> str:
    """Every key of a dataclass schema (a class, or an instance: its sections as they are) with
    its type, default and help text (for `--help-config`); `prefix` is the dotted path of a
    section printed on its own."""
    lines: list[str] = []

    def walk(obj: Any, prefix: str) -> None:
        cls = obj if isinstance(obj, type) else type(obj)
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            if isinstance(obj, type):
                value = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            else:
                value = getattr(obj, f.name)
            if _is_section(value):
                lines.append(f"\n[{prefix}{f.name}]  {help_of(cls, f)}")
                walk(value, f"{prefix}{f.name}.")
                continue
            shown = ("none" if value is None else ",".join(map(str, value))
                     if isinstance(value, (tuple, list)) else value)
            lines.append(f"  --{prefix}{f.name} ({_type_name(hints[f.name])}; default {shown})")
            lines.append(f"      {help_of(cls, f)}")

    walk(schema, prefix)
    return "\n".join(lines).strip("\n") + "\n"
