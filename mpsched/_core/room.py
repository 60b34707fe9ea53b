"""Room: the bounds on what a queue holds pending (jobs, payload bytes), and the wait of a
submitter for room under them (a bounded queue's ``notFull`` condition).

No lock of its own: it shares its JobQueue's, and every method but the constructor and
:meth:`Room.batch_size` is called with that lock held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mpsched._core.clock import Clock, Waitable
from mpsched._core.job import JobRequest, Payload
from mpsched._core.queues import PendingQueues
from mpsched._errors import ConfigError, InvalidJobError, QueueFullError, SchedulerShutdownError


def check_fits(count: int, size: int, max_pending: int | None, max_bytes: int | None) -> None:
    """Refuse a batch of ``count`` jobs of ``size`` payload bytes that could never fit
    the bounds, however many jobs leave the queue (None: no bound).

    Raises:
        InvalidJobError: the batch is larger than either bound.
    """
    if max_pending is not None and count > max_pending:
        raise InvalidJobError(f"a batch of {count} jobs can never fit max_pending={max_pending}")
    if max_bytes is not None and size > max_bytes:
        raise InvalidJobError(
            f"a batch of {size} payload bytes can never fit max_pending_bytes={max_bytes}"
        )


class Room:
    """``max_pending`` jobs and ``max_bytes`` payload bytes (as ``sizer`` counts them) at
    most in ``pending``; None: no bound."""

    def __init__(
        self,
        lock: threading.Lock,
        clock: Clock,
        pending: PendingQueues,
        max_pending: int | None,
        max_bytes: int | None,
        sizer: Callable[[Payload], int],
    ) -> None:
        if max_pending is not None and max_pending < 1:
            raise ConfigError("max_pending", max_pending, "at least 1")
        if max_bytes is not None and max_bytes < 1:
            raise ConfigError("max_pending_bytes", max_bytes, "at least 1")
        self.max_pending = max_pending
        self.max_bytes = max_bytes
        self._clock = clock
        self._pending = pending
        self._sizer = sizer
        # Submitters wait here while a bound is reached. Notified (all of them: a woken
        # batch that still does not fit must not swallow the wake-up of a smaller one
        # that would) each time a pending job leaves the heap; all by close_locked().
        self._room = clock.condition(lock)
        self._waiting = 0  # submitters inside a wait for room
        self._closed = False

    def batch_size(self, requests: list[JobRequest]) -> int:
        """The payload bytes of a batch, checked against the bounds it can never fit.

        Raises:
            InvalidJobError: the batch is larger than either bound.
        """
        size = 0 if self.max_bytes is None else sum(self._sizer(r.payload) for r in requests)
        check_fits(len(requests), size, self.max_pending, self.max_bytes)
        return size

    def wait_locked(
        self,
        now: float,
        timeout: float | None,
        count: int,
        size: int,
        wait: Callable[[Waitable, float | None], None],
    ) -> None:
        """Wait until ``count`` jobs of ``size`` payload bytes fit, up to ``timeout``
        seconds; ``wait`` is the queue's condition wait (it counts waits).

        Raises:
            QueueFullError: no room within ``timeout``.
            SchedulerShutdownError: the queue was closed.
        """
        if self._closed:
            raise SchedulerShutdownError("the queue is closed")
        if self.max_pending is None and self.max_bytes is None:
            return
        deadline = None if timeout is None else now + timeout
        while full := self._full_locked(count, size):
            remaining = None if deadline is None else deadline - self._clock.now()
            if remaining is not None and remaining <= 0:
                raise QueueFullError(full[0], timeout, full[1])
            self._waiting += 1
            try:
                wait(self._room, remaining)
            finally:
                self._waiting -= 1
            if self._closed:
                raise SchedulerShutdownError("the queue is closed")

    def left_locked(self) -> None:
        """Pending jobs left the heap: wake the submitters waiting for room."""
        if self._waiting:
            self._room.notify_all()

    def close_locked(self) -> None:
        """Every waiting and future wait raises SchedulerShutdownError."""
        self._closed = True
        self._room.notify_all()

    def _full_locked(self, count: int, size: int) -> tuple[int, str] | None:
        """The bound that ``count`` more jobs of ``size`` payload bytes would pass."""
        if self.max_pending is not None and len(self._pending) + count > self.max_pending:
            return self.max_pending, "jobs"
        if self.max_bytes is not None and self._pending.bytes + size > self.max_bytes:
            return self.max_bytes, "payload bytes"
        return None
