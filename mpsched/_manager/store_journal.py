"""Journal: the journal of a manager with a store.

``Journal`` makes the store calls at the right moments:

- submit: journalled (durable) *before* the jobs enter the heap, with the seqs the heap
  will order them by; a job whose ``key`` is held by a live or retained job is not queued,
  and the holder's id stands for it;
- take: the lease is journalled (durable) before the job is handed out, so a job taken
  before a crash comes back as running (run again only if its retries allow);
- finish, requeue: journalled in order, without waiting;
- cancel: journalled (durable) before the client hears it was cancelled.

Recovery maps each stored wall-clock due time to the manager's monotonic clock with one
offset. A job that was running is resolved by what its worker's claim slot says
(mpsched._worker.slot_file): ended, with the outcome the worker kept there; never started
(a prefetched job), pending again untouched; else as one whose worker died.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mpsched._core.clock import Clock
from mpsched._core.job import (
    DEFAULT_QUEUE,
    After,
    Assignment,
    Job,
    JobRecord,
    JobRequest,
    JobState,
    Outcome,
    OutcomeKind,
    check_request,
)
from mpsched._core.queue import JobQueue
from mpsched._core.retrying import RetryState, error_line, is_retry_kind, retry_delay
from mpsched._errors import JobError, JobNotFoundError, StoreError, WorkerCrashedError
from mpsched._manager.journal import (
    BaseJournal,
    Recovered,
    cancelled,
    decode,
    encode,
    failure,
    not_requeueable,
    request_again,
)
from mpsched._manager.retries import final_outcome, note_attempt, note_crash
from mpsched._protocol.records import LONG_POLL, LeftBehind
from mpsched._store.base import JournalStore, Recovery, StoredJob
from mpsched._store.lease_records import OUTCOME_IN_LOG

log = logging.getLogger("mpsched.manager")


def _lost(job_id: str) -> Outcome:
    """The outcome a watcher gets of a job that ended without its outcome in the store (a
    large one, not yet committed when the manager died)."""
    error = JobError(
        f"job {job_id} ran to its end, but its outcome was lost: the manager "
        f"stopped before it reached the store (only outcomes of up to "
        f"{OUTCOME_IN_LOG // 1024} KiB are journalled with the job's end)"
    )
    return failure(job_id, error, OutcomeKind.OUTCOME_LOST)


class Journal(BaseJournal):
    """Journals one queue's job changes to ``store`` and keeps the watchers of each job."""

    def __init__(
        self, store: JournalStore, queue: JobQueue, wall: Callable[[], float] = time.time
    ) -> None:
        super().__init__(store, queue)
        self.store: JournalStore = store
        self.queue: JobQueue = queue
        self._wall = wall
        # Jobs recovered that wait for their parents, with them: for Workflows.recover.
        self.recovered_waiting: list[tuple[Job, After]] = []

    # ------------------------------------------------------------------ recovery

    def recover(self, clock: Clock, traces: dict[str, LeftBehind] | None = None) -> Recovered:
        """Put the store's pending jobs back in the queue, and resolve the ones that were
        running: by what ``traces`` (the local workers' slots, by worker id) say; a job
        of a worker without one (a remote worker, which may still run it) stays in flight
        for that worker, awaited (WorkerTable.await_worker)."""
        recovery = self.store.recover()
        offset = clock.now() - self._wall()
        gc_was_on = gc.isenabled()
        gc.disable()  # a million small objects: the cyclic collector would only slow it
        try:
            retry = recovery.retry or {}
            jobs = [_job(stored, offset, retry) for stored in recovery.pending]
            resolved = self._resolve_running(recovery, offset, jobs, traces or {})
            parents = self.store.waiting()
            if parents:  # they wait out of the heap: see Workflows.recover
                self.recovered_waiting = [
                    (job, parents[job.job_id]) for job in jobs if job.job_id in parents
                ]
                jobs = [job for job in jobs if job.job_id not in parents]
            self.queue.restore(jobs, recovery.next_seq)
            for worker_id, held in resolved.awaited.items():
                self.queue.hold_in_flight(worker_id, held)
        finally:
            if gc_was_on:
                gc.enable()
        if not (recovery.pending or recovery.running):
            return Recovered("", {})
        return Recovered(
            f"recovered {len(recovery.pending)} pending job(s) from {self.store.location}; "
            f"of {len(recovery.running)} running when the manager stopped, "
            f"{resolved.summary()}",
            resolved.awaited,
        )

    def _resolve_running(
        self, recovery: Recovery, offset: float, jobs: list[Job], traces: dict[str, LeftBehind]
    ) -> _Resolved:
        resolved = _Resolved()
        for running in recovery.running:
            job = _job(running.job, offset, recovery.retry or {})
            trace = traces.get(running.worker_id)
            if trace is None:  # no slot here: its worker may be running it still
                resolved.awaited.setdefault(running.worker_id, []).append(job)
                continue
            outcome = trace.outcome(job.job_id)
            if outcome is not None and self._retry_recovered(job, outcome):
                jobs.append(job)  # it ran and failed; its retry was not journalled
                resolved.retried += 1
            elif outcome is not None:  # it ran to its end; the report never reached us
                outcome = final_outcome(job, outcome)
                state = JobState.DONE if outcome.ok else JobState.FAILED
                self.store.finish(job.job_id, state, encode(outcome), self._wall())
                resolved.ended += 1
            elif not trace.entered_job(job.job_id):
                job.attempt -= 1  # handed out with others, never started: not an attempt
                self.store.requeue(job.job_id, job.attempt)
                jobs.append(job)
                resolved.unstarted += 1
            elif job.attempt <= job.retries:
                if job.retry is None:
                    self.store.requeue(job.job_id, job.attempt)
                else:  # its policy's budget counts the crash: noted, with the others
                    note_crash(job, running.worker_id, None)
                    self.retried(job, 0.0)
                jobs.append(job)
                resolved.retried += 1
            else:
                error = WorkerCrashedError(job.job_id, running.worker_id, None)
                self.store.finish(
                    job.job_id,
                    JobState.FAILED,
                    encode(failure(job.job_id, error, OutcomeKind.WORKER_CRASHED)),
                    self._wall(),
                )
                resolved.failed += 1
        return resolved

    def _retry_recovered(self, job: Job, outcome: Outcome) -> bool:
        """A job whose worker kept its failed attempt's report, which the manager before
        this one did not journal: back to pending with its back-off if its policy allows;
        False when it ended."""
        if outcome.ok or not is_retry_kind(outcome.error_kind):
            return False
        delay = retry_delay(job.job_id, job.attempt, job.retry, outcome.error_kind)
        if delay is None:
            return False
        note_attempt(job, error_line(outcome.traceback))
        job.due = self.queue.clock.now() + delay
        self.retried(job, delay)
        return True

    # ------------------------------------------------------------------ changes

    def submit(
        self, requests: list[JobRequest], timeout: float | None, due: float | None = None
    ) -> list[str] | None:
        """As BaseJournal.submit; the store keeps the wall-clock time the requests'
        ``delay`` gives."""
        for request in requests:
            check_request(request)
        seqs = self.queue.reserve_seqs(len(requests))
        now = self._wall()
        retry = {r.job_id: RetryState(r.retry).encode() for r in requests if r.retry}
        holders = self.store.submit(
            [
                StoredJob(
                    r.job_id,
                    r.client_id,
                    r.key,
                    r.name,
                    r.payload,
                    r.priority,
                    r.at if r.at is not None else now + (r.delay or 0.0),
                    seq,
                    r.timeout,
                    r.retries,
                    0,
                    now,
                    None if r.queue == DEFAULT_QUEUE else r.queue,
                    r.limit,
                )
                for r, seq in zip(requests, seqs, strict=True)
            ],
            retry or None,
        )
        fresh = [
            (r, seq)
            for r, seq, holder in zip(requests, seqs, holders, strict=True)
            if holder == r.job_id
        ]
        try:
            self.queue.submit_many(
                [r for r, _ in fresh], timeout, seqs=[s for _, s in fresh], due=due, checked=True
            )
        except BaseException:
            self.store.cancel([r.job_id for r, _ in fresh], self._wall())
            raise
        return None if len(fresh) == len(requests) else holders

    def waiting(self, jobs: list[Job], requests: list[JobRequest], afters: list[After]) -> None:
        now = self._wall()
        retry = {r.job_id: RetryState(r.retry).encode() for r in requests if r.retry}
        self.store.submit_waiting(
            [
                StoredJob(
                    r.job_id,
                    r.client_id,
                    None,
                    r.name,
                    r.payload,
                    r.priority,
                    r.at if r.at is not None else now + (r.delay or 0.0),
                    job.seq,
                    r.timeout,
                    r.retries,
                    0,
                    now,
                    None if r.queue == DEFAULT_QUEUE else r.queue,
                    r.limit,
                )
                for r, job in zip(requests, jobs, strict=True)
            ],
            afters,
            retry or None,
        )

    def lease(self, assignment: Assignment) -> bool:
        lease = assignment.lease
        try:
            self.store.lease(lease.job_id, lease.worker_id, lease.attempt)
            return True
        except StoreError as exc:
            log.error("job %s not handed out: %s", lease.job_id, exc)
            self.queue.return_lease(lease.lease_id)
            return False

    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str]:
        state = JobState.DONE if outcome.ok else JobState.FAILED
        kept = encode(outcome) if self.store.keeps_outcomes else None
        try:  # not under _lock: a large outcome waits for its commit here
            if job.progress is not None:  # only a job that reported progress pays for it
                self.store.set_progress(job.job_id, job.progress)
            self.store.finish(job.job_id, state, kept, self._wall())
            if job.notes is not None and not outcome.ok:  # its final error, for listings
                self.store.retry_ended(
                    job.job_id, RetryState(job.retry, job.error, job.notes).encode()
                )
        except StoreError as exc:
            log.error("the outcome of job %s was not journalled: %s", job.job_id, exc)
        with self._lock:  # a watcher that registered before the finish was readable
            return self._watchers.pop(job.job_id, set())

    def requeue_ended(self, client_id: str, job_id: str) -> None:
        self.store.flush()  # its end is readable
        record = self.store.get(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        if record.state is not JobState.FAILED and record.state is not JobState.CANCELLED:
            raise not_requeueable(job_id, f"it is {record.state}")
        requeued = self.store.requeue_ended(job_id, client_id, self._wall())
        if requeued is None:  # requeued (or pruned) meanwhile
            raise not_requeueable(job_id, "it was requeued or forgotten meanwhile")
        stored, retry = requeued
        request = request_again(stored, client_id)
        if retry is not None:  # its policy goes back with it, with a fresh budget
            request = request._replace(retry=RetryState.decode(retry).terms)
        try:
            self.queue.submit_many([request], LONG_POLL, seqs=[stored.seq], checked=True)
        except BaseException:
            self.store.cancel([job_id], self._wall())  # pending in the store, not queued
            raise

    def requeued(self, job: Job) -> None:
        try:
            if job.notes is not None:  # a crash its policy counts: its note is kept too
                state = RetryState(job.retry, job.error, job.notes).encode()
                self.store.retried(job.job_id, job.attempt, self._wall(), state)
            else:
                self.store.requeue(job.job_id, job.attempt)
        except StoreError as exc:
            log.error("the requeue of job %s was not journalled: %s", job.job_id, exc)

    def retried(self, job: Job, delay: float, cause: str = "exception") -> None:
        state = RetryState(job.retry, job.error, job.notes).encode()
        try:
            self.store.retried(job.job_id, job.attempt, self._wall() + delay, state)
        except StoreError as exc:
            log.error("the retry of job %s was not journalled: %s", job.job_id, exc)

    def cancelled(self, jobs: list[Job]) -> dict[str, set[str]]:
        if jobs:
            self.store.cancel([job.job_id for job in jobs], self._wall())
        return super().cancelled(jobs)

    # ------------------------------------------------------------------ lookups

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        # Watch first, then read what was journalled: a job that ends after this line hands
        # its outcome to the watcher, one that ended before is found by the read. The flush
        # (a commit) runs outside the lock, so no finish waits for it.
        with self._lock:
            self._watch_locked(client_id, job_id)
        self.store.flush()  # outcomes journalled so far are readable
        record = self.store.get(job_id)
        if (
            record is not None
            and not record.state.finished
            and record.state is not JobState.CANCELLED
        ):
            return None  # its end will be handed over
        with self._lock:
            handed = not self._unwatch_locked(client_id, job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        if handed:
            return None  # it ended between the watch and the read: its outcome is on its way
        if record.state is JobState.CANCELLED:
            return cancelled(job_id)
        return _lost(job_id) if record.outcome is None else decode(record.outcome)

    def get(self, job_id: str, *, fresh: bool = False) -> JobRecord | None:
        if fresh:
            self.store.flush()  # what was journalled so far is readable
        record = self.store.get(job_id)
        return None if record is None else self._running_progress(record)

    def jobs(self, state: str | None, limit: int | None) -> list[JobRecord]:
        self.store.flush()
        records = self.store.jobs(None if state is None else JobState(state), limit)
        return [self._running_progress(r) for r in records]

    def _running_progress(self, record: JobRecord) -> JobRecord:
        """``record`` with the progress of the job if it runs: the queue has it (the store
        gets it at the job's end)."""
        if record.state is not JobState.RUNNING:
            return record
        found = self.queue.find(record.job_id)
        if found is None or found[0].progress is None:
            return record
        return record._replace(progress=found[0].progress)


@dataclass
class _Resolved:
    """How the jobs that were running when the manager stopped were resolved."""

    ended: int = 0  # their workers had run them to their end
    unstarted: int = 0  # handed out but never started: pending again, untouched
    retried: int = 0  # started, with a retry left: pending again
    failed: int = 0  # started, no retry left: WorkerCrashedError
    awaited: dict[str, list[Job]] = field(default_factory=dict)  # by remote worker id

    def summary(self) -> str:
        parts = [f"{self.ended} had ended"] if self.ended else []
        if self.unstarted:
            parts.append(f"{self.unstarted} had not started")
        if self.awaited:
            held = sum(map(len, self.awaited.values()))
            parts.append(f"{held} wait for their remote worker to say how they ended")
        parts.append(f"{self.retried} will run again and {self.failed} failed (WorkerCrashedError)")
        return ", ".join(parts)


def _job(stored: StoredJob, offset: float, retry: Mapping[str, str]) -> Job:
    job = Job(
        job_id=stored.job_id,
        client_id=stored.client_id,
        payload=stored.payload,
        priority=stored.priority,
        due=stored.due_wall + offset,
        seq=stored.seq,
        timeout=stored.timeout,
        retries=stored.retries,
        attempt=stored.attempt,
        key=stored.key,
        name=stored.name,
        queue=stored.queue or DEFAULT_QUEUE,
        limit=stored.limit,
    )
    text = retry.get(job.job_id)
    if text is not None:
        try:
            job.retry, job.error, job.notes = RetryState.decode(text)
        except (ValueError, KeyError, TypeError) as exc:  # its policy is lost, not the job
            log.error(
                "job %s: its retry state in the store is unreadable (%s): it runs "
                "without its retry policy",
                job.job_id,
                exc,
            )
    return job
