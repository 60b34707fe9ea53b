"""The wall-clock watcher of a manager's schedules: a thread that compares the wall and the
monotonic clocks every WALL_CHECK seconds.

Every-schedules run on the monotonic clock and never notice a jump of the wall clock; cron
runs are instants of the wall clock, mapped to the monotonic clock when armed, so a jump
must re-map them. Each check also lets the schedules whose run could not be queued (a full
queue, a store error) try again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mpsched._core.clock import Clock

log = logging.getLogger("mpsched.schedules")

WALL_CHECK = 1.0  # seconds between two comparisons of the wall and monotonic clocks
WALL_JUMP = 0.5  # seconds the wall clock may move against the monotonic one unnoticed


class WallClockWatcher:
    """Calls ``every_check`` every WALL_CHECK seconds, and ``on_jump`` when the wall clock
    moved more than WALL_JUMP against the monotonic one since the last check."""

    def __init__(
        self, clock: Clock, every_check: Callable[[], object], on_jump: Callable[[], object]
    ) -> None:
        self._clock = clock
        self._every_check = every_check
        self._on_jump = on_jump
        # Set by stop(); the watcher thread waits on it between checks.
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mpsched-wall-clock", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop checking; wait (a little) for the thread."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        offset = self._clock.now() - self._clock.wall()
        while not self._stopped.wait(WALL_CHECK):
            now_offset = self._clock.now() - self._clock.wall()
            self._every_check()
            if abs(now_offset - offset) > WALL_JUMP:
                log.warning(
                    "the wall clock jumped by %+.3f s; cron runs re-planned", offset - now_offset
                )
                self._on_jump()
            offset = now_offset
