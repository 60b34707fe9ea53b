"""Inspection: what the manager tells of its state, and its limits.

``status``, the status page and ``Client.job`` read it: the scheduler's statistics, the
records of jobs with what each pending one waits for, and the declared limits.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from mpsched._core.job import DEFAULT_QUEUE, JobRecord, JobState, Priority, check_name
from mpsched._core.limits import LimitSpec, parse_limit
from mpsched._core.queue_like import JobQueueLike
from mpsched._manager.failures import described
from mpsched._manager.journal import BaseJournal
from mpsched._manager.mailbox import Mailboxes
from mpsched._manager.worker_table import WorkerTable
from mpsched._manager.workflows import Workflows
from mpsched._protocol.records import QueueStatus, Stats

log = logging.getLogger("mpsched.manager")

THROUGHPUT_WINDOW = 10.0  # seconds over which stats() measures throughput


class Inspection:
    """The statistics, the job records and the limits; the supervisor's counts."""

    def __init__(
        self,
        queue: JobQueueLike,
        journal: BaseJournal,
        workers: WorkerTable,
        mailboxes: Mailboxes,
        workflows: Workflows | None,
    ) -> None:
        """``workflows``: the jobs waiting for their parents; None with a shared store."""
        self._queue = queue
        self._journal = journal
        self._workers = workers
        self._mailboxes = mailboxes
        self._workflows = workflows
        # The supervisor's counts (written by its thread only, through note_workers()); read
        # by stats().
        self._workers_missing = 0
        self._worker_start_failures = 0
        self._started = time.monotonic()

    def note_workers(self, missing: int, start_failed: bool = False) -> None:
        """The supervisor's count of workers it could not start again yet, and whether an
        attempt to start one just failed (for stats())."""
        self._workers_missing = missing
        self._worker_start_failures += start_failed

    def job(self, job_id: str) -> JobRecord | None:
        """The record of one job the manager knows (None: it knows no such job)."""
        record = self._journal.get(job_id, fresh=True)
        return None if record is None else described(self._waiting(record))

    def jobs(self, state: str | None = None, limit: int | None = None) -> list[JobRecord]:
        """The jobs the store knows, in submission order: see ManagerService.jobs."""
        return [described(self._waiting(r)) for r in self._journal.jobs(state, limit)]

    def _waiting(self, record: JobRecord) -> JobRecord:
        """``record`` with what it waits for, if it is a pending job of a limit or one
        waiting for its parents."""
        if record.state is not JobState.PENDING:
            return record
        if self._workflows is not None and len(self._workflows):
            parents = self._workflows.remaining(record.job_id)
            if parents:
                return record._replace(waiting_for=f"after {parents} jobs")
        if record.limit is None:
            return record
        return record._replace(waiting_for=self._queue.waiting_for(record.job_id))

    def limits(self) -> dict[str, str]:
        """The declared limits by name, in their forms ("2", "10/s", "2,10/s")."""
        return {name: str(spec) for name, spec in self._queue.limits().items()}

    def set_limit(self, name: str, form: str) -> None:
        """Declare or change a limit (``form`` "" for one without bounds), kept in the
        store."""
        check_name("limit", name)
        spec = parse_limit(name, form) if form else LimitSpec()
        self._journal.save_limit(name, str(spec))
        self._queue.set_limit(name, spec)
        log.info("limit %s set to %s", name, spec or "no bound")

    def stats(self, lateness: bool = True) -> Stats:
        """The scheduler's state; ``lateness`` False leaves out the lateness percentiles."""
        now = time.monotonic()
        workers, recent = self._workers.statuses(since=now - THROUGHPUT_WINDOW)
        window = min(THROUGHPUT_WINDOW, max(now - self._started, 1e-9))
        queue = self._queue.stats(lateness=lateness)
        if self._workflows is not None and len(self._workflows):  # waiting: pending too
            waiting = self._workflows.waiting_levels()
            queue = dataclasses.replace(
                queue,
                pending={
                    p.name.lower(): queue.pending[p.name.lower()] + waiting[p.level]
                    for p in Priority
                },
            )
        return Stats(
            queue=queue,
            workers=workers,
            uptime=now - self._started,
            throughput=recent / window,
            workers_missing=self._workers_missing,
            worker_start_failures=self._worker_start_failures,
            clients=len(self._mailboxes),
            store=self._journal.store.location,
            store_size=self._journal.store.size(),
            store_jobs=self._journal.store.kept() if self._journal.shared else None,
            managers=self._journal.managers(workers),
            queues=self._queue_statuses(),
            limits=tuple(sorted(self.limits().items())),
        )

    def _queue_statuses(self) -> tuple[QueueStatus, ...]:
        """Each queue with pending jobs or a worker naming it: its pending count and how
        many of this manager's workers serve it."""
        pending = self._queue.pending_by_queue()
        served = self._workers.subscriptions()
        names = {name for name, count in pending.items() if count}
        names.update(name for queues in served if queues for name in queues)
        names.add(DEFAULT_QUEUE)
        return tuple(
            QueueStatus(
                name=name,
                pending=pending.get(name, 0),
                workers=sum(1 for q in served if q is None or name in q),
            )
            for name in sorted(names)
        )
