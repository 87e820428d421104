"""`bertgpu demo --seeds 0` measured no seed spread, but its closing lines counted every set as
"not beating the spread" and called the difference "seed noise, not a benefit" (the report's
table already says "n/a (one seed)")."""

from __future__ import annotations

import statistics


def _rows(pre: dict[str, list[float]], rnd: dict[str, list[float]], seeds: list[int]) -> list:
    rows = []
    for init, by_task in (("pretrained", pre), ("random", rnd)):
        for task, scores in by_task.items():
            rows.append({"kind": "finetune", "name": "modern-tiny", "init": init, "task": task,
                         "metric": "accuracy", "train_examples": 10, "dev_examples": 5,
                         "seeds": seeds, "scores": scores, "median": statistics.median(scores),
                         "min": min(scores), "max": max(scores),
                         "spread": max(scores) - min(scores)})
    return rows


def test_one_seed_says_no_spread_was_measured(monkeypatch, tmp_path):
    from bertgpu import demo
    from bertgpu.bench import quality

    rows = _rows({"polarity": [80.0], "lee": [70.0]}, {"polarity": [50.0], "lee": [69.0]}, [0])
    monkeypatch.setattr(quality, "compare_downstream", lambda inits, sets, seeds, out: rows)
    text = demo.finetune_table(tmp_path / "hf", tmp_path / "ft", [0], "modern-tiny")
    assert "Seed 0 alone measures no seed spread" in text
    assert "seed noise, not a benefit" not in text and "of 2 sets" not in text
