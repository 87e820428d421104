"""Typed configuration machinery for any dataclass schema: TOML files and `--a.b value` overrides.

A schema is a tree of dataclasses whose fields carry a help text (`option(default, help)`, or a
string literal under the field as its docstring, as the model configs do). A field whose value is
a dataclass instance is a section, whatever its annotation (`[model]` holds the chosen
architecture's config class). `apply_dict` applies a parsed TOML file, `apply_overrides` the
command line; values are converted to the field's type, unknown keys are errors with a
did-you-mean, and `dump_toml` / `format_help` write the resolved configuration and the list of
keys. The schemas themselves live in `schema.py` and `finetune.py`.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import math
import textwrap
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


def option(default: Any = dataclasses.MISSING, help: str = "",
           factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its help text in `metadata["help"]` (printed by --help-config)."""
    if factory is not dataclasses.MISSING:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def reuse(section: type, name: str, default: Any = dataclasses.MISSING,
          help: str | None = None) -> Any:
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

@functools.cache
def _docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string literal written under it in the class body (litgpt's style)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (frozen app): no help text
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:], strict=False):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                out[node.target.id] = " ".join(after.value.value.split())
    return out


def help_of(cls: type, f: dataclasses.Field) -> str:
    """The help text of field `f` of dataclass `cls`: `option(help=...)`, else its docstring."""
    return f.metadata.get("help") or _docstrings(cls).get(f.name, "")


# --------------------------------------------------------------------------------------------
# Typed values
# --------------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(value: Any) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


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
    if typing.get_origin(tp) is typing.Literal:  # a few words, e.g. Literal["auto"]
        return " or ".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (tuple, list):
        inner = typing.get_args(tp)
        if typing.get_origin(tp) is tuple and inner and inner[-1] is not Ellipsis:
            return f"{len(inner)} comma-separated values ({_type_name(inner[0])} each)"
        return "comma-separated values"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def type_name(tp: Any) -> str:
    """What a value of type `tp` may be, in an error's words ("true or false", "an integer")."""
    return _type_name(tp)


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
    if typing.get_origin(tp) is typing.Literal:
        if text.strip() in typing.get_args(tp):
            return text.strip()
        raise _BadValue(text)
    if typing.get_origin(tp) in (tuple, list):
        inner = typing.get_args(tp)
        parts = [p.strip() for p in text.strip().strip("()[]").split(",") if p.strip()]
        elem = inner[0] if inner else str
        if (typing.get_origin(tp) is tuple and inner and inner[-1] is not Ellipsis
                and len(parts) != len(inner)):
            raise _BadValue(text)
        values = [_parse_text(p, elem) for p in parts]
        return tuple(values) if typing.get_origin(tp) is tuple else values
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


def parse_text(text: str, tp: Any) -> Any:
    """Command-line text -> a value of type `tp`; ValueError when it is not one."""
    return _parse_text(text, tp)


def _coerce(value: Any, tp: Any) -> Any:
    """A TOML value -> a value of type `tp`: ints accepted for floats, lists for tuples, the
    string "none" for optional fields (`dump_toml` writes None so) and a Literal's own words
    ("auto"). Any other string for a number, a bool or a list is the wrong type, refused like
    `"abc"` (`max_steps = "300"`: TOML has integers; only the command line's words are text)."""
    args = _union_args(tp)
    if args is not None:
        if (type(None) in args and isinstance(value, str)
                and value.strip().lower() in ("none", "null")):
            return None
        return _first_that_converts(args, _coerce, value)
    if typing.get_origin(tp) is typing.Literal:
        if isinstance(value, str) and value.strip() in typing.get_args(tp):
            return value.strip()
        raise _BadValue(value)
    if typing.get_origin(tp) in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise _BadValue(value)
        inner = typing.get_args(tp)
        if (typing.get_origin(tp) is tuple and inner and inner[-1] is not Ellipsis
                and len(value) != len(inner)):
            raise _BadValue(value)
        elem = inner[0] if inner else Any
        values = [v if elem is Any else _coerce(v, elem) for v in value]
        return tuple(values) if typing.get_origin(tp) is tuple else values
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
    """Every dotted leaf key of a dataclass schema, e.g. ["seed", "out", "model.vocab_size", ...];
    of an instance, its sections as they are (the `[model]` of its architecture)."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    keys: list[str] = []
    for name, tp in _hints(cls).items():
        if name.startswith("_"):
            continue
        value = getattr(cls_or_obj, name, None) if not isinstance(cls_or_obj, type) else None
        if _is_section(value):
            keys += all_keys(value, f"{prefix}{name}.")
        elif _is_dataclass_type(tp):
            keys += all_keys(tp, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def all_sections(cls_or_obj: Any, prefix: str = "") -> list[str]:
    """Every dotted section name of a dataclass schema, e.g. ["model", "data", "train", ...]."""
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    names: list[str] = []
    for name, tp in _hints(cls).items():
        value = getattr(cls_or_obj, name, None) if not isinstance(cls_or_obj, type) else None
        if name.startswith("_") or not (_is_section(value) or _is_dataclass_type(tp)):
            continue
        names.append(prefix + name)
        names += all_sections(value if _is_section(value) else tp, f"{prefix}{name}.")
    return names


RENAMED = {"train.eval_batches": "train.eval_sequences (validation sequences per evaluation, "
           "the same for any micro batch: the old value times impl.micro_batch_size)"}


OTHER_COMMANDS = {"data_dir": "--data-dir is bertgpu glue's option; here the data folder is "
                               "--data DIR"}
"""Options of another command that reach a config as unknown keys, and what to write instead."""


def _unknown(key: str, obj: Any, source: str) -> BertgpuError:
    if key in RENAMED:
        return BertgpuError(f"{source}: {key} is now {RENAMED[key]}")
    if key in OTHER_COMMANDS:
        return BertgpuError(f"{source}: unknown key {key} ({OTHER_COMMANDS[key]})")
    candidates = all_keys(obj)
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    if not close:  # also try the last part alone ("max_stepz" -> "train.max_steps")
        leaf = key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in candidates}
        close = [by_leaf[m]
                 for m in difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)]
    hint = f" (did you mean {close[0]}?)" if close else ""
    return BertgpuError(f"{source}: unknown key {key}{hint}")


def _unknown_section(table: str, obj: Any, source: str) -> BertgpuError:
    """A TOML table (dotted `table`) that names no section of dataclass `obj`: its name is
    matched against the sections beside it, not against keys (`[chekpoint]` was offered the key
    checkpoint.grace_s), and with no close section there is no guess."""
    parent = table.rpartition(".")[0]
    siblings = [name for name in all_sections(obj) if name.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(table, siblings, n=1, cutoff=0.6)
    hint = f" (did you mean [{close[0]}]?)" if close else ""
    return BertgpuError(f"{source}: unknown section [{table}]{hint}")


def _resolve(obj: Any, key: str, source: str) -> tuple[Any, str, Any]:
    """(owner dataclass instance, field name, field type) of a dotted key."""
    parts = key.split(".")
    target = obj
    for i, part in enumerate(parts):
        hints = _hints(type(target))
        if part not in hints or part.startswith("_"):
            raise _unknown(key, obj, source)
        tp, value = hints[part], getattr(target, part)
        if i == len(parts) - 1:
            if _is_section(value):
                raise BertgpuError(f"{source}: {key} is a section; set one of its keys, e.g. "
                                   f"{all_keys(value, key + '.')[0]}")
            return target, part, tp
        if not _is_section(value):
            raise _unknown(key, obj, source)
        target = value
    raise _unknown(key, obj, source)  # pragma: no cover - empty key


def set_value(obj: Any, key: str, value: Any, source: str, *, from_text: bool = False) -> None:
    """Set dotted `key` of dataclass `obj`, converting `value` to the field's type."""
    owner, name, tp = _resolve(obj, key, source)
    try:
        converted = _parse_text(value, tp) if from_text else _coerce(value, tp)
    except _BadValue:
        shown = (value if from_text else json.dumps(value, default=str)  # (a TOML date: str)
                 if not isinstance(value, tuple) else list(value))
        raise BertgpuError(f"{source}: {key} = {shown}: expected {_type_name(tp)}") from None
    if isinstance(converted, float) and not math.isfinite(converted):  # inf passed "> 0"
        raise BertgpuError(f"{source}: {key} = {value}: expected a finite number")
    setattr(owner, name, converted)


def apply_dict(obj: Any, data: dict[str, Any], source: str, prefix: str = "") -> Any:
    """Apply a nested mapping (a parsed TOML file) to dataclass `obj` in place; returns `obj`.
    Two spellings of one key in a table (max_steps and max-steps) are refused: the later won."""
    spelled: dict[str, str] = {}
    for key in data:
        first = spelled.setdefault(key.replace("-", "_"), key)
        if first != key:
            raise BertgpuError(f"{source}: {prefix}{first} and {prefix}{key} are one key, given "
                               "twice; expected it once")
    for key, value in data.items():
        dotted = prefix + key.replace("-", "_")
        if isinstance(value, dict):
            owner = obj
            for part in filter(None, prefix.rstrip(".").split(".")):
                owner = getattr(owner, part)
            hints = _hints(type(owner))
            name = key.replace("-", "_")
            if name not in hints or not _is_section(getattr(owner, name)):
                if name in hints:
                    raise BertgpuError(f"{source}: {dotted} = a table: expected "
                                       f"{_type_name(hints[name])}")
                raise _unknown_section(dotted, obj, source)
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
    given: dict[str, tuple[str, str]] = {}  # key -> (its word, its value): a second must agree
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
        # Two names of a key (`--data X --data.dir Y`: Y won wherever it stood) are refused.
        spelling = word.split("=", 1)[0]
        first = given.setdefault(key, (spelling, text))
        same = first[0][2:].replace("-", "_") == spelling[2:].replace("-", "_")  # max-seq-len
        if not same and first[1] != text:
            raise BertgpuError(f"{source}: {first[0]} {first[1]} and {spelling} {text} set one "
                               f"key ({key}) twice; expected one value")
        set_value(obj, key, text, source, from_text=True)
    return obj


def word_keys(words: list[str], aliases: dict[str, str] | None = None) -> set[str]:
    """The dotted keys that `--key value` / `--key=value` words set (dashes read as
    underscores, `aliases` resolved)."""
    keys = {word[2:].partition("=")[0].replace("-", "_") for word in words
            if word.startswith("--") and not _looks_numeric(word)}
    return {(aliases or {}).get(key, key) for key in keys}


def field_type(obj: Any, key: str) -> Any:
    """The type of dotted `key` in dataclass `obj`; None when `obj` has no such field."""
    try:
        return _resolve(obj, key, "")[2]
    except BertgpuError:
        return None


def is_value_of(tp: Any, word: str) -> bool:
    """Whether `--KEY WORD` gives a key of type `tp` the value WORD (as `apply_overrides`
    reads it): not when WORD is an option (`--x`; a negative number is a value), and for a key
    that may stand alone for true (a bool) only when WORD is one of its values."""
    if word.startswith("--") and not _looks_numeric(word):
        return False
    if tp is bool or (_union_args(tp) and bool in _union_args(tp)):  # type: ignore[operator]
        try:
            _parse_text(word, tp)
        except _BadValue:
            return False
    return True


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
    except IsADirectoryError:
        raise BertgpuError(f"{p}: is a folder; expected a TOML config file") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 by definition
        raise BertgpuError(f"{p}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset "
                           f"{exc.start}); expected a TOML config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise BertgpuError(f"{p}: invalid TOML: {exc}") from None
    except OSError as exc:  # permission denied, a FIFO gone, ...
        raise BertgpuError(f"{p}: cannot read the config file: "
                           f"{exc.strerror or exc}") from None


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
