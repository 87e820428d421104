"""The model and tokenizer of a fine-tuning run's `--init`: a run folder, a checkpoint folder, a
Hugging Face folder, or `random` with `--config-from` (its architecture, fresh weights), and the
tokens per sequence its position table allows. `bertgpu finetune` and `bertgpu glue` use these
before anything trains (`--nproc`: before the workers start)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertgpu.config.finetune import FinetuneConfig, resolve_seq_len
from bertgpu.errors import BertgpuError

if TYPE_CHECKING:
    import torch

def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "vocab.txt").is_file()


def find_tokenizer(init: str | os.PathLike[str]) -> Path:
    """Tokenizer folder of `--init`: the folder itself (HF), RUN_DIR/tokenizer, or the run folder
    two levels above a checkpoints/step_N folder."""
    from bertgpu.models.hf_io import resolve_checkpoint_folder

    folder = Path(init)
    resolved = resolve_checkpoint_folder(folder)
    for cand in (folder, folder / "tokenizer", resolved, resolved.parent.parent / "tokenizer"):
        if cand.is_dir() and _has_tokenizer(cand):
            return cand
    raise BertgpuError(f"{folder}: no tokenizer (expected tokenizer.json or vocab.txt in it, or a "
                       "tokenizer/ folder of a bertgpu run)")


def tokenizer_for(init: str, config_from: str | os.PathLike[str] | None) -> Path:
    """The tokenizer folder of `init` (of `config_from` with `--init random`); a one-line error
    when either is not a model or run folder."""
    if init == "random":
        if config_from is None:
            raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint "
                               "or HF folder)")
        return find_tokenizer(config_from)
    return find_tokenizer(init)


def build_model(init: str, head: str, num_labels: int | None, cfg: FinetuneConfig,
                config_from: str | None = None,
                labels: Sequence[str] | None = None) -> torch.nn.Module:
    """The task model: pretrained weights from `init` (fresh head, listed in a warning), or with
    `init == "random"` the architecture of `config_from` with fresh weights. `labels`: the class
    names by id, exported as config.json's id2label / label2id."""
    import torch

    from bertgpu.models import build, hf_io

    overrides = None
    if cfg.hidden_dropout_prob is not None:
        # BERT's hidden dropout, or what the architecture calls the same places (ModernBERT:
        # embedding and MLP dropout).
        source = hf_io.read_config(
            hf_io.resolve_checkpoint_folder(config_from if init == "random" else init))
        spec = build.spec(build.architecture_of(source))
        names = (("hidden_dropout_prob",)
                 if "hidden_dropout_prob" in spec.config_class.__dataclass_fields__
                 else spec.equivalents["hidden_dropout_prob"])
        overrides = dict.fromkeys(names, cfg.hidden_dropout_prob)
    torch.manual_seed(cfg.seed)  # the fresh head (and random init) depend on the seed
    if init != "random":
        model = hf_io.load_pretrained(init, head=head, num_labels=num_labels,
                                      config_overrides=overrides)
    else:
        if config_from is None:
            raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint "
                               "or HF folder)")
        folder = hf_io.resolve_checkpoint_folder(config_from)
        d = {**hf_io.read_config(folder), **(overrides or {})}
        # the labels are this task's, not the folder's
        for key in ("id2label", "label2id", "num_labels"):
            d.pop(key, None)
        try:
            model = build.build_model(d, head, num_labels or (None if head == "qa" else 2))
        except BertgpuError as e:
            raise BertgpuError(f"{folder / 'config.json'}: {e}") from None
    if hasattr(model, "id2label"):
        # What save_pretrained writes into config.json: this task's label names, or LABEL_i;
        # never the init's (a model fine-tuned on another task carries that task's names).
        model.id2label = (dict(enumerate(labels)) if labels is not None
                          else {i: f"LABEL_{i}" for i in range(model.num_labels)})
    return model


def sequence_length(cfg: FinetuneConfig, task_default: int, init: str,
                    config_from: str | os.PathLike[str] | None) -> tuple[int, str]:
    """Tokens per sequence of the run and the start-up row's note: --max_seq_len, else the
    task's default capped at the model's max_position_embeddings; a given value beyond it is a
    one-line error before anything loads."""
    from bertgpu.models.hf_io import position_limit

    if init == "random" and config_from is None:
        raise BertgpuError("--init random needs --config-from FOLDER (a run, checkpoint "
                           "or HF folder)")
    limit, where = position_limit(config_from if init == "random" else init)
    return resolve_seq_len(cfg, task_default, limit, str(where))


def fresh_rows(model: Any) -> list[tuple[str, str]]:
    """The start-up row naming the weights the init lacked (the task's head, and BERT's pooler
    after pretraining without NSP), initialised fresh as fine-tuning always does; weights beyond
    those are a warning from hf_io.load_pretrained as well."""
    report = getattr(model, "load_report", None)
    if report is None or not report.missing:
        return []
    return [("initialised fresh", report.fresh_text())]
