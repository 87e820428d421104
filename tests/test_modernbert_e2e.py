"""ModernBERT through the commands: pretrain (configs/modern-tiny.toml) -> Hugging Face export ->
transformers loads it -> fine-tune on GLUE-style files from the run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _shards import write_synthetic_shards

from bertgpu.cli import main

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_pretrain_export_and_finetune_modernbert(tmp_path):
    transformers = pytest.importorskip("transformers")
    data = write_synthetic_shards(tmp_path / "d", n_train=64, n_val=16, seq_len=32, vocab_size=100)
    run = tmp_path / "run"
    assert main(["pretrain", str(ROOT / "configs" / "modern-tiny.toml"), "--data", str(data),
                 "--out", str(run), "--model.vocab_size", "100", "--model.hidden_size", "32",
                 "--model.intermediate_size", "48", "--model.max_position_embeddings", "64",
                 "--model.local_attention", "8", "--train.max_steps", "3",
                 "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
                 "--train.eval_every_steps", "0", "--train.log_every_steps", "1"]) == 0
    cfg = json.loads((run / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "modernbert" and cfg["architectures"] == ["ModernBertForMaskedLM"]
    hf = transformers.AutoModelForMaskedLM.from_pretrained(run / "hf")
    assert type(hf).__name__ == "ModernBertForMaskedLM"

    # Fine-tuning from the run folder (its newest checkpoint, its tokenizer), the BERT-style
    # --hidden_dropout_prob mapped onto ModernBERT's dropouts.
    words = [line.strip()
             for line in (data / "tokenizer" / "vocab.txt").read_text().splitlines()[5:40]]
    sst2 = tmp_path / "SST-2"
    sst2.mkdir()
    for split, n in (("train", 24), ("dev", 8)):
        rows = ["sentence\tlabel"] + [f"{words[i % 30]} {words[(i * 7) % 30]}\t{i % 2}"
                                      for i in range(n)]
        (sst2 / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "ft"
    assert main(["finetune", "sst2", "--data", str(sst2), "--init", str(run), "--out", str(out),
                 "--epochs", "1", "--global_batch_size", "8", "--hidden_dropout_prob", "0"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 3 and "accuracy" in res["metrics"]["dev"]
    ft_cfg = json.loads((out / "model" / "config.json").read_text())
    assert ft_cfg["architectures"] == ["ModernBertForSequenceClassification"]
    assert ft_cfg["mlp_dropout"] == 0.0 and ft_cfg["embedding_dropout"] == 0.0
