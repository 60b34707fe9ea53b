"""LeaseFence: whether the leases a manager holds on a shared Redis queue are still its own.

A manager's leases last ``lease_timeout`` past its last renewal, on the server's clock;
then a peer may take its jobs back. A manager that was paused (SIGSTOP, a VM stall) past
that learns it only at its next heartbeat, while its takers and its local workers may be
about to start a job it claimed before. So nothing starts unless the fence says so:

- ``valid_until``: the manager's last heartbeat that Redis answered was sent at T, so its
  leases hold until T + lease_timeout on any clock running at the server's rate; the
  fence keeps a margin (SAFE) and measures it on this host's monotonic clock;
- ``stale_below``: the heartbeat that finds the manager presumed dead (its jobs taken
  back) makes every lease granted so far stale: lease ids only grow.

A taker hands a batch out only if its leases are not stale and ``valid_until`` is ahead
(else it asks for a heartbeat now and waits for its answer); a local worker checks the
same two values, shared with it through its claim slot (mpsched._worker.claims), right
before it starts each job. The check costs one comparison per job while the manager beats
on time. Only the heartbeat thread moves the fence (a claim renews the lease in Redis too,
but a claim may answer between a take-back and the heartbeat that reports it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

SAFE = 0.9  # share of lease_timeout past a renewal's sending during which leases are held
NEVER_NS = (1 << 63) - 1  # valid_until before the first heartbeat's answer: no fence


class LeaseFence:
    """The fence of one manager's leases (see the module docstring).

    Args:
        lease_timeout: seconds a renewal keeps this manager's leases, on the server.
        now: this manager's monotonic clock (the queue's).
    """

    def __init__(self, lease_timeout: float, now: Callable[[], float]) -> None:
        self._lease = lease_timeout
        self._now = now
        # Guards the fields below. Takers wait on _moved for a heartbeat's answer
        # (wait_valid); renewed() and taken_back() notify all.
        self._lock = threading.Lock()
        self._moved = threading.Condition(self._lock)
        self._valid_until = math.inf  # no fence until the first heartbeat's answer
        self._valid_ns = NEVER_NS  # the same instant, for the local workers
        self._stale_below = 0
        self._ask: Callable[[], None] = lambda: None
        self._publish: list[Callable[[int, int], None]] = []

    def on_ask(self, ask: Callable[[], None]) -> None:
        """How a taker asks for a heartbeat now (the link's beat_now)."""
        self._ask = ask

    def on_change(self, publish: Callable[[int, int], None]) -> None:
        """Called with (valid until, in time.monotonic_ns(); stale below) each time the
        fence moves, and once now: the local workers' claim slots."""
        with self._lock:
            self._publish.append(publish)
            values = self._values_locked()
        publish(*values)

    def renewed(self, sent_at: float, sent_ns: int) -> None:
        """A heartbeat sent at ``sent_at`` (this clock; ``sent_ns``: time.monotonic_ns())
        was answered: the leases hold for SAFE x lease_timeout past it."""
        with self._lock:
            self._valid_until = sent_at + SAFE * self._lease
            self._valid_ns = sent_ns + int(SAFE * self._lease * 1e9)
            self._moved_locked()

    def taken_back(self, next_lease: int) -> None:
        """This manager was presumed dead and its jobs taken back: every lease below
        ``next_lease`` is stale."""
        with self._lock:
            self._stale_below = max(self._stale_below, next_lease)
            self._moved_locked()

    @property
    def stale_below(self) -> int:
        """Leases below this id were taken back (0: never); one int, read whole."""
        return self._stale_below

    def stale(self, lease_id: int) -> bool:
        with self._lock:
            return lease_id < self._stale_below

    def wait_valid(self, lowest: int, timeout: float) -> bool:
        """Whether leases from ``lowest`` on may start: not stale and held now, asking for
        a heartbeat and waiting (``timeout`` seconds at most) for its answer if they may
        have run out. False: stale, or still in doubt after ``timeout``."""
        deadline = self._now() + timeout
        with self._lock:
            while lowest >= self._stale_below:
                now = self._now()
                if now < self._valid_until:
                    return True
                if now >= deadline:
                    return False
                self._ask()
                self._moved.wait(min(deadline - now, 0.1))
            return False

    def _values_locked(self) -> tuple[int, int]:
        return self._valid_ns, self._stale_below

    def _moved_locked(self) -> None:
        self._moved.notify_all()
        values = self._values_locked()
        for publish in self._publish:
            publish(*values)
