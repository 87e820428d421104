"""Typed configuration machinery for any dataclass schema: TOML files and `--a.b value` overrides.

A schema is a tree of dataclasses whose fields carry a help text (`option(default, help)`).
`apply_dict` applies a parsed TOML file, `apply_overrides` the command line; values are converted
to the field's type, unknown keys are errors with a did-you-mean, and `dump_toml` / `format_help`
write the resolved configuration and the list of keys. The schemas themselves live in
`config.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]



def option(default: Any = dataclasses.MISSING, help: str = "", factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its help text in `metadata["help"]` (printed by --help-config)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})



def reuse(section: type, name: str, default: Any = dataclasses.MISSING, help: str | None = None) -> Any:
    """The field `name` of dataclass `section` again, for another schema: the same help text
    (unless `help` is given) and the same default (unless `default` is given). The fine-tuning
    schema takes its shared knobs from the pretraining sections this way instead of
    re-declaring them."""
    found = {f.name: f for f in dataclasses.fields(section)}
    if name not in found:
        raise KeyError(f"{section.__name__} has no field {name!r}")
    f = found[name]
    text = f.metadata.get("help", "") if help is None else help
    if default is dataclasses.MISSING:
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            return field(default_factory=f.default_factory, metadata={"help": text})  # type: ignore[misc]
        default = f.default
    return field(default=default, metadata={"help": text})

# --------------------------------------------------------------------------------------------
# Typed values
# --------------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _union_args(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _type_name(tp: Any) -> str:
    args = _union_args(tp)
    if args is not None:
        return " or ".join("none" if a is type(None) else _type_name(a) for a in args)
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)
        if inner and inner[-1] is not Ellipsis:
            return f"{len(inner)} comma-separated values ({_type_name(inner[0])} each)"
        return "comma-separated values"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


class _BadValue(ValueError):
    pass


def _first_that_converts(types_: tuple[Any, ...], convert: Any, value: Any) -> Any:
    """`convert(value, tp)` for the first member of a union that takes it (int before str for
    int | str, as written); _BadValue when none does."""
    for tp in types_:
        if tp is type(None):
            continue
        try:
            return convert(value, tp)
        except _BadValue:
            continue
    raise _BadValue(value)


def _parse_text(text: str, tp: Any) -> Any:
    """Command-line text -> a value of type `tp`."""
    args = _union_args(tp)
    if args is not None:
        if type(None) in args and text.strip().lower() in ("none", "null"):
            return None
        return _first_that_converts(args, _parse_text, text)
    if typing.get_origin(tp) is tuple:
        inner = typing.get_args(tp)
        parts = [p.strip() for p in text.strip().strip("()[]").split(",") if p.strip()]
        elem = inner[0] if inner else str
        if inner and inner[-1] is not Ellipsis and len(parts) != len(inner):
            raise _BadValue(text)
        return tuple(_parse_text(p, elem) for p in parts)
    if tp is bool:
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise _BadValue(text)
    try:
        if tp is int:
            value = float(text) if any(c in text for c in ".eE") else int(text)
            if isinstance(value, float):
                if not value.is_integer():
                    raise _BadValue(text)
                value = int(value)
            return value
        if tp is float:
            return float(text)
    except (TypeError, ValueError):
        raise _BadValue(text) from None
    if tp is str:
        return text
    raise _BadValue(text)


def _coerce(value: Any, tp: Any) -> Any:
    """A TOML value -> a value of type `tp` (ints accepted for floats, lists for tuples,
    the string "none" for optional fields, strings parsed like the command line)."""
    if isinstance(value, str) and tp is not str:
        return _parse_text(value, tp)
    args = _union_args(tp)
    if args is not None:
        return _first_that_converts(args, _coerce, value)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise _BadValue(value)
        inner = typing.get_args(tp)
        if inner and inner[-1] is not Ellipsis and len(value) != len(inner):
            raise _BadValue(value)
        elem = inner[0] if inner else Any
        return tuple(v if elem is Any else _coerce(v, elem) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _BadValue(value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _BadValue(value)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _BadValue(value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _BadValue(value)
    return value


# --------------------------------------------------------------------------------------------
# Applying files and overrides to any dataclass
# --------------------------------------------------------------------------------------------


def all_keys(cls_or_obj: Any, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a dataclass schema, e.g. ["seed", "out", "model.vocab_size", ...]."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    keys: list[str] = []
    for name, tp in _hints(cls).items():
        if name.startswith("_"):
            continue
        if _is_dataclass_type(tp):
            keys += all_keys(tp, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _unknown(key: str, obj: Any, source: str) -> BertgpuError:
    candidates = all_keys(obj)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # also try the last part alone ("max_stepz" -> "train.max_steps")
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in candidates}
        close = [by_leaf[m] for m in difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)]
    hint = f" (did you mean {close[0]}?)" if close else ""
    return BertgpuError(f"{source}: unknown key {key}{hint}")


def _resolve(obj: Any, key: str, source: str) -> tuple[Any, str, Any]:
    """(owner dataclass instance, field name, field type) of a dotted key."""
    parts = key.split(".")
    target = obj
    for i, part in enumerate(parts):
        hints = _hints(type(target))
        if part not in hints or part.startswith("_"):
            raise _unknown(key, obj, source)
        tp = hints[part]
        if i == len(parts) - 1:
            if _is_dataclass_type(tp):
                raise BertgpuError(f"{source}: {key} is a section; set one of its keys, e.g. {all_keys(tp, key + '.')[0]}")
            return target, part, tp
        if not _is_dataclass_type(tp):
            raise _unknown(key, obj, source)
        target = getattr(target, part)
    raise _unknown(key, obj, source)  # pragma: no cover - empty key


def set_value(obj: Any, key: str, value: Any, source: str, *, from_text: bool = False) -> None:
    """Set dotted `key` of dataclass `obj`, converting `value` to the field's type."""
    owner, name, tp = _resolve(obj, key, source)
    try:
        converted = _parse_text(value, tp) if from_text else _coerce(value, tp)
    except _BadValue:
        shown = value if from_text else json.dumps(value) if not isinstance(value, tuple) else list(value)
        raise BertgpuError(f"{source}: {key} = {shown}: expected {_type_name(tp)}") from None
    setattr(owner, name, converted)


def apply_dict(obj: Any, data: dict[str, Any], source: str, prefix: str = "") -> Any:
    """Apply a nested mapping (a parsed TOML file) to dataclass `obj` in place; returns `obj`."""
    for key, value in data.items():
        dotted = prefix + key.replace("-", "_")
        if isinstance(value, dict):
            owner = obj
            for part in filter(None, prefix.rstrip(".").split(".")):
                owner = getattr(owner, part)
            hints = _hints(type(owner))
            name = key.replace("-", "_")
            if name not in hints or not _is_dataclass_type(hints[name]):
                if name in hints:
                    raise BertgpuError(f"{source}: {dotted} = a table: expected {_type_name(hints[name])}")
                raise _unknown(dotted, obj, source)
            apply_dict(obj, value, source, prefix=dotted + ".")
        else:
            set_value(obj, dotted, value, source)
    return obj


def apply_overrides(
    obj: Any,
    overrides: list[str],
    source: str = "command line",
    aliases: dict[str, str] | None = None,
) -> Any:
    """Apply `--section.key value` / `--section.key=value` words to dataclass `obj` in place.

    Dashes in keys read as underscores (`--train.max-steps`); `aliases` maps short names to
    dotted keys (`--data DIR` -> data.dir); a bool key given without a value means true."""
    aliases = aliases or {}
    i = 0
    while i < len(overrides):
        word = overrides[i]
        if not word.startswith("--") or len(word) == 2:
            raise BertgpuError(
                f"{source}: unexpected argument {word!r}; overrides look like --section.key value"
            )
        body = word[2:]
        if "=" in body:
            key, text = body.split("=", 1)
            i += 1
        else:
            key, text = body, None
            i += 1
        key = key.replace("-", "_")
        key = aliases.get(key, key)
        _, _, tp = _resolve(obj, key, source)
        if text is None:
            nxt = overrides[i] if i < len(overrides) else None
            takes_next = nxt is not None and (not nxt.startswith("--") or _looks_numeric(nxt))
            if takes_next:
                text = nxt
                i += 1
            elif tp is bool or _union_args(tp) and bool in _union_args(tp):  # type: ignore[operator]
                text = "true"
            else:
                raise BertgpuError(f"{source}: --{key} needs a value ({_type_name(tp)})")
        set_value(obj, key, text, source, from_text=True)
    return obj


def _looks_numeric(word: str) -> bool:
    try:
        float(word)
        return True
    except ValueError:
        return False


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; errors name the file and the line."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise BertgpuError(f"{p}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise BertgpuError(f"{p}: invalid TOML: {exc}") from None


# --------------------------------------------------------------------------------------------
# Output: dict, TOML, help
# --------------------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Nested plain dict (tuples become lists), ready for json.dumps."""

    def plain(v: Any) -> Any:
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(dataclasses.asdict(cfg))


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
            lines += [f"{g.name} = {_toml_value(getattr(value, g.name))}" for g in dataclasses.fields(value)]
            tables.append("\n".join(lines))
        else:
            top.append(f"{f.name} = {_toml_value(value)}")
    return "\n\n".join(["\n".join(top)] + tables if top else tables) + "\n"


def format_help(cls: type) -> str:
    """Every key with its type, default and help text (for `--help-config`)."""
    lines: list[str] = []

    def walk(tp: type, prefix: str) -> None:
        hints = _hints(tp)
        for f in dataclasses.fields(tp):
            ftp = hints[f.name]
            if _is_dataclass_type(ftp):
                lines.append(f"\n[{prefix}{f.name}]  {f.metadata.get('help', '')}")
                walk(ftp, f"{prefix}{f.name}.")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            shown = "none" if default is None else ",".join(map(str, default)) if isinstance(default, tuple) else default
            lines.append(f"  --{prefix}{f.name} ({_type_name(ftp)}; default {shown})")
            lines.append(f"      {f.metadata.get('help', '')}")

    walk(cls, "")
    return "\n".join(lines).strip("\n") + "\n"
