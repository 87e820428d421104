"""Inputs read as their authors meant, and errors that say what was actually checked: an NER
CSV cell keeps a token with a no-break space whole, and `pretrain --init` with shards whose
special ids differ from the init's says whether the init had a tokenizer to check them against."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from _shards import write_synthetic_shards

from bertgpu.cli import main
from bertgpu.tasks import ner

ROOT = Path(__file__).resolve().parents[1]
ADAPT = str(ROOT / "configs" / "domain-adapt.toml")
SMALL = ["--train.global_batch_size", "8", "--impl.micro_batch_size", "8",
         "--impl.num_workers", "0", "--train.precision", "fp32", "--train.max_steps", "1",
         "--train.eval_every_steps", "0", "--logging.gpu_monitor_interval_s", "0",
         "--impl.device", "cpu"]


# --- NER .csv: words split on ASCII whitespace only ---------------------------------------------


def test_ner_csv_keeps_a_token_with_a_no_break_space_whole(tmp_path):
    # "10\u00a0000" (French thousands) is one token with one tag; str.split() made it two
    # tokens for three tags and stopped the run with "4 tokens but 3 tags".
    path = tmp_path / "train.csv"
    path.write_text("tokens,tags\n\"Paris\t10\u00a0000 habitants\",B-LOC O O\n", encoding="utf-8")
    [sentence] = ner.read_sentences(path)
    assert sentence.tokens == ["Paris", "10\u00a0000", "habitants"]
    assert sentence.tags == ["B-LOC", "O", "O"] and sentence.lines == [2, 2, 2]


# --- pretrain --init: the special-id error names what the init folder holds ----------------------


def _modernbert_init(folder: Path, pad_token_id: int) -> None:
    """A tiny transformers ModernBERT (vocabulary 100) in `folder`: config.json and weights,
    no tokenizer files."""
    transformers = pytest.importorskip("transformers")
    from _tiny_modern import TINY_MODERN

    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **{**TINY_MODERN, "vocab_size": 100, "pad_token_id": pad_token_id})).save_pretrained(folder)


def _one_line_error(capsys, rc: int) -> str:
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("launch", [[], ["--nproc", "2"]])
def test_init_without_tokenizer_files_says_so_in_the_pad_id_error(tmp_path, capsys, launch):
    # The shards' [PAD] is 0, the init's config says 7, and the init has no tokenizer: the old
    # hint "set model.pad_token_id 0, or prepare with the model's tokenizer" named a setting
    # --init refuses and a tokenizer the folder does not have.
    _modernbert_init(hf := tmp_path / "hfmb", pad_token_id=7)
    shards = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32,
                                    vocab_size=100)
    capsys.readouterr()  # transformers' progress bar
    rc = main(["pretrain", *launch, ADAPT, "--init", str(hf), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL])
    err = _one_line_error(capsys, rc)
    assert str(shards / "manifest.json") in err, err
    assert "pad has id 0 in the shards but the model's pad_token_id is 7" in err, err
    assert f"--init {hf} has no tokenizer files" in err, err
    assert "could not be checked" in err, err
    assert "set model.pad_token_id" not in err and not (tmp_path / "r").exists()


@pytest.mark.usefixtures("one_thread")
def test_init_whose_tokenizer_matches_the_shards_but_not_its_config_says_so(tmp_path, capsys):
    # The init's tokenizer is the shards' (check_init passes) but its config.json's pad id is 7:
    # the disagreement is inside the init folder, not a setting of this run.
    _modernbert_init(hf := tmp_path / "hfmb", pad_token_id=7)
    shards = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32,
                                    vocab_size=100)
    for file in (shards / "tokenizer").iterdir():
        shutil.copy(file, hf / file.name)
    capsys.readouterr()
    rc = main(["pretrain", ADAPT, "--init", str(hf), "--data", str(shards),
               "--out", str(tmp_path / "r"), *SMALL])
    err = _one_line_error(capsys, rc)
    assert f"its tokenizer {hf} gives pad id 0 as the shards do" in err, err
    assert "config.json and tokenizer files to agree" in err, err
    assert "set model.pad_token_id" not in err and not (tmp_path / "r").exists()


# --- pretrain's own warnings: one `bertgpu pretrain: warning:` line on stderr --------------------


@pytest.mark.usefixtures("one_thread")
def test_an_empty_validation_split_and_an_init_without_tokenizer_are_warnings(tmp_path, capsys):
    """Both were printed to stdout as a bare "warning: ..." among the progress lines, where the
    command's other warnings are `bertgpu pretrain: warning: ...` lines on stderr."""
    _modernbert_init(hf := tmp_path / "hfmb", pad_token_id=0)
    shards = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=0, seq_len=32,
                                    vocab_size=100)
    capsys.readouterr()
    assert main(["pretrain", ADAPT, "--init", str(hf), "--data", str(shards), "--out",
                 str(tmp_path / "r"), *SMALL]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in out, out
    lines = err.splitlines()
    for expected in (f"--init {hf} has no tokenizer files",
                     f"{shards / 'manifest.json'}: the validation split is empty"):
        assert any(line.startswith(f"bertgpu pretrain: warning: {expected}") for line in lines), err


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_token_id_past_the_vocabulary_is_one_line(tmp_path, capsys, workers):
    """A damaged shard (a token id past manifest.json's vocab_size) was an IndexError traceback
    from the masking; in a loader worker torch wraps any error of ours into "Caught BertgpuError
    in DataLoader worker process 1." and the worker's traceback."""
    import json

    import numpy as np

    shards = write_synthetic_shards(tmp_path / "d", n_train=16, n_val=8, seq_len=32,
                                    vocab_size=100)
    first = sorted(shards.glob("train-*.input_ids.npy"))[0]
    ids = np.load(first, mmap_mode="r+")
    ids[:, 5] = 60000
    ids.flush()
    argv = ["pretrain", str(ROOT / "configs" / "tiny.toml"), "--data", str(shards), "--out",
            str(tmp_path / "r"), "--model.vocab_size", "100", "--model.hidden_size", "32",
            "--model.intermediate_size", "64", "--model.max_position_embeddings", "64",
            "--train.global_batch_size", "8", "--impl.micro_batch_size", "4",
            "--train.max_steps", "2", "--impl.num_workers", workers]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    expected = ("the shards hold token id 60000, past the vocabulary of 100 (manifest.json's "
                "vocab_size): a damaged shard or one of another tokenizer; expected the shard set "
                "as bertgpu prepare wrote it (prepare it again)")
    assert err[-1] == f"bertgpu pretrain: error: {expected}", err
    records = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").open()]
    assert records[-1]["error"] == expected
