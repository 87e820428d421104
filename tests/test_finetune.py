"""Fine-tuning end to end on learnable fixtures: classification, regression, span extraction.

A tiny random BERT (hidden 32, 2 layers) and a word-level vocab.txt make each run a few seconds;
each fixture has a rule the model can learn, so a metric far above chance shows that data,
batching, loss, optimizer and evaluation fit together.
"""

from __future__ import annotations

import json
import random
import re
import warnings
from pathlib import Path

import _tiny_init
import numpy as np
import pytest
from _tiny_init import SPECIAL

from bertgpu.config.finetune import FinetuneConfig
from bertgpu.config.finetune import load_finetune_config as load_config
from bertgpu.errors import BertgpuError
from bertgpu.finetune import finetune, finetune_examples
from bertgpu.tasks.demo_sets import demo_tasks

WORDS = ("apple river stone cloud table green quiet music paper window garden silver bright lamp "
         "horse ocean").split()
# the SQuAD fixture's answers: never elsewhere in a context
ANSWERS = ["red", "blue", "gold", "pink"]
VOCAB = SPECIAL + ["good", "bad", "is", "what", "the", ".", "?"] + WORDS + ANSWERS
# Fast, learnable settings: no hidden dropout, a high lr for a random model.
FAST = ["--lr", "3e-3", "--hidden_dropout_prob", "0", "--warmup_fraction", "0.05",
        "--global_batch_size", "16", "--max_seq_len", "32"]


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_init(root: Path, vocab: list[str] = VOCAB) -> Path:
    return _tiny_init.tiny_init(root, vocab)


def sst2_fixture(folder: Path, n_train: int = 256, n_dev: int = 64) -> Path:
    """SST-2 layout where the label is the presence of "good" (1) or "bad" (0)."""
    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)

    def sentence(label: int) -> str:
        w = rng.sample(WORDS, 5)
        w.insert(rng.randrange(6), "good" if label else "bad")
        return " ".join(w)

    for split, n in (("train", n_train), ("dev", n_dev)):
        labels = [rng.randrange(2) for _ in range(n)]
        rows = ["sentence\tlabel"] + [f"{sentence(y)}\t{y}" for y in labels]
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    rows = ["index\tsentence"] + [f"{i}\t{sentence(i % 2)}" for i in range(6)]
    (folder / "test.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


def test_classification_learns_and_writes_outputs(tmp_path):
    init = tiny_init(tmp_path)
    data = sst2_fixture(tmp_path / "glue" / "SST-2")
    out = tmp_path / "ft"
    res = finetune("sst-2", tmp_path / "glue", init, out, overrides=[*FAST, "--epochs", "3"],
                   predict_test=True)
    assert res["task"] == "SST-2" and res["metrics"]["dev"]["accuracy"] >= 90.0  # chance: ~50
    assert res["columns"] == {"SST-2": res["metrics"]["dev"]["accuracy"]}
    assert [e["epoch"] for e in res["epochs"]] == [1, 2, 3]
    assert res["steps"] == 3 * 16 and res["train_sequences"] == 256
    assert res["train_examples_per_s"] > 0 and res["eval_examples_per_s"] > 0
    assert res["config"]["epochs"] == 3 and res["device"].startswith("cpu")
    assert json.loads((out / "results.json").read_text()) == res
    assert not (tmp_path / "ft.tmp").exists()
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("eval") == 3
    assert ({"config.json", "model.safetensors", "vocab.txt"}
            <= {p.name for p in (out / "model").iterdir()})
    sub = (out / "submission" / "SST-2.tsv").read_text().splitlines()
    assert sub[0] == "index\tprediction" and len(sub) == 7
    # The test sentences follow the same rule, so the predictions are right too.
    assert [line.split("\t")[1] for line in sub[1:]] == ["0", "1"] * 3
    # The export reloads as a classifier with the trained head.
    from bertgpu.models.hf_io import load_pretrained

    model = load_pretrained(out / "model", head="classification")
    assert model.num_labels == 2
    del data


def test_regression_learns(tmp_path):
    """STS-B layout: the score is 1.25 x the number of "good" words in the pair (0 to 4)."""
    init = tiny_init(tmp_path)
    rng = random.Random(1)
    folder = tmp_path / "glue" / "STS-B"
    folder.mkdir(parents=True)
    header = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
              "\tscore")
    for split, n in (("train", 320), ("dev", 80)):
        rows = [header]
        for i in range(n):
            k = rng.randrange(5)
            words = rng.sample(WORDS, 8 - k) + ["good"] * k
            rng.shuffle(words)
            a, b = " ".join(words[:4]), " ".join(words[4:])
            rows.append(f"{i}\tg\tf\t2012\t{i:04d}\tnone\tnone\t{a}\t{b}\t{1.25 * k:.3f}")
        (folder / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    res = finetune("stsb", tmp_path / "glue", init, tmp_path / "ft",
                   overrides=[*FAST, "--epochs", "4", "--lr", "1e-3"])
    dev = res["metrics"]["dev"]
    assert set(dev) == {"pearson", "spearman"}
    assert dev["pearson"] > 60.0, dev  # chance: ~0


def squad_fixture(path: Path, n: int, seed: int) -> Path:
    """SQuAD v1.1 JSON where the answer is the word after "is", at a varying position; answers
    come from their own small set so that a tiny model can learn them in a few steps."""
    rng = random.Random(seed)
    data = []
    for i in range(n):
        before, after = rng.sample(WORDS, rng.randint(0, 4)), rng.sample(WORDS, 3)
        answer = rng.choice(ANSWERS)
        context = " ".join(before) + " is " + answer + " " + " ".join(after) + " ."
        start = context.index(" is ") + 4
        qas = [{"id": f"q{seed}-{i}", "question": "what is the " + rng.choice(WORDS) + " ?",
                "answers": [{"text": answer, "answer_start": start}]}]
        data.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": qas}]})
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")
    return path


def test_span_extraction_learns(tmp_path, capsys):
    init = tiny_init(tmp_path)
    squad_dir = tmp_path / "squad"
    squad_dir.mkdir()
    squad_fixture(squad_dir / "train-v1.1.json", 192, 0)
    squad_fixture(squad_dir / "dev-v1.1.json", 60, 1)
    out = tmp_path / "ft"
    res = finetune("squad", squad_dir, init, out,
                   overrides=[*FAST, "--epochs", "2", "--max_seq_len", "48", "--doc_stride", "16"])
    assert res["task"] == "SQuAD v1.1"
    assert res["metrics"]["dev"]["exact"] > 80.0, res["metrics"]  # chance: ~1/8 of the tokens
    preds = json.loads((out / "predictions.json").read_text())
    assert len(preds) == 60 and all(isinstance(v, str) for v in preds.values())
    # the last line shows the question count as a count ("total 60.00" before)
    assert re.search(r"^SQuAD v1\.1: dev exact \d+\.\d\d, f1 \d+\.\d\d, total 60 -> ",
                     capsys.readouterr().out, re.M)


def test_hf_folder_without_mlm_head_or_pooler(tmp_path, capsys):
    """A bare transformers BertModel (like all-MiniLM) fine-tunes; the fresh weights are named."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    folder = tmp_path / "hf"
    transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    sst2_fixture(tmp_path / "SST-2", n_train=32, n_dev=16)
    # The pooler and the classifier, which the folder lacks, are initialised fresh as fine-tuning
    # always does: a start-up row, not a warning (one on every README fine-tune was noise).
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*initialised fresh")
        res = finetune("sst2", tmp_path / "SST-2", folder, tmp_path / "ft",
                       overrides=["--epochs", "1", "--max_seq_len", "32"])
    assert re.search(r"initialised fresh .*bert\.pooler.*classifier", capsys.readouterr().out)
    assert res["steps"] == 1 and "accuracy" in res["metrics"]["dev"]
    assert res["tokenizer"] == str(folder)


def test_random_init_takes_the_architecture_of_config_from(tmp_path):
    init = tiny_init(tmp_path)
    sst2_fixture(tmp_path / "SST-2", n_train=32, n_dev=16)
    res = finetune("sst2", tmp_path / "SST-2", "random", tmp_path / "ft", config_from=init,
                   overrides=["--epochs", "1", "--seed", "3"])
    assert (res["init"] == "random" and res["config_from"] == str(init)
            and res["config"]["seed"] == 3)
    cfg = json.loads((tmp_path / "ft" / "model" / "config.json").read_text())
    assert cfg["hidden_size"] == 32 and cfg["architectures"] == ["BertForSequenceClassification"]
    with pytest.raises(BertgpuError, match="--config-from"):
        finetune("sst2", tmp_path / "SST-2", "random", tmp_path / "ft2")


def test_in_memory_examples(tmp_path):
    from bertgpu.tasks.glue import Example

    init = tiny_init(tmp_path)
    rng = random.Random(2)
    make = [Example(str(i), " ".join(rng.sample(WORDS, 3)), " ".join(rng.sample(WORDS, 3)),
                    float(rng.random() * 5)) for i in range(40)]
    res = finetune_examples("stsb", make[:32], make[32:], init, tmp_path / "ft",
                            overrides=["--epochs", "1"], name="toy similarity")
    assert res["task"] == "toy similarity" and set(res["metrics"]["dev"]) == {"pearson", "spearman"}


def test_overrides_and_their_errors():
    cfg = load_config(None, ["--train.epochs", "5", "--lr=1e-4", "--max_train_examples", "10"])
    assert (cfg.epochs, cfg.lr, cfg.max_train_examples) == (5, 1e-4, 10)
    assert load_config(cfg, ["--seed", "2"]).epochs == 5 and cfg.seed == 0  # cfg is not modified
    with pytest.raises(BertgpuError, match="unknown key epoch.*did you mean epochs"):
        load_config(None, ["--epoch", "3"])
    with pytest.raises(BertgpuError, match="precision = 'fp8'"):
        load_config(None, ["--precision", "fp8"])
    assert FinetuneConfig().max_seq_len is None  # 128 for GLUE, 384 for SQuAD


def test_missing_squad_file_and_unknown_task(tmp_path):
    init = tiny_init(tmp_path)
    with pytest.raises(BertgpuError, match="train-v2.0.json: not found"):
        finetune("squad2", tmp_path, init, tmp_path / "ft")
    with pytest.raises(BertgpuError, match="unknown GLUE task 'squad3'") as err:
        finetune("squad3", tmp_path, init, tmp_path / "ft")
    assert "squad, squad2, classify or ner" in str(err.value)  # every task, not GLUE's alone
    assert not (tmp_path / "ft").exists() and not (tmp_path / "ft.tmp").exists()


def test_cli_errors_are_one_line(tmp_path, capsys):
    from bertgpu.cli import main

    assert main(["finetune", "sst2", "--data", str(tmp_path)]) == 2
    assert "missing --init, --out" in capsys.readouterr().err
    assert main(["finetune", "--help-config"]) == 0
    assert "--max_seq_len" in capsys.readouterr().out


def test_demo_tasks_are_deterministic_splits():
    pytest.importorskip("gensim", reason="demo data ships with gensim")  # only its files are read
    tasks = demo_tasks(seed=0)
    train, dev, task = tasks["polarity"]
    assert task.key == "sst2" and len(train) == 160 and len(dev) == 40
    assert sorted(e.label for e in dev) == [0] * 20 + [1] * 20
    assert {e.guid for e in train}.isdisjoint(e.guid for e in dev)
    lee_train, lee_dev, lee_task = tasks["lee"]
    assert lee_task.key == "stsb" and len(lee_train) + len(lee_dev) == 1225
    assert 0.15 < len(lee_dev) / 1225 < 0.25
    scores = np.array([e.label for e in lee_train])
    assert 0.0 <= scores.min() and scores.max() <= 5.0 and scores.std() > 0.1
    again = demo_tasks(seed=0)
    assert [e.guid for e in again["lee"][1]] == [e.guid for e in lee_dev]
    assert [e.guid for e in demo_tasks(seed=1)["polarity"][1]] != [e.guid for e in dev]


@pytest.mark.timeout(120)
def test_two_process_finetune(tmp_path):
    """`--nproc 2` (gloo, CPU): two ranks share each step, rank 0 evaluates and writes."""
    import os
    import subprocess
    import sys

    init = tiny_init(tmp_path)
    sst2_fixture(tmp_path / "SST-2", n_train=64, n_dev=16)
    out = tmp_path / "ft"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "bertgpu", "finetune", "sst2", "--data", str(tmp_path / "SST-2"),
         "--init", str(init), "--out", str(out), "--nproc", "2", "--epochs", "1",
         "--global_batch_size", "16"],
        capture_output=True, text=True, env=env, timeout=110, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert res["world_size"] == 2 and res["steps"] == 4
    assert "global batch / micro / accumulation  16 / 8 / 1" in proc.stdout
