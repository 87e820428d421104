"""`bertgpu glue` on the official-format GLUE fixtures: table, average convention, idempotence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import _tiny_init
import pytest
from _tiny_init import SPECIAL

from bertgpu.cli import main

FIXTURES = Path(__file__).parent / "fixtures" / "glue"
TASKS = ["sst2", "mnli", "stsb"]
FAST = ["--epochs", "1", "--max_seq_len", "64", "--global_batch_size", "4"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def tiny_init(tmp_path) -> Path:
    """A tiny random BERT whose vocab.txt holds every lower-cased word of the fixtures."""
    words = sorted({w for p in FIXTURES.rglob("*.tsv")
                    for w in re.findall(r"[a-z0-9]+|[^\sa-z0-9]",
                                        p.read_text(encoding="utf-8").lower())})
    return _tiny_init.tiny_init(tmp_path, [*SPECIAL, *words])


def glue(out: Path, init: Path, *extra: str) -> int:
    return main(["glue", "--data-dir", str(FIXTURES), "--init", str(init), "--out", str(out),
                 "--tasks", *TASKS, *FAST, *extra])


def test_glue_table_average_and_idempotence(tmp_path, tiny_init, capsys):
    out = tmp_path / "glue"
    assert glue(out, tiny_init, "--seeds", "1", "2", "--reference", "bert-base-cramming",
                "sidsite-8gb") == 0
    summary = json.loads((out / "glue_results.json").read_text())
    assert summary["convention"] == "glue-score"
    assert list(summary["columns"]) == ["SST-2", "MNLI-m", "MNLI-mm", "STS-B"]
    assert summary["protocol"]["aggregate"] == "median over 2 seeds"
    assert summary["protocol"]["epochs"] == 1 and summary["protocol"]["seeds"] == [1, 2]
    assert summary["protocol"]["lr"] == 3e-4  # by model size (hidden 32), as the runs recorded it
    # The average counts MNLI once: mean of (SST-2, mean(MNLI-m, MNLI-mm), STS-B).
    c = summary["columns"]
    expected = (c["SST-2"] + (c["MNLI-m"] + c["MNLI-mm"]) / 2 + c["STS-B"]) / 3
    assert summary["average"] == pytest.approx(expected)
    # Each column is the median (here: mean of two) of the per-seed results.
    sst = [json.loads((out / "SST-2" / f"seed_{s}" / "results.json").read_text()) for s in (1, 2)]
    assert c["SST-2"] == pytest.approx((sst[0]["score"] + sst[1]["score"]) / 2)
    assert [r["config"]["seed"] for r in sst] == [1, 2]
    assert set(summary["tasks"]["MNLI"]["metrics"]) == {"dev_matched", "dev_mismatched"}
    md = (out / "glue_results.md").read_text()
    assert '"glue-score" convention' in md and "median over 2 seeds" in md
    assert "| ours |" in md and "(published)" in md and "| 80.9 |" in md
    assert re.search(r"\| BERT from scratch on one 8 GB GPU.*\| 89\.1 \| 79\.3 \| 80\.1 \| "
                     r"61\.9 \| 72\.7 \|", md)

    # Second run: nothing is trained again, the table is rebuilt from results.json.
    stamp = (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns
    capsys.readouterr()
    assert glue(out, tiny_init, "--seeds", "1", "2") == 0
    printed = capsys.readouterr().out
    assert printed.count("results.json exists, not re-run") == 6 and "note:" not in printed
    assert (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns == stamp
    assert json.loads((out / "glue_results.json").read_text())["columns"] == c
    assert glue(out, tiny_init, "--seeds", "1", "--lr", "1e-4") == 0
    # lr left to the model size: the runs used (and recorded) the small-model default
    assert "results.json was made with lr 0.0003 (now 0.0001)" in capsys.readouterr().out

    # --force trains again (one task to keep it quick).
    assert main(["glue", "--data-dir", str(FIXTURES), "--init", str(tiny_init), "--out", str(out),
                 "--tasks", "sst2", *FAST, "--force"]) == 0
    assert (out / "SST-2" / "seed_1" / "results.json").stat().st_mtime_ns != stamp


def test_missing_task_folder_is_an_error_unless_skipped(tmp_path, tiny_init, capsys):
    data = tmp_path / "data"
    (data / "SST-2").mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):
        (data / "SST-2" / name).write_bytes((FIXTURES / "SST-2" / name).read_bytes())
    args = ["glue", "--data-dir", str(data), "--init", str(tiny_init), "--out", str(tmp_path / "o"),
            "--tasks", "sst2", "rte", *FAST]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "no train file for GLUE task RTE" in err and "--skip-missing" in err
    assert main([*args, "--skip-missing"]) == 0
    summary = json.loads((tmp_path / "o" / "glue_results.json").read_text())
    assert summary["skipped"] == ["RTE"] and list(summary["columns"]) == ["SST-2"]
    assert "Skipped (no data folder): RTE." in (tmp_path / "o" / "glue_results.md").read_text()


def test_bad_arguments(tmp_path, tiny_init, capsys):
    base = ["glue", "--data-dir", str(FIXTURES), "--init", str(tiny_init), "--out", str(tmp_path)]
    assert main([*base, "--seed", "3"]) == 2
    assert "use --seeds" in capsys.readouterr().err
    assert main([*base, "--epochz", "3"]) == 2
    assert "unknown key epochz (did you mean epochs?)" in capsys.readouterr().err
    assert main([*base, "--tasks", "nope"]) == 2
    assert "unknown GLUE task 'nope'" in capsys.readouterr().err
    assert not any(tmp_path.glob("*/seed_*"))
