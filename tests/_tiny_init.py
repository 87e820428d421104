"""One tiny random BERT in the Hugging Face layout,
the `--init` of the fine-tuning and GLUE tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def word_tokenizer(folder: Path, words: list[str]):
    """A word-level BERT WordPiece tokenizer from FOLDER/vocab.txt alone (SPECIAL, then `words`),
    as `load_tokenizer` builds it."""
    from bertgpu.data.tokenizer_folder import load_tokenizer

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL + words) + "\n", encoding="utf-8")
    return load_tokenizer(folder)


def tiny_init(root: Path, vocab: list[str]) -> Path:
    """ROOT/init: config.json, model.safetensors (hidden 32, 2 layers, no NSP head) and a word-level
    vocab.txt (`vocab`, specials first) with a lower-casing tokenizer_config.json."""
    from bertgpu.models.bert.config import BertConfig
    from bertgpu.models.bert.model import BertForPreTraining
    from bertgpu.models.hf_export import save_pretrained

    tok = root / "tok"
    tok.mkdir(parents=True, exist_ok=True)
    (tok / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (tok / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}),
                                               encoding="utf-8")
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(0)
    return save_pretrained(BertForPreTraining(cfg, with_nsp=False), root / "init", tokenizer=tok)
