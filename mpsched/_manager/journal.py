"""Journals: the manager's bridge between its queue and its store.

The heap (JobQueue) decides what happens to a job; a store (mpsched._store.base) records
it, so that a manager started again on the same store gets its jobs back. ``BaseJournal``
is what the service tells of each job's life and asks of it by id; ``Journal``
(mpsched._manager.store_journal) makes the store calls at the right moments.

A manager without a store journals nothing: ``NoJournal``, here, stands in for the journal
there. It makes no call per job beyond what the queue does anyway; lookups by id and
listings are answered from the queue's own records (pending and in-flight jobs; ended
ones kept in memory, bounded, for ``result_ttl``), and it keeps the keys of live jobs so
that ``key=`` works the same.

Both keep the clients that watch a job they did not submit (``Client.job(job_id)``), so that
each of them gets its outcome.
"""

from __future__ import annotations

import abc
import heapq
import logging
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

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
    check_request,
)
from mpsched._core.queue import JobQueue
from mpsched._errors import InvalidJobError, JobError, JobNotFoundError
from mpsched._manager.retained import MAX_OUTCOME, Ended, EndedJobs
from mpsched._manager.shared_queue import SharedQueue
from mpsched._protocol.records import LONG_POLL, LeftBehind, ManagerStatus, WorkerStatus
from mpsched._store.base import Store, StoredJob
from mpsched._store.memory import MemoryStore

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


class WaitingJobs(Protocol):
    """The jobs waiting for their parents, out of the heap (mpsched._manager.workflows)."""

    def find(self, job_id: str) -> tuple[Job, int] | None: ...

    def listing(self) -> list[tuple[Job, int]]: ...


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

    def __init__(self, store: Store, queue: JobQueue | SharedQueue) -> None:
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
        return _not_kept(job_id)

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


class NoJournal(BaseJournal):
    """The journal of a manager without a store: nothing is written, nothing survives it.

    Lookups and listings see the jobs pending or in flight (the queue's records), and for
    ``result_ttl`` seconds those that ended, with their outcomes, in memory and bounded
    (mpsched._manager.retained). Keys: a job with a ``key`` holds it while it is pending, running,
    or kept ended (done or failed; a cancelled one frees it). Schedules are kept in a
    MemoryStore.
    """

    def __init__(
        self, queue: JobQueue, wall: Callable[[], float] = time.time, result_ttl: float = 0.0
    ) -> None:
        super().__init__(MemoryStore(), queue)
        self.queue: JobQueue = queue
        self._wall = wall
        # Under the base class's lock: key -> the id of the job holding it, and back; the
        # jobs that ended.
        self._holders: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._ended = EndedJobs(result_ttl, queue.clock.now)
        self._keeps = result_ttl > 0  # ended jobs are kept at all
        self.waiting_jobs: WaitingJobs | None = None  # set by the service

    def _find(self, job_id: str) -> tuple[Job, str | None] | None:
        """A job pending, waiting for its parents (worker None) or running."""
        found = self.queue.find(job_id)
        if found is None and self.waiting_jobs is not None:
            waiting = self.waiting_jobs.find(job_id)
            return None if waiting is None else (waiting[0], None)
        return found

    def outcome_of(self, job_id: str) -> Outcome:
        with self._lock:
            ended = self._ended.get_locked(job_id)
        if ended is not None and ended.outcome is not None:
            return ended.outcome
        return _not_kept(job_id)

    def submit(
        self, requests: list[JobRequest], timeout: float | None, due: float | None = None
    ) -> list[str] | None:
        if all(r.key is None for r in requests):
            self.queue.submit_many(requests, timeout, due=due, refuse_running=True)
            return None
        for request in requests:
            check_request(request)  # before any key is taken
        holders, fresh = self._take_keys(requests)
        try:
            self.queue.submit_many(fresh, timeout, due=due, checked=True, refuse_running=True)
        except BaseException:
            with self._lock:
                for request in fresh:
                    self._release_key_locked(request.job_id)
            raise
        return None if len(fresh) == len(requests) else holders

    def _take_keys(self, requests: list[JobRequest]) -> tuple[list[str], list[JobRequest]]:
        """For each request, the id of the job holding its key (its own when it takes the
        key), and the requests to queue. A key is held from here on, so a concurrent
        submit of the same key finds it taken even before this batch is in the heap."""
        holders: list[str] = []
        fresh: list[JobRequest] = []
        with self._lock:
            for request in requests:
                holder = None if request.key is None else self._holders.get(request.key)
                if holder is not None and not self._holds_locked(holder):
                    self._release_key_locked(holder)  # it ended, and is no longer kept
                    holder = None
                if holder is None:
                    if request.key is not None:
                        self._holders[request.key] = request.job_id
                        self._keys[request.job_id] = request.key
                    fresh.append(request)
                holders.append(request.job_id if holder is None else holder)
        return holders, fresh

    def _holds_locked(self, job_id: str) -> bool:
        """Whether a job that took a key still holds it: queued (or on its way there),
        running, or ended and still kept (a cancelled one has let go of it already)."""
        kept = self._ended.ended_locked(job_id)
        return kept is None or kept

    def cancelled(self, jobs: list[Job]) -> dict[str, set[str]]:
        with self._lock:
            for job in jobs:
                if self._keys:
                    self._release_key_locked(job.job_id)
                if self._keeps:
                    self._forgotten_locked(
                        self._ended.add_locked(
                            job, JobState.CANCELLED, None, self._wall(), cancelled(job.job_id)
                        )
                    )
            return {job.job_id: w for job in jobs if (w := self._watchers.pop(job.job_id, None))}

    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str]:
        with self._lock:
            if self._keeps:
                self._forgotten_locked(
                    self._ended.add_locked(
                        job,
                        JobState.DONE if outcome.ok else JobState.FAILED,
                        worker_id,
                        self._wall(),
                        outcome,
                    )
                )
            elif job.key is not None:
                self._release_key_locked(job.job_id)
            return self._watchers.pop(job.job_id, set()) if self._watchers else set()

    def _forgotten_locked(self, dropped: Sequence[Ended]) -> None:
        """Ended jobs no longer kept let go of their keys."""
        if dropped and self._keys:
            for ended in dropped:
                self._release_key_locked(ended.job.job_id)

    def requeued(self, job: Job) -> None:
        pass  # nothing is journalled: the job is back in the heap, which is the record

    def requeue_ended(self, client_id: str, job_id: str) -> None:
        with self._lock:
            ended = self._ended.get_locked(job_id)
            if ended is None:
                found = self.queue.find(job_id)
                if found is not None:
                    state = JobState.PENDING if found[1] is None else JobState.RUNNING
                    raise not_requeueable(job_id, f"it is {state}")
                raise JobNotFoundError(job_id)
            if ended.state is JobState.DONE:
                raise not_requeueable(job_id, "it is done")
            job = ended.job
            if not job.payload:
                raise not_requeueable(
                    job_id, "its arguments were not kept (they went through shared memory)"
                )
            self._ended.forget_locked(job_id)
            if self._keys:
                self._release_key_locked(job_id)
        request = request_again(job, client_id)
        try:
            holders = self.submit([request], LONG_POLL)
        except BaseException:
            self._keep_again(ended)
            raise
        if holders is not None:
            self._keep_again(ended)
            raise not_requeueable(job_id, f"its key is held by job {holders[0]}")

    def _keep_again(self, ended: Ended) -> None:
        """Keep an ended job whose requeue failed as it was."""
        with self._lock:
            self._forgotten_locked(
                self._ended.add_locked(
                    ended.job, ended.state, ended.worker_id, ended.finished_wall, ended.outcome
                )
            )

    def _release_key_locked(self, job_id: str) -> None:
        key = self._keys.pop(job_id, None)
        if key is not None and self._holders.get(key) == job_id:
            del self._holders[key]

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        with self._lock:
            ended = self._ended.get_locked(job_id)
            if ended is not None:
                return ended.outcome if ended.outcome is not None else _not_kept(job_id)
            if self._find(job_id) is None:
                raise JobNotFoundError(job_id)
            self._watch_locked(client_id, job_id)
            return None

    def get(self, job_id: str, *, fresh: bool = False) -> JobRecord | None:
        found = self._find(job_id)
        if found is not None:
            job, worker_id = found
            return self._record(job, worker_id)
        with self._lock:
            ended = self._ended.get_locked(job_id)
        return None if ended is None else self._ended_record(ended)

    def owner(self, job_id: str) -> str | None:
        found = self._find(job_id)
        if found is not None:
            job, _worker = found
            return job.client_id
        with self._lock:
            ended = self._ended.get_locked(job_id)
        return None if ended is None else ended.job.client_id

    def jobs(self, state: str | None, limit: int | None) -> list[JobRecord]:
        wanted = None if state is None else JobState(state)
        ended: list[Ended] = []
        if wanted is None or wanted.finished:
            with self._lock:
                ended = [e for e in self._ended.all_locked() if wanted is None or e.state is wanted]
            if limit is not None:
                ended = heapq.nsmallest(limit, ended, key=lambda e: e.job.seq)
        # Ended jobs alone: no copy of every pending one (a million of them, maybe); and
        # records only for the jobs listed, the first ``limit`` chosen before.
        live = self.queue.jobs(wanted, limit) if wanted is None or not wanted.finished else []
        records = [self._record(job, worker) for job, worker in live]
        if self.waiting_jobs is not None and wanted in (None, JobState.PENDING):
            records += [self._record(job, None) for job, _n in self.waiting_jobs.listing()]
        records += [self._ended_record(e) for e in ended]
        records.sort(key=lambda record: record.seq)
        return records[:limit]

    def _record(
        self,
        job: Job,
        worker_id: str | None,
        state: JobState | None = None,
        finished_wall: float | None = None,
    ) -> JobRecord:
        to_wall = self._wall() - self.queue.clock.now()
        return JobRecord(
            job_id=job.job_id,
            client_id=job.client_id,
            key=job.key,
            name=job.name,
            priority=job.priority,
            due_wall=job.due + to_wall,
            seq=job.seq,
            timeout=job.timeout,
            retries=job.retries,
            attempt=job.attempt,
            submitted_wall=job.due + to_wall,  # not kept without a store: its due time
            state=state or (JobState.PENDING if worker_id is None else JobState.RUNNING),
            worker_id=worker_id,
            finished_wall=finished_wall,
            outcome=None,
            error=job.error,
            progress=job.progress,
            queue=job.queue,
            limit=job.limit,
        )

    def _ended_record(self, ended: Ended) -> JobRecord:
        record = self._record(ended.job, ended.worker_id, ended.state, ended.finished_wall)
        if ended.state is JobState.FAILED and ended.outcome is not None:
            return record._replace(outcome=encode(ended.outcome))
        return record


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


def _not_kept(job_id: str) -> Outcome:
    """The outcome a watcher of an ended job gets when its outcome was not kept."""
    error = JobError(
        f"job {job_id} ended, but its outcome was not kept (without a store "
        f"the manager keeps outcomes of up to {MAX_OUTCOME // 2**20} MiB, and "
        f"none that went through shared memory)"
    )
    return failure(job_id, error, OutcomeKind.OUTCOME_NOT_KEPT)
