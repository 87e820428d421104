"""Continued pretraining: the weights, and on request the optimizer state, of `--init PATH`.

    bertgpu pretrain configs/domain-adapt.toml --init hf/published --data data/ --out runs/adapted
    bertgpu pretrain configs/bert-base-phase2.toml --init runs/phase1 --data d512/ --out runs/p2
    bertgpu pretrain RECIPE --init runs/phase1 --resume-optimizer ...   # Adam moments too

PATH is a bertgpu run folder (its newest good checkpoint), a checkpoint folder, or a Hugging Face
BERT / ModernBERT folder (BertForPreTraining, BertForMaskedLM, ModernBertForMaskedLM or a bare
encoder). It is a new run: step 0, a fresh schedule, a fresh optimizer unless
`resume_optimizer` (only from a bertgpu checkpoint, which has one). Heads PATH lacks (an MLM
head for a bare encoder, an NSP head) keep their fresh initialisation and are listed at
start-up; a grown position table is stated there too (models/hf_io.load_init_weights).

The `[model]` section itself comes from PATH's config.json (config/continued.py); the shards
must use PATH's tokenizer (tasks/pretraining.PretrainData.check_init: the folder's own, or a
run's tokenizer/). Re-running the same
command after a crash resumes from the run's own checkpoint, not from PATH again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertgpu.errors import BertgpuError


@dataclass(frozen=True)
class InitSource:
    """Where the weights of `--init` come from."""

    given: str
    """The path as given."""
    folder: Path
    """The folder holding config.json and the weights (a run folder's newest good checkpoint)."""
    state: Path | None
    """train_state.pt of a bertgpu checkpoint (the optimizer state), None for an HF folder."""

    @classmethod
    def open(cls, path: str) -> InitSource:
        from bertgpu.models.hf_io import resolve_checkpoint_folder
        from bertgpu.train.checkpoint import STATE_FILE

        folder = resolve_checkpoint_folder(path)
        state = folder / STATE_FILE
        return cls(str(path), folder, state if state.is_file() else None)

    @property
    def kind(self) -> str:
        return "bertgpu checkpoint" if self.state is not None else "Hugging Face folder"


def load_weights(model: torch.nn.Module, src: InitSource, resume_optimizer: bool
                 ) -> list[tuple[str, str]]:
    """`src`'s weights into `model` (before the engine wraps it); the start-up rows that say
    what was loaded, what was initialised fresh and which position tables grew."""
    from bertgpu.models.hf_io import load_init_weights

    report = load_init_weights(model, src.folder)
    what = ("weights and optimizer state; the schedule starts fresh" if resume_optimizer
            else "weights only; the optimizer and the schedule start fresh")
    rows = [("init", f"{src.folder} ({src.kind}): {what}")]
    if report.missing:
        rows.append(("init: initialised fresh", f"{len(report.missing)} weights not in it: "
                                                + ", ".join(report.missing)))
    if report.unused:
        rows.append(("init: not used", f"{len(report.unused)} weights this model has no place "
                                       "for: " + ", ".join(report.unused)))
    for name, old, new in report.grown:
        rows.append(("init: positions grown", f"{name} {old} -> {new} rows (rows {old}-{new - 1} "
                                              f"copy rows 0-{old - 1})"))
    return rows


def load_optimizer_state(optimizer: torch.optim.Optimizer, src: InitSource,
                         optim_name: str, model: torch.nn.Module | None = None) -> None:
    """The moments (and step counts) of `src`'s optimizer into `optimizer`, keeping this run's
    hyper-parameters (lr, betas, weight decay): torch's load_state_dict would bring back the old
    run's. One-line errors when `src` has no optimizer state or one that does not fit. A sharded
    (FSDP) run's checkpoint keeps its moments in torch.distributed.checkpoint files, read into
    `model`'s optimizer by parameter name (collective when this run has several ranks); whole
    moments into a sharded `model` go in as each rank's shards (fused AdamW failed on them:
    "mixed torch.Tensor and DTensor")."""
    from bertgpu.config.overrides import read_toml
    from bertgpu.train import sharding
    from bertgpu.train.checkpoint import is_sharded_checkpoint

    if src.state is None:
        raise BertgpuError(f"--resume-optimizer: {src.folder} has no train_state.pt; expected a "
                           "bertgpu run or checkpoint folder (a Hugging Face folder carries no "
                           "optimizer state)")
    config = src.folder / "config.toml"
    saved_name = read_toml(config).get("optim", {}).get("name") if config.is_file() else None
    if saved_name is not None and saved_name != optim_name:
        raise BertgpuError(f"--resume-optimizer: {config}: optim.name is {saved_name!r}, this "
                           f"run's {optim_name!r}; expected the same optimizer")
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    if is_sharded_checkpoint(src.folder) and model is not None:
        _load_sharded(optimizer, model, src.folder)
    else:
        try:
            saved = torch.load(src.state, map_location="cpu", weights_only=True)["optimizer"]
        except Exception as e:  # a pickle of something else, a truncated file, no "optimizer"
            raise BertgpuError(f"{src.state}: cannot read its optimizer state ({e})") from None
        _check_fits(saved, optimizer, src.state)
        if model is not None and sharding.is_sharded(model):  # whole moments -> this rank's
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_optimizer_state_dict,
            )

            from bertgpu.train.checkpointer import optim_by_name

            set_optimizer_state_dict(model, optimizer, optim_by_name(model, optimizer, saved),
                                     options=StateDictOptions(full_state_dict=True))
        else:
            optimizer.load_state_dict(saved)
    for group, own in zip(optimizer.param_groups, hyper, strict=True):
        group.update(own)


def _load_sharded(optimizer: torch.optim.Optimizer, model: torch.nn.Module, folder: Path) -> None:
    """The optimizer tree of a torch.distributed.checkpoint folder into `optimizer`: the template
    (this rank's shapes, shards or whole tensors, keyed by parameter name) is filled from
    whichever of the source's ranks wrote the pieces, so the number of ranks may differ."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from bertgpu.train.checkpointer import OPTIM_KEY, dcp_mismatch

    template = get_optimizer_state_dict(model, optimizer)
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.load({OPTIM_KEY: template}, storage_reader=dcp.FileSystemReader(str(folder)))
    except (Exception, CheckpointException) as e:  # DCP's own error type is a BaseException
        raise BertgpuError(f"--resume-optimizer: {folder}: its optimizer state does not fit "
                           f"({dcp_mismatch(e)}); the model differs (an NSP head, a grown position "
                           "table); drop --resume-optimizer") from None
    set_optimizer_state_dict(model, optimizer, template)


def _check_fits(saved: dict[str, Any], optimizer: torch.optim.Optimizer, path: Path) -> None:
    problem = optimizer_state_mismatch(saved, optimizer)
    if problem is not None:
        raise BertgpuError(f"--resume-optimizer: {path}: {problem}; the model differs (an NSP "
                           "head, a grown position table, or a checkpoint from before bertgpu "
                           "fused query/key/value); drop --resume-optimizer")


def optimizer_state_mismatch(saved: dict[str, Any],
                             optimizer: torch.optim.Optimizer) -> str | None:
    """What keeps the optimizer state dict `saved` from fitting `optimizer` (torch's
    load_state_dict checks the group sizes only: a moment of another shape loads and fails at the
    first step), or None: same groups of the same sizes, every state tensor of its parameter's
    shape."""
    sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
    own = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != own:
        return f"parameter groups of sizes {sizes}, this model's {own}"
    ids = [i for g in saved["param_groups"] for i in g["params"]]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in zip(ids, params, strict=True):
        for name, value in saved.get("state", {}).get(i, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape:
                return (f"{name} of shape {tuple(value.shape)} for a parameter of shape "
                        f"{tuple(p.shape)}")
    return None


__all__ = ["InitSource", "load_optimizer_state", "load_weights", "optimizer_state_mismatch"]
