"""Read and write the Hugging Face folder layout (config.json + model.safetensors), without
importing transformers, for both architectures: BERT (`model_type` "bert") and ModernBERT
("modernbert"); `build.py` picks the classes.

Files are in Hugging Face's layout (names, shapes); our models hold two kinds of tensor
differently for speed (BERT's query/key/value as one Linear, vocabulary tables padded to a
multiple of 64 rows: layout.py). Loading normalises whatever it reads (a Hugging Face folder, or a
bertgpu checkpoint, which is in the model's own layout) to Hugging Face's layout, checks keys and
shapes there, so every message names the keys and shapes users know, then converts into the
model; saving converts back, so an export has exactly the keys, shapes and values of the unpadded,
unfused model:

    model = load_pretrained("hf/base", head="classification", num_labels=3)  # HF folder
    model = load_pretrained("runs/base", head="masked_lm")     # latest checkpoints/step_N
    save_pretrained(model, "hf/out", tokenizer="runs/base/tokenizer")   # hf_export.py

The check is strict where a silent mistake would cost a training run: a tensor of the wrong shape
or a key we do not recognise is an error naming it. Weights the model has and the checkpoint lacks
(a fresh classifier, a pooler) are initialised as HF does and listed in a warning. Pickled
`pytorch_model.bin` files are read with `torch.load(weights_only=True)`, which refuses code.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertgpu import fsutil, step_folders
from bertgpu.errors import BertgpuError
from bertgpu.models import layout
from bertgpu.models.build import ARCHITECTURES, HEADS, architecture_of, build_model, spec
from bertgpu.models.shared import Configurable, VocabDecoder

# Tied to other parameters (word embeddings, cls.predictions.bias): never stored, never missing.
# BERT's MLM decoder, then ModernBERT's (its weight is the token embedding).
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "decoder.weight")
# Each MLM decoder weight -> the word embeddings our models tie it to (names as _normalise_keys
# gives them to a model with a head).
_DECODER_TIES = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
                 "decoder.weight": "model.embeddings.tok_embeddings.weight"}
# Files of a tokenizer folder that travel with an export (tokenizer.py writes these).
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")
_HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.", "head.", "decoder.")
# The task output layers, sized by the number of labels: another task's (an MNLI model's 3
# classes when fine-tuning RTE's 2) is replaced by a fresh one when the labels are asked for.
_TASK_OUTPUTS = ("classifier.", "qa_outputs.")


# ---------------------------------------------------------------------------------------------
# Finding and reading the files


def resolve_checkpoint_folder(path: str | os.PathLike) -> Path:
    """An HF folder or a checkpoint folder as is (a `checkpoints/step_N` folder only when good);
    for a bertgpu run folder, its newest good `checkpoints/step_N` (fsutil's one definition:
    complete, checksums matching; a damaged newer one is skipped with a warning)."""
    folder = Path(path)
    if not folder.is_dir():
        if folder.parent.name == "checkpoints" and folder.parent.is_dir():  # chosen, then pruned
            raise fsutil.FolderRemoved(folder)
        raise BertgpuError(f"{folder}: not a folder (expected a Hugging Face model folder or a "
                           "bertgpu run folder)")
    if is_checkpoint_folder(folder):  # wherever it lies (a copied step_N too): verified
        problem = fsutil.verify_folder(folder)
        if problem is not None:
            raise BertgpuError(f"{folder}: not a usable checkpoint: {problem}")
    if (folder / "config.json").is_file():
        return folder
    newest = _newest_good(folder / "checkpoints")
    if newest is not None:
        return newest
    model = finetuned_model(folder)
    if model is not None:
        raise BertgpuError(f"{folder}: a fine-tuning output, with no config.json of its own; "
                           f"expected its model folder {model} (in the Hugging Face layout)")
    raise BertgpuError(f"{folder}: no config.json (expected a Hugging Face model folder, a "
                       "checkpoint folder, or a run folder with a complete checkpoints/step_N/)")


def _newest_good(root: Path) -> Path | None:
    """`step_folders.newest_good`, asked again when the run removes the checkpoint it is
    verifying (its keep_last, as it saves a newer one: `fsutil.FolderRemoved`, which was a
    FileNotFoundError traceback), with a note each time."""
    return step_folders.again_if_removed(
        lambda: step_folders.newest_good(root, advice="expected a run with a good checkpoint, "
                                         "or a good checkpoint folder"),
        "taking the newest checkpoint now")


def finetuned_model(folder: Path) -> Path | None:
    """FOLDER/model when `folder` is a fine-tuning output (results.json beside the fine-tuned
    model, tasks/finetune_output.py), else None: messages point there."""
    model = Path(folder) / "model"
    return (model if (Path(folder) / "results.json").is_file()
            and (model / "config.json").is_file() else None)


def is_checkpoint_folder(folder: Path) -> bool:
    """A bertgpu checkpoint (`checkpoints/step_N`, or a copy of one): sealed with COMPLETE and
    checksums.json, or holding a training state (then a missing seal means an interrupted save)."""
    folder = Path(folder)
    return ((folder.parent.name == "checkpoints" and folder.name.startswith("step_"))
            or any((folder / n).is_file() for n in (fsutil.COMPLETE, fsutil.CHECKSUMS,
                                                     "train_state.pt")))


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BertgpuError(f"{path}: cannot read JSON ({e})") from None
    if not isinstance(d, dict):
        raise BertgpuError(f"{path}: found {type(d).__name__}, expected a JSON object")
    if d.get("model_type", "bert") not in ARCHITECTURES:
        raise BertgpuError(f"{path}: model_type is {d['model_type']!r}, expected one of "
                           f"{', '.join(ARCHITECTURES)}")
    return d


def position_limit(path: str | os.PathLike) -> tuple[int, Path]:
    """The max_position_embeddings of the model in `path` (any folder `resolve_checkpoint_folder`
    takes; BERT and ModernBERT alike: the longest sequence it has positions for) and the
    config.json it is read from."""
    folder = resolve_checkpoint_folder(path)
    cfg = read_config(folder)
    where = folder / "config.json"
    try:
        return int(spec(architecture_of(cfg)).config_class.from_dict(cfg)
                   .max_position_embeddings), where
    except (BertgpuError, TypeError, ValueError) as e:
        raise BertgpuError(f"{where}: {e}") from None


def _load_weight_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path), device="cpu")
        except Exception as e:  # safetensors raises its own error types for corrupt headers
            raise BertgpuError(f"{path}: not a readable safetensors file ({e})") from None
    try:
        # weights_only: a pickle may run arbitrary code; this refuses anything but tensors.
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise BertgpuError(f"{path}: refused to load (only plain tensor pickles are accepted with "
                           "weights_only=True): "
                           f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
                           ) from None
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise BertgpuError(f"{path}: expected a dict of tensors (a state dict)")
    return sd


def weight_files(folder: Path) -> list[Path]:
    """The files `read_state_dict` reads, the one it goes by first: model.safetensors, else
    pytorch_model.bin, else either's *.index.json and its shards, else a sharded checkpoint's
    .metadata and *.distcp files (also before both when model.safetensors is not there); []
    when none."""
    if (folder / ".metadata").is_file() and not (folder / "model.safetensors").is_file():
        return [folder / ".metadata", *sorted(folder.glob("*.distcp"))]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / name]
        index = folder / f"{name}.index.json"
        if index.is_file():
            try:
                shards = sorted(set(
                    json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as e:
                raise BertgpuError(f"{index}: cannot read the weight_map ({e})") from None
            return [index, *(folder / shard for shard in shards)]
    return []


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors, else pytorch_model.bin (also their sharded *.index.json forms), else
    the weights of a sharded run's checkpoint (torch.distributed.checkpoint), gathered whole."""
    files = weight_files(folder)
    if not files:
        raise BertgpuError(f"{folder}: no model.safetensors or pytorch_model.bin")
    if files[0].name == ".metadata":
        return _read_dcp_weights(folder)
    sd: dict[str, torch.Tensor] = {}
    for path in files[1:] if files[0].name.endswith(".index.json") else files:
        sd.update(_load_weight_file(path))
    return sd


def _read_dcp_weights(folder: Path, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The full weights of a torch.distributed.checkpoint folder (a sharded run's checkpoint: its
    "model." tree; the optimizer's is not read), from every rank's files, in this process alone
    (no process group needed, none used)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        reader = dcp.FileSystemReader(str(folder))
        entries = reader.read_metadata().state_dict_metadata
        weights = {k[len(prefix):]: torch.empty(m.size, dtype=m.properties.dtype)
                   for k, m in entries.items()
                   if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
        # "assuming the intent is to load in a single process": it is.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({prefix[:-1]: weights}, storage_reader=reader, no_dist=True)
    except (Exception, CheckpointException) as e:  # DCP's own error types for damaged files
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise BertgpuError(f"{folder}: unreadable sharded checkpoint ({first})") from None
    return weights


# ---------------------------------------------------------------------------------------------
# Loading


def _normalise_keys(sd: dict[str, torch.Tensor], base: bool, arch: str,
                    vocab_size: int, untied: Path | None = None) -> dict[str, torch.Tensor]:
    """Checkpoint names -> our model's names in Hugging Face's layout: legacy LayerNorm.gamma/beta,
    the encoder's prefix ("bert.", "model.": present in task models, absent in a bare encoder such
    as all-MiniLM), the keys the architecture's older files store differently, the tied decoder
    copies dropped, and a bertgpu checkpoint's fused and padded tensors split and cut
    (`layout.to_hf` with the file's own `vocab_size`). `untied`: the config.json that says
    tie_word_embeddings false, when an MLM head is loaded (`_check_decoder_tied`)."""
    a = spec(arch)
    prefix, encoder_names = a.encoder_prefix, a.encoder_names
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        k = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", k)
        k = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", k)
        if base and k.startswith(prefix):
            k = k[len(prefix):]
        elif not base and k.startswith(encoder_names):
            k = prefix + k
        out[k] = v
    if a.fix_legacy_keys is not None:
        out = a.fix_legacy_keys(out, base)
    if untied is not None:
        _check_decoder_tied(out, untied)
    for k in TIED_KEYS:
        out.pop(k, None)
    return layout.to_hf(out, arch, vocab_size)


def _untied_config(folder: Path, cfg: dict[str, Any], mlm_head: bool) -> Path | None:
    """config.json of `folder` when it says tie_word_embeddings false and the model loaded from
    it has an MLM head, the one place where a decoder of its own would be used."""
    return (folder / "config.json"
            if mlm_head and cfg.get("tie_word_embeddings", True) is False else None)


def _check_decoder_tied(sd: dict[str, torch.Tensor], config_json: Path) -> None:
    """Our models tie the MLM decoder to the word embeddings by construction; a file whose
    decoder differs from them (tie_word_embeddings false) would lose it to the embeddings, giving
    other logits than transformers' and an export that claims tied weights: refused. A decoder
    equal to the embeddings loses nothing, and one the file lacks is a fresh head either way."""
    for decoder, embeddings in _DECODER_TIES.items():
        if decoder in sd and embeddings in sd and not (
                sd[decoder].shape == sd[embeddings].shape
                and torch.equal(sd[decoder], sd[embeddings])):
            raise BertgpuError(
                f"{config_json}: tie_word_embeddings is false and its MLM decoder "
                f"({decoder}) has weights of its own: expected true (bertgpu's MLM head always "
                "shares the word embeddings, so this decoder cannot be loaded); fine-tuning "
                "classification, QA or NER from this folder works, as they do not use it")


def _vocab_size(folder: Path, cfg: dict[str, Any], arch: str) -> int:
    """The vocabulary size a folder's weights were saved with (its config.json's)."""
    try:
        return int(spec(arch).config_class.from_dict(cfg).vocab_size)
    except (BertgpuError, TypeError, ValueError) as e:
        raise BertgpuError(f"{folder / 'config.json'}: {e}") from None


def _buffer(key: str) -> bool:
    """An old persistent buffer (positions, RoPE frequencies): recomputed here."""
    return key.endswith(("embeddings.position_ids", "embeddings.token_type_ids")) or (
        "rotary_emb." in key)


def _harmless(key: str, model_keys: set[str]) -> bool:
    """Keys we may drop: old persistent buffers, a pooler the model does not use, and heads of
    another task (an MLM head when fine-tuning, a classifier when loading the encoder)."""
    if _buffer(key):
        return True
    if "pooler." in key and not any("pooler." in k for k in model_keys):
        return True
    if key.startswith(_HEAD_PREFIXES):
        # the head module: "cls.seq_relationship.", "classifier.", ...; harmless if the model has
        # none
        parts = key.split(".")
        module = ".".join(parts[:2] if parts[0] == "cls" else parts[:1]) + "."
        return not any(k.startswith(module) for k in model_keys)
    return False


def load_pretrained(path: str | os.PathLike, head: str = "pretraining",
                    num_labels: int | None = None, with_nsp: bool | None = None,
                    config_overrides: dict[str, Any] | None = None) -> nn.Module:
    """Build the model for `head` from an HF folder, a checkpoint folder or a run folder.

    The architecture is config.json's model_type: "bert" or "modernbert" (see build.py).
    head: "pretraining" (BERT: NSP head iff the checkpoint has one, unless `with_nsp` says;
    ModernBERT: its MLM model), "masked_lm" (pretraining without NSP, HF's BertForMaskedLM /
    ModernBertForMaskedLM), "classification" (`num_labels` from the argument, else the config's
    id2label / num_labels), "qa", "token_classification", "base" (the bare encoder). With
    `num_labels` given, a checkpoint's classifier of another size (another task's head) is left
    out and initialised fresh, listed in the warning; every other weight must fit.
    config_overrides: config fields of the architecture to change, e.g. {"hidden_dropout_prob": 0.0}
    (BERT) or {"classifier_dropout": 0.1} (ModernBERT).
    Returns the model in train mode on the CPU in float32.
    """
    if head not in HEADS:
        raise BertgpuError(f"head {head!r}: expected one of {', '.join(HEADS)}")
    folder = resolve_checkpoint_folder(path)
    cfg = read_config(folder)
    try:
        arch = architecture_of(cfg)
        cls = spec(arch).config_class
        if config_overrides:
            known = {f.name for f in dataclasses.fields(cls)}
            bad = sorted(set(config_overrides) - known)
            if bad:
                raise BertgpuError(f"config override {', '.join(bad)}: not a {cls.__name__} field "
                                   f"(expected one of {', '.join(sorted(known))})")
            cfg = {**cfg, **config_overrides}
        cls.from_dict(cfg).validate()
    except (BertgpuError, TypeError) as e:
        raise BertgpuError(f"{folder / 'config.json'}: {e}") from None

    raw = read_state_dict(folder)
    # the rows of a bertgpu checkpoint's padded tables follow the file's config, not the overrides
    sd = _normalise_keys(raw, base=(head == "base"), arch=arch,
                         vocab_size=_vocab_size(folder, read_config(folder), arch),
                         untied=_untied_config(folder, cfg, head in ("pretraining", "masked_lm")))
    if spec(arch).has_nsp and head == "pretraining" and with_nsp is None:
        # follow the checkpoint: NSP head present -> keep it
        with_nsp = "cls.seq_relationship.weight" in sd
    pooler = any(k.startswith(("pooler.", "bert.pooler.")) for k in sd)
    model = build_model(cfg, head, num_labels, with_nsp, add_pooling_layer=pooler)
    report = _copy_weights(model, sd, folder, fresh_task_outputs=num_labels is not None)
    model.load_report = report  # what a caller lists at start-up (fine-tuning: the fresh head)
    if report.missing and not (head in FINETUNE_HEADS and report.only_task_head()):
        warnings.warn(report.missing_text(), stacklevel=2)
    return model


FINETUNE_HEADS = ("classification", "qa", "token_classification")
"""Heads whose own layers (and BERT's pooler, which pretraining without NSP does not train) a
pretrained model lacks by nature: fresh ones are listed by the caller, not warned about."""


@dataclasses.dataclass
class LoadReport:
    """What loading weights into a model did besides copying them."""

    folder: Path
    model_class: str
    missing: list[str]
    """Weights of the model the checkpoint lacks, left as initialised (heads it does not have)."""
    grown: list[tuple[str, int, int]]
    """(name, rows in the checkpoint, rows now) of the position tables that grew."""
    replaced: list[str] = dataclasses.field(default_factory=list)
    """"name (checkpoint shape) (model shape)" of another task's output layer, left out (its
    weights are among `missing`)."""
    unused: list[str] = dataclasses.field(default_factory=list)
    """Weights of the checkpoint the model has no place for (a pooler or a head it lacks: an NSP
    head into an MLM-only model), left out; old buffers that are recomputed are not listed."""

    def only_task_head(self) -> bool:
        """Every fresh weight belongs to the task's head or the pooler: what fine-tuning a
        pretrained model always initialises."""
        return all(k.startswith(_HEAD_PREFIXES) or ".pooler." in k or k.startswith("pooler.")
                   for k in self.missing)

    def fresh_text(self) -> str:
        """The fresh weights for a start-up row: names, and another task's head if replaced."""
        other = (f" (the checkpoint's are another task's head: {_names(self.replaced)})"
                 if self.replaced else "")
        return f"{_names(self.missing)}{other}"

    def missing_text(self) -> str:
        other = (f" (the checkpoint's are another task's head: {_names(self.replaced)})"
                 if self.replaced else "")
        return (f"{self.folder}: {len(self.missing)} weights of {self.model_class} are not in the "
                f"checkpoint and were initialised fresh: {_names(self.missing)}{other}")


def load_init_weights(model: nn.Module, path: str | os.PathLike) -> LoadReport:
    """Copy the weights of `path` (an HF folder, a checkpoint folder or a run folder) into
    `model`, built from a config that agrees with the folder's config.json except that
    max_position_embeddings may be larger: the rows beyond the old table are copies of the
    learned rows, repeated (Longformer's initialisation, Beltagy et al. 2020, sec. 5: better
    than random rows, as attention patterns of nearby positions carry over).

    Heads the folder lacks keep their fresh initialisation and are listed in the report;
    unknown or mis-shaped weights are a BertgpuError naming them (as in `load_pretrained`)."""
    folder = resolve_checkpoint_folder(path)
    arch = unwrap_model(model).config.architecture
    cfg = read_config(folder)
    vocab = _vocab_size(folder, cfg, arch)
    mlm = any(isinstance(m, VocabDecoder) for m in unwrap_model(model).modules())  # MLM head
    sd = _normalise_keys(read_state_dict(folder), base=False, arch=arch, vocab_size=vocab,
                         untied=_untied_config(folder, cfg, mlm))
    return _copy_weights(unwrap_model(model), sd, folder, grow_positions=True)


def _grow_positions(sd: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
                    arch: str) -> list[tuple[str, int, int]]:
    """Longer position tables in `sd` (in place): the old rows, then copies of them."""
    grown = []
    for name in spec(arch).position_tables:
        key = spec(arch).encoder_prefix + name
        if key not in sd or key not in own:
            continue
        old, new = sd[key], own[key]
        if old.shape[0] >= new.shape[0] or old.shape[1:] != new.shape[1:]:
            continue  # the same (nothing to do) or shrunk / mis-shaped (the shape check says so)
        reps = -(-new.shape[0] // old.shape[0])  # ceil
        sd[key] = old.repeat(reps, *([1] * (old.dim() - 1)))[: new.shape[0]].clone()
        grown.append((key, old.shape[0], new.shape[0]))
    return grown


def _copy_weights(model: nn.Module, sd: dict[str, torch.Tensor], folder: Path,
                  grow_positions: bool = False, fresh_task_outputs: bool = False) -> LoadReport:
    """`sd` (our names, Hugging Face's layout) into `model`: an error for unknown or mis-shaped
    weights, the missing ones listed (they keep the model's values); weights are cast to the
    model's dtype (checkpoints may be fp16/bf16). `fresh_task_outputs`: a task output layer
    (`_TASK_OUTPUTS`) of another shape is left out instead (another task's head). The checks
    compare Hugging Face layouts, the copy goes through `layout.from_hf`."""
    own = {k: v for k, v in layout.hf_state_dict(model).items() if k not in TIED_KEYS}
    unexpected = sorted(k for k in sd if k not in own and not _harmless(k, set(own)))
    if unexpected:
        raise BertgpuError(f"{folder}: {len(unexpected)} unexpected weights for a "
                           f"{type(model).__name__} with this config.json: {_names(unexpected)}")
    grown = _grow_positions(sd, own, model.config.architecture) if grow_positions else []
    replaced = []
    if fresh_task_outputs:
        other = {k.rsplit(".", 1)[0] for k, v in own.items()
                 if k.startswith(_TASK_OUTPUTS) and k in sd and sd[k].shape != v.shape}
        for k in sorted(k for k in own if k.rsplit(".", 1)[0] in other and k in sd):
            replaced.append(f"{k} {tuple(sd.pop(k).shape)} (model {tuple(own[k].shape)})")
    mis_shaped = [f"{k} {tuple(sd[k].shape)} (model {tuple(v.shape)})"
                  for k, v in own.items() if k in sd and sd[k].shape != v.shape]
    if mis_shaped:
        raise BertgpuError(f"{folder}: {len(mis_shaped)} weights have the wrong shape for its "
                           f"config.json: {_names(mis_shaped)}")
    missing = sorted(k for k in own if k not in sd)
    # Missing parts keep the model's values (copies: a fused tensor is rebuilt from all its parts)
    state = {k: sd[k].to(v.dtype) if k in sd else v.clone() for k, v in own.items()}
    config = model.config
    # strict=False: the tied decoder copies are not in `state`; every other key is
    model.load_state_dict(layout.from_hf(state, config.architecture, config.vocab_size),
                          strict=False)
    model.tie_weights()
    unused = sorted(k for k in sd if k not in own and k not in TIED_KEYS and not _buffer(k))
    return LoadReport(folder, type(model).__name__, missing, grown, replaced, unused)


def _names(keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def unwrap_model(model: nn.Module) -> nn.Module:
    """Strip DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while not isinstance(model, Configurable):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            raise BertgpuError(f"save_pretrained: found {type(model).__name__}, expected a bertgpu "
                               "BERT or ModernBERT model")
        model = inner
    return model


__all__ = ["LoadReport", "finetuned_model", "load_init_weights", "load_pretrained", "unwrap_model",
           "position_limit", "resolve_checkpoint_folder", "read_config",
           "read_state_dict"]
