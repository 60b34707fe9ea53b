"""One manager's shared-queue side in the test process (its RedisStore, SharedQueue,
SharedJournal and a started SharedLink) and a worker's take in a thread: what the tests of
managers sharing a Redis store drive directly (tests/manager/test_shared_*.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from mpsched._core.job import Assignment, JobState, Outcome
from mpsched._errors import SchedulerShutdownError
from mpsched._manager.shared_journal import SharedJournal
from mpsched._manager.shared_link import SharedLink
from mpsched._manager.shared_queue import SharedQueue
from mpsched._store.redis.records import NewJob
from mpsched._store.redis.server import OPERATION_TIMEOUT
from mpsched._store.redis.store import RedisStore


class Peer:
    """One manager: its store connection, queue, journal and link (started)."""

    def __init__(
        self,
        url: str,
        name: str,
        *,
        clock: Any = None,
        lease: float = 30.0,
        claims: Any = None,
        operation_timeout: float = OPERATION_TIMEOUT,
    ) -> None:
        self.store = RedisStore(url, operation_timeout=operation_timeout)
        self.queue = SharedQueue(
            self.store, manager_id=name, lease_timeout=lease, clock=clock, claims=claims
        )
        self.journal = SharedJournal(self.store, self.queue)
        self.delivered: list[tuple[str, Outcome]] = []
        self.journal.bind(
            lambda client, outcome, watchers: self.delivered.append((client, outcome))
        )
        self.link = SharedLink(
            self.store, self.queue, self.journal, outage=self.queue.outage, status=lambda: b""
        )
        self.queue.on_unregistered(self.link.beat_now)
        self.link.start()

    def submit(self, job_id: str, delay: float = 0.0, client: str = "c1") -> None:
        self.store.submit_jobs(
            [NewJob(job_id, client, None, "f", b"payload", 2, delay, None, None, 0)],
            self.queue.manager_id,
        )

    def close(self) -> None:
        self.queue.close()
        self.link.stop()
        self.store.close()


def state(peer: Peer, job_id: str) -> tuple[JobState, int]:
    record = peer.store.get(job_id)
    assert record is not None
    return record.state, record.attempt


class Taker(threading.Thread):
    """A worker's take, in a thread: ``got`` is its assignment (None: none came)."""

    def __init__(self, queue: SharedQueue, worker: str, timeout: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.queue, self.worker, self.timeout = queue, worker, timeout
        self.got: Assignment | None = None
        self.ended: float | None = None
        self.start()

    def run(self) -> None:
        with contextlib.suppress(SchedulerShutdownError):  # the test ended: it was closed
            self.got = self.queue.take(self.worker, self.timeout)
        self.ended = time.monotonic()
