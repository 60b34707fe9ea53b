"""Time as the pure core sees it: a monotonic now, the wall clock, and timed waits.

Injected into JobQueue and its lease table, so tests drive them with a fake clock
(tests/fakeclock.py) and real threads, without sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


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
