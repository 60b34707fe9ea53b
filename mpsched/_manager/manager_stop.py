"""ManagerStop: how a manager stops, and how its supervisor is woken.

The supervisor (mpsched._manager.supervisor) sleeps on the worker sentinels and on the read
end of a pipe: a worker joining or a stop writes to it. Once stopped, no job is handed out;
remote workers are dismissed first when the manager was told to drain them on its stop.
"""

from __future__ import annotations

import logging
import os
import threading

from mpsched._core.queue_like import JobQueueLike
from mpsched._manager.schedules import Schedules
from mpsched._manager.worker_table import WorkerTable

log = logging.getLogger("mpsched.manager")


class ManagerStop:
    """The manager's stop: its event, the supervisor's wake pipe, remote dismissals."""

    def __init__(
        self,
        queue: JobQueueLike,
        workers: WorkerTable,
        schedules: Schedules,
        stopping: threading.Event,
        drain_workers_on_stop: bool,
    ) -> None:
        """``stopping``: set by :meth:`stop`; the supervisor sees it through the wake pipe.
        ``drain_workers_on_stop``: :meth:`stop` dismisses the remote workers too."""
        self._queue = queue
        self._workers = workers
        self._schedules = schedules
        self.stopping = stopping
        self.drain_workers_on_stop = drain_workers_on_stop
        self.wake_reader, self._wake_writer = os.pipe()

    def wake_supervisor(self) -> None:
        """Wake the supervisor loop (it waits on ``wake_reader`` with the worker sentinels)."""
        os.write(self._wake_writer, b"x")

    def drain_workers(self) -> int:
        """Dismiss every remote worker connected now; returns how many were dismissed."""
        dismissed = self._workers.dismiss_remote()
        log.warning("dismissed %d remote worker(s): their pools drain and exit", dismissed)
        return dismissed

    def stop(self) -> None:
        """Stop handing out jobs, and wake the supervisor to drain and exit."""
        if self.drain_workers_on_stop and not self.stopping.is_set():
            log.info(
                "stopping: dismissed %d remote worker(s); their pools drain and exit",
                self._workers.dismiss_remote(),
            )
        self.stopping.set()
        self._schedules.close()
        self._queue.close()
        self.wake_supervisor()
