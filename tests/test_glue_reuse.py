"""When `bertgpu glue` may count a finished run in its table (glue_reuse.py), from a probe of
fine-tuning combinations:

1. A seed trained with `--lr 1e-2` and a later one left to the model size's lr (3e-4) made one
   median, under a protocol line that said "lr 0.01"; the same with --epochs.
2. A dev.tsv edited in place under the same --data-dir: seed 1 scored on 60 rows, seed 2 on 20,
   one table, no word.
3. A malformed row in a later task's file stopped the command after the earlier tasks had
   trained (QQP after CoLA, SST-2, MRPC, STS-B), and its advice (--skip_malformed true) then
   refused those runs as made with other settings.
4. `--max_seq_len 128`, the default's own value, was refused against a run on the default
   ("max_seq_len None (now 128)").
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL
from test_glue_probe_fixes import FIXTURES, _sst2_copy

from bertgpu.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_init(tmp_path) -> Path:
    """A tiny random BERT whose vocabulary holds the words of SST-2's and RTE's fixtures."""
    words = sorted({w for task in ("SST-2", "RTE") for p in (FIXTURES / task).glob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]",
                                        p.read_text(encoding="utf-8").lower())})
    return _tiny_init.tiny_init(tmp_path, [*SPECIAL, *words])

FAST = ["--max_seq_len", "64", "--global_batch_size", "4"]


def _run(data: Path, init: Path, out: Path, *extra: str, tasks: tuple[str, ...] = ("sst2",)
         ) -> int:
    return main(["glue", "--data-dir", str(data), "--init", str(init), "--out", str(out),
                 "--tasks", *tasks, *extra])


def test_an_lr_given_once_and_left_to_the_model_the_next_time_is_refused(tmp_path, tiny_init,
                                                                         capsys):
    data, out = _sst2_copy(tmp_path / "g"), tmp_path / "out"
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", "--lr", "1e-2",
                "--seeds", "1") == 0
    capsys.readouterr()
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", "--seeds", "1", "2") == 2
    err = capsys.readouterr().err
    assert "made with lr 0.01 (now 0.0003); a table would mix the two settings" in err, err
    assert not (out / "SST-2" / "seed_2").exists()
    assert _run(data, tiny_init, out, *FAST, "--lr", "0.01", "--seeds", "1") == 2
    assert "made with epochs 1 (now 10)" in capsys.readouterr().err  # the tiny model's 10
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", "--lr", "0.01", "--seeds",
                "1") == 0


def test_the_default_max_seq_len_given_is_the_same_run(tmp_path, tiny_init, capsys):
    data, out = _sst2_copy(tmp_path / "g"), tmp_path / "out"
    assert _run(data, tiny_init, out, "--epochs", "1", "--global_batch_size", "4",
                "--seeds", "1") == 0
    capsys.readouterr()
    assert _run(data, tiny_init, out, "--epochs", "1", "--global_batch_size", "4",
                "--max_seq_len", "128", "--seeds", "1") == 0
    assert "SST-2 seed 1: results.json exists, not re-run" in capsys.readouterr().out
    assert _run(data, tiny_init, out, "--epochs", "1", "--global_batch_size", "4",
                "--max_seq_len", "64", "--seeds", "1") == 2
    assert "made with max_seq_len 128 (now 64)" in capsys.readouterr().err


def test_a_dev_file_changed_in_place_is_refused(tmp_path, tiny_init, capsys):
    data, out = _sst2_copy(tmp_path / "g"), tmp_path / "out"
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", "--seeds", "1") == 0
    dev = data / "SST-2" / "dev.tsv"
    dev.write_text("".join(dev.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]),
                   encoding="utf-8")
    capsys.readouterr()
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", "--seeds", "1", "2") == 2
    err = capsys.readouterr().err
    assert f"made with {dev.resolve()} changed since (another sha256)" in err, err
    assert not (out / "SST-2" / "seed_2").exists()


def test_a_malformed_later_task_stops_the_command_before_any_training(tmp_path, tiny_init,
                                                                      capsys):
    data = _sst2_copy(tmp_path / "g")
    shutil.copytree(FIXTURES / "RTE", data / "RTE")
    train = data / "RTE" / "train.tsv"
    train.write_text(train.read_text(encoding="utf-8") + "99\tonly two columns\n",
                     encoding="utf-8")
    out = tmp_path / "out"
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", tasks=("sst2", "rte")) == 2
    err = capsys.readouterr().err
    assert f"{train}:" in err and "--skip_malformed true" in err, err
    assert not (out / "SST-2").exists()  # nothing trained before the refusal
    assert _run(data, tiny_init, out, *FAST, "--epochs", "1", "--skip_malformed", "true",
                tasks=("sst2", "rte")) == 0
