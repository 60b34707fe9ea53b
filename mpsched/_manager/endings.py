"""How jobs end in the manager, and how their outcomes reach the clients waiting for them.

A job ends by its worker's report (with its next take, early from its reporter thread, or
read from the claim slot of a worker that died after running it), by the loss of its
worker (requeued untouched, run again within ``retries``, or failed by the manager:
WorkerCrashedError, JobTimeoutError, SchedulerShutdownError), or by a cancel. Whichever,
the outcome is journalled and then delivered: to the job's client and every client
watching it (their mailboxes), to its schedule if it is a run, to the list of recent
failures, and its shared-memory segments change hands.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable

from mpsched._core.job import Job, Lease, Outcome, OutcomeKind
from mpsched._core.leases import LostLease
from mpsched._core.queue_like import JobQueueLike
from mpsched._core.retrying import error_line, is_retry_kind, retry_cause, retry_delay
from mpsched._errors import (
    JobTimeoutError,
    MpschedError,
    SchedulerShutdownError,
    WorkerCrashedError,
)
from mpsched._manager.failures import RecentFailures
from mpsched._manager.journal import BaseJournal, cancelled, failure
from mpsched._manager.mailbox import Mailboxes
from mpsched._manager.retries import final_outcome, note_attempt, note_crash
from mpsched._manager.worker_table import WorkerTable
from mpsched._payload.segments import Segments
from mpsched._protocol.codec import report_from_wire
from mpsched._protocol.records import LeftBehind, Report

log = logging.getLogger("mpsched.manager")

KINDS: dict[type[MpschedError], OutcomeKind] = {
    JobTimeoutError: OutcomeKind.JOB_TIMEOUT,
    SchedulerShutdownError: OutcomeKind.SHUTDOWN,
    WorkerCrashedError: OutcomeKind.WORKER_CRASHED,
}


class Endings:
    """The ends of jobs: thread-safe, as the parts it joins are.

    ``run_ended`` is the Schedules' ``ended`` (made after this: they tell cancelled runs
    through :meth:`cancelled`); ``stopping`` is set once the manager stops.
    """

    def __init__(
        self,
        queue: JobQueueLike,
        journal: BaseJournal,
        segments: Segments,
        mailboxes: Mailboxes,
        failures: RecentFailures,
        workers: WorkerTable,
        stopping: threading.Event,
        run_ended: Callable[[str, Outcome], None],
    ) -> None:
        self._queue = queue
        self._journal = journal
        self._segments = segments
        self._mailboxes = mailboxes
        self._failures = failures
        self._workers = workers
        self._stopping = stopping
        self._run_ended = run_ended
        # Told of every end after it is journalled: it releases or fails the jobs waiting
        # for it (mpsched._manager.workflows); None for a shared store's queue.
        self.on_ended: Callable[[str, Outcome], None] | None = None

    def complete(
        self, report: Report, worker_id: str, *, same_clock: bool, late: bool = True
    ) -> bool:
        """End a lease with its worker's report; False for a lease that had ended.
        ``late``: such a report's outcome reaches nobody (its result segment is
        unlinked)."""
        return self.complete_all([report], worker_id, same_clock=same_clock, late=late) == 1

    def complete_all(
        self,
        reports: list[Report],
        worker_id: str,
        *,
        same_clock: bool,
        late: bool = True,
        more: int | None = None,
    ) -> int:
        """:meth:`complete` each of one worker's reports, journalled together (a shared
        store records them in one call, and claims the worker's next jobs in it: ``more``
        beyond the first, None for as many as its last take asked); returns how many
        ended a lease."""
        ended: list[tuple[Job, Outcome]] = []
        for report in reports:
            # A start stamp from another monotonic clock than ours says nothing about
            # lateness here: only workers we started report on our clock; other workers'
            # jobs stay out of the lateness and started-early counts.
            stats_outcome = report.outcome if same_clock else report.outcome._replace(started=None)
            outcome: Outcome | None = report.outcome
            if report.outcome.ok or not is_retry_kind(report.outcome.error_kind):
                job = self._queue.complete(report.lease_id, stats_outcome, worker_id)
            else:  # only a job that raised what it may be retried for comes here
                job, outcome = self._retry(report, stats_outcome, worker_id)
                if job is not None and outcome is None:
                    continue  # it runs again
            if job is None:
                if late:
                    self._segments.discarded(report.outcome)  # a late report: nobody gets it
                continue
            assert outcome is not None
            if not outcome.ok:
                job.error = error_line(outcome.traceback)
                self._failures.note(job, outcome, worker_id)
            self._segments.ended([job.job_id])
            ended.append((job, outcome))
        if not ended:
            return 0
        on_ended = self.on_ended
        for (job, outcome), watchers in zip(
            ended, self._journal.finished_all(ended, worker_id, more), strict=True
        ):
            if watchers is not None:  # None: a shared store refused it (a stale lease)
                if on_ended is not None:  # before the result's segment is handed on
                    on_ended(job.job_id, outcome)
                self.deliver(job.client_id, outcome, watchers)
            else:
                self._segments.discarded(outcome)  # nobody gets it: its result segment goes
        return len(ended)

    def _retry(
        self, report: Report, stats_outcome: Outcome, worker_id: str
    ) -> tuple[Job | None, Outcome | None]:
        """End a lease whose job raised what it may be retried for: back in the heap with
        its back-off if its budget allows, in the same step. Returns the job (None for a
        lease that had ended) and its final outcome (None: it runs again)."""
        lease_id, outcome = report.lease_id, report.outcome
        line = error_line(outcome.traceback)

        def delay_of(job: Job) -> float | None:  # under the queue's lock, before the push
            delay = retry_delay(job.job_id, job.attempt, job.retry, outcome.error_kind)
            if delay is not None:
                note_attempt(job, line)
            return delay

        job, delay = self._queue.retry(lease_id, stats_outcome, worker_id, delay_of)
        if job is None:
            return None, None
        if delay is not None:
            self._journal.retried(job, delay, retry_cause(outcome.error_kind))
            log.info(
                "job %s: attempt %d on worker %s failed (%s); it runs again in %.3g s",
                job.job_id,
                job.attempt,
                worker_id,
                line,
                delay,
            )
            return job, None
        return job, final_outcome(job, outcome)

    def recover(self, worker_id: str, kept: list[bytes]) -> int:
        """A local worker exited: complete the jobs whose reports it kept in its claim slot
        (mpsched._worker.claims) and the manager may not have had yet, before its leases
        are resolved as lost. Returns how many were still in flight."""
        completed = 0
        for record in kept:
            report = report_from_wire(pickle.loads(record))
            # A report that came in meanwhile ended its lease: nothing more to do (its
            # outcome was posted; its result segment is its recipients' now).
            completed += self.complete(report, worker_id, same_clock=True, late=False)
        if completed:
            log.info(
                "worker %s exited; %d job(s) it had run were reported from its slot",
                worker_id,
                completed,
            )
        return completed

    def lose_worker(
        self, worker_id: str, exitcode: int | None, received: Callable[[Lease], bool] | None = None
    ) -> int:
        """Forget a worker and resolve each job it held; returns how many it held.

        ``received`` tells whether the worker got a lease (local workers: their claim
        slot); by default, the last lease it acknowledged (every lease, for a worker awaited
        since a restart: WorkerTable.await_worker).
        """
        lost = self._queue.release_worker(worker_id)
        acked = self._workers.remove(worker_id)
        for item in lost:
            got = (
                received(item.lease) if received else acked is None or item.lease.lease_id == acked
            )
            self._resolve_lost(item, got, exitcode)
        return len(lost)

    def resolve_left(
        self, worker_id: str, exitcode: int | None, left: LeftBehind, *, same_clock: bool
    ) -> int:
        """A worker is gone, or joined again under a new id, and ``left`` says what it left
        (its claim slot): end the jobs it ran to their end with their outcomes, then
        resolve its other leases, the job it entered as one it died under and the rest as
        never received. Returns how many leases it held besides the ended ones."""
        completed = 0
        for report in left.ended:
            lease = self._queue.leases.lease_of(report.outcome.job_id)
            if lease is not None and lease.worker_id == worker_id:
                # Its own lease id: one of a manager before a restart names no lease here.
                completed += self.complete(
                    report._replace(lease_id=lease.lease_id),
                    worker_id,
                    same_clock=same_clock,
                    late=False,
                )
        if completed:
            log.info(
                "worker %s is gone; %d job(s) it had run were reported from its slot",
                worker_id,
                completed,
            )
        return self.lose_worker(
            worker_id, exitcode, received=lambda lease: left.entered_job(lease.job_id)
        )

    def _resolve_lost(self, item: LostLease, received: bool, exitcode: int | None) -> None:
        job, lease = item.job, item.lease
        self._segments.lease_lost(lease.lease_id)  # a result it wrote but never reported
        error: MpschedError
        if item.past_deadline:
            assert job.timeout is not None
            self._queue.fail(job, timed_out=True)
            error = JobTimeoutError(job.job_id, job.timeout)
        elif not received and self._queue.requeue(job, retry=False):
            self._journal.requeued(job)
            log.info("job %s never reached worker %s; requeued", job.job_id, lease.worker_id)
            return
        elif received and job.attempt <= job.retries and self._crash_retry(job, lease, exitcode):
            self._journal.requeued(job)
            log.warning(
                "job %s: worker %s died on attempt %d; requeued",
                job.job_id,
                lease.worker_id,
                job.attempt,
            )
            return
        elif self._stopping.is_set():
            self._queue.fail(job)
            error = SchedulerShutdownError(f"the manager stopped before job {job.job_id} ran")
        else:
            self._queue.fail(job)
            error = WorkerCrashedError(job.job_id, lease.worker_id, exitcode)
            log.error("%s", error)
        self._segments.ended([job.job_id])
        outcome = final_outcome(job, failure(job.job_id, error, KINDS[type(error)]))
        job.error = f"{type(error).__name__}: {error}"
        self._failures.note(job, outcome, lease.worker_id, job.error)
        watchers = self._journal.finished(job, outcome, lease.worker_id)
        if watchers is not None:  # None: a shared store refused it (a stale lease)
            if self.on_ended is not None:
                self.on_ended(job.job_id, outcome)
            self.deliver(job.client_id, outcome, watchers)

    def _crash_retry(self, job: Job, lease: Lease, exitcode: int | None) -> bool:
        """Put back a job its worker died under, with a retry left; False when the queue
        is closed. A job with a retry policy notes the crash as a failed attempt."""
        noted = job.retry is not None
        if noted:
            note_crash(job, lease.worker_id, exitcode)
        if self._queue.requeue(job, retry=True):
            return True
        if noted and job.notes:
            job.notes.pop()
        return False

    def cancelled(self, jobs: list[Job], told: dict[str, set[str]] | None = None) -> list[str]:
        """Jobs taken out of the heap unrun: journal them and tell their watchers (and, in
        ``told``, further clients by job id); returns their ids."""
        job_ids = [job.job_id for job in jobs]
        self._segments.ended(job_ids)
        watchers = self._journal.cancelled(jobs)
        for job_id, more in (told or {}).items():
            watchers.setdefault(job_id, set()).update(more)
        for job_id, clients in watchers.items():
            for client in clients:
                self._mailboxes.post(client, cancelled(job_id))
        for job_id in job_ids:
            self._run_ended(job_id, cancelled(job_id))
        if self.on_ended is not None:
            for job_id in job_ids:
                self.on_ended(job_id, cancelled(job_id))
        return job_ids

    def deliver(self, client_id: str, outcome: Outcome, watchers: set[str]) -> None:
        """Post a job's outcome to its client and to every other client watching it."""
        others = watchers - {client_id}
        self._segments.posted(outcome, 1 + len(others))
        try:  # first: a client that hears a run ended finds its outcome kept (runs())
            self._run_ended(outcome.job_id, outcome)
        finally:
            self._mailboxes.post(client_id, outcome)
            for watcher in others:
                self._mailboxes.post(watcher, outcome)
