"""What ``Scheduler.run_forever`` waits for, and what a Scheduler says of the schedules
that end with its manager.

A program whose work is its schedules must keep its Scheduler, and so its manager, alive:
``run_forever`` blocks until SIGTERM, a Ctrl-C, or the Scheduler's closing (by another
thread, or a lost manager). Python lets only the main thread set a signal handler, so
only there is SIGTERM's handler ours while it waits; the program's own is back before the
wait returns. Ctrl-C stays Python's: a KeyboardInterrupt in the main thread.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType

from mpsched._client.closing import MAIN_THREAD_WAKE, count
from mpsched._client.link import DISCONNECTED
from mpsched._core.recurring import ScheduleInfo
from mpsched._errors import MpschedError

log = logging.getLogger("mpsched.scheduler")

SHOWN_IDS = 10  # schedule ids a warning names before "and N more"


def wait_for_stop(closed: threading.Event) -> bool:
    """Block until SIGTERM (True) or until ``closed`` is set (False).

    In the main thread, SIGTERM's handler is this wait's own until it returns, then the
    previous one again. In any other thread no handler is set: only ``closed`` ends it.

    Raises:
        KeyboardInterrupt: Ctrl-C, in the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        closed.wait()
        return False
    # A list, not an Event: the handler runs in this thread, perhaps inside Event.wait
    # while it holds the Event's lock, and Event.set would wait for that lock forever.
    received: list[int] = []

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # not set from Python: the default is the best guess
        previous = signal.SIG_DFL
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
        # In slices: a signal is handled between two of them at the latest.
        while not received and not closed.is_set():
            closed.wait(MAIN_THREAD_WAKE)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return bool(received)


class DroppedSchedules:
    """Says once, for a Scheduler without a store, which schedules its manager held as it
    stopped (they end with it), and how to keep them."""

    def __init__(self) -> None:
        # Guards _said: the manager's stop may come from two threads (a Ctrl-C while the
        # shutdown thread drains). Held for a look and a set; nobody waits on it.
        self._lock = threading.Lock()
        self._said = False

    def hush(self) -> bool:
        """Say nothing from now on (the stop was asked: run_forever); True if it was
        said, or hushed, before."""
        with self._lock:
            said, self._said = self._said, True
        return said

    def say(self, ask: Callable[[], list[ScheduleInfo]]) -> None:
        """Log the warning once, if ``ask()`` (the manager's schedules) names any; a
        manager that is gone (its schedules with it) is not asked twice."""
        if self.hush():
            return
        try:
            infos = ask()
        except (MpschedError, *DISCONNECTED):
            return
        if infos:
            log.warning("%s", _warning([info.schedule_id for info in infos]))


def _warning(schedule_ids: list[str]) -> str:
    shown = ", ".join(schedule_ids[:SHOWN_IDS])
    if len(schedule_ids) > SHOWN_IDS:
        shown += f" and {len(schedule_ids) - SHOWN_IDS} more"
    return (
        f"mpsched: this Scheduler stops its manager, which has no store, so "
        f"{count(len(schedule_ids), 'schedule')} "
        f"{'ends' if len(schedule_ids) == 1 else 'end'} with it: {shown}. To keep a program's "
        f"schedules running, end its with block with run_forever() (until Ctrl-C or "
        f"SIGTERM); to keep them for the next Scheduler, give it a store "
        f'(store="jobs.db")'
    )
