"""Time as the pure core sees it: a monotonic now, the wall clock, and timed waits.

Injected into JobQueue and its lease table, so tests drive them with a fake clock
(tests/fakeclock.py) and real threads, without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

# A timed wait ends late by a share of its length on some machines (seen on a 2-core VM:
# 0.1-0.3%, so a 2 s wait ended 2-6 ms late), more than the lateness mpsched promises. A
# wait for a due time therefore ends AHEAD_SHARE of its length early, and the waiter waits
# again for the rest (ahead()): what is left late is the timer's share of the last wait,
# which lasts at most SHORT_WAIT, for about log(delay / SHORT_WAIT) / log(1 / AHEAD_SHARE)
# more wake-ups (two more for a 2 s wait, four for an hour).
AHEAD_SHARE = 1 / 64
SHORT_WAIT = 0.002


def ahead(delay: float) -> float:
    """How long to wait for an instant ``delay`` seconds away, waking before it (see
    AHEAD_SHARE) so that a timer that runs late does not make the instant late; the
    caller looks at the time again when the wait ends."""
    return delay if delay <= SHORT_WAIT else delay * (1 - AHEAD_SHARE)


class Waitable(Protocol):
    """The part of ``threading.Condition`` the core uses; a fake clock provides its own."""

    def wait(self, timeout: float | None = None) -> bool: ...
    def notify(self, n: int = 1) -> None: ...
    def notify_all(self) -> None: ...


class Clock(Protocol):
    """A monotonic now, the wall clock, and conditions whose timed waits follow it."""

    def now(self) -> float: ...
    def wall(self) -> float: ...
    def condition(self, lock: threading.Lock) -> Waitable: ...


class SystemClock:
    """The real clock: ``time.monotonic``, ``time.time`` and ``threading.Condition``."""

    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def condition(self, lock: threading.Lock) -> Waitable:
        return threading.Condition(lock)
