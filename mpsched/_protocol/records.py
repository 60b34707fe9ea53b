"""The records that cross a process boundary: hellos, reports, heartbeats, stats, the
manager's configuration and start-up messages, and the exit codes of ``python -m mpsched``
and its worker processes.

Job records (``JobRequest``, ``Lease``, ``Assignment``, ``Outcome``) live one level down, in
``mpsched._core.job``, because the pure queue uses them too; the flat tuples the per-job
ones travel as are in :mod:`mpsched._protocol.codec`.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple

from mpsched._core.job import Order, Outcome, QueueStats, job_digest
from mpsched._core.options import Durability, Option
from mpsched._errors import MpschedError
from mpsched._transport.http_access import HttpConfig
from mpsched._transport.tls import TlsConfig

# Longest a single proxied call may block in the manager. A caller that went away frees
# its server thread within this; live callers simply call again.
LONG_POLL = 5.0
HEARTBEAT_TIMEOUT = 10.0  # a remote worker silent this long is declared gone
LEASE_TIMEOUT = 30.0  # a manager of a Redis store silent this long is presumed dead
STOP = "stop"  # the owner's message on a manager's control pipe: running jobs may finish
STOP_NOW = "stop-now"  # ... or: kill the workers with their jobs at once (a second Ctrl-C)


class Exit(IntEnum):
    """Exit codes of ``python -m mpsched`` and of its worker processes.

    A signal that stops a command without a drain exits 128 + its number, as a shell
    reports a process killed by it: 130 for SIGINT (Ctrl-C), 143 for SIGTERM. ``serve``
    and ``worker`` drain on the first SIGTERM or SIGINT and exit 0; a second one, or one
    before they are up, exits 130 or 143. Ctrl-C on ``submit --wait`` exits 130 at once
    and leaves the job queued.
    """

    OK = 0
    FAILURE = 1  # the job failed (submit --wait), stress found a fault, a worker crashed
    USAGE = 2  # bad arguments
    AUTH = 3  # no key, an unsafe key file, or the manager rejected the key
    VERSION = 4  # Python or cloudpickle version differs from the manager's
    UNREACHABLE = 5  # no manager answers at the address
    UNSAFE = 6  # a non-loopback address without an explicit authkey (or --http without
    # a token and TLS)
    STORE = 7  # the job store cannot be opened: locked by another manager, unreadable
    RUNNING = 8  # serve: this user's local manager is already running
    JOB_TIMEOUT = 124  # a remote worker process that killed its job past its timeout
    INTERRUPTED = 130  # 128 + SIGINT
    TERMINATED = 143  # 128 + SIGTERM


class Report(NamedTuple):
    """A worker's report of one finished lease; it rides on the worker's next ``take``."""

    lease_id: int
    outcome: Outcome


class LeftBehind(NamedTuple):
    """What a worker that is gone, or that joined again under a new id, left of its jobs,
    as its claim slot says (mpsched._worker.claims): the manager resolves that worker's
    leases by it rather than by what it acknowledged."""

    entered: bytes  # job_digest of the job whose callable it entered last; b"" for none
    ended: tuple[Report, ...]  # jobs it ran to their end, whose reports may not have arrived

    def outcome(self, job_id: str) -> Outcome | None:
        """How ``job_id`` ended, if the worker ran it to its end."""
        return next((r.outcome for r in self.ended if r.outcome.job_id == job_id), None)

    def entered_job(self, job_id: str) -> bool:
        """Whether ``job_id`` is the job whose callable the worker entered last."""
        return bool(self.entered) and self.entered == job_digest(job_id)


class WorkerHello(NamedTuple):
    """What a worker says when it joins."""

    worker_id: str
    pid: int
    host: str
    python: str  # "3.11"
    cloudpickle: str
    remote: bool = False  # joined with ``worker --connect``: kept alive by heartbeats
    # The manager's token (ManagerService.local_token), known only to workers it started:
    # the proof that this worker shares the manager's monotonic clock.
    local_token: str = ""
    queues: tuple[str, ...] | None = None  # the queues it serves in order; None: every one


class ClientHello(NamedTuple):
    """What a client says when it connects."""

    client_id: str
    python: str
    cloudpickle: str


class WorkerLoad(NamedTuple):
    """A remote worker's heartbeat: how busy its process is."""

    cpu_percent: float  # local workers: over the last second or more; remote: 2 s
    rss: int
    cpu_seconds: float = 0.0  # user + system CPU time of its process since it started
    slot: int = 0  # its place among its host's workers, taken again by its replacement


@dataclass(frozen=True)
class WorkerStatus:
    """One connected worker, as ``stats()`` shows it."""

    worker_id: str
    pid: int
    host: str
    remote: bool
    jobs_done: int
    current_job: str | None
    cpu_percent: float  # local workers: over the last second or more; remote: 2 s
    rss: int
    cpu_seconds: float = 0.0  # user + system CPU time of its process since it started
    slot: int = 0  # its place among its host's workers, taken again by its replacement


@dataclass(frozen=True)
class ManagerStatus:
    """One manager of a shared (Redis) store, as its last heartbeat left it."""

    manager_id: str
    host: str
    pid: int
    address: str
    heartbeat_age: float  # seconds since its last heartbeat, on the store's clock
    lease_timeout: float  # silent this long, its peers presume it dead
    workers: tuple[WorkerStatus, ...]
    # How old what ``workers`` says is: the heartbeat's age, 0.0 for the manager that
    # answers (its own workers as they are now).
    workers_age: float = 0.0


class QueueStatus(NamedTuple):
    """One named queue: its pending jobs, and how many workers serve it."""

    name: str
    pending: int
    workers: int


@dataclass(frozen=True)
class Stats:
    """A snapshot of the whole scheduler: the queue's counters and the workers."""

    queue: QueueStats
    workers: tuple[WorkerStatus, ...]
    uptime: float
    throughput: float  # jobs finished per second over the last THROUGHPUT_WINDOW seconds
    # Local workers the manager wants but could not start (fork failed, no file descriptors);
    # it keeps retrying with backoff. start_failures counts every failed attempt.
    workers_missing: int = 0
    worker_start_failures: int = 0
    clients: int = 0  # clients with a mailbox (connected, or closing with outcomes left)
    store: str = "memory"  # where jobs are journalled: a path, or "memory" (IN_MEMORY)
    store_size: int | None = None  # bytes the store takes on disk (Redis: its server uses)
    store_jobs: int | None = None  # job records the store keeps, where it counts them
    # With a shared store: every manager of it (this one included), from their heartbeats.
    managers: tuple[ManagerStatus, ...] = ()
    # Each queue with pending jobs or a worker serving it by name (this manager's workers).
    queues: tuple[QueueStatus, ...] = ()
    limits: tuple[tuple[str, str], ...] = ()  # each limit's name and form ("2,10/s")

    @property
    def pending(self) -> dict[str, int]:
        return self.queue.pending

    @property
    def in_flight(self) -> int:
        return self.queue.in_flight

    @property
    def completed(self) -> int:
        return self.queue.completed

    @property
    def failed(self) -> int:
        return self.queue.failed

    @property
    def lateness(self) -> dict[str, float]:
        return self.queue.lateness


def stats_json(stats: Stats) -> dict[str, Any]:
    """``stats`` as ``status --json`` prints it (each queue an object, limits by name)."""
    shown = dataclasses.asdict(stats)
    shown["queues"] = [queue._asdict() for queue in stats.queues]
    shown["limits"] = dict(stats.limits)
    return shown


class StartMethod(Option):
    """How a manager starts its local worker processes: never fork, the manager has
    threads; neither of these re-runs the program's main module in the workers."""

    FORKSERVER = "forkserver"
    SPAWN = "spawn"

    @classmethod
    def default(cls) -> StartMethod:
        """FORKSERVER where the platform has it, else SPAWN."""
        if "forkserver" in multiprocessing.get_all_start_methods():
            return cls.FORKSERVER
        return cls.SPAWN


@dataclass(frozen=True)
class ManagerConfig:
    """How a manager process is set up."""

    authkey: bytes
    workers: int
    mp_method: StartMethod
    address: Any = None  # None: a fresh Unix socket
    order: Order = Order.TIME
    max_pending: int | None = None
    start_timeout: float = 60.0
    log_level: int = logging.WARNING
    max_tasks_per_worker: int | None = None
    max_memory_per_worker: int | None = None  # bytes of RSS
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    drain_timeout: float = 30.0  # on stop, how long running jobs may take to finish
    # On stop, dismiss the remote workers too (their pools exit); else they wait for the
    # manager to come back at its address.
    drain_workers_on_stop: bool = False
    tls: TlsConfig | None = None  # TCP only; local workers connect with it too
    store: str | None = None  # a SQLite file, or a Redis URL (shared); None: in memory
    durability: Durability = Durability.SYNC  # SYNC: submits survive a power cut; PROCESS: a crash
    result_ttl: float = 86400.0  # seconds finished jobs' outcomes are kept (store or memory)
    max_pending_bytes: int | None = None  # bound on what pending payloads hold
    shared_memory: bool = False  # large buffers through /dev/shm (local clients, no store)
    http: HttpConfig | None = None  # the status page, metrics and JSON API; None: none
    # A shared (Redis) store: silent this long, a manager is presumed dead by its peers,
    # which take its jobs back.
    lease_timeout: float = LEASE_TIMEOUT
    # A Scheduler's manager: its owner's multiprocessing authkey, which the manager takes
    # as its own process's and so passes to its workers: a multiprocessing.Manager's
    # proxies, Queues and Events then work in jobs. b"": the manager keeps its own.
    process_authkey: bytes = field(default=b"", repr=False)
    queues: tuple[str, ...] | None = None  # what the local workers serve; None: every queue
    limits: tuple[tuple[str, str], ...] = ()  # (name, form) of each declared limit


class ManagerReady(NamedTuple):
    """Sent over the control pipe once the manager listens and its workers have joined."""

    address: Any
    pid: int
    recovered: tuple[str, ...] = ()  # what it got back from its store, a line each
    http_url: str = ""  # where its status page is ("": it serves none)


class ManagerFailed(NamedTuple):
    """Sent over the control pipe instead of ManagerReady when start-up failed."""

    reason: str
    error: MpschedError | None = None  # raised as itself by the owner (a StoreError, say)
