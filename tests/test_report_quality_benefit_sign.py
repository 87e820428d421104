"""bench quality's "benefit > spread" verdict is signed: pretraining that hurts (a negative
benefit larger in size than the seed spread) is "no", not "yes". A probe that compared the
benefit's absolute value found no test failing."""

from __future__ import annotations

import statistics

import pytest

from bertgpu.report.quality import comparisons, downstream_table


def _row(init: str, scores: list[float]) -> dict:
    return {"kind": "finetune", "name": "tiny", "init": init, "task": "polarity",
            "metric": "accuracy", "seeds": list(range(len(scores))), "scores": scores,
            "median": statistics.median(scores), "min": min(scores), "max": max(scores),
            "spread": max(scores) - min(scores)}


@pytest.mark.parametrize("pre, rnd, benefit, verdict", [
    ([70.0, 72.0], [50.0, 52.0], "+20.0", "yes"),   # helps, beyond the spread of 2
    ([50.0, 52.0], [70.0, 72.0], "-20.0", "no"),    # hurts by as much: not a benefit
    ([60.0, 62.0], [59.0, 61.0], "+1.0", "no"),     # helps, within the spread
])
def test_benefit_beats_spread_only_when_positive(pre, rnd, benefit, verdict):
    rows = [_row("pretrained", pre), _row("random", rnd)]
    (c,) = comparisons(rows)
    assert c["beats_spread"] is (verdict == "yes")
    _, cells = downstream_table(rows)
    assert cells[0][-3:] == [benefit, "2.0", verdict]
