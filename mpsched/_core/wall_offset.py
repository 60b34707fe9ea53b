"""Due times for jobs asked for ``at=`` a wall-clock time, on a queue's monotonic clock.

One wall-to-monotonic offset maps them, re-read only on real drift: equal ``at`` values
must keep equal due times (so ties break by priority, then FIFO), which a fresh offset per
job would not give. A job about to start before its wall-clock time (the wall clock fell
behind since the job came in: slewed by NTP, or set back) is held until it gets there.

No lock of its own: it shares its JobQueue's, and is called with that lock held.
"""

from __future__ import annotations

import math

from mpsched._core.clock import Clock
from mpsched._core.job import Job, JobRequest

# Drift between the wall clock and the monotonic clock that makes us re-read their offset.
# Below it, equal ``at`` values must keep getting equal due times (so ties break by
# priority, then FIFO), which a fresh offset per submit would not give.
WALL_OFFSET_RESYNC = 1e-3

# A job asked for at a wall-clock time is held when, handed out now, it would start more
# than this before that time by the wall clock (a wall clock that fell behind the
# monotonic one since the job came in: slewed by NTP, or set back). Below it, the
# difference is the clocks' reading noise, far less than a job takes to be entered.
WALL_EARLY_TOLERANCE = 1e-5

# The wall-to-monotonic offset is read between two monotonic reads at most this far apart,
# else read again (up to OFFSET_READS times, keeping the closest pair): a thread switch
# between the reads (the GIL's 5 ms switch interval, the OS) would skew it by its length,
# and a skew over WALL_OFFSET_RESYNC would give equal ``at`` values unequal due times.
OFFSET_BRACKET = 50e-6
OFFSET_READS = 4


class WallOffset:
    """The queue's one wall-to-monotonic offset."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._offset: float | None = None

    def fresh(self) -> float:
        """The wall clock's offset from the monotonic clock, read now: the wall time
        less the middle of the two monotonic reads around it, from the closest pair.
        (Not from a caller's ``now``: the time its batch or take began, which may be a
        thread switch old.)"""
        best, width = 0.0, math.inf
        for _ in range(OFFSET_READS):
            before = self._clock.now()
            wall = self._clock.wall()
            after = self._clock.now()
            if after - before < width:
                best, width = wall - (before + after) / 2, after - before
                if width <= OFFSET_BRACKET:
                    break
        return best

    def due_locked(self, request: JobRequest, now: float) -> float:
        """A request's due time on the monotonic clock, no earlier than ``now``."""
        if request.at is not None:
            fresh = self.fresh()
            if self._offset is None or abs(fresh - self._offset) > WALL_OFFSET_RESYNC:
                self._offset = fresh
            due = request.at - self._offset
        else:
            due = now + (request.delay or 0.0)
        return max(due, now)

    def early_locked(self, job: Job, now: float, fresh: float | None = None) -> bool:
        """Whether ``job`` (asked for ``at=``), started now, would start before that time
        by the wall clock (``fresh``: the wall-to-monotonic offset, read now if None)."""
        assert job.at is not None
        if fresh is None:
            fresh = self.fresh()
        return job.at - fresh > job.due + WALL_EARLY_TOLERANCE

    def held_due_locked(self, job: Job, now: float) -> float | None:
        """For a job just popped for ``at=``: None if it may start now; else the due time
        to put it back with (the offset as it is now, kept for the jobs popped after it,
        so equal ``at`` values keep equal due times)."""
        assert job.at is not None
        fresh = self.fresh()
        if not self.early_locked(job, now, fresh):
            return None
        if self._offset is None or abs(fresh - self._offset) > WALL_EARLY_TOLERANCE:
            self._offset = fresh
        return job.at - self._offset
