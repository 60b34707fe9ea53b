"""What a manager and a shared Redis store say to each other: plain NamedTuples.

Times that cross are durations measured on the Redis server's clock (``delay``,
``head_in``) or UTC epoch seconds read from it (``due_wall``); never a manager's instant.
"""

from __future__ import annotations

from typing import NamedTuple

from mpsched._core.job import DEFAULT_QUEUE, JobState, Order, Payload


class NewJob(NamedTuple):
    """A job a manager submits. Exactly one of ``delay`` and ``at`` is set."""

    job_id: str
    client_id: str
    key: str | None
    name: str
    payload: Payload
    priority: int  # Priority.level
    delay: float | None  # seconds after the server receives it
    at: float | None  # UTC epoch seconds
    timeout: float | None
    retries: int
    # The submitting manager keeps this job's large buffers in shared memory too: its
    # own claims get no payload from Redis (the claim script) and hand its workers the
    # framed payload that names the segment.
    held: bool = False
    retry: str | None = None  # its retry state (RetryState, encoded): a job with a policy
    queue: str = DEFAULT_QUEUE
    limit: str | None = None


class Claimed(NamedTuple):
    """A job claimed for a worker, under a lease whose fencing token is ``token``."""

    job_id: str
    payload: Payload
    delay: float  # seconds until it is due, on the server's clock at the claim (>= 0)
    timeout: float | None
    attempt: int  # this run's number, from 1
    token: str  # its lease's fencing token: a finish or requeue must name it
    priority: int
    seq: int
    client_id: str
    owner: str  # the manager its client submitted it through
    retries: int
    key: str | None
    name: str
    due_wall: float  # UTC epoch seconds, as the server reads it
    submitted_wall: float
    retry: str | None = None  # its retry state (RetryState, encoded), if it has one
    # A job whose ResultOf take its parents' outcomes: (parent id, its state, the
    # manager's encoding of its outcome, b"" when not kept) each; None for any other.
    inputs: list[tuple[str, str, bytes]] | None = None


class Finish(NamedTuple):
    """A leased job's end, reported under its lease. State PENDING is a failed attempt
    that runs again: ``outcome`` is then :func:`retry_end`'s."""

    job_id: str
    token: str
    state: JobState  # DONE or FAILED; PENDING: a retry
    outcome: bytes  # the manager's encoding; opaque to the store
    retry: str | None = None  # a failed job's final retry state (its listed error)


def retry_end(delay: float, cause: str, retry: str) -> bytes:
    """A retry's Finish outcome: microseconds until it is due on the server's clock, the
    stats counter it counts in, and the job's retry state, as finish() in common.lua
    reads them."""
    return f"{round(delay * 1_000_000)} {cause} {retry}".encode()


class Requeue(NamedTuple):
    """A leased job put back: ``retry`` when its worker had it (an attempt), else it never
    started and its attempt is not counted."""

    job_id: str
    token: str
    retry: bool


class Take(NamedTuple):
    """What to claim in a report call: ``want`` due jobs from the head for ``worker``
    (or the pending jobs ``ids``), those due within ``early`` seconds too; ``lead``:
    "wait" (the caller will wait if it gets nothing: take the lead if it is free), "give"
    (give the lead up) or "" (leave it); ``waiting``: another taker of the caller's waits
    for work (other managers prefetch nothing meanwhile)."""

    want: int = 0
    worker: str = ""
    early: float = 0.0
    lead: str = ""
    ids: tuple[str, ...] = ()
    waiting: bool = False
    # The claim's name (unique per manager), written in each job it leases: a claim
    # whose answer never came is given back by it (RedisStore.unclaim).
    claim: str = ""
    queues: tuple[str, ...] = ()  # the worker's queues in strict order; (): every queue


class Reply(NamedTuple):
    """The answer to a report call (see the claim script)."""

    # per Finish: 0 stale (refused), 1 recorded, 2 recorded, deliver here, 3 recorded in
    # place of the failure a peer recorded when it took the job back
    finished: list[int]
    requeued: list[int]  # per Requeue: 0 stale, 1 back in the queue, 2 and the new head
    jobs: list[Claimed]
    head_in: float | None  # seconds until the head is due (<= 0: due); None: empty queue
    leader: bool  # the caller is the timed waiter
    leader_left: float | None  # seconds the current leader's lead lasts; None: no leader
    registered: bool  # False: the caller was presumed dead; nothing was claimed


# How a job failed because of a parent shows in its ``crashed_worker`` (its field x):
# this, the parent's id, "|" and how that one ended (see release_kids in common.lua).
AFTER = "after:"


class StoredEnd(NamedTuple):
    """A job's end as a manager's inbox (or a watch) hands it over."""

    job_id: str
    state: JobState | None  # None: already forgotten
    outcome: bytes | None  # None: cancelled, crashed, or not kept
    crashed_worker: str | None  # set when a peer took the job back and failed it
    client_id: str
    owner: str


class Withdrawn(NamedTuple):
    """A job cancelled while pending; ``mine``: the caller tells the clients of it."""

    job_id: str
    client_id: str
    mine: bool


class Held(NamedTuple):
    """A job a cancel waits for: prefetched by manager ``holder``, which is asked to give
    it back unless its worker started it (see the cancel script)."""

    job_id: str
    client_id: str
    holder: str


class TakenBack(NamedTuple):
    """The jobs a heartbeat took back from one manager it presumed dead."""

    manager: str
    lease_timeout: float  # that manager's (seconds; < 0: unknown)
    requeued: int
    failed: int


class Beat(NamedTuple):
    """What a heartbeat found (see the heartbeat script)."""

    registered_before: bool  # False on the first beat, or after being presumed dead
    reaped: list[str]  # managers presumed dead just now
    taken_back: list[TakenBack]  # what was taken back from each
    failed: list[tuple[str, str, str, bool]]  # (job id, worker, client, deliver here)
    requeued: int
    next_expiry: float | None  # seconds until another manager's lease runs out (None: none)
    order: Order  # the store's order, which this manager's claims follow


class ManagerRecord(NamedTuple):
    """One manager of the store, as its last heartbeat left it."""

    manager_id: str
    seen_ago: float  # seconds since its last heartbeat, on the server's clock
    lease_timeout: float
    status: bytes  # the manager's own encoding of what it runs (workers, address)


class QueueCounts(NamedTuple):
    """The shared queue's counters, across every manager."""

    pending: dict[int, int]  # by priority level
    pending_bytes: int  # what their stored payloads hold (max_pending_bytes bounds it)
    running: int
    submitted: int
    done: int
    failed: int
    cancelled: int
    retried: int
    head_in: float | None  # seconds until the head is due; None: nothing pending
    retried_exception: int = 0  # attempts run again by a retry policy
    retried_later: int = 0  # attempts run again after RetryLater
