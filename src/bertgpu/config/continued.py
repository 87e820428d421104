"""The `[model]` section of a run continued from a checkpoint (`bertgpu pretrain --init PATH`).

Continued pretraining starts from the weights of PATH (a run folder, a checkpoint folder or a
Hugging Face BERT / ModernBERT folder), so the model is PATH's: its config.json gives `[model]`,
and a recipe only says how to train it. A `[model]` value in the recipe or on the command line
that differs from config.json would build another model than the weights describe, so it is an
error naming both, except the fields the architecture lets a continued run change
(`Architecture.continuation_fields`: max_position_embeddings, which may only grow, dropout
rates, ModernBERT's RoPE thetas)::

    bertgpu pretrain configs/bert-base-phase2.toml --init runs/phase1 --data d512/ --out runs/p2
    bertgpu pretrain configs/modern-base-8k.toml --init runs/modern-base --data data8k/ ...

A recipe written for continued pretraining says `requires_init = true`, so that `bertgpu
pretrain` without `--init` is a one-line error (`refuse_without_init`, from schema.check_start),
not a randomly initialised model; the recipe still loads on its own (load_config).

`load_config` (schema.py) calls `init_model` for the section to start from, then applies the
recipe and the command line, then `check_recipe`. Reading config.json goes through
`models.hf_io` (imported here only when `--init` is given).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bertgpu.errors import BertgpuError
from bertgpu.models import build


def word_value(words: list[str], key: str) -> str | None:
    """The value of `--KEY value` / `--KEY=value` among command-line words (the last wins)."""
    found = None
    for i, word in enumerate(words):
        name, eq, text = word[2:].partition("=")
        if not word.startswith("--") or name.replace("-", "_") != key:
            continue
        if eq:
            found = text
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            found = words[i + 1]
    return found


def init_asked(data: dict[str, Any], words: list[str]) -> str | None:
    """`init` of the command line, else of the recipe file; None for none (also "none")."""
    value = word_value(words, "init")
    if value is None:
        value = data.get("init")
    return None if value in (None, "", "none") else str(value)


def refuse_without_init(required: bool, init: str | None, words: list[str], source: str
                        ) -> None:
    """A recipe that continues pretrained weights says so (`requires_init = true`: domain-adapt,
    bert-base-phase2, modern-base-8k); without an init it would train its model from a random
    initialisation, with no warning. One line naming the recipe (or the command line, where the
    key was given there) instead."""
    if not required or init is not None:
        return
    keys = {w[2:].partition("=")[0].replace("-", "_") for w in words if w.startswith("--")}
    where = "command line" if "requires_init" in keys or source == "None" else source
    raise BertgpuError(f"{where}: requires_init = true (the recipe continues pretrained weights) "
                       "but no --init is given; expected --init PATH: a Hugging Face BERT / "
                       "ModernBERT folder, or a bertgpu run or checkpoint folder")


def config_path(init: str) -> Path:
    """The config.json that describes the weights of `init` (its newest good checkpoint's, for
    a run folder); a one-line error when there is none."""
    from bertgpu.models.hf_io import resolve_checkpoint_folder

    return resolve_checkpoint_folder(init) / "config.json"


def init_model(init: str, asked: str | None, where: str) -> Any:
    """The `[model]` section of `init`'s config.json (the architecture's config class, checked).
    `asked` is the recipe's model.architecture (None when it names none): another one is an
    error naming both."""
    from bertgpu.models.hf_io import read_config

    path = config_path(init)
    fields = read_config(path.parent)
    arch = build.architecture_of(fields)
    if asked is not None and asked != arch:
        raise BertgpuError(f"{where}: model.architecture = {asked!r} contradicts {path}: "
                           f"model_type {arch!r}; expected the architecture of the --init weights")
    try:
        return build.spec(arch).config_class.from_dict(fields).validate()
    except (BertgpuError, TypeError) as e:
        raise BertgpuError(f"{path}: {e}") from None


# Where the recipes of each architecture are, for the error that finds a recipe of another one.
RECIPES = {"bert": "configs/bert-*.toml, configs/tiny.toml", "modernbert": "configs/modern-*.toml"}


def refuse_other_architecture(init: str, arch: str, found: list[tuple[str, Any, str, str]]
                              ) -> None:
    """Raise the error for `[model]` keys of another architecture than `arch`, the init's:
    `found` holds (key, value, where given, architecture it belongs to). Keys in a recipe file
    make it a recipe for another architecture, which is what the user must change, so the error
    names the recipe, the init's config.json and both architectures, not one key to rename."""
    path = config_path(init)
    given = f"--init {init} is a {arch} model ({path}: model_type {arch!r})"
    in_file = [row for row in found if row[2] != "command line"]
    if in_file:
        where, other = in_file[0][2], in_file[0][3]
        keys = ", ".join(f"model.{key}" for key, _, w, _ in in_file if w == where)
        recipes = f" ({RECIPES[arch]})" if arch in RECIPES else ""
        raise BertgpuError(f"{where}: a {other} recipe ({keys}) but {given}; expected a {arch} "
                           f"recipe{recipes}, one without a [model] section such as "
                           "configs/domain-adapt.toml, or no recipe (the model comes from --init)")
    key, value, where, other = found[0]
    instead = build.spec(arch).equivalents.get(key, ())
    hint = f"model.{', model.'.join(instead)} instead, or none" if instead else "no value"
    raise BertgpuError(f"{where}: model.{key} = {value!r} is a {other} field but {given}; "
                       f"expected {hint}")


def check_recipe(model: Any, base: Any, given: dict[str, str], init: str) -> None:
    """Every `[model]` field of the resolved `model` that differs from `base` (the init's) must be
    one the architecture lets a continued run change; `given` maps field -> where it was set.
    max_position_embeddings may grow, never shrink (the learned rows would be lost)."""
    spec = build.spec(model.architecture)
    path = config_path(init)
    for f in dataclasses.fields(model):
        value, before = getattr(model, f.name), getattr(base, f.name)
        if value == before:
            continue
        where = given.get(f.name, "config")
        if f.name not in spec.continuation_fields:
            raise BertgpuError(f"{where}: model.{f.name} = {value!r} contradicts {path}: "
                               f"{f.name} = {before!r}; expected {before!r} or no value (the model "
                               "comes from --init)")
        if f.name == "max_position_embeddings" and value < before:
            raise BertgpuError(f"{where}: model.max_position_embeddings = {value} is below {path}: "
                               f"max_position_embeddings = {before}; expected {before} or more "
                               "(positions can grow, not shrink)")


def changes(model: Any, base: Any) -> list[str]:
    """`field before -> after` for every `[model]` field a continued run changed (start-up)."""
    return [f"{f.name} {getattr(base, f.name)!r} -> {getattr(model, f.name)!r}"
            for f in dataclasses.fields(model) if getattr(model, f.name) != getattr(base, f.name)]


__all__ = ["RECIPES", "changes", "check_recipe", "config_path", "init_asked", "init_model",
           "refuse_other_architecture", "refuse_without_init", "word_value"]
