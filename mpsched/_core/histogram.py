"""Histogram: observations counted in fixed buckets, as a Prometheus histogram keeps them.

Counting costs one bisection of a short tuple and two additions per observation, so the
manager can keep one on a per-job path (a job's lateness) and one per store commit. No lock
of its own: the owner calls :meth:`Histogram.observe` and :meth:`Histogram.snapshot` with
its own lock held (the queue's, the store writer's). Pure: no clock, no I/O.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from typing import NamedTuple

# Seconds from a job's due time to its start: from the timer's floor (~0.1 ms) to a minute.
LATENESS_BOUNDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Seconds one store commit takes, its fsync included.
COMMIT_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class HistogramSnapshot(NamedTuple):
    """A histogram's state at one moment.

    ``counts`` has one entry per bucket, not cumulative: ``counts[i]`` observations were at
    most ``bounds[i]`` and above ``bounds[i - 1]``; the last entry counts those above every
    bound (Prometheus' ``+Inf`` bucket holds them all).
    """

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total: float  # the sum of every observation

    @property
    def observations(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """Observations at most each bound, then all of them (Prometheus' ``le`` buckets)."""
        running, out = 0, []
        for n in self.counts:
            running += n
            out.append(running)
        return out

    def since(self, earlier: HistogramSnapshot) -> HistogramSnapshot:
        """What was observed after ``earlier`` (a snapshot of the same histogram)."""
        if earlier.bounds != self.bounds:
            raise ValueError("snapshots of histograms with different bounds")
        counts = tuple(now - then for now, then in zip(self.counts, earlier.counts, strict=True))
        return HistogramSnapshot(
            bounds=self.bounds, counts=counts, total=self.total - earlier.total
        )

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile (0 < q <= 1); None with
        no observation, ``math.inf`` when it lies above every bound."""
        total = self.observations
        if not total:
            return None
        rank = max(1, math.ceil(q * total))
        for bound, seen in zip((*self.bounds, math.inf), self.cumulative(), strict=True):
            if seen >= rank:
                return bound
        return math.inf  # pragma: no cover - the last cumulative count is the total


def empty(bounds: tuple[float, ...]) -> HistogramSnapshot:
    """A snapshot with nothing observed."""
    return HistogramSnapshot(bounds=bounds, counts=(0,) * (len(bounds) + 1), total=0.0)


class Histogram:
    """Counts of observations per bucket, with their sum; guarded by its owner's lock."""

    __slots__ = ("_counts", "_total", "bounds")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        """``bounds``: the buckets' upper bounds, finite and strictly increasing.

        Raises:
            ValueError: bounds that are not so.
        """
        if (
            not bounds
            or any(not math.isfinite(b) for b in bounds)
            or any(a >= b for a, b in itertools.pairwise(bounds))
        ):
            raise ValueError(f"histogram bounds must be finite and increasing: {bounds}")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._total = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is at least it."""
        self._counts[bisect_left(self.bounds, value)] += 1
        self._total += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(bounds=self.bounds, counts=tuple(self._counts), total=self._total)
