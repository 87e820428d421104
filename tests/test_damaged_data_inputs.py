"""Damaged inputs of a run that were accepted or crashed: a vocab.txt with a token on two lines
(bertgpu read its first id, transformers its last: the exported model's fill-mask pipeline failed
with an IndexError), shard lengths outside 2..seq_len (zeros trained at loss 0 and exported a
model), an empty .npy shard (an EOFError traceback) and a shard set without its tokenizer/ (a
traceback, or an error naming the run's copy, with files left in --out). Each is now one line
naming the damaged file, before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _shards import write_synthetic_shards

from bertgpu.cli import main
from bertgpu.data.shards import ShardSet
from bertgpu.data.tokenizer_folder import load_tokenizer
from bertgpu.errors import BertgpuError

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ["pretrain", str(ROOT / "configs" / "tiny.toml"), "--model.vocab_size", "100",
            "--model.hidden_size", "32", "--model.intermediate_size", "64",
            "--model.max_position_embeddings", "64", "--train.global_batch_size", "8",
            "--impl.micro_batch_size", "4", "--train.max_steps", "2", "--impl.num_workers", "0"]
DAMAGED = "a damaged shard; expected the shard set as bertgpu prepare wrote it (prepare it again)"


@pytest.fixture
def data(tmp_path) -> Path:
    return write_synthetic_shards(tmp_path / "data", n_train=30, n_val=4, seq_len=16,
                                  vocab_size=100)


def _one_line_error(capsys, argv: list[str], command: str) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"bertgpu {command}: error: "), err
    return err.removeprefix(f"bertgpu {command}: error: ")


def _pretrain_error(capsys, data: Path, out: Path) -> str:
    """The one-line error of a pretrain run on `data`, which wrote nothing to `out`."""
    err = _one_line_error(capsys, [*PRETRAIN, "--data", str(data), "--out", str(out)],
                          "pretrain")
    assert not out.exists(), sorted(p.name for p in out.iterdir())
    return err


# 1. a vocab.txt with a token on two lines ---------------------------------------------------


def test_a_vocab_txt_with_a_repeated_token_is_refused(data, tmp_path, capsys):
    tok = tmp_path / "tok"
    shutil.copytree(data / "tokenizer", tok)
    (tok / "tokenizer.json").unlink()  # vocab.txt is the vocabulary
    lines = (tok / "vocab.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (tok / "vocab.txt").write_text("".join(lines + lines[2:4]), encoding="utf-8")  # [CLS] [SEP]
    expected = (f"{tok / 'vocab.txt'}: token '[CLS]' is on lines 3 and 101; expected each token "
                "on one line (transformers would give it the id of its last line, bertgpu its "
                "first)")
    with pytest.raises(BertgpuError) as caught:
        load_tokenizer(tok)
    assert str(caught.value) == expected
    (tmp_path / "corpus.txt").write_text("w1 w2 ##c3 w4\nw5 w6 w7\n", encoding="utf-8")
    out = tmp_path / "shards"
    assert _one_line_error(capsys, ["prepare", "--corpus", str(tmp_path / "corpus.txt"),
                                    "--format", "lines", "--tokenizer", str(tok), "--seq-len",
                                    "16", "--out", str(out)], "prepare") == expected
    assert not out.exists()


def test_a_vocab_txt_without_repeats_still_loads(data, tmp_path):
    tok = tmp_path / "tok"
    shutil.copytree(data / "tokenizer", tok)
    (tok / "tokenizer.json").unlink()
    assert load_tokenizer(tok).token_to_id("[MASK]") == 4


# 2. lengths outside 2..seq_len, or not the manifest's tokens ---------------------------------


def _set_length(data: Path, row: int, value: int, shard: str = "train-00000") -> Path:
    path = data / f"{shard}.lengths.npy"
    lengths = np.load(path)
    lengths[row] = value
    np.save(path, lengths)
    return path


@pytest.mark.parametrize("value", [0, 1, 17, 9999])
def test_a_length_outside_2_to_seq_len_is_a_damaged_shard(data, tmp_path, capsys, value):
    path = _set_length(data, 5, value)
    expected = (f"{path}: row 5 has length {value}, expected 2 ([CLS] and [SEP]) to seq_len 16 "
                f"({data / 'manifest.json'}): {DAMAGED}")
    with pytest.raises(BertgpuError) as caught:
        ShardSet(data, "train")
    assert str(caught.value) == expected
    assert _pretrain_error(capsys, data, tmp_path / "run") == expected


def test_every_length_zero_does_not_train_at_loss_zero(data, tmp_path, capsys):
    path = data / "train-00000.lengths.npy"
    np.save(path, np.zeros_like(np.load(path)))
    err = _pretrain_error(capsys, data, tmp_path / "run")
    assert err.startswith(f"{path}: row 0 has length 0, expected 2"), err


def test_lengths_that_do_not_sum_to_the_manifests_tokens_are_a_damaged_shard(data):
    path = _set_length(data, 5, 9)  # within 2..16, but 7 tokens fewer than prepare counted
    listed = json.loads((data / "manifest.json").read_text())["splits"]["train"]["shards"][0]
    with pytest.raises(BertgpuError) as caught:
        ShardSet(data, "train")
    assert str(caught.value) == (
        f"{path}: the lengths sum to {listed['tokens'] - 7} tokens, expected the "
        f"{listed['tokens']} that {data / 'manifest.json'} lists for train-00000: {DAMAGED}")


def test_a_short_last_row_with_its_tokens_counted_is_fine(data):
    """A packed split's last row is short, and prepare counts its tokens in the manifest."""
    _set_length(data, 5, 9, shard="train-00001")  # rows 24..29: the last is 9 tokens long
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][1]["tokens"] -= 7
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert ShardSet(data, "train").has_short_rows()


def test_a_manifest_without_shard_tokens_checks_the_lengths_alone(data):
    manifest = json.loads((data / "manifest.json").read_text())
    for shard in manifest["splits"]["train"]["shards"]:
        del shard["tokens"]
    (data / "manifest.json").write_text(json.dumps(manifest))
    _set_length(data, 5, 9)
    assert len(ShardSet(data, "train")) == 30
    _set_length(data, 5, 0)
    with pytest.raises(BertgpuError, match="row 5 has length 0"):
        ShardSet(data, "train")


# 3. an empty .npy shard -----------------------------------------------------------------------


@pytest.mark.parametrize("field", ["input_ids", "lengths"])
def test_an_empty_shard_file_is_one_line(data, tmp_path, capsys, field):
    from bertgpu.bench.batches import sample_lengths

    path = data / f"train-00001.{field}.npy"
    path.write_bytes(b"")
    expected = f"{path}: not a readable .npy file (No data left in file)"
    with pytest.raises(BertgpuError) as caught:
        ShardSet(data, "train")
    assert str(caught.value) == expected
    assert _pretrain_error(capsys, data, tmp_path / "run") == expected
    with pytest.raises(BertgpuError) as caught:  # bench model --real-lengths DATA
        sample_lengths(str(data), 8, 16, 0)
    assert str(caught.value) == expected


# 4. a shard set without its tokenizer ---------------------------------------------------------


AGAIN = ("expected the copy of the tokenizer that `bertgpu prepare` writes beside manifest.json "
         "(prepare again, or copy the tokenizer the shards were made with there)")


def test_a_shard_set_without_its_tokenizer_folder_is_refused_before_the_run(data, tmp_path,
                                                                            capsys):
    shutil.rmtree(data / "tokenizer")
    assert (_pretrain_error(capsys, data, tmp_path / "run")
            == f"{data / 'tokenizer'}: missing from the shard set; {AGAIN}")
    (data / "tokenizer").write_text("")
    assert (_pretrain_error(capsys, data, tmp_path / "run")
            == f"{data / 'tokenizer'}: a file, not a folder; {AGAIN}")


def test_an_empty_tokenizer_folder_names_the_shard_set_not_the_run(data, tmp_path, capsys):
    for name in ("tokenizer.json", "vocab.txt"):
        (data / "tokenizer" / name).unlink()
    assert (_pretrain_error(capsys, data, tmp_path / "run")
            == f"{data / 'tokenizer'}: neither tokenizer.json nor vocab.txt found; {AGAIN}")
