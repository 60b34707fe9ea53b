"""Admission: a due job of a limit starts only while its limit has a slot.

A taker that pops a job of a full limit parks it (mpsched._core.queues) and goes on to
the next due job: no taker ever waits behind it, and it uses no attempt. A slot frees when
a lease of that limit ends (an end, a crash, a timeout, a job taken back), and the next
parked jobs go back to their queue's heap at once, waking a taker. A full rate window
opens at a known instant: the leader's timed wait counts it like a due time.

No lock of its own: it shares its JobQueue's. Methods ending in ``_locked`` are called
with it held.
"""

from __future__ import annotations

from collections.abc import Callable

from mpsched._core.clock import Clock
from mpsched._core.job import Job
from mpsched._core.limits import Limits, LimitSpec
from mpsched._core.queues import PendingQueues


class Admission:
    """The limits of one JobQueue and the parked jobs' way back into its heaps.

    ``push`` is the move of a job into the heap (HandOut's: it tells takers of a new head).
    """

    def __init__(
        self, limits: Limits, clock: Clock, pending: PendingQueues, *, push: Callable[[Job], None]
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._pending = pending
        self._push = push
        # When the full rate window of each limit with parked jobs opens (read by takes:
        # empty on the plain path, so a take checks it without a call).
        self.opens: dict[str, float] = {}

    def admit_locked(self, job: Job, now: float) -> bool:
        """Take a slot of ``job.limit`` for ``job``, just popped; else park it (False)."""
        assert job.limit is not None
        if self.limits.admit_locked(job.limit, now):
            if self._pending.parked_count(job.limit):  # it may have filled the window
                self._note_window_locked(job.limit, now)
            return True
        self._pending.park(job)
        self._note_window_locked(job.limit, now)
        return False

    def ended_locked(self, job: Job) -> None:
        """A lease of ``job`` (of a limit) ended: its slot goes to the next parked job."""
        assert job.limit is not None
        self.limits.ended_locked(job.limit)
        if self._pending.parked_count(job.limit):
            self.release_locked(job.limit, self._clock.now())

    def set_locked(self, name: str, spec: LimitSpec | None) -> None:
        """Change a limit now; parked jobs it now admits go back to their queue."""
        self.limits.set_locked(name, spec)
        self.opens.pop(name, None)
        if self._pending.parked_count(name):
            self.release_locked(name, self._clock.now())

    def next_open_locked(self) -> float | None:
        """The earliest instant a rate window with parked jobs opens (None: none)."""
        return min(self.opens.values(), default=None) if self.opens else None

    def reopen_locked(self, now: float) -> None:
        """Let back the parked jobs of every rate window that has opened by ``now``."""
        for name, opens in list(self.opens.items()):
            if opens <= now:
                del self.opens[name]
                self.release_locked(name, now)

    def release_locked(self, name: str, now: float) -> None:
        """As many parked jobs of ``name`` as it has room for back in their queue."""
        free = self.limits.free_locked(name, now)
        for job in self._pending.unpark(name, free):
            self._push(job)
        if self._pending.parked_count(name):
            self._note_window_locked(name, now)

    def _note_window_locked(self, name: str, now: float) -> None:
        opens = self.limits.opens_locked(name, now)
        if opens is not None:
            self.opens[name] = opens
