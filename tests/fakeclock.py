"""A fake clock for JobQueue: time moves only when a test calls ``advance``.

``FakeClock.condition(lock)`` returns a condition whose timed waits expire on fake time,
so leader/follower behaviour is tested with real threads but without sleeping: a test
waits (on an event, with a real safety bound) until the expected number of threads are
parked, then advances the clock or submits.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

SAFETY = 30.0  # real seconds a parked thread or a test may wait before failing loudly


@dataclass(eq=False)
class _Waiter:
    deadline: float | None
    woken: threading.Event = field(default_factory=threading.Event)
    notified: bool = False


class FakeCondition:
    """``threading.Condition`` semantics (FIFO notify) with timeouts on fake time."""

    def __init__(self, clock: FakeClock, lock: threading.Lock) -> None:
        self._clock = clock
        self._lock = lock
        self._waiters: list[_Waiter] = []  # guarded by the queue's lock
        self.wakeups = 0  # returns from wait(), for O(1) wake-up assertions

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None:
            timeout *= 1 + self._clock.oversleep
        deadline = None if timeout is None else self._clock.now() + timeout
        waiter = _Waiter(deadline)
        self._waiters.append(waiter)
        self._clock._parked(+1)
        if deadline is not None and deadline <= self._clock.now():
            self._expire_locked(self._clock.now())
        self._lock.release()
        try:
            if not waiter.woken.wait(SAFETY):
                raise AssertionError("a FakeCondition waiter was never woken")
        finally:
            self._lock.acquire()
            self.wakeups += 1
        return waiter.notified

    def notify(self, n: int = 1) -> None:
        for waiter in self._waiters[:n]:
            self._release_locked(waiter, notified=True)

    def notify_all(self) -> None:
        self.notify(len(self._waiters))

    def _expire_locked(self, now: float) -> None:
        for waiter in [w for w in self._waiters if w.deadline is not None and w.deadline <= now]:
            self._release_locked(waiter, notified=False)

    def _release_locked(self, waiter: _Waiter, *, notified: bool) -> None:
        self._waiters.remove(waiter)
        waiter.notified = notified
        self._clock._parked(-1)
        waiter.woken.set()

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class FakeClock:
    """Monotonic and wall time that move only on ``advance``.

    ``oversleep``: every timed wait lasts that share longer than asked, as on machines
    whose timers run late (0.003: a 2 s wait ends 6 ms late).
    """

    def __init__(
        self, start: float = 1000.0, wall_offset: float = 1.7e9, oversleep: float = 0.0
    ) -> None:
        self._now = start
        self.oversleep = oversleep
        self.wall_offset = wall_offset
        self._conditions: list[tuple[FakeCondition, threading.Lock]] = []
        # Guards _parked_count; tests wait on it until the expected threads are parked.
        self._parked_cond = threading.Condition()
        self._parked_count = 0

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self.wall_offset

    def condition(self, lock: threading.Lock) -> FakeCondition:
        cond = FakeCondition(self, lock)
        self._conditions.append((cond, lock))
        return cond

    def next_deadline(self) -> float | None:
        """When the first timed wait ends (None: no timed wait)."""
        deadlines = []
        for cond, lock in self._conditions:
            with lock:
                deadlines += [w.deadline for w in cond._waiters if w.deadline is not None]
        return min(deadlines, default=None)

    def advance(self, seconds: float) -> None:
        """Move time on and expire every timed wait whose deadline has passed."""
        self._now += seconds
        for cond, lock in self._conditions:
            with lock:
                cond._expire_locked(self._now)

    def _parked(self, delta: int) -> None:
        with self._parked_cond:
            self._parked_count += delta
            self._parked_cond.notify_all()

    def wait_parked(self, count: int) -> None:
        """Block (really) until exactly ``count`` threads are parked in fake waits."""
        with self._parked_cond:
            ok = self._parked_cond.wait_for(lambda: self._parked_count == count, SAFETY)
        if not ok:
            raise AssertionError(f"expected {count} parked waiters, have {self._parked_count}")
