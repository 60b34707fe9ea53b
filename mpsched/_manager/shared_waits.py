"""TakerWaits: when the takers of a manager on a shared Redis queue ask Redis, and how long
they wait in between.

Waiting is leader/follower across managers and inside this one (the diagram is in
mpsched._manager.shared_queue). A taker whose claim found nothing new since the last
wake-up waits without asking Redis again, so idle managers send nothing but their
heartbeats (and the leader's look every LEAD_SPAN seconds while a job waits in the future).
Only durations measured on the server's clock (the head's delay) cross to this manager,
which times them on its own monotonic clock.
"""

from __future__ import annotations

import threading

from mpsched._core.clock import Clock, Waitable, ahead
from mpsched._store.redis.records import Reply

# A taker's wait after Redis failed, doubling up to the second: the link's look at the
# store (as often) wakes every taker the moment it answers again.
BACKOFF = (0.1, 1.0)
FOLLOW_GRACE = 0.01  # a follower looks again this long after the leader's lead lapses
ASK = 0.0  # a taker's wait that means: claim now


class TakerWaits:
    """The waiting of one manager's takers (see the module docstring).

    Args:
        lock: the shared queue's lock, which guards every field here. ``closed``,
            ``gen`` and ``waiting`` are read by the takers under it.
    """

    def __init__(self, lock: threading.Lock, clock: Clock) -> None:
        self._lock = lock
        self._clock = clock
        # Takers wait here: timed by the local leader (the head's delay), until the lead
        # of another manager lapses, or untimed. Notified (one) by a wake-up (a new head,
        # a free lead: wake()), by a taker that leaves while more is due or no taker
        # leads; all by close().
        self._available: Waitable = clock.condition(lock)
        # Takers of this manager serve different queues: each asks Redis for itself
        # (one's empty claim says nothing of another's queues) and waits timed for the
        # head of its own; a wake-up wakes them all.
        self._mixed = False
        self.gen = 0  # wake-ups so far: a claim older than the last one may be stale
        self._leader: object | None = None  # the taker that times the head for us
        self._idle_gen: int | None = None  # the queue was empty at this generation
        self._follow_until: float | None = None  # another manager leads until then
        self.waiting = 0
        self._wakeups = 0
        self._backoff = BACKOFF[0]
        self.closed = False

    def set_mixed_locked(self, mixed: bool) -> None:
        """Whether this manager's takers serve different queues."""
        self._mixed = mixed

    def counts_locked(self) -> tuple[int, int]:
        """Takers waiting now, and the wake-ups of takers so far."""
        return self.waiting, self._wakeups

    def known_wait_locked(self) -> float | None:
        """How long a new taker may wait without asking Redis, nothing having changed
        since it was last asked (None: until woken); ASK when it must ask."""
        if self._mixed:
            return ASK  # what another taker saw says nothing of this one's queues
        if self._leader is not None:
            return None  # follow our own leader, untimed
        if self._idle_gen == self.gen:
            return None  # empty, and nothing was submitted since
        if self._follow_until is not None and self._follow_until > self._clock.now():
            return self._follow_until - self._clock.now()
        return ASK

    def handed_locked(self, head_in: float | None, early: float) -> None:
        """A claim brought jobs (``head_in``: the next head's delay, from its reply)."""
        self._backoff = BACKOFF[0]
        if self.waiting and (self._leader is None or (head_in is not None and head_in <= early)):
            self._available.notify()  # more is due, or nobody times the head: pass it on

    def after_locked(self, reply: Reply | None, early: float) -> tuple[float | None, object | None]:
        """How long a taker that claimed nothing waits (None: until woken; 0.0: it
        claims again at once), and its lead token when it times the head for us."""
        if reply is None:
            wait, self._backoff = self._backoff, min(self._backoff * 2, BACKOFF[1])
            return wait, None
        self._backoff = BACKOFF[0]
        if reply.head_in is None:
            self._idle_gen = self.gen
            return None, None
        if reply.leader:
            self._follow_until = None
            if self._mixed:  # each times the head of its own queues
                return max(ahead(reply.head_in - early), 1e-6), None
            if self._leader is not None:
                return None, None  # another taker of ours times it already
            self._leader = lead = object()
            return max(ahead(reply.head_in - early), 1e-6), lead
        if reply.leader_left is not None:
            self._follow_until = self._clock.now() + reply.leader_left + FOLLOW_GRACE
            return reply.leader_left + FOLLOW_GRACE, None
        return ASK, None  # the head is due: another manager raced us to it

    def wait_locked(self, timeout: float, lead: object | None) -> None:
        """Wait ``timeout`` seconds at most (``lead``: the taker times the head for us)."""
        self.waiting += 1
        try:
            self._available.wait(timeout)
        finally:
            self.waiting -= 1
            self._wakeups += 1
            if lead is not None and self._leader is lead:
                self._leader = None  # it looks again now

    def leave_locked(self, lead: object | None) -> None:
        """A taker leaves empty-handed: a waiting taker looks, if nobody leads."""
        if lead is not None and self._leader is lead:
            self._leader = None
        if self.waiting and self._leader is None and self._idle_gen != self.gen:
            self._available.notify()

    def wake(self) -> None:
        """Something changed in Redis: one waiting taker looks again."""
        with self._lock:
            self.gen += 1
            self._leader = None
            self._idle_gen = self._follow_until = None
            if self.waiting and self._mixed:
                self._available.notify_all()  # each looks at its own queues
            elif self.waiting:
                self._available.notify()

    def wake_all(self) -> None:
        """The store answers again after an outage: every waiting taker looks at once."""
        with self._lock:
            self.gen += 1
            self._leader = None
            self._idle_gen = self._follow_until = None
            self._backoff = BACKOFF[0]
            self._available.notify_all()

    def close(self) -> None:
        """Every waiting taker wakes, and finds the queue closed."""
        with self._lock:
            self.closed = True
            self._available.notify_all()
