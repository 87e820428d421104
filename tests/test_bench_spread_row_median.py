"""The quality bench's "median" over fine-tuning seeds is the median, not the mean: with two
seeds they agree, so a probe that took the mean found no test failing."""

from __future__ import annotations

import pytest

from bertgpu.bench.downstream import spread_row


@pytest.mark.parametrize("scores, median", [
    ([51.0, 60.0, 50.0], 51.0),          # mean 53.67
    ([80.0, 10.0, 75.0, 70.0], 72.5),    # even count: the middle two's mean; mean 58.75
    ([42.0], 42.0),
])
def test_spread_row_takes_the_median_of_uneven_seeds(scores, median):
    row = spread_row(scores)
    assert row["median"] == pytest.approx(median)
    assert (row["min"], row["max"]) == (min(scores), max(scores))
    assert row["spread"] == pytest.approx(max(scores) - min(scores))
