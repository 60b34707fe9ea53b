from __future__ import annotations

import math

import pytest

from mpsched._core.histogram import LATENESS_BOUNDS, Histogram, empty


def test_an_observation_counts_in_the_first_bucket_whose_bound_holds_it() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.0, 0.1, 0.5, 1.0, 7.0):
        histogram.observe(value)
    snap = histogram.snapshot()
    assert snap.counts == (2, 2, 1)  # <= 0.1, <= 1.0 (above 0.1), above every bound
    assert snap.cumulative() == [2, 4, 5]
    assert snap.observations == 5
    assert snap.total == pytest.approx(8.6)


def test_a_window_is_the_difference_of_two_snapshots() -> None:
    histogram = Histogram((0.1, 1.0))
    histogram.observe(0.05)
    before = histogram.snapshot()
    histogram.observe(0.5)
    histogram.observe(3.0)
    window = histogram.snapshot().since(before)
    assert window.counts == (0, 1, 1)
    assert window.total == pytest.approx(3.5)
    with pytest.raises(ValueError, match="different bounds"):
        window.since(empty((1.0,)))


def test_a_quantile_is_the_bound_of_its_bucket() -> None:
    histogram = Histogram((0.1, 1.0))
    assert histogram.snapshot().quantile(0.5) is None
    for value in (0.05, 0.06, 0.07, 0.5):
        histogram.observe(value)
    snap = histogram.snapshot()
    assert snap.quantile(0.5) == 0.1
    assert snap.quantile(1.0) == 1.0
    histogram.observe(9.0)
    assert histogram.snapshot().quantile(1.0) == math.inf


@pytest.mark.parametrize(
    "bounds",
    [(), (1.0, 1.0), (2.0, 1.0), (1.0, math.inf)],
    ids=["none", "equal", "decreasing", "infinite"],
)
def test_bounds_must_be_finite_and_increasing(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="finite and increasing"):
        Histogram(bounds)


def test_the_lateness_buckets_span_the_timer_floor_to_a_minute() -> None:
    assert LATENESS_BOUNDS[0] <= 0.0001 and LATENESS_BOUNDS[-1] >= 60
    Histogram(LATENESS_BOUNDS)  # valid
