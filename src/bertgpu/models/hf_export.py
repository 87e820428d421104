"""Write the Hugging Face folder layout: config.json (`hf_config`), model.safetensors and the
tokenizer files (`save_pretrained`), which transformers' AutoModelFor... and AutoTokenizer load;
and what an earlier export is (`is_model_folder`: the only folder an export replaces, known by
the mark in its config.json, `EXPORT_MARK`). Reading is `hf_io`'s; both convert through
`layout.py`, so an export has exactly the keys, shapes and values of the unpadded, unfused model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertgpu import fsutil
from bertgpu.errors import BertgpuError
from bertgpu.fsutil import check_output_folder, make_scratch, replace_dir
from bertgpu.models import layout
from bertgpu.models.hf_io import TIED_KEYS, TOKENIZER_FILES, is_checkpoint_folder, unwrap_model


def architecture(model: nn.Module) -> str:
    """The transformers class that loads this model's export (ours carry transformers' class
    names; a model that exports as another class says so in `hf_class_name`)."""
    return getattr(model, "hf_class_name", _unsharded_class(model).__name__)


def _unsharded_class(model: nn.Module) -> type:
    """The model's own class: FSDP2's fully_shard swaps in a subclass named FSDP<name> (a
    ModernBERT trained with FSDP exported "FSDPModernBertForMaskedLM")."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without distributed
        return type(model)
    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def hf_config(model: nn.Module, token_ids: dict[str, int] | None = None) -> dict[str, Any]:
    """config.json content that transformers (4.4x and 5.x) reads as a BertConfig or a
    ModernBertConfig. `token_ids`: the special-token ids of the tokenizer that travels with the
    model (`special_token_ids`), which fill the config's token-id fields left unset (None)."""
    model = unwrap_model(model)
    fields = model.config.to_dict()
    for key, value in (token_ids or {}).items():
        if key in fields and fields[key] is None:
            fields[key] = value
    cfg: dict[str, Any] = {
        "architectures": [architecture(model)],
        "model_type": fields.pop("architecture"),
        **fields,
        "tie_word_embeddings": True,
    }
    if hasattr(model, "id2label"):  # sequence and token classification: the label names travel
        cfg["num_labels"] = model.num_labels
        cfg["id2label"] = {str(i): name for i, name in sorted(model.id2label.items())}
        cfg["label2id"] = {name: i for i, name in sorted(model.id2label.items())}
        if architecture(model).endswith("ForSequenceClassification"):
            cfg["problem_type"] = ("regression" if model.num_labels == 1
                                   else "single_label_classification")
    return cfg


def save_pretrained(model: nn.Module, folder: str | os.PathLike,
                    tokenizer: str | os.PathLike | None = None,
                    state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `folder` (config.json, model.safetensors, the tokenizer files if `tokenizer` names a
    tokenizer folder) so that transformers' AutoModelFor... loads it with no missing keys.
    `state_dict`: the weights to write instead of the model's own (a sharded model's, gathered
    whole by the caller: the model's parameters are then only shards).

    Written to `folder.tmp` and renamed into place; an earlier export there is replaced (the files
    the user added beside it kept: `keep_added_files`), any other non-empty folder refused before
    any work (`check_export_folder`), and so is a model whose config.json some transformers version
    would read as another model (`config.export_problem()`: ModernBERT layer types that no period
    derives). A write that fails (a full disk, a folder that is not writable) removes `folder.tmp`
    and raises one line naming the folder and the cause (for a full disk the bytes needed and free).
    """
    model = unwrap_model(model)
    folder = Path(folder)
    problem = model.config.export_problem()
    if problem is not None:
        raise BertgpuError(f"{folder}: cannot export this {model.config.architecture} model: "
                           f"{problem}")
    tok_files = ({} if tokenizer is None else
                 tokenizer_files(tokenizer, model.config.max_position_embeddings,
                                 getattr(model.config, "type_vocab_size", 1) > 1))
    check_export_folder(folder)

    # Tied copies are left out (HF re-ties them on load); the fused and padded tensors in HF's
    # layout; each tensor stored once, a copy of its own (split parts of one tensor share memory,
    # which safetensors refuses).
    weights = model.state_dict() if state_dict is None else state_dict
    hf = layout.to_hf({k: v for k, v in weights.items() if k not in TIED_KEYS},
                      model.config.architecture, model.config.vocab_size)
    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in hf.items()}
    scratch = folder.with_name(folder.name + fsutil.TMP)
    fsutil.check_scratch(scratch, folder)  # absent or bertgpu's: the except below may remove it
    try:
        tmp = make_scratch(scratch, folder)
        fsutil.save_safetensors(state, tmp / "model.safetensors")
        (tmp / "config.json").write_text(
            json.dumps({**hf_config(model, special_token_ids(tok_files)), EXPORT_MARK: True},
                       indent=2, sort_keys=True) + "\n",
            encoding="utf-8")
        for name, data in tok_files.items():
            (tmp / name).write_bytes(data)
        keep_added_files(folder, tmp)
        return replace_dir(tmp, folder, replaces=is_model_folder, what=MODEL_FOLDER)
    except OSError as exc:  # a full disk, a folder that is not writable: no half-written output
        fsutil.remove_marked(scratch)
        needed = (sum(t.numel() * t.element_size() for t in state.values())
                  + sum(len(data) for data in tok_files.values()) + (64 << 10))
        where = folder.parent if folder.parent != Path(".") else Path.cwd()
        why, fix = fsutil.write_problem(where, exc, needed)
        raise BertgpuError(f"{where}: cannot write {folder.name}: {why}; {fix} and re-run the "
                           "same command") from None


STANDARD_MAX_LENGTH = 512
"""The model_max_length of bertgpu's tokenizer folders (data/tokenizer.py) and of BERT's."""


def tokenizer_files(tokenizer: str | os.PathLike, positions: int,
                    token_types: bool = True) -> dict[str, bytes]:
    """The files of a tokenizer folder that travel with a model (`TOKENIZER_FILES`, those it
    has), by name, with tokenizer_config.json's `model_max_length` fitted to the model's
    `positions` (`_fitted_config`; one written where the folder has none), and for a model
    without token types (`token_types` False: ModernBERT, a BERT of type_vocab_size 1) its
    `model_input_names` without token_type_ids, as answerdotai's folders say (transformers 4.x's
    ModernBertModel refused the key a BERT tokenizer class gives; a BERT of one token type
    raised IndexError on the 1s of a text pair's second segment); a one-line error when the
    folder holds none of them."""
    tok_dir = Path(tokenizer)
    files = {n: (tok_dir / n).read_bytes() for n in TOKENIZER_FILES if (tok_dir / n).is_file()}
    if not files:
        raise BertgpuError(f"{tok_dir}: no tokenizer files (expected "
                           f"{', '.join(TOKENIZER_FILES[:4])})")
    # A folder without one (vocab.txt or tokenizer.json alone: a converted Google checkpoint)
    # gets one that says the positions: transformers' default is no limit, and truncation=True
    # cut nothing ("The size of tensor a (202) must match ... (64)").
    files["tokenizer_config.json"] = _fitted_config(files.get("tokenizer_config.json", b"{}"),
                                                    positions, token_types)
    return files


_SPECIAL_ID_FIELDS = {"cls_token": ("cls_token_id", "bos_token_id"),
                      "sep_token": ("sep_token_id", "eos_token_id")}
"""Which config.json fields take the id of which tokenizer token: ModernBERT's (answerdotai's
folders: bos = [CLS], eos = [SEP]). Exported as null, transformers 4.x read ModernBERT's own
vocabulary's 50281/50282 from its defaults elsewhere, ids past a vocabulary of ours."""


def special_token_ids(files: dict[str, bytes]) -> dict[str, int]:
    """The ids of the tokenizer's [CLS] and [SEP] (the names its tokenizer_config.json or
    special_tokens_map.json gives, else BERT's), by the config.json fields that hold them
    (`_SPECIAL_ID_FIELDS`), looked up in tokenizer.json's vocabulary or else vocab.txt's lines;
    a token the vocabulary lacks is left out."""
    names = {"cls_token": "[CLS]", "sep_token": "[SEP]"}
    for source in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            given = json.loads(files[source].decode("utf-8")) if source in files else {}
        except ValueError:
            continue
        for key in names:
            value = given.get(key) if isinstance(given, dict) else None
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                names[key] = value
    vocab: dict[str, int] = {}
    try:
        if "tokenizer.json" in files:
            from tokenizers import Tokenizer
            vocab = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8")).get_vocab()
        elif "vocab.txt" in files:
            lines = files["vocab.txt"].decode("utf-8").split("\n")
            vocab = {token.rstrip("\r"): i for i, token in reversed(list(enumerate(lines)))}
    except Exception:  # noqa: BLE001 - unreadable tokenizer files: no ids, as before
        vocab = {}
    return {field: vocab[names[key]] for key, fields in _SPECIAL_ID_FIELDS.items()
            for field in fields if names[key] in vocab}


def _fitted_config(data: bytes, positions: int, token_types: bool = True) -> bytes:
    """The tokenizer's `model_max_length` (what `truncation=True` cuts to) is the model's
    positions: our tokenizer folders say 512. A 128-position model's export made transformers'
    pipelines fail on long inputs ("size of tensor a (486) must match ... (128)") or, for
    ModernBERT, run past the positions it was trained on; an 8192-position ModernBERT's export
    cut every input to 512 tokens, the long context it was trained for lost at inference. A
    tokenizer that asks for fewer than the positions keeps its own, unless it says 512, which
    bertgpu's tokenizer folders (and BERT's) say whatever the model."""
    try:
        config = json.loads(data.decode("utf-8"))
    except ValueError:
        return data  # not ours to mend: copied as it was
    if not isinstance(config, dict):
        return data
    names = None if token_types else ["input_ids", "attention_mask"]
    given = config.get("model_max_length")
    if isinstance(given, (int, float)) and not isinstance(given, bool):
        asks_fewer = given < positions and given != STANDARD_MAX_LENGTH
        if (given == positions or asks_fewer) and names in (None, config.get("model_input_names")):
            return data
        if asks_fewer:
            positions = int(given)
    config["model_max_length"] = positions
    if names is not None:
        config["model_input_names"] = names
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


MODEL_FOLDER = "a model folder (new, or an earlier bertgpu export, which an export replaces)"

EXPORT_MARK = "bertgpu_export"
"""The config.json key (true) that tells an earlier export, which a new one may replace, from
every other model folder. transformers keeps unknown config keys (a model loaded from an export
and saved by transformers keeps it too) but always writes its own `transformers_version`, which
an export never does: a folder with both is transformers', with whatever it saved beside the
model (a model card, training_args.bin). In config.json, not in a file of its own or in the
safetensors header, so an export holds exactly the files and weight bytes transformers writes."""


def is_model_folder(folder: Path, beside: bool = True) -> bool:
    """An earlier export, which a new export replaces (keeping the plain files the user added beside
    it, `keep_added_files`): its config.json a model's (a JSON object with a model_type) carrying
    `EXPORT_MARK` and no transformers_version, no folder and no hidden entry beside it. Never a
    checkpoint, a folder of the user's that happens to hold a config.json (a project's .git and
    sources), a clone of a model repository (its .git), nor a model folder transformers (or an older
    bertgpu, whose exports had no mark) wrote: a hub download with its model card, a run's --init
    folder. The one unmarked folder replaced is a run's own hf/ holding only export files
    (`_unmarked_run_export`). ``beside`` False: whatever else is beside it."""
    folder = Path(folder)
    if is_checkpoint_folder(folder):
        return False
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        entries = list(folder.iterdir())
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict) or "model_type" not in config:
        return False
    marked = config.get(EXPORT_MARK) is True and "transformers_version" not in config
    return ((marked or _unmarked_run_export(folder, entries))
            and not (beside and any(p.is_dir() or p.name.startswith(".") for p in entries)))


EXPORT_FILES = frozenset({"config.json", "model.safetensors", *TOKENIZER_FILES})
"""Every file an export may write: an earlier export's copies are replaced (or dropped, a
tokenizer file the new export has not), never carried over."""


def keep_added_files(folder: Path, tmp: Path) -> None:
    """Carry the files added to an earlier export at `folder` (a model card README.md,
    eval_results.json: anything but `EXPORT_FILES`) into its replacement `tmp`. A re-export
    deleted them without a word. Linked where the file system allows (no copy of a large file),
    copied elsewhere; the earlier export stays whole until `replace_dir` swaps it."""
    import shutil

    if not is_model_folder(folder):
        return
    for path in sorted(Path(folder).iterdir()):
        if path.name in EXPORT_FILES:
            continue
        if path.is_symlink():
            os.symlink(os.readlink(path), tmp / path.name)
            continue
        try:
            os.link(path, tmp / path.name)
        except OSError:
            shutil.copy2(path, tmp / path.name)


def _unmarked_run_export(folder: Path, entries: list[Path]) -> bool:
    """A pretraining run's own hf/ written before exports were marked: its place says whose it
    is, and it holds only what an export writes. Refusing it would fail a resumed run of an older
    bertgpu at its very end, after the training."""
    run = folder.parent
    return (folder.name == "hf" and (run / "checkpoints").is_dir()
            and (run / "config.toml").is_file() and all(p.name in EXPORT_FILES for p in entries))


def check_export_folder(folder: str | os.PathLike) -> None:
    """`folder` may receive an export: new, empty, or an earlier export (`is_model_folder`); any
    other folder is refused in one line before any work (a model folder of transformers' holds
    files an export does not write, and is often the very folder a run started from)."""
    folder = Path(folder)
    if (folder.is_dir() and not folder.is_symlink() and any(folder.iterdir())
            and not is_model_folder(folder)):
        blocking = sorted(p.name for p in folder.iterdir() if p.is_dir() or p.name[0] == ".")
        if blocking and is_model_folder(folder, beside=False):  # a .gitattributes, an eval/
            raise BertgpuError(f"{folder}: an earlier bertgpu export, but it also holds "
                               f"{blocking[0]} (a folder or hidden file: an export keeps only "
                               "plain files added beside it); expected it moved out of the "
                               "folder, or another --out")
        raise BertgpuError(f"{folder}: a folder that is not an earlier bertgpu export (no "
                           f"config.json marked {EXPORT_MARK}: a folder of yours, a model saved "
                           "by transformers, or an export of a bertgpu older than the mark); an "
                           "export replaces its folder, so expected a new or empty folder: "
                           "choose another --out, or remove this folder first")
    check_output_folder(folder, MODEL_FOLDER, replaces=is_model_folder)


__all__ = ["EXPORT_FILES", "EXPORT_MARK", "MODEL_FOLDER", "check_export_folder", "hf_config",
           "is_model_folder", "keep_added_files", "save_pretrained", "special_token_ids",
           "tokenizer_files"]
