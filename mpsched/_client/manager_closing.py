"""How a Scheduler closes: as any client does, and then it stops the manager it owns."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mpsched._client.closing import Closing, count
from mpsched._client.core import ClientCore
from mpsched._client.forever import DroppedSchedules
from mpsched._errors import SchedulerShutdownError
from mpsched._manager.launcher import ManagerProcess

log = logging.getLogger("mpsched.scheduler")


class ManagerClosing(Closing):
    """The closing of a client that owns its manager: jobs not yet due are kept in the
    store or dropped loudly, a second Ctrl-C kills the workers, and the last step stops
    the manager."""

    def __init__(
        self,
        core: ClientCore,
        *,
        process: ManagerProcess,
        store: str | None,
        dropped: DroppedSchedules,
        stop_manager: Callable[[], Any],
    ) -> None:
        """``store``: as shown (no password); ``stop_manager``: stops the manager, once."""
        super().__init__(core)
        self._process = process
        self._store = store
        self.dropped = dropped  # says once which schedules end with the manager
        self._stop_manager = stop_manager

    def say_dropped_schedules(self) -> None:
        """Warn, once, of the schedules that end with the manager (none with a store)."""
        self.dropped.say(lambda: self._core.link.ask(lambda service: service.list_schedules()))

    def stop(self) -> None:
        """As a client stops, then the manager stops."""
        self.say_dropped_schedules()
        super().stop()
        self._stop_manager()

    def exit_work(self) -> None:
        """What is due runs to completion; jobs due later stay in the store or are dropped."""
        # As ProcessPoolExecutor does at exit: what is due runs to completion. Jobs due
        # later would keep the program alive until then: a store keeps them for the next
        # manager on it; without one they are dropped, loudly.
        if self._store is not None:
            kept = self._core.leave_not_due(f"stays pending in the store {self._store}")
            if kept:
                log.warning(
                    "interpreter exit: %d job(s) not yet due stay pending in the store "
                    "%s; a Scheduler or serve started on it runs them",
                    kept,
                    self._store,
                )
        elif dropped := self._core.cancel_pending(not_due_only=True):
            log.warning(
                "interpreter exit: dropped %d job(s) not yet due. To run them, call "
                "shutdown(wait=True) before the program ends, give the Scheduler a store "
                "(store=...) to keep them for the next one, or submit them to a "
                "long-running manager (python -m mpsched serve) with mpsched.connect()",
                dropped,
            )
        # Jobs of other clients watched by id die with this manager: no waiting for them.
        self._core.fail_watched(
            SchedulerShutdownError(
                "the interpreter exited, and this Scheduler's manager with it, before the job ended"
            )
        )
        self.drain_and_stop()

    def drop_not_started(self) -> list[str]:
        """As a client does; with a store, jobs not yet due stay pending in it."""
        if self._store is None:
            return super().drop_not_started()
        kept = self._core.leave_not_due(f"stays pending in the store {self._store}")
        cancelled = self._core.cancel_jobs(
            [f.job_id for f in self._core.outstanding() if not f.watched]
        )
        notes = [f"cancelled {count(cancelled, 'job')} not started"] if cancelled else []
        if kept:
            notes.append(
                f"{count(kept, 'job')} due later {'stays' if kept == 1 else 'stay'} "
                f"pending in the store {self._store}"
            )
        return notes

    def stop_now(self) -> str:
        """The manager kills its workers, and the jobs they run, at once."""
        running = self._core.outstanding()
        described = self.describe(running) if running else ""
        self.say_dropped_schedules()
        self._process.stop_now()
        self.stop()
        stopped = "stopped the manager and its workers"
        if not running:
            return stopped
        return f"{stopped}, killing {count(len(running), 'running job')}: {described}"
