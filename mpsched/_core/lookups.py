"""Lookups: what one JobQueue holds, read under its lock: a job by id, the jobs pending or
in flight, and the queue's stats.

What a reader gets is copied under the lock; choosing, sorting and summarising happen
after it is let go, so that takers wait only for the copy.

No lock of its own: it shares its JobQueue's, and each method takes it.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
import threading
from collections.abc import Iterable

from mpsched._core.clock import Clock
from mpsched._core.hand_out import HandOut
from mpsched._core.intake import Intake
from mpsched._core.job import Job, JobState, Priority, QueueStats
from mpsched._core.leases import Leases, percentiles
from mpsched._core.queues import PendingQueues

_by_seq = operator.attrgetter("seq")


class Lookups:
    """The reading side of one JobQueue, guarded by that queue's ``lock``."""

    def __init__(
        self,
        lock: threading.Lock,
        clock: Clock,
        pending: PendingQueues,
        leases: Leases,
        intake: Intake,
        hand_out: HandOut,
    ) -> None:
        self._lock = lock  # the queue's: guards what each part below holds
        self._clock = clock
        self._pending = pending
        self._leases = leases
        self._intake = intake
        self._hand_out = hand_out
        self._prefetch = hand_out.prefetch

    def find(self, job_id: str) -> tuple[Job, str | None] | None:
        """A job pending (worker None) or in flight, by id (JobQueue.find)."""
        with self._lock:
            job = self._pending.get(job_id)
            if job is not None:
                return job, None
            found = self._leases.find_locked(job_id)
            return None if found is None else (found[0], found[1].worker_id)

    def jobs(self, state: JobState | None, limit: int | None) -> list[tuple[Job, str | None]]:
        """The jobs pending or in flight, in submission order (JobQueue.jobs)."""
        with self._lock:
            # A snapshot: iterating PendingJobs copies its jobs when the iterator is made.
            pending: Iterable[Job] = (
                iter(self._pending) if state in (None, JobState.PENDING) else ()
            )
            running: list[tuple[Job, str | None]] = (
                [(job, lease.worker_id) for job, lease in self._leases.jobs_locked()]
                if state in (None, JobState.RUNNING)
                else []
            )
        if limit is not None:
            pending = heapq.nsmallest(limit, pending, key=_by_seq)
        jobs: list[tuple[Job, str | None]] = [(job, None) for job in pending]
        jobs += running
        jobs.sort(key=lambda entry: entry[0].seq)
        return jobs if limit is None else jobs[:limit]

    def stats(self, *, lateness: bool) -> QueueStats:
        """Counters, pending jobs per priority and lateness percentiles (JobQueue.stats)."""
        with self._lock:
            pending = {p.name.lower(): self._pending.levels[p.level] for p in Priority}
            head_due = self._pending.head_due()
            if self._pending.has_ready():
                head_due = self._clock.now()
            done = self._leases.outcomes_locked(samples=lateness)
            intake = self._intake
            stats = QueueStats(
                pending=pending,
                in_flight=done.in_flight,
                submitted=intake.submitted,
                completed=done.completed,
                failed=done.failed,
                cancelled=intake.cancelled,
                retried=intake.retried,
                retried_exception=intake.retried_exception,
                retried_later=intake.retried_later,
                timed_out=done.timed_out,
                started_early=done.started_early,
                next_due_in=None if head_due is None else head_due - self._clock.now(),
                lateness={},
                lateness_samples=done.lateness_samples,
                wakeups=self._hand_out.wakeups,
                waiting=self._hand_out.waiting,
                crashed=done.crashed,
                prefetched=self._prefetch.handed,
                revoked=self._prefetch.revoked,
            )
        # Sorted here, outside the lock: 10,000 samples take milliseconds, which every
        # take would otherwise wait out.
        return dataclasses.replace(stats, lateness=percentiles(done.recent)) if lateness else stats
