"""Journals: the manager's bridge between its queue and its store.

The heap (JobQueue) decides what happens to a job; a store (mpsched._store.base) records
it, so that a manager started again on the same store gets its jobs back. ``BaseJournal``,
here, is what the service tells of each job's life and asks of it by id; ``Journal``
(mpsched._manager.store_journal) makes the store calls at the right moments, and
``NoJournal`` (mpsched._manager.no_journal) stands in for it without a store.

Every journal keeps the clients that watch a job they did not submit
(``Client.job(job_id)``), so that each of them gets its outcome. This module also holds
what the journals share: outcomes as a store keeps them, and the requeue of an ended job.
"""

from __future__ import annotations

import abc
import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from mpsched._core.clock import Clock
from mpsched._core.job import (
    After,
    Assignment,
    Job,
    JobRecord,
    JobRequest,
    JobState,
    Outcome,
    OutcomeKind,
)
from mpsched._core.queue import JobQueue
from mpsched._core.queue_like import JobQueueLike
from mpsched._errors import InvalidJobError, JobError
from mpsched._manager.retained import MAX_OUTCOME
from mpsched._protocol.records import LeftBehind, ManagerStatus, WorkerStatus
from mpsched._store.base import Store, StoredJob

log = logging.getLogger("mpsched.manager")


def encode(outcome: Outcome) -> bytes:
    """An outcome as the store keeps it (plain data, its kind a word: the manager may
    unpickle it)."""
    if type(outcome.error_kind) is not str:  # an OutcomeKind member
        outcome = outcome._replace(error_kind=str(outcome.error_kind))
    return pickle.dumps(tuple(outcome), protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> Outcome:
    return Outcome._make(pickle.loads(data))


def failure(job_id: str, error: BaseException, kind: OutcomeKind) -> Outcome:
    """The outcome of a job that the manager, not the job, ended with ``error``."""
    return Outcome(
        job_id=job_id,
        ok=False,
        payload=pickle.dumps(error),
        traceback="",
        started=None,
        error_kind=kind,
    )


def cancelled(job_id: str) -> Outcome:
    return Outcome(
        job_id=job_id,
        ok=False,
        payload=b"",
        traceback="",
        started=None,
        error_kind=OutcomeKind.CANCELLED,
    )


class Recovered(NamedTuple):
    """What a manager got back from its store."""

    summary: str  # in one line ("" for nothing)
    awaited: dict[str, list[Job]]  # jobs held in flight for each remote worker, by its id


class BaseJournal(abc.ABC):
    """What the service tells of each job's life, and the lookups by id; the watchers of
    each job. ``store`` keeps the schedules (and, in ``Journal``, the jobs).

    ``shared``: the queue lives in a store that several managers share
    (mpsched._manager.shared_journal); the others journal this manager's own queue.
    """

    shared = False

    def __init__(self, store: Store, queue: JobQueueLike) -> None:
        self.store = store
        self.queue = queue
        # Guards _watchers (and NoJournal's keys). Held while a job's watchers are taken
        # (after its end was recorded: NoJournal records it under the lock, Journal just
        # before, in the store, whose flush covers it from then on), and while a client
        # starts or stops watching a job, so that a watcher either finds the job's outcome
        # (or that it is unknown) or is handed the outcome: never neither, never both
        # (Journal.watch). Held for dict updates only: never across a store call of
        # Journal's (a flush is a commit).
        self._lock = threading.Lock()
        self._watchers: dict[str, set[str]] = {}

    def recover(self, clock: Clock, traces: dict[str, LeftBehind] | None = None) -> Recovered:
        """Put the store's pending jobs back in the queue, and resolve the ones that were
        running (by ``traces``: what each local worker's claim slot says, by worker id);
        nothing without a store."""
        return Recovered("", {})

    @property
    def max_payload(self) -> int | None:
        """The largest job pickle the store takes (None: no bound but memory's)."""
        return None

    def save_limit(self, name: str, form: str | None) -> None:
        """Keep a limit's form in the store (None: forget it); a store that keeps
        nothing across restarts ignores it."""
        self.store.save_limit(name, form)

    def saved_limits(self) -> dict[str, str]:
        """The limits the store kept, by name, in their forms."""
        return self.store.saved_limits()

    def managers(self, live: tuple[WorkerStatus, ...] = ()) -> tuple[ManagerStatus, ...]:
        """Every manager of a shared store, from their heartbeats, this one with its
        workers as they are now (``live``); () for one's own."""
        return ()

    def bind(self, deliver: Callable[[str, Outcome, set[str]], None]) -> None:  # noqa: B027
        """How ends this manager did not see (another manager of a shared store recorded
        them) reach its clients; a journal of this manager's own queue sees them all."""

    @abc.abstractmethod
    def submit(
        self, requests: list[JobRequest], timeout: float | None, due: float | None = None
    ) -> list[str] | None:
        """Journal then queue a batch, all or none. Returns None when every job was queued
        as itself, else for each job the id of the job that stands for it (a keyed job
        whose key was held). ``due``: as JobQueue.submit_many (the queue's clock).

        Raises:
            InvalidJobError, QueueFullError, SchedulerShutdownError: as JobQueue.submit_many.
            StoreError: the store could not take them; nothing was queued.
        """

    def lease(self, assignment: Assignment) -> bool:
        """Journal a job handed out; False (the job is back in the heap) if that failed."""
        return True

    def waiting(  # noqa: B027
        self,
        jobs: list[Job],
        requests: list[JobRequest],
        afters: list[After],
    ) -> None:
        """Journal (durably) jobs that wait for their parents, with their edges; nothing
        without a store.

        Raises:
            InvalidJobError: a job id the store holds already.
            StoreError: the store could not take them.
        """

    def outcome_of(self, job_id: str) -> Outcome:
        """The outcome of a job that ended; a failure saying so when it was not kept."""
        record = self.get(job_id, fresh=True)
        if record is not None and record.state is JobState.CANCELLED:
            return cancelled(job_id)
        if record is not None and record.outcome is not None:
            return decode(record.outcome)
        return not_kept(job_id)

    @abc.abstractmethod
    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str] | None:
        """Journal how a job ended (``worker_id``: who ran it); returns the clients
        (besides its own) watching it, or None when the store refused the end (a shared
        store, whose lease had gone stale: nobody is told)."""

    def finished_all(
        self, ends: list[tuple[Job, Outcome]], worker_id: str | None = None, more: int | None = None
    ) -> list[set[str] | None]:
        """:meth:`finished` for each of the jobs one worker ran (a shared store records
        them in one call, with the worker's next jobs: ``more`` beyond the first)."""
        return [self.finished(job, outcome, worker_id) for job, outcome in ends]

    @abc.abstractmethod
    def requeued(self, job: Job) -> None:
        """Journal that a job whose lease was lost is pending again."""

    def retried(self, job: Job, delay: float, cause: str) -> None:
        """Journal that a job whose attempt failed runs again, due ``delay`` seconds from
        now, with its notes; ``cause``: "exception" (its retry policy) or "retry_later"."""
        self.requeued(job)

    @abc.abstractmethod
    def requeue_ended(self, client_id: str, job_id: str) -> None:
        """Put a failed or cancelled job back in the queue by its id, due now, with its
        record (payload, priority, timeout, retries, key), no attempt made, and
        ``client_id`` the client its end goes to.

        Raises:
            JobNotFoundError: the manager knows no such job (never, or forgotten).
            InvalidJobError: it is pending, running or done; its payload was not kept;
                its key is held by another job now.
            QueueFullError, SchedulerShutdownError, StoreError: as :meth:`submit`.
        """

    def progress(self, lease_id: int, job_id: str, progress: str) -> None:
        """Note the latest progress a job in flight under ``lease_id`` reported (JSON text):
        on the queue's record of the job, which its listings and its end read."""
        assert isinstance(self.queue, JobQueue)  # a shared queue's journal has its own
        self.queue.set_progress(lease_id, job_id, progress)

    def cancelled(self, jobs: list[Job]) -> dict[str, set[str]]:
        """Journal (durably) jobs taken out of the heap; returns their watchers by job."""
        with self._lock:
            return {job.job_id: w for job in jobs if (w := self._watchers.pop(job.job_id, None))}

    @abc.abstractmethod
    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        """Start watching a job: its outcome now if it has one (finished and retained, or
        cancelled), else None and the client is handed it when the job ends.

        Raises:
            JobNotFoundError: the manager knows no such job (never, or forgotten).
        """

    @abc.abstractmethod
    def get(self, job_id: str, *, fresh: bool = False) -> JobRecord | None:
        """The record of a job the manager knows (with a store: as it was journalled,
        its outcome included); ``fresh``: after every change journalled so far."""

    def adopt(self, run_id: str) -> bool | None:
        """A schedule's run armed before (another life of this manager, or another
        manager): True while it is pending or running (its end will come here too),
        False once it ended, None when unknown."""
        record = self.get(run_id)
        return None if record is None else not record.state.finished

    def schedule_changed(self, schedule_id: str) -> None:  # noqa: B027
        """Tell the other managers of a shared store that a schedule changed."""

    def owner(self, job_id: str) -> str | None:
        """The client that submitted a job the manager knows."""
        record = self.get(job_id)
        return None if record is None else record.client_id

    @abc.abstractmethod
    def jobs(self, state: str | None, limit: int | None) -> list[JobRecord]:
        """The jobs the manager knows in submission order, without payloads or outcomes."""

    def _watch_locked(self, client_id: str, job_id: str) -> None:
        self._watchers.setdefault(job_id, set()).add(client_id)

    def _unwatch_locked(self, client_id: str, job_id: str) -> bool:
        """Stop ``client_id`` watching a job; False if it was not (its end was handed to it)."""
        watching = self._watchers.get(job_id)
        if watching is None or client_id not in watching:
            return False
        watching.discard(client_id)
        if not watching:
            del self._watchers[job_id]
        return True


def request_again(job: Job | StoredJob, client_id: str) -> JobRequest:
    """The request that puts an ended job back in the queue, due now, for ``client_id``:
    every field of a JobRequest that the job's record has too, by name, so that an option
    added to both travels with a requeue unchanged (a record's None where the request
    has another default, such as a stored job's default queue, takes that default)."""
    defaults = JobRequest._field_defaults
    fields: dict[str, Any] = {
        name: value
        for name in JobRequest._fields
        if (value := getattr(job, name, None)) is not None or defaults.get(name) is None
    }
    fields.update(client_id=client_id, delay=0.0, at=None)
    return JobRequest(**fields)


def not_requeueable(job_id: str, why: str) -> InvalidJobError:
    """The error of a requeue refused: only a failed or cancelled job can be requeued."""
    return InvalidJobError(
        f"job {job_id} cannot be requeued: {why} (only a failed or cancelled job can be)"
    )


def not_kept(job_id: str) -> Outcome:
    """The outcome a watcher of an ended job gets when its outcome was not kept."""
    error = JobError(
        f"job {job_id} ended, but its outcome was not kept (without a store "
        f"the manager keeps outcomes of up to {MAX_OUTCOME // 2**20} MiB, and "
        f"none that went through shared memory)"
    )
    return failure(job_id, error, OutcomeKind.OUTCOME_NOT_KEPT)
