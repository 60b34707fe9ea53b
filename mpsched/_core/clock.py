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
# The share of its length a timed wait is taken to end late by, at most (see above). A
# wake-up costs ~30 µs of CPU on such a VM: a waiter that may end late by ``slack``
# unharmed (a worker on the manager's clock is handed its job that early) waits once
# while the timer's lateness fits in half of it.
OVERSLEEP = 0.005


def ahead(delay: float, slack: float = 0.0) -> float:
    """How long to wait for an instant ``delay`` seconds away, waking before it (see
    AHEAD_SHARE) so that a timer that runs late does not make the instant late, unless
    ``slack`` seconds late do no harm and the timer's lateness fits in them: then the
    whole ``delay``. The caller looks at the time again when the wait ends."""
    if delay <= SHORT_WAIT or delay * OVERSLEEP <= slack / 2:
        return delay
    return delay * (1 - AHEAD_SHARE)


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
