"""The job store: a journal of every job's state changes, so a restarted manager recovers.

The manager's heap stays the index, in memory; a store records what happens to each job so
that a manager started again on the same store gets its jobs back. Backends share the
:class:`Store` interface below: :class:`MemoryStore` (no store configured: nothing
survives the process), ``SQLiteStore`` (``_store_sqlite``), and later Redis. Nothing here
assumes the store lives in the manager's memory or on its disk.

A job's life in a store, and the call that records each step::

    submit ─▶ pending ──lease──▶ running ──finish──▶ done | failed
               │   ▲                │
               │   └────requeue─────┘   (retried, or never received by its worker)
               └──cancel──▶ cancelled

Calls that must not be lost block until they are durable: ``submit`` (a client's submit is
acknowledged only after it), ``cancel`` (a job reported cancelled must not run after a
restart) and ``lease`` (a job taken before a crash comes back as *running*, so it is only run
again if its retries allow). ``finish`` and ``requeue`` return at once and are written in
order after every earlier call; ``flush`` waits for them. A manager that dies before they are
written recovers the job as running, the safe side.

Times in a store are wall-clock UTC epoch seconds: the manager maps them to its monotonic
clock with one offset when it loads them. Payloads and outcomes are opaque bytes: a store
never unpickles them.
"""

from __future__ import annotations

import abc
import enum
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple

from mpsched._errors import InvalidJobError, StoreError

DAY = 86400.0


class JobState(str, enum.Enum):
    """Where a job is in its life (the value is what a store writes and a listing shows)."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for the states a job never leaves: done, failed, cancelled."""
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


class StoredJob(NamedTuple):
    """A job as submitted to a store: everything needed to put it back in the heap.

    A NamedTuple (not a dataclass) so that a million of them load fast at recovery.
    """

    job_id: str
    client_id: str
    key: str | None  # idempotency key: one live job per key (see Store.submit)
    name: str  # the callable's qualified name, for listings
    payload: bytes  # cloudpickled (fn, args, kwargs); never unpickled by a store
    priority: int  # Priority.level
    due_wall: float  # UTC epoch seconds
    seq: int  # the manager's submission counter: FIFO among equal due and priority
    timeout: float | None
    retries: int
    attempt: int  # times handed to a worker that received it
    submitted_wall: float


class JobRecord(NamedTuple):
    """A job as a listing or a lookup shows it: no payload, its state and how it ended."""

    job_id: str
    client_id: str
    key: str | None
    name: str
    priority: int
    due_wall: float
    seq: int
    timeout: float | None
    retries: int
    attempt: int
    submitted_wall: float
    state: JobState
    worker_id: str | None  # who runs it, or ran it last
    finished_wall: float | None  # when it was finished or cancelled
    outcome: bytes | None  # the manager's opaque bytes; None while unfinished, in listings

    @classmethod
    def of(cls, job: StoredJob, state: JobState, worker_id: str | None = None,
           finished_wall: float | None = None, outcome: bytes | None = None) -> JobRecord:
        """The record of ``job`` in ``state``."""
        return cls(job.job_id, job.client_id, job.key, job.name, job.priority, job.due_wall,
                   job.seq, job.timeout, job.retries, job.attempt, job.submitted_wall,
                   state, worker_id, finished_wall, outcome)


class RunningJob(NamedTuple):
    """A job that was running when its manager died, with the worker it was leased to."""

    job: StoredJob  # ``attempt`` counts the run the manager lost
    worker_id: str


class Recovery(NamedTuple):
    """What a manager starting on a store gets back.

    ``running`` jobs are to be treated like jobs whose worker died: requeued if their
    retries allow, else finished as failed (WorkerCrashedError). ``next_seq`` is the first
    submission counter the manager may hand out, so new jobs order after recovered ones.
    """

    pending: list[StoredJob]  # in seq order
    running: list[RunningJob]  # in seq order
    next_seq: int


class Store(abc.ABC):
    """The journal of job state changes. Thread-safe: any manager thread may call it.

    Unknown job ids are ignored by ``cancel``, ``lease``, ``finish`` and ``requeue``: the
    manager's queue decides what happens to a job, the store records it.
    """

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the jobs live, for ``status``: a path, a URL, or ``"memory"``."""

    @abc.abstractmethod
    def size(self) -> int | None:
        """Bytes the store takes (database and journal files), or None if unknown."""

    @abc.abstractmethod
    def recover(self) -> Recovery:
        """The pending and running jobs, and the next seq. Call once, before any write."""

    @abc.abstractmethod
    def submit(self, jobs: Sequence[StoredJob]) -> list[str]:
        """Record new pending jobs, all or none; durable when this returns.

        A job with a ``key`` held by a job that is pending, running, or finished and still
        retained (see ``find_key``) is not recorded: its entry in the result is the holder's
        id instead of its own. Within one call, a repeated key maps to the first job with it.

        Returns:
            For each job, in order, the id of the job that stands for it.
        Raises:
            InvalidJobError: a job id or seq already in the store; nothing was recorded.
            StoreError: the jobs could not be written (StoreFullError when full).
        """

    @abc.abstractmethod
    def cancel(self, job_ids: Sequence[str], finished_wall: float) -> None:
        """Mark pending jobs cancelled; durable when this returns. Others are left as they
        are. A cancelled job frees its key at once.

        Raises:
            StoreError: the change could not be written.
        """

    @abc.abstractmethod
    def lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        """Mark a job running with ``worker_id`` as its ``attempt``-th run; durable when this
        returns, so that a job taken before a crash is recovered as running, never pending.

        Raises:
            StoreError: the change could not be written; the job must not be handed out.
        """

    @abc.abstractmethod
    def finish(self, job_id: str, state: JobState, outcome: bytes | None,
               finished_wall: float) -> None:
        """Record how a job ended (``state`` done or failed). Returns at once; written in
        order after every earlier call. The outcome is retained for ``result_ttl`` seconds.

        Raises:
            InvalidJobError: ``state`` is not done or failed.
            StoreError: the store is closed.
        """

    @abc.abstractmethod
    def requeue(self, job_id: str, attempt: int) -> None:
        """Put a job back to pending with its attempt count (a retry, or a job its worker
        never received). Returns at once; written in order after every earlier call.

        Raises:
            StoreError: the store is closed.
        """

    @abc.abstractmethod
    def flush(self) -> None:
        """Wait until every earlier call is durable (or was reported as failed in a log).

        Raises:
            StoreError: the store is closed.
        """

    @abc.abstractmethod
    def get(self, job_id: str) -> JobRecord | None:
        """The job's record with its outcome, or None when unknown (or pruned).

        Reads see durable state: ``finish`` and ``requeue`` show after ``flush``.
        """

    @abc.abstractmethod
    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        """Jobs in seq order (only those in ``state``, at most ``limit``); outcomes are left
        out (None) to keep listings light: ``get`` a job for its outcome.
        """

    @abc.abstractmethod
    def find_key(self, key: str) -> JobRecord | None:
        """The job holding ``key``: pending, running, or finished less than ``result_ttl``
        seconds ago. Cancelled jobs hold no key."""

    @abc.abstractmethod
    def prune(self, now_wall: float) -> int:
        """Forget jobs finished (or cancelled) ``result_ttl`` seconds or more before
        ``now_wall``; returns how many. Backends also prune on their own."""

    @abc.abstractmethod
    def close(self) -> None:
        """Write what is queued, then release the store. Idempotent. Later calls raise
        StoreError."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def check_options(result_ttl: float) -> None:
    """Raise InvalidJobError for a ``result_ttl`` that is not a number of seconds >= 0."""
    if isinstance(result_ttl, bool) or not isinstance(result_ttl, (int, float)) \
            or not 0 <= result_ttl < float("inf"):
        raise InvalidJobError(f"result_ttl must be a number of seconds >= 0, not {result_ttl!r}")


def check_finish_state(state: JobState) -> None:
    """Raise InvalidJobError unless ``state`` is one ``finish`` may record."""
    if state not in (JobState.DONE, JobState.FAILED):
        raise InvalidJobError(f"a job finishes as done or failed, not {state!r}")


@dataclass(slots=True)
class _Entry:
    job: StoredJob
    state: JobState
    worker_id: str | None = None
    finished_wall: float | None = None
    outcome: bytes | None = None

    def record(self, *, with_outcome: bool = True) -> JobRecord:
        return JobRecord.of(self.job, self.state, self.worker_id, self.finished_wall,
                            self.outcome if with_outcome else None)


class MemoryStore(Store):
    """The store of a manager without one: the same semantics, in this process's memory.

    Nothing survives the process, so ``recover`` of a new MemoryStore returns nothing. With
    the default ``result_ttl=0`` a finished or cancelled job is forgotten at once (no
    outcome is kept, its key is free again): a manager without a store keeps no history, so
    its memory stays bounded by what is pending and running. With ``result_ttl > 0`` finished
    jobs are kept as a SQLiteStore keeps them. Every call takes effect before it returns.
    """

    def __init__(self, *, result_ttl: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        check_options(result_ttl)
        self._result_ttl = float(result_ttl)
        self._clock = clock  # wall clock: when a retained job expires
        # Guards every field below; held briefly by each call, never while waiting.
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._keys: dict[str, str] = {}  # key -> id of the job holding it
        self._seqs: set[int] = set()  # of the entries: a seq is never reused
        self._closed = False

    @property
    def location(self) -> str:
        return "memory"

    def size(self) -> int | None:
        return None

    def recover(self) -> Recovery:
        with self._lock:
            self._check_open_locked()
            entries = sorted(self._entries.values(), key=lambda e: e.job.seq)
            seqs = [e.job.seq for e in entries]
            return Recovery(
                [e.job for e in entries if e.state is JobState.PENDING],
                [RunningJob(e.job, e.worker_id or "") for e in entries
                 if e.state is JobState.RUNNING],
                max(seqs) + 1 if seqs else 0)

    def submit(self, jobs: Sequence[StoredJob]) -> list[str]:
        with self._lock:
            self._check_open_locked()
            ids = self._resolve_keys_locked(jobs)
            new = [job for job, job_id in zip(jobs, ids, strict=True) if job_id == job.job_id]
            if len({job.job_id for job in new}) < len(new) \
                    or len({job.seq for job in new}) < len(new) \
                    or any(j.job_id in self._entries or j.seq in self._seqs for j in new):
                raise InvalidJobError("a job id or seq repeats one in the batch or the store")
            for job in new:
                self._entries[job.job_id] = _Entry(job, JobState.PENDING)
                self._seqs.add(job.seq)
                if job.key is not None:
                    self._keys[job.key] = job.job_id
            return ids

    def _resolve_keys_locked(self, jobs: Sequence[StoredJob]) -> list[str]:
        """For each job, the id of the job holding its key, or its own id."""
        now = self._clock()
        held: dict[str, str] = {}
        ids: list[str] = []
        for job in jobs:
            holder = None if job.key is None else (
                held.get(job.key) or self._holder_locked(job.key, now))
            if holder is None and job.key is not None:
                held[job.key] = job.job_id
            ids.append(job.job_id if holder is None else holder)
        return ids

    def cancel(self, job_ids: Sequence[str], finished_wall: float) -> None:
        with self._lock:
            self._check_open_locked()
            for job_id in job_ids:
                entry = self._entries.get(job_id)
                if entry is not None and entry.state is JobState.PENDING:
                    self._end_locked(entry, JobState.CANCELLED, None, finished_wall)

    def lease(self, job_id: str, worker_id: str, attempt: int) -> None:
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                entry.state, entry.worker_id = JobState.RUNNING, worker_id
                entry.job = entry.job._replace(attempt=attempt)

    def finish(self, job_id: str, state: JobState, outcome: bytes | None,
               finished_wall: float) -> None:
        check_finish_state(state)
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                self._end_locked(entry, state, outcome, finished_wall)

    def requeue(self, job_id: str, attempt: int) -> None:
        with self._lock:
            self._check_open_locked()
            entry = self._entries.get(job_id)
            if entry is not None:
                entry.state, entry.worker_id = JobState.PENDING, None
                entry.job = entry.job._replace(attempt=attempt)

    def flush(self) -> None:
        with self._lock:
            self._check_open_locked()

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            entry = self._entries.get(job_id)
            return None if entry is None else entry.record()

    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        with self._lock:
            entries = sorted((e for e in self._entries.values()
                              if state is None or e.state is state), key=lambda e: e.job.seq)
            return [e.record(with_outcome=False) for e in entries[:limit]]

    def find_key(self, key: str) -> JobRecord | None:
        with self._lock:
            holder = self._holder_locked(key, self._clock())
            return None if holder is None else self._entries[holder].record()

    def prune(self, now_wall: float) -> int:
        with self._lock:
            expired = [e for e in self._entries.values() if self._expired(e, now_wall)]
            for entry in expired:
                self._forget_locked(entry)
            return len(expired)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open_locked(self) -> None:
        if self._closed:
            raise StoreError("memory", "the store is closed")

    def _expired(self, entry: _Entry, now_wall: float) -> bool:
        return entry.finished_wall is not None \
            and entry.finished_wall <= now_wall - self._result_ttl

    def _holder_locked(self, key: str, now_wall: float) -> str | None:
        """The id of the job holding ``key``; an expired holder is forgotten here."""
        job_id = self._keys.get(key)
        if job_id is None:
            return None
        entry = self._entries[job_id]
        if self._expired(entry, now_wall):
            self._forget_locked(entry)
            return None
        return job_id

    def _end_locked(self, entry: _Entry, state: JobState, outcome: bytes | None,
                    finished_wall: float) -> None:
        entry.state, entry.outcome, entry.finished_wall = state, outcome, finished_wall
        if state is JobState.CANCELLED and entry.job.key is not None:
            self._keys.pop(entry.job.key, None)
        if self._result_ttl == 0:
            self._forget_locked(entry)

    def _forget_locked(self, entry: _Entry) -> None:
        del self._entries[entry.job.job_id]
        self._seqs.discard(entry.job.seq)
        key = entry.job.key
        if key is not None and self._keys.get(key) == entry.job.job_id:
            del self._keys[key]
