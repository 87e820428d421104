"""Fine-tuning runs whose folders end alike (the demo's .../pretrained/lee/seed_0 and
.../random/lee/seed_0) got one name, "lee/seed_0", twice: the parent was added once and the
names not checked again, so the pretrained and random-init twins could not be told apart in the
table or in finetune.png's legend. Names now grow until unique, and an init column says what
each run started from (results.json's ``init``)."""

from __future__ import annotations

import json

from test_report import _table_rows

from bertgpu.report import build_report


def _results(folder, init: str, score: float, step: int | None = None) -> None:
    folder.mkdir(parents=True)
    ckpt = {"path": init, "step": step, "sha256": "0" * 64} if init != "random" else None
    (folder / "results.json").write_text(json.dumps({
        "task": "lee", "init": init, "init_checkpoint": ckpt, "score": score,
        "metrics": {"dev": {"pearson": score, "spearman": score}},
        "epochs": [{"epoch": 1, "score": score, "train_loss": 1.0}], "steps": 10,
    }), encoding="utf-8")


def test_twins_with_the_same_folder_tail_get_different_names_and_their_init(tmp_path):
    demo = tmp_path / "demo"
    _results(demo / "pretrained" / "lee" / "seed_0", "/runs/base", 64.8, step=200)
    _results(demo / "random" / "lee" / "seed_0", "random", 40.1)
    _results(demo / "pretrained" / "polarity" / "seed_0", "/runs/base/hf", 52.5)
    paths = [demo / "pretrained" / "lee" / "seed_0", demo / "random" / "lee" / "seed_0",
             demo / "pretrained" / "polarity" / "seed_0"]
    md = (build_report(paths, tmp_path / "rep") / "README.md").read_text(encoding="utf-8")
    rows = _table_rows(md)
    names = [line.split(" | ")[0].lstrip("| ") for line in md.splitlines()
             if line.startswith("| ") and "/seed_0" in line]
    assert names == ["pretrained/lee/seed_0", "random/lee/seed_0", "polarity/seed_0"]
    assert rows["run"][:3] == ["task", "init", "score"]
    assert rows["pretrained/lee/seed_0"][:3] == ["lee", "/runs/base (step 200)", "64.8"]
    assert rows["random/lee/seed_0"][:3] == ["lee", "random", "40.1"]
    assert rows["polarity/seed_0"][:2] == ["lee", "/runs/base/hf"]
