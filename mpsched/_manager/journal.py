"""Journal: the manager's bridge between its queue and its store.

The heap (JobQueue) decides what happens to a job; the store (mpsched._store.base) records it,
so that a manager started again on the same store gets its jobs back. ``Journal`` makes
the store calls at the right moments:

- submit: journalled (durable) *before* the jobs enter the heap, with the seqs the heap
  will order them by; a job whose ``key`` is held by a live or retained job is not queued,
  and the holder's id stands for it;
- take: the lease is journalled (durable) before the job is handed out, so a job taken
  before a crash comes back as running (run again only if its retries allow);
- finish, requeue: journalled in order, without waiting;
- cancel: journalled (durable) before the client hears it was cancelled.

Recovery maps each stored wall-clock due time to the manager's monotonic clock with one
offset, and treats a job that was running as one whose worker died.

A manager without a store journals nothing: ``NoJournal`` stands in for the journal there.
It makes no call per job beyond what the queue does anyway; lookups by id and listings are
answered from the queue's own records (pending and in-flight jobs: a job is forgotten once
it ends), and it keeps the keys of live jobs so that ``key=`` works the same.

Both keep the clients that watch a job they did not submit (``Client.job(job_id)``), so that
each of them gets its outcome.
"""

from __future__ import annotations

import abc
import gc
import logging
import pickle
import threading
import time
from collections.abc import Callable, Sequence

from mpsched._core.clock import Clock
from mpsched._core.job import (
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
from mpsched._errors import JobError, JobNotFoundError, StoreError, WorkerCrashedError
from mpsched._manager.ended import MAX_OUTCOME, Ended, EndedJobs
from mpsched._store.base import JournalStore, Recovery, Store, StoredJob
from mpsched._store.lease_records import OUTCOME_IN_LOG
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
    return Outcome(job_id=job_id, ok=False, payload=pickle.dumps(error), traceback="",
                   started=None, error_kind=kind)


def cancelled(job_id: str) -> Outcome:
    return Outcome(job_id=job_id, ok=False, payload=b"", traceback="", started=None,
                   error_kind=OutcomeKind.CANCELLED)


class BaseJournal(abc.ABC):
    """What the service tells of each job's life, and the lookups by id; the watchers of
    each job. ``store`` keeps the schedules (and, in ``Journal``, the jobs)."""

    def __init__(self, store: Store, queue: JobQueue) -> None:
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

    def recover(self, clock: Clock) -> str:
        """Put the store's pending jobs back in the queue; a one-line summary ("" for
        nothing)."""
        return ""

    @abc.abstractmethod
    def submit(self, requests: list[JobRequest], timeout: float | None,
               due: float | None = None) -> list[str] | None:
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

    @abc.abstractmethod
    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str]:
        """Journal how a job ended (``worker_id``: who ran it); returns the clients
        (besides its own) watching it."""

    @abc.abstractmethod
    def requeued(self, job: Job) -> None:
        """Journal that a job whose lease was lost is pending again."""

    def cancelled(self, jobs: list[Job]) -> dict[str, set[str]]:
        """Journal (durably) jobs taken out of the heap; returns their watchers by job."""
        with self._lock:
            return {job.job_id: w for job in jobs
                    if (w := self._watchers.pop(job.job_id, None))}

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
    (mpsched._manager.ended). Keys: a job with a ``key`` holds it while it is pending, running, or
    kept ended (done or failed; a cancelled one frees it). Schedules are kept in a
    MemoryStore.
    """

    def __init__(self, queue: JobQueue, wall: Callable[[], float] = time.time,
                 result_ttl: float = 0.0) -> None:
        super().__init__(MemoryStore(), queue)
        self._wall = wall
        # Under the base class's lock: key -> the id of the job holding it, and back; the
        # jobs that ended.
        self._holders: dict[str, str] = {}
        self._keys: dict[str, str] = {}
        self._ended = EndedJobs(result_ttl, queue.clock.now)
        self._keeps = result_ttl > 0  # ended jobs are kept at all

    def submit(self, requests: list[JobRequest], timeout: float | None,
               due: float | None = None) -> list[str] | None:
        if all(r.key is None for r in requests):
            self.queue.submit_many(requests, timeout, due=due, refuse_running=True)
            return None
        for request in requests:
            check_request(request)  # before any key is taken
        holders, fresh = self._take_keys(requests)
        try:
            self.queue.submit_many(fresh, timeout, due=due, checked=True,
                                   refuse_running=True)
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
                    self._forgotten_locked(self._ended.add_locked(
                        job, JobState.CANCELLED, None, self._wall(), cancelled(job.job_id)))
            return {job.job_id: w for job in jobs
                    if (w := self._watchers.pop(job.job_id, None))}

    def finished(self, job: Job, outcome: Outcome, worker_id: str | None = None) -> set[str]:
        with self._lock:
            if self._keeps:
                self._forgotten_locked(self._ended.add_locked(
                    job, JobState.DONE if outcome.ok else JobState.FAILED, worker_id,
                    self._wall(), outcome))
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

    def _release_key_locked(self, job_id: str) -> None:
        key = self._keys.pop(job_id, None)
        if key is not None and self._holders.get(key) == job_id:
            del self._holders[key]

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        with self._lock:
            ended = self._ended.get_locked(job_id)
            if ended is not None:
                return ended.outcome if ended.outcome is not None else _not_kept(job_id)
            if self.queue.find(job_id) is None:
                raise JobNotFoundError(job_id)
            self._watch_locked(client_id, job_id)
            return None

    def get(self, job_id: str, *, fresh: bool = False) -> JobRecord | None:
        found = self.queue.find(job_id)
        if found is not None:
            job, worker_id = found
            return self._record(job, worker_id)
        with self._lock:
            ended = self._ended.get_locked(job_id)
        return None if ended is None else self._ended_record(ended)

    def owner(self, job_id: str) -> str | None:
        found = self.queue.find(job_id)
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
                ended = self._ended.all_locked()
        # Ended jobs alone: no copy of every pending one (a million of them, maybe).
        live = self.queue.jobs() if wanted is None or not wanted.finished else []
        records = [self._record(job, worker) for job, worker in live]
        records += [self._ended_record(e) for e in ended]
        records.sort(key=lambda record: record.seq)
        return [r for r in records if wanted is None or r.state is wanted][:limit]

    def _record(self, job: Job, worker_id: str | None, state: JobState | None = None,
                finished_wall: float | None = None) -> JobRecord:
        to_wall = self._wall() - self.queue.clock.now()
        return JobRecord(
            job_id=job.job_id, client_id=job.client_id, key=job.key, name=job.name,
            priority=job.priority, due_wall=job.due + to_wall, seq=job.seq,
            timeout=job.timeout, retries=job.retries, attempt=job.attempt,
            submitted_wall=job.due + to_wall,  # not kept without a store: its due time
            state=state or (JobState.PENDING if worker_id is None else JobState.RUNNING),
            worker_id=worker_id, finished_wall=finished_wall, outcome=None)

    def _ended_record(self, ended: Ended) -> JobRecord:
        return self._record(ended.job, ended.worker_id, ended.state, ended.finished_wall)


def _not_kept(job_id: str) -> Outcome:
    """The outcome a watcher of an ended job gets when its outcome was not kept."""
    error = JobError(f"job {job_id} ended, but its outcome was not kept (without a store "
                     f"the manager keeps outcomes of up to {MAX_OUTCOME // 2**20} MiB, and "
                     f"none that went through shared memory)")
    return failure(job_id, error, OutcomeKind.OUTCOME_NOT_KEPT)


def _lost(job_id: str) -> Outcome:
    """The outcome a watcher gets of a job that ended without its outcome in the store (a
    large one, not yet committed when the manager died)."""
    error = JobError(f"job {job_id} ran to its end, but its outcome was lost: the manager "
                     f"stopped before it reached the store (only outcomes of up to "
                     f"{OUTCOME_IN_LOG // 1024} KiB are journalled with the job's end)")
    return failure(job_id, error, OutcomeKind.OUTCOME_LOST)


class Journal(BaseJournal):
    """Journals one queue's job changes to ``store`` and keeps the watchers of each job."""

    def __init__(self, store: JournalStore, queue: JobQueue,
                 wall: Callable[[], float] = time.time) -> None:
        super().__init__(store, queue)
        self.store: JournalStore = store
        self._wall = wall

    # ------------------------------------------------------------------ recovery

    def recover(self, clock: Clock) -> str:
        """Put the store's pending jobs back in the queue; resolve the ones that were
        running as if their worker died. Returns a one-line summary ("" for nothing)."""
        recovery = self.store.recover()
        offset = clock.now() - self._wall()
        gc_was_on = gc.isenabled()
        gc.disable()  # a million small objects: the cyclic collector would only slow it
        try:
            jobs = [_job(stored, offset) for stored in recovery.pending]
            retried, failed = self._resolve_running(recovery, offset, jobs)
            self.queue.restore(jobs, recovery.next_seq)
        finally:
            if gc_was_on:
                gc.enable()
        if not (recovery.pending or recovery.running):
            return ""
        return (f"recovered {len(recovery.pending)} pending job(s) from {self.store.location}; "
                f"of {len(recovery.running)} running when the manager stopped, {retried} "
                f"will run again and {failed} failed (WorkerCrashedError)")

    def _resolve_running(self, recovery: Recovery, offset: float,
                         jobs: list[Job]) -> tuple[int, int]:
        retried = failed = 0
        for running in recovery.running:
            job = _job(running.job, offset)
            if job.attempt <= job.retries:
                self.store.requeue(job.job_id, job.attempt)
                jobs.append(job)
                retried += 1
            else:
                error = WorkerCrashedError(job.job_id, running.worker_id, None)
                self.store.finish(job.job_id, JobState.FAILED, encode(failure(
                    job.job_id, error, OutcomeKind.WORKER_CRASHED)), self._wall())
                failed += 1
        return retried, failed

    # ------------------------------------------------------------------ changes

    def submit(self, requests: list[JobRequest], timeout: float | None,
               due: float | None = None) -> list[str] | None:
        """As BaseJournal.submit; the store keeps the wall-clock time the requests'
        ``delay`` gives."""
        for request in requests:
            check_request(request)
        seqs = self.queue.reserve_seqs(len(requests))
        now = self._wall()
        holders = self.store.submit([
            StoredJob(r.job_id, r.client_id, r.key, r.name, r.payload, r.priority,
                      r.at if r.at is not None else now + (r.delay or 0.0), seq, r.timeout,
                      r.retries, 0, now)
            for r, seq in zip(requests, seqs, strict=True)])
        fresh = [(r, seq) for r, seq, holder in zip(requests, seqs, holders, strict=True)
                 if holder == r.job_id]
        try:
            self.queue.submit_many([r for r, _ in fresh], timeout, seqs=[s for _, s in fresh],
                                   due=due, checked=True)
        except BaseException:
            self.store.cancel([r.job_id for r, _ in fresh], self._wall())
            raise
        return None if len(fresh) == len(requests) else holders

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
            self.store.finish(job.job_id, state, kept, self._wall())
        except StoreError as exc:
            log.error("the outcome of job %s was not journalled: %s", job.job_id, exc)
        with self._lock:  # a watcher that registered before the finish was readable
            return self._watchers.pop(job.job_id, set())

    def requeued(self, job: Job) -> None:
        try:
            self.store.requeue(job.job_id, job.attempt)
        except StoreError as exc:
            log.error("the requeue of job %s was not journalled: %s", job.job_id, exc)

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
        if record is not None and not record.state.finished \
                and record.state is not JobState.CANCELLED:
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
        return self.store.get(job_id)

    def jobs(self, state: str | None, limit: int | None) -> list[JobRecord]:
        self.store.flush()
        return self.store.jobs(None if state is None else JobState(state), limit)


def _job(stored: StoredJob, offset: float) -> Job:
    return Job(job_id=stored.job_id, client_id=stored.client_id, payload=stored.payload,
               priority=stored.priority, due=stored.due_wall + offset, seq=stored.seq,
               timeout=stored.timeout, retries=stored.retries, attempt=stored.attempt,
               key=stored.key, name=stored.name)
