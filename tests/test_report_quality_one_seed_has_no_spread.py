"""With one fine-tuning seed, bench quality's table (and the demo's, drawn by the same function)
said the benefit was beyond the seed spread ("+2.5 | 0.0 | yes"): one seed has a spread of 0 by
construction, so any benefit "beat" it. It now says the spread was not measured."""

from __future__ import annotations

from bertgpu.report.quality import comparisons, downstream_table


def _row(init: str, scores: list[float]) -> dict:
    return {"kind": "finetune", "name": "tiny", "init": init, "task": "polarity",
            "metric": "accuracy", "seeds": list(range(len(scores))), "scores": scores,
            "median": sorted(scores)[len(scores) // 2], "min": min(scores), "max": max(scores),
            "spread": max(scores) - min(scores)}


def test_one_seed_has_no_spread_and_no_verdict():
    rows = [_row("pretrained", [52.5]), _row("random", [50.0])]
    (c,) = comparisons(rows)
    assert c["benefit"] == 2.5 and "beats_spread" not in c and "spread" not in c
    _, cells = downstream_table(rows)
    assert cells == [["tiny", "polarity", "accuracy", "52.5", "50.0", "+2.5",
                      "n/a (one seed)", "n/a (one seed)"]]


def test_two_seeds_still_get_their_spread_and_verdict():
    rows = [_row("pretrained", [50.0, 60.0]), _row("random", [50.0, 51.0])]  # +9 < 10
    _, cells = downstream_table(rows)
    assert cells[0][-3:] == ["+9.0", "10.0", "no"]
