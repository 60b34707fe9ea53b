"""Handing due jobs to a worker: what the manager's ``take`` does once the worker's reports
are in.

The queue picks the job (and, for a worker this manager started whose jobs are short, the
due jobs prefetched with it: mpsched._core.prefetch); then each lease is journalled before
the worker may start the job, a cron run the wall clock has not reached is put back, the
schedules hear their runs started, and the assignments go out: with the due instant to a
worker on this manager's clock (it may get a job early and sleep the rest), with only the
delay left and the payload's buffers inline to any other.
"""

from __future__ import annotations

from collections.abc import Callable

from mpsched._core.clock import Clock
from mpsched._core.job import Assignment, Job
from mpsched._core.queue_like import JobQueueLike
from mpsched._errors import SchedulerShutdownError, WorkerDismissedError
from mpsched._manager.journal import BaseJournal
from mpsched._manager.schedule_events import ScheduleEvents
from mpsched._manager.worker_table import WorkerTable
from mpsched._payload.segments import Segments
from mpsched._protocol.codec import AssignmentWire, assignment_to_wire
from mpsched._protocol.records import LONG_POLL

# Workers this manager started get a job this long before it is due and sleep the rest on
# the monotonic clock they share with it, so the manager's wake-up and the reply's trip do
# not add to the job's lateness. Any other worker's clock is not ours, whatever its host
# name says (another container, a VM booted later): it gets jobs when due.
EARLY_HANDOFF = 0.002


class Dispatch:
    """Hands due jobs to workers; thread-safe, as the parts it joins are. ``wake_supervisor``
    is called when a job with a timeout goes out (the supervisor sleeps until the earliest
    job deadline)."""

    def __init__(
        self,
        queue: JobQueueLike,
        journal: BaseJournal,
        schedules: ScheduleEvents,
        workers: WorkerTable,
        segments: Segments,
        clock: Clock,
        wake_supervisor: Callable[[], None],
    ) -> None:
        self._queue = queue
        self._journal = journal
        self._schedules = schedules
        self._workers = workers
        self._segments = segments
        self._clock = clock
        self._wake_supervisor = wake_supervisor

    def take(self, worker_id: str, local: bool, timeout: float, more: int) -> list[AssignmentWire]:
        """Wait up to ``timeout`` (at most LONG_POLL) for the next due job for
        ``worker_id``, with up to ``more`` prefetched if ``local`` (a worker this manager
        started); the assignments as they go out ([] for none).

        Raises:
            WorkerDismissedError: the worker was dismissed: its pool leaves (it is noted as
                told).
            SchedulerShutdownError: the manager stops.
        """
        # Only a worker we started shares our monotonic clock: it can be handed a job early
        # and sleep until its due time itself. Any other gets it when due, and a delay
        # (measured here, so ~0) rather than an instant it would misread on its own clock.
        early = EARLY_HANDOFF if local else 0.0
        batch = self._take_batch(worker_id, min(timeout, LONG_POLL), early, more if local else 0)
        if not batch:
            return []
        first = batch[0]
        if self._schedules.too_early(first.lease.job_id, early):
            for assignment in batch:
                self._queue.return_lease(assignment.lease.lease_id)
            self._schedules.remap_cron()
            return []
        batch = self._journal_leases(batch)
        if not batch:
            return []
        self._workers.update(worker_id, current=first.lease.job_id)
        for assignment in batch:
            self._schedules.started(assignment.lease.job_id)
        if first.timeout is not None:
            self._wake_supervisor()  # it sleeps until the earliest job deadline
        assert first.due is not None  # the queue always sets it
        delay = max(0.0, first.due - self._clock.now())
        if local:  # the prefetched jobs are due already: no delay
            return [assignment_to_wire(a, delay if a is first else 0.0) for a in batch]
        # Any other worker may run on another host: it cannot map our shared memory.
        return [assignment_to_wire(first, delay, self._segments.for_remote(first.payload))]

    def _take_batch(
        self, worker_id: str, timeout: float, early: float, more: int
    ) -> list[Assignment]:
        """The queue's take, unless the worker was dismissed (before or as the queue
        closed): then WorkerDismissedError."""
        if self._workers.dismissal(worker_id):
            raise WorkerDismissedError(f"worker {worker_id} was dismissed: its pool leaves")
        try:
            return self._queue.take_batch(
                worker_id,
                timeout,
                early,
                more,
                self._prefetchable,
                self._workers.queues_of(worker_id),
            )
        except SchedulerShutdownError:
            if self._workers.dismissal(worker_id):
                raise WorkerDismissedError(
                    f"the manager stops and dismissed worker {worker_id}: its pool leaves"
                ) from None
            self._workers.told_stop(worker_id)
            raise

    def _prefetchable(self, job: Job) -> bool:
        """Whether a job may be prefetched: not a run of a schedule (a run counts as
        started when handed out, and its schedule plans on that)."""
        return not self._schedules.is_run(job.job_id)

    def _journal_leases(self, batch: list[Assignment]) -> list[Assignment]:
        """Journal each lease of ``batch``; on a failure, that job (put back by the
        journal) and those after it go back to the heap. Returns those handed out."""
        for i, assignment in enumerate(batch):
            if not self._journal.lease(assignment):
                for rest in batch[i + 1 :]:
                    self._queue.return_lease(rest.lease.lease_id)
                return batch[:i]
        return batch
