"""The job store: where jobs' records, outcomes, keys and schedules live.

Two kinds of backend share the :class:`Store` interface (records and lookups by id, keys,
retention, schedules) and differ in where the queue itself lives:

- a :class:`JournalStore` journals one manager's queue, which stays in that manager's
  memory as the index (``MemoryStore`` in ``memory``: no store configured, nothing
  survives the process; ``SQLiteStore`` in ``sqlite``: one manager per file). The
  manager orders jobs (its seqs), reads due times off its own clock, picks the job it
  hands out and journals each step; a manager started again ``recover``s the rest.
- a shared store holds the queue itself, and several managers are its peers
  (``RedisStore`` in ``redis``): the store orders jobs, reads due times off its own clock,
  picks the job a claim gets, and fences every lease with a token, so that a manager
  presumed dead cannot finish what a peer took back. Nothing is recovered into memory.

A job's life in a store::

    submit ─▶ pending ──lease──▶ running ──finish──▶ done | failed
               │   ▲                │
               │   └────requeue─────┘   (retried, or never received by its worker)
               └──cancel──▶ cancelled

Times in a store are wall-clock UTC epoch seconds. Payloads and outcomes are opaque
bytes: a store never unpickles them.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import NamedTuple, TypeVar

from mpsched._core.histogram import HistogramSnapshot
from mpsched._core.job import DEFAULT_QUEUE, After, JobRecord, JobState, Payload
from mpsched._errors import ConfigError, InvalidJobError

DAY = 86400.0
IN_MEMORY = "memory"  # the location of the store of a manager without one: its memory
StoreT = TypeVar("StoreT", bound="Store")  # `with SQLiteStore(...) as store` is a SQLiteStore


class StoredJob(NamedTuple):
    """A job as submitted to a store: everything needed to put it back in the heap.

    A NamedTuple (not a dataclass) so that a million of them load fast at recovery.
    """

    job_id: str
    client_id: str
    key: str | None  # idempotency key: one live job per key (see Store.submit)
    name: str  # the callable's qualified name, for listings
    payload: Payload  # cloudpickled (fn, args, kwargs); never unpickled by a store
    priority: int  # Priority.level
    due_wall: float  # UTC epoch seconds
    seq: int  # the manager's submission counter: FIFO among equal due and priority
    timeout: float | None
    retries: int
    attempt: int  # times handed to a worker that received it
    submitted_wall: float
    queue: str | None = None  # None: the default queue (nothing stored for it)
    limit: str | None = None


def record_of(
    job: StoredJob,
    state: JobState,
    worker_id: str | None = None,
    finished_wall: float | None = None,
    outcome: bytes | None = None,
) -> JobRecord:
    """The record of ``job`` in ``state``."""
    return JobRecord(
        job_id=job.job_id,
        client_id=job.client_id,
        key=job.key,
        name=job.name,
        priority=job.priority,
        due_wall=job.due_wall,
        seq=job.seq,
        timeout=job.timeout,
        retries=job.retries,
        attempt=job.attempt,
        submitted_wall=job.submitted_wall,
        state=state,
        worker_id=worker_id,
        finished_wall=finished_wall,
        outcome=outcome,
        queue=job.queue or DEFAULT_QUEUE,
        limit=job.limit,
    )


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
    # The retry state (RetryState, encoded) of each of those jobs that has a retry policy.
    retry: Mapping[str, str] | None = None


class StoredSchedule(NamedTuple):
    """A recurring schedule as a store keeps it: opaque to the store, like a payload."""

    schedule_id: str
    spec: bytes  # the manager's encoding of what was asked (mpsched._core.recurring)
    state: bytes  # the manager's encoding of where it stands (last slot, counters)


class Store(abc.ABC):
    """Where jobs' records live: lookups by id and key, listings, retention, schedules.
    Thread-safe: any manager thread may call it."""

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the jobs live, for ``status``: a path, a URL, or IN_MEMORY."""

    @abc.abstractmethod
    def size(self) -> int | None:
        """Bytes the store takes (database and journal files), or None if unknown."""

    def kept(self) -> int | None:
        """How many job records the store keeps (pending, running, ended until
        result_ttl), where that is cheap to know; None elsewhere."""
        return None

    def commit_latency(self) -> HistogramSnapshot | None:
        """How long each commit took so far (seconds, in fixed buckets); None for a store
        that does not commit (memory) or does not measure it."""
        return None

    @property
    def keeps_outcomes(self) -> bool:
        """Whether ``finish`` keeps the outcome (False: the manager need not encode it)."""
        return True

    @abc.abstractmethod
    def flush(self) -> None:
        """Wait until every earlier change is durable (or was reported as failed in a log);
        a store whose every call is done when it returns does nothing.

        Raises:
            StoreError: the store is closed.
        """

    @abc.abstractmethod
    def get(self, job_id: str) -> JobRecord | None:
        """The job's record with its outcome, or None when unknown (or pruned).

        Reads see committed state: a journal store's ``lease``, ``finish`` and ``requeue``
        show after ``flush`` (``recover`` sees every durable change).
        """

    @abc.abstractmethod
    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        """Jobs in seq order (only those in ``state``, at most ``limit``); outcomes are left
        out (None) to keep listings light, but for failed jobs' (their error is listed):
        ``get`` a job for its outcome. Committed state, as ``get``.
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
    def save_schedule(self, schedule: StoredSchedule) -> None:
        """Record a schedule, replacing one with its id; durable when this returns.

        Raises:
            StoreError: it could not be written.
        """

    def save_schedule_unless_same(
        self, schedule: StoredSchedule, same: Callable[[bytes], bool]
    ) -> StoredSchedule | None:
        """Record a schedule, unless the one recorded under its id has a spec ``same``
        says is this one's: then that one is returned, unchanged (a store that several
        managers share keeps the first one's timeline). One manager per store: it knows
        what it recorded, so this records.

        Raises:
            StoreError: it could not be written.
        """
        self.save_schedule(schedule)
        return None

    @abc.abstractmethod
    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        """Record where a schedule stands, without waiting (in order with every later
        call); an unknown id is ignored."""

    @abc.abstractmethod
    def delete_schedule(self, schedule_id: str) -> None:
        """Forget a schedule (an unknown id is ignored); durable when this returns."""

    @abc.abstractmethod
    def schedules(self) -> list[StoredSchedule]:
        """Every schedule, in the order they were first saved."""

    def save_limit(self, name: str, form: str | None) -> None:  # noqa: B027
        """Record a limit in its form (``"2,10/s"``), or forget it (None); durable when
        this returns. A store that keeps nothing across restarts ignores it."""

    def saved_limits(self) -> dict[str, str]:
        """The limits recorded, by name, in their forms."""
        return {}

    @abc.abstractmethod
    def close(self) -> None:
        """Write what is queued, then release the store. Idempotent. Later calls raise
        StoreError."""

    def __enter__(self: StoreT) -> StoreT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class JournalStore(Store):
    """The journal of one manager's queue, which stays in the manager's memory.

    Calls that must not be lost block until they are durable: ``submit`` (a client's submit
    is acknowledged only after it), ``cancel`` (a job reported cancelled must not run after
    a restart) and ``lease`` (a job taken before a crash comes back as *running*, so it is
    only run again if its retries allow). ``finish`` and ``requeue`` return at once and are
    written in order after every earlier call; ``flush`` waits for them. A manager that dies
    before they are written recovers the job as running, the safe side.

    The manager maps the stored wall-clock times to its monotonic clock with one offset when
    it loads them. Unknown job ids are ignored by ``cancel``, ``lease``, ``finish`` and
    ``requeue``: the manager's queue decides what happens to a job, the store records it.
    """

    @abc.abstractmethod
    def recover(self) -> Recovery:
        """The pending and running jobs, and the next seq. Call once, before any write."""

    def submit_waiting(
        self,
        jobs: Sequence[StoredJob],
        parents: Sequence[After],
        retry: Mapping[str, str] | None = None,
    ) -> None:
        """Record new pending jobs that wait for their ``parents`` (one After each), with
        those edges, all or none; durable when this returns. Their keys are None;
        ``retry`` as for :meth:`submit`.

        Raises:
            InvalidJobError, StoreError: as :meth:`submit`.
        """
        self.submit(jobs, retry)

    def waiting(self) -> dict[str, After]:
        """The parents of each pending job that was submitted with some (the edges of the
        jobs no longer pending are dropped here). Call once, after :meth:`recover`."""
        return {}

    @abc.abstractmethod
    def submit(
        self, jobs: Sequence[StoredJob], retry: Mapping[str, str] | None = None
    ) -> list[str]:
        """Record new pending jobs, all or none; durable when this returns. ``retry``: the
        retry state (RetryState, encoded) of each job that has a retry policy, by id.

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
        """Mark a job running with ``worker_id`` as its ``attempt``-th run; when this returns
        it survives a crash of the manager, so that a job taken before a crash is recovered
        as running, never pending. A store may make it survive a power cut a little later
        (SQLiteStore with durability="sync": within ~2 ms, by group sync).

        Raises:
            StoreError: the change could not be written; the job must not be handed out.
        """

    @abc.abstractmethod
    def finish(
        self, job_id: str, state: JobState, outcome: bytes | None, finished_wall: float
    ) -> None:
        """Record how a job ended (``state`` done or failed); when this returns it survives
        a crash of the manager, as a lease does (SQLiteStore: in its lease log, with the
        outcome if it is up to OUTCOME_IN_LOG bytes, else committed first when it can be),
        and it is written in order after every earlier call. The outcome is retained for
        ``result_ttl`` seconds.

        Raises:
            InvalidJobError: ``state`` is not done or failed.
            StoreError: the store is closed.
        """

    def retried(self, job_id: str, attempt: int, due_wall: float, retry: str) -> None:
        """Put back to pending a job whose attempt failed, due at ``due_wall`` (UTC epoch
        seconds), with its retry state; durable when this returns. This default keeps
        the attempt count only.

        Raises:
            StoreError: the store is closed, or the change could not be written.
        """
        self.requeue(job_id, attempt)

    def retry_ended(self, job_id: str, retry: str) -> None:
        """Record a job's retry state as it ended for good (its final error); returns at
        once, written after every earlier call. This default keeps nothing."""

    @abc.abstractmethod
    def set_progress(self, job_id: str, progress: str) -> None:
        """Record the latest progress of a job that reported some (JSON text), before its
        finish. Returns at once; written in order after every earlier call.

        Raises:
            StoreError: the store is closed.
        """

    @abc.abstractmethod
    def requeue_ended(
        self, job_id: str, client_id: str, due_wall: float
    ) -> tuple[StoredJob, str | None] | None:
        """Put a failed or cancelled job back as pending, due at ``due_wall``, with no
        attempt made, its end forgotten and ``client_id`` its client; its id, seq, payload
        and options stay, and its retry policy without its earlier attempts' errors.
        Durable when this returns. Returns the job as it is now and its retry state
        (RetryState, encoded; None without a policy), or None when it is not failed or
        cancelled (or unknown).

        Raises:
            InvalidJobError: its key is held by another job now.
            StoreError: it could not be written.
        """

    @abc.abstractmethod
    def requeue(self, job_id: str, attempt: int) -> None:
        """Put a job back to pending with its attempt count (a retry, or a job its worker
        never received). Returns at once; written in order after every earlier call.

        Raises:
            StoreError: the store is closed.
        """


def check_options(result_ttl: float) -> None:
    """Raise ConfigError for a ``result_ttl`` that is not a number of seconds >= 0."""
    if (
        isinstance(result_ttl, bool)
        or not isinstance(result_ttl, (int, float))
        or not 0 <= result_ttl < float("inf")
    ):
        raise ConfigError("result_ttl", result_ttl, "a number of seconds >= 0")


def check_finish_state(state: JobState) -> None:
    """Raise InvalidJobError unless ``state`` is one ``finish`` may record."""
    if state not in (JobState.DONE, JobState.FAILED):
        raise InvalidJobError(f"a job finishes as done or failed, not {state!r}")
