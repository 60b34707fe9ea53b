"""The job model: priorities, the ordering keys, and the records that cross processes.

Everything here is plain data, picklable with the standard pickler, so the manager can store
and forward jobs without importing user code: the callable and its arguments travel as an
opaque cloudpickled ``payload``. The checks of what a job asks for are in
:mod:`mpsched._core.job_checks`.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, NamedTuple

# The checks live in job_checks; they stay importable from here, with the types they check.
from mpsched._core.job_checks import MAX_EPOCH as MAX_EPOCH
from mpsched._core.job_checks import MAX_KEY as MAX_KEY
from mpsched._core.job_checks import MIN_EPOCH as MIN_EPOCH
from mpsched._core.job_checks import check_job as check_job
from mpsched._core.job_checks import check_name as check_name
from mpsched._core.job_checks import check_queues as check_queues
from mpsched._core.job_checks import check_run as check_run
from mpsched._core.job_checks import due_arguments as due_arguments
from mpsched._core.options import Option
from mpsched._core.retrying import RetryTerms
from mpsched._errors import InvalidJobError

DEFAULT_QUEUE = "default"  # the queue of a job that names none


class Priority(enum.Enum):
    """How urgent a job is among jobs due at the same time.

    Each member carries an explicit ``level`` (lower runs first). The level is written
    here, never derived from declaration order, so reordering members changes nothing.
    """

    HIGH = 1
    MEDIUM = 2
    LOW = 3

    @property
    def level(self) -> int:
        """1 for HIGH, 2 for MEDIUM, 3 for LOW: lower levels run first."""
        return int(self.value)

    @classmethod
    def coerce(cls, priority: Priority | str) -> Priority:
        """Return ``priority`` as a member; names are accepted in any case (``"high"``).

        Raises:
            InvalidJobError: ``priority`` is neither a member nor one of their names.
        """
        if isinstance(priority, Priority):
            return priority
        if isinstance(priority, str):
            try:
                return cls[priority.strip().upper()]
            except KeyError:
                pass
        names = ", ".join(p.name.lower() for p in cls)
        raise InvalidJobError(f"unknown priority {priority!r}: use Priority or one of {names}")


class Order(Option):
    """Which key decides among jobs that are already due."""

    TIME = "time"  # due time, then priority, then submission order
    PRIORITY = "priority"  # priority, then due time, then submission order


# A job's or an outcome's pickled bytes. Received out of band (mpsched._transport.wire), a payload
# is the bytearray it was read into: copying it into bytes would cost as much as receiving it.
Payload = bytes | bytearray


class JobRequest(NamedTuple):
    """What a client sends to submit one job. Exactly one of ``delay`` and ``at`` is set."""

    job_id: str
    client_id: str
    payload: Payload  # cloudpickled (fn, args, kwargs); the manager never unpickles it
    priority: int  # Priority.level
    delay: float | None  # seconds from the manager's receipt, >= 0
    at: float | None  # wall-clock epoch seconds
    timeout: float | None = None  # seconds a worker may run it before it is killed
    retries: int = 0  # times it is run again after its worker died under it
    key: str | None = None  # idempotency key: one live job per key
    name: str = ""  # the callable's qualified name, for listings
    # A retry policy's numbers; None (the plain path) is left off the wire (codec).
    retry: RetryTerms | None = None
    queue: str = DEFAULT_QUEUE  # the queue whose workers may run it
    limit: str | None = None  # the manager's limit it runs under (None: none)


class After(NamedTuple):
    """What a job waits for before it becomes due: sent beside its JobRequest, only for a
    job that has parents."""

    parents: tuple[str, ...]  # ids of the jobs it runs after, each once
    results: tuple[str, ...]  # of those, the ones whose result its ResultOf arguments take
    allow_failure: bool = False  # run it even when a parent failed or was cancelled


@dataclass(eq=False, slots=True)
class Job:
    """A job inside the manager. Heap entries hold it; keys never compare it."""

    job_id: str
    client_id: str
    payload: Payload
    priority: int
    due: float  # the manager's monotonic clock
    seq: int  # manager-wide submission counter: the FIFO tie-break
    timeout: float | None = None
    retries: int = 0
    attempt: int = 0  # times handed to a worker that received it
    cancelled: bool = field(default=False)
    key: str | None = None  # idempotency key (JobRequest.key)
    name: str = ""  # the callable's qualified name, for listings
    at: float | None = None  # wall-clock epoch seconds it was asked for (JobRequest.at)
    retry: RetryTerms | None = None  # its retry policy's numbers (JobRequest.retry)
    error: str | None = None  # the last failed attempt's one line, while it waits to retry
    notes: list[str] | None = None  # each earlier failed attempt, for the final exception
    progress: str | None = None  # the latest its worker reported, as JSON text
    queue: str = DEFAULT_QUEUE  # JobRequest.queue
    limit: str | None = None  # JobRequest.limit

    def time_key(self) -> tuple[float, int, int]:
        """The heap key of ``order="time"``: due, then priority level, then seq."""
        return (self.due, self.priority, self.seq)

    def priority_key(self) -> tuple[int, float, int]:
        """The key among due jobs of ``order="priority"``: level, then due, then seq."""
        return (self.priority, self.due, self.seq)


class Lease(NamedTuple):
    """A worker's claim on one in-flight job; completing it names the lease."""

    lease_id: int
    job_id: str
    worker_id: str
    attempt: int


def job_digest(job_id: str) -> bytes:
    """Eight bytes that stand for ``job_id`` where a worker records which job it entered
    (mpsched._worker.claims): fixed in size whatever the id's length."""
    return hashlib.blake2b(job_id.encode(), digest_size=8).digest()


class Assignment(NamedTuple):
    """What ``take()`` hands a worker: the job's payload under a lease.

    ``due`` is an instant on the manager's monotonic clock. Only a worker the manager
    started itself provably shares that clock: it alone receives ``due`` (and may be handed
    the job early and sleep until then). Every other worker receives ``due=None`` and waits
    ``delay`` seconds from receipt instead, a duration measured at the manager at hand-off.
    """

    lease: Lease
    payload: Payload
    due: float | None  # the manager's monotonic clock; None for a worker with another clock
    timeout: float | None = None  # seconds the job may run once started
    delay: float = 0.0  # seconds from hand-off until due, measured at the manager; >= 0
    # Wall-clock epoch seconds the job was asked for (``at=``); only a worker on the
    # manager's machine receives it, and it also waits for the wall clock to get there.
    at: float | None = None


class OutcomeKind(Option):
    """How a job that did not return a result ended: ``Outcome.error_kind``.

    The words are what the store keeps and the wire carries; those of the manager's
    verdicts on a job (a crash, a timeout, a stop) are the names of the errors raised.
    """

    RAISED = ""  # the job's own exception (or, with ok, its result)
    CANCELLED = "cancelled"  # cancelled: by another client, through its id, or withdrawn
    DEPENDENCY_FAILED = "DependencyFailedError"  # a parent failed or was cancelled
    JOB_UNPICKLING = "job-unpickling"  # the worker could not unpickle the job
    RESULT_PICKLING = "result-pickling"  # the worker could not pickle the result
    OUTCOME_LOST = "outcome-lost"  # it ended, but its outcome never reached the store
    OUTCOME_NOT_KEPT = "outcome-not-kept"  # it ended, and its outcome was not kept
    WORKER_CRASHED = "WorkerCrashedError"  # its worker died under it
    JOB_TIMEOUT = "JobTimeoutError"  # it ran past its timeout and was killed
    SHUTDOWN = "SchedulerShutdownError"  # the manager stopped before it ran
    # A failed attempt that may run again; never stored or delivered: the manager decides
    # and, on a final failure, delivers it as RAISED (mpsched._core.retrying).
    RETRYABLE = "retryable"  # the job raised what its policy retries
    RETRY_LATER = "retry-later"  # the job raised RetryLater: "retry-later:<seconds>"


class Outcome(NamedTuple):
    """How one job ended, as a worker reports it and a client receives it.

    ``ok`` means ``payload`` is the cloudpickled return value; otherwise it is the
    cloudpickled exception (or empty when even that failed) and ``traceback`` is the
    worker's formatted traceback. ``started`` is the worker's monotonic clock at the
    moment the callable was entered; ``None`` when it never was.
    """

    job_id: str
    ok: bool
    payload: Payload
    traceback: str
    started: float | None
    error_kind: str = ""  # an OutcomeKind's word: "" for the job's own result or exception


@dataclass(frozen=True)
class QueueStats:
    """A snapshot of the queue's counters (see ``Scheduler.stats()``)."""

    pending: dict[str, int]  # by priority name
    in_flight: int
    submitted: int
    completed: int
    failed: int
    cancelled: int
    retried: int  # jobs run again after their worker died under them
    timed_out: int
    started_early: int  # jobs whose worker started them before their due time (always 0)
    next_due_in: float | None  # seconds until the earliest pending job is due
    # p50, p90, p99, max (seconds), over recent jobs; empty from stats(lateness=False)
    lateness: dict[str, float]
    lateness_samples: int
    wakeups: int  # returns from a condition wait, by takers and blocked submitters
    waiting: int  # takers and submitters inside a wait right now
    # Of ``failed``: jobs lost with their worker (it died, went silent, or the manager
    # stopped) and not run again; ``timed_out`` ones are not among them.
    crashed: int = 0
    prefetched: int = 0  # jobs handed to a worker along with the one it took
    revoked: int = 0  # of those, taken back before their worker started them
    retried_exception: int = 0  # attempts run again because the job raised (retry policy)
    retried_later: int = 0  # attempts run again because the job raised RetryLater

    @property
    def retried_all(self) -> int:
        """Attempts run again, whatever the cause: crash, exception or RetryLater."""
        return self.retried + self.retried_exception + self.retried_later


def check_request(request: JobRequest) -> None:
    """:func:`check_job` on a request's fields; the queue calls it on what it is sent.

    Raises:
        InvalidJobError: as :func:`check_job`.
    """
    check_job(
        request.priority, request.delay, request.at, request.timeout, request.retries, request.key
    )
    if request.queue != DEFAULT_QUEUE:
        check_name("queue", request.queue)
    if request.limit is not None:
        check_name("limit", request.limit)


@dataclass(frozen=True)
class JobInfo:
    """One job as ``Client.jobs()`` lists it.

    ``state`` is "pending", "running", "done", "failed" or "cancelled"; ``due`` is an aware
    datetime in UTC; ``attempts`` counts the runs a worker started; ``worker`` is the one
    running it (or that ran it last); ``key`` its idempotency key, if it has one;
    ``error`` a failed job's error in one line; ``progress`` the latest value the job
    reported with ``current_job().set_progress``; ``queue`` the queue it waits in;
    ``limit`` the limit it runs under, if any; ``waiting_for`` what a pending job waits for
    (``"limit NAME"``, or ``"after 2 jobs"``: its parents still pending or running), else
    None.
    """

    job_id: str
    name: str
    state: str
    due: datetime
    priority: Priority
    attempts: int
    worker: str | None
    key: str | None
    error: str | None = None  # the last error's one line (None before any)
    # The latest progress the job reported: a number in [0, 1] or a dict.
    progress: float | dict | None = None  # type: ignore[type-arg]
    queue: str = DEFAULT_QUEUE
    limit: str | None = None
    waiting_for: str | None = None


class JobState(Option):
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


# What Client.jobs(state=) takes: a member, or its word.
JobStateLike = JobState | Literal["pending", "running", "done", "failed", "cancelled"]


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
    error: str | None = None  # the last failed attempt's one line; a failed job's error
    progress: str | None = None  # the latest progress the job reported, as JSON text
    queue: str = DEFAULT_QUEUE
    limit: str | None = None
    waiting_for: str | None = None  # JobInfo.waiting_for


class PayloadOptions(NamedTuple):
    """What a client learns from the manager about sending payloads."""

    prefix: str  # names of this manager's segments; "" when it takes payloads inline only
    probe: bytes  # the content of the segment ``prefix + "probe"``: proves /dev/shm is shared
    max_pending_bytes: int | None  # the bound on pending payload bytes (None: none)
    max_payload: int | None = None  # the largest job pickle the store takes (None: no bound)
