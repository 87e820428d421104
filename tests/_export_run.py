"""A tiny pretraining run folder for the export tests: its tokenizer/ and whole-file checkpoints of
a tiny BERT that hold the tokenizer files, as pretraining writes them
(tasks/pretraining.checkpoint_files)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _tiny import TINY

VOCAB = "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                  + [f"w{i}" for i in range(TINY["vocab_size"] - 5)]) + "\n"


def tiny_model(seed: int = 0, **overrides):
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining

    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig(**{**TINY, **overrides}), with_nsp=False)


def tiny_run(run: Path, steps: tuple[int, ...] = (10,), keep_last: int = 0) -> Path:
    """RUN with tokenizer/ (VOCAB) and a checkpoint per step (`save_step`)."""
    (run / "tokenizer").mkdir(parents=True, exist_ok=True)
    (run / "tokenizer" / "vocab.txt").write_text(VOCAB, encoding="utf-8")
    for step in steps:
        save_step(run, step, keep_last)
    return run


def save_step(run: Path, step: int, keep_last: int = 0) -> Path:
    """The checkpoint of `step` (weights seeded by the step), saved as pretraining saves one:
    its older ones pruned to `keep_last` (0: all kept)."""
    from bertgpu.models.hf_export import hf_config, tokenizer_files
    from bertgpu.train import checkpoint as ckpt

    model = tiny_model(step)
    files = {"config.json": json.dumps(hf_config(model)),
             **tokenizer_files(run / "tokenizer", model.config.max_position_embeddings)}
    return ckpt.save_checkpoint(run, step, model.state_dict(), {"step": step}, extra_files=files,
                                keep_last=keep_last)


def word_embeddings(folder: Path) -> torch.Tensor:
    """The word embeddings of an export's model.safetensors (the vocabulary's rows)."""
    from safetensors.torch import load_file

    table = load_file(str(folder / "model.safetensors"))["bert.embeddings.word_embeddings.weight"]
    return table[: TINY["vocab_size"]]
