"""LatenessHistory: the recent past of the lateness histogram, for the page's chart.

The queue counts every job's lateness since the start (mpsched._core.histogram); a chart
of "the last five minutes" is the difference between the histogram now and as it was five
minutes ago. Each request for the page's data calls :meth:`LatenessHistory.tick`, which
copies the histogram when the latest copy is ``every`` seconds old: a few dozen integers
under the queue's lock, never per job, and nothing at all while nobody looks (the chart
then covers the time since the last look, and says how long that is).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from mpsched._core.histogram import HistogramSnapshot

EVERY = 5.0  # seconds between two copies of the histogram
WINDOW = 300.0  # seconds the chart covers


class LatenessHistory:
    """Copies of a histogram over the last ``window`` seconds. Thread-safe."""

    def __init__(
        self,
        read: Callable[[], HistogramSnapshot],
        *,
        every: float = EVERY,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``read``: returns the histogram as it is now (it takes the owner's lock)."""
        self._read = read
        self._every = every
        self._window = window
        self._clock = clock
        # Guards _copies; held to look or to append (``read`` runs under it: this lock is
        # taken before the queue's, never after). Nobody waits on it.
        self._lock = threading.Lock()
        self._copies: deque[tuple[float, HistogramSnapshot]] = deque()
        self.tick()

    def tick(self) -> None:
        """Copy the histogram if the latest copy is ``every`` seconds old; drop copies older
        than the window (one is kept from before it, the baseline of the window)."""
        now = self._clock()
        with self._lock:
            if self._copies and now - self._copies[-1][0] < self._every:
                return
            self._copies.append((now, self._read()))
            while len(self._copies) > 1 and self._copies[1][0] <= now - self._window:
                self._copies.popleft()

    def recent(self) -> tuple[HistogramSnapshot, float]:
        """What was observed over (about) the window, and how many seconds that covers:
        less than the window while the manager is younger than it."""
        now, current = self._clock(), self._read()
        with self._lock:
            since, baseline = self._copies[0]
        return current.since(baseline), now - since
