from __future__ import annotations

from mpsched._core.histogram import Histogram
from mpsched._manager.http.history import LatenessHistory


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_chart_shows_what_was_observed_within_the_window() -> None:
    clock, histogram = Clock(), Histogram((0.001, 0.01))
    reads: list[float] = []

    def read() -> object:
        reads.append(clock.now)
        return histogram.snapshot()

    history = LatenessHistory(read, every=5, window=60, clock=clock)  # type: ignore[arg-type]
    histogram.observe(0.0005)  # at 0 s
    for second in range(1, 100):
        clock.now = float(second)
        history.tick()
        if second == 50:
            histogram.observe(0.005)
    window, covered = history.recent()
    assert window.counts == (0, 1, 0)  # the observation at 0 s is out of the window
    assert 60 <= covered < 65
    assert reads.count(97.0) == 0 and len(reads) == 21  # one copy every 5 s, plus recent()


def test_a_young_manager_shows_everything_since_it_started() -> None:
    clock, histogram = Clock(), Histogram((0.001,))
    history = LatenessHistory(histogram.snapshot, every=5, window=60, clock=clock)
    histogram.observe(0.0001)
    clock.now = 12.0
    history.tick()
    histogram.observe(0.5)
    window, covered = history.recent()
    assert window.counts == (1, 1) and covered == 12.0
