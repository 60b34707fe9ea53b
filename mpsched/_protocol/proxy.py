"""The wire protocol: everything that crosses a process boundary, and nothing else.

Clients, workers, the CLI and the manager all import this module; it imports none of them.
It holds the typed records each side sends (hellos, reports, heartbeats, stats), the flat
tuples the per-job messages travel as, ``ServiceProxy`` (the client side of the manager's
``ManagerService``), the manager's configuration and start-up messages, and the exit codes
of ``python -m mpsched`` and its worker processes.

Job records (``JobRequest``, ``Lease``, ``Assignment``, ``Outcome``) live one level down, in
``mpsched._core.job``, because the pure queue uses them too.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from multiprocessing.managers import BaseManager, BaseProxy
from multiprocessing.util import ForkAwareLocal
from pickle import PickleBuffer
from typing import Any, NamedTuple, TypeVar

from mpsched._core.job import (
    Assignment,
    JobRecord,
    JobRequest,
    Lease,
    Order,
    Outcome,
    Payload,
    PayloadOptions,
    QueueStats,
)
from mpsched._core.options import Durability
from mpsched._core.recurring import ScheduleInfo, ScheduleSpec
from mpsched._errors import MpschedError, SchedulerShutdownError
from mpsched._transport.sockets import SERIALIZER, HardenedServer
from mpsched._transport.tls import TlsConfig
from mpsched._transport.wire import FastConnection

# Longest a single proxied call may block in the manager. A caller that went away frees
# its server thread within this; live callers simply call again.
LONG_POLL = 5.0
HEARTBEAT_TIMEOUT = 10.0  # a remote worker silent this long is declared gone
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
    UNSAFE = 6  # a non-loopback address without an explicit authkey
    STORE = 7  # the job store cannot be opened: locked by another manager, unreadable
    RUNNING = 8  # serve: this user's local manager is already running
    JOB_TIMEOUT = 124  # a remote worker process that killed its job past its timeout
    INTERRUPTED = 130  # 128 + SIGINT
    TERMINATED = 143  # 128 + SIGTERM


class Report(NamedTuple):
    """A worker's report of one finished lease; it rides on the worker's next ``take``."""

    lease_id: int
    outcome: Outcome


# The messages sent once per job cross as flat tuples: pickling nested NamedTuples
# runs Python code per record (~12 us against ~1 us flat; a JobRequest in a submit batch
# 2.1 us against 0.5). ServiceProxy converts on the client side, ManagerService on the
# manager side; the code on both sides sees records.
#
# A payload of BLOB bytes or more crosses as a PickleBuffer: FastConnection
# (mpsched._transport.wire) sends it from its own memory and receives it into a buffer of its own,
# where pickling it into the message would copy it on both sides. It arrives as a bytearray, or as a
# read-only view of one (blob_in unwraps it); the code on both sides sees bytes-like data.
F = TypeVar("F", bound=Callable[..., Any])

BLOB = 1 << 16
Blob = bytes | bytearray | PickleBuffer | memoryview  # a payload in a wire tuple
JobRequestWire = tuple[str, str, Blob, int, "float | None", "float | None", "float | None",
                       int, "str | None", str]
AssignmentWire = tuple[int, str, str, int, Blob, "float | None", "float | None", float]
ReportWire = tuple[int, str, bool, Blob, str, "float | None", str]
OutcomeWire = tuple[str, bool, Blob, str, "float | None", str]


def blob_in(payload: Blob) -> Payload:
    """A payload as it came out of a message: bytes or a bytearray."""
    if isinstance(payload, memoryview):
        received = payload.obj  # the buffer it was received into
        assert isinstance(received, bytearray)
        return received
    assert not isinstance(payload, PickleBuffer)
    return payload


def request_to_wire(r: JobRequest) -> JobRequestWire:
    return tuple(r) if len(r.payload) < BLOB else (  # type: ignore[return-value]
        *r[:2], PickleBuffer(r.payload), *r[3:])


def request_from_wire(w: JobRequestWire) -> JobRequest:
    return JobRequest._make(w) if type(w[2]) is bytes else JobRequest(
        w[0], w[1], blob_in(w[2]), *w[3:])


def assignment_to_wire(a: Assignment, delay: float,
                       remote_payload: Payload | None = None) -> AssignmentWire:
    """``a`` as sent, ``delay`` seconds before it is due; with ``remote_payload``, as sent
    to a worker on another clock: that payload instead, and no due instant."""
    payload = a.payload if remote_payload is None else remote_payload
    lease = a.lease
    return (lease.lease_id, lease.job_id, lease.worker_id, lease.attempt,
            payload if len(payload) < BLOB else PickleBuffer(payload),
            a.due if remote_payload is None else None, a.timeout, delay)


def assignment_from_wire(w: AssignmentWire) -> Assignment:
    payload = w[4]
    return Assignment(Lease(w[0], w[1], w[2], w[3]),
                      payload if type(payload) is bytes else blob_in(payload), w[5], w[6], w[7])


def outcome_to_wire(o: Outcome) -> OutcomeWire:
    return tuple(o) if len(o.payload) < BLOB else (  # type: ignore[return-value]
        o.job_id, o.ok, PickleBuffer(o.payload), o.traceback, o.started, o.error_kind)


def outcome_from_wire(w: OutcomeWire) -> Outcome:
    return Outcome._make(w) if type(w[2]) is bytes else Outcome(
        w[0], w[1], blob_in(w[2]), w[3], w[4], w[5])


def report_to_wire(r: Report) -> ReportWire:
    return (r.lease_id, *outcome_to_wire(r.outcome))


def report_from_wire(w: ReportWire) -> Report:
    return Report(w[0], outcome_from_wire(w[1:]))


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


class ClientHello(NamedTuple):
    """What a client says when it connects."""

    client_id: str
    python: str
    cloudpickle: str


class WorkerLoad(NamedTuple):
    """A remote worker's heartbeat: how busy its process is."""

    cpu_percent: float
    rss: int


@dataclass(frozen=True)
class WorkerStatus:
    """One connected worker, as ``stats()`` shows it."""

    worker_id: str
    pid: int
    host: str
    remote: bool
    jobs_done: int
    current_job: str | None
    cpu_percent: float
    rss: int


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
    store: str = "memory"  # where jobs are journalled: a path, or "memory"
    store_size: int | None = None  # bytes the store takes on disk

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




class ServiceProxy(BaseProxy):
    """Typed client side of the manager's ManagerService (mpsched._manager.service).

    A proxy owns its connections: one per thread that calls through it, opened at that
    thread's first call, closed when the proxy is collected or :meth:`discard` ed.
    multiprocessing's proxies share one connection per (address, thread) among every proxy
    of an address, which goes wrong twice here: a new proxy of a manager restarted at the
    same address would call through the dead manager's connection, and collecting any
    proxy closes the connection its thread shares with the others, which a client may
    have just opened with (the manager takes the end of a client's opening connection,
    before its result thread has called, for the client going away).
    """

    def __init__(self, token: Any, serializer: str, manager: Any = None,
                 authkey: bytes | None = None, exposed: Any = None, incref: bool = True,
                 manager_owned: bool = False) -> None:
        super().__init__(token, serializer, manager, authkey, exposed, incref=False,
                         manager_owned=manager_owned)
        # This proxy's own connection in each thread, and the ids BaseProxy._decref looks
        # at before it closes one: this proxy's alone.
        self._tls = ForkAwareLocal()
        self._idset = type(self._idset)()  # type: ignore[has-type]  # a ProcessLocalSet
        # Guards _connections and _discarded; held briefly, by a thread's first call and by
        # discard(). Nobody waits on it.
        self._connections_lock = threading.Lock()
        # The connections this proxy opened that are still referenced: weak, so that a
        # thread that ends takes its connection with it.
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._discarded = False
        if incref:
            self._incref()  # type: ignore[attr-defined]

    def _connect(self) -> None:
        with self._connections_lock:
            if self._discarded:
                raise EOFError("this proxy's manager went away (its connections are closed)")
        super()._connect()  # type: ignore[misc]
        with self._connections_lock:
            self._connections.add(self._tls.connection)

    def discard(self) -> None:
        """Forget the manager this proxy called: close each of its connections, in every
        thread, and make any later call fail with EOFError rather than connect to whatever
        listens at the address by then (a manager restarted there knows nothing this proxy
        refers to). Nothing is sent when it is collected either."""
        with self._connections_lock:
            self._discarded = True
            connections = list(self._connections)
            self._connections.clear()
        decref = getattr(self, "_close", None)
        if decref is not None:
            decref.cancel()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.close()

    def _call(self, method: str, *args: Any) -> Any:
        return self._callmethod(method, args)

    @property
    def manager_address(self) -> Any:
        """The address of the manager this proxy calls (no call: it is in the token)."""
        return self._token.address  # type: ignore[attr-defined]

    def set_connection_aside(self) -> Any:
        """Take the calling thread's connection away from it (its next call opens a new
        one) and return it (None if it had none). A call that an asynchronous exception
        (Ctrl-C) cut short leaves its reply unread on it, where the next call would take
        it for its own. The caller closes it when the client closes: it may be the
        connection the client opened with, whose end (before the result thread's first
        call) tells the manager that the client is gone."""
        tls = self._tls
        connection = getattr(tls, "connection", None)
        if connection is not None:
            del tls.connection
        return connection

    def hello(self, hello: WorkerHello) -> float:
        return float(self._call("hello", hello))

    def take(self, worker_id: str, report: Report | None, timeout: float) -> Assignment | None:
        wire = self._call("take", worker_id, None if report is None else report_to_wire(report),
                          timeout)
        return None if wire is None else assignment_from_wire(wire)

    def expect_reply_soon(self, seconds: float) -> None:
        """The reply to this thread's next call is due within about ``seconds``: wait for
        it awake that long (FastConnection.expect_soon) before sleeping."""
        conn = getattr(self._tls, "connection", None)
        if isinstance(conn, FastConnection):
            conn.expect_soon(seconds)

    def ack(self, worker_id: str, lease_id: int) -> None:
        self._call("ack", worker_id, lease_id)

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        self._call("heartbeat", worker_id, load)

    def finish(self, worker_id: str, report: Report | None) -> None:
        self._call("finish", worker_id, None if report is None else report_to_wire(report))

    def leave(self, worker_id: str, report: Report | None) -> None:
        self._call("leave", worker_id, None if report is None else report_to_wire(report))

    def worker_exited(self, worker_id: str, exitcode: int) -> None:
        self._call("worker_exited", worker_id, exitcode)

    def open_client(self, hello: ClientHello) -> int | None:
        result: int | None = self._call("open_client", hello)
        return result

    def close_client(self, client_id: str) -> None:
        self._call("close_client", client_id)

    def submit(self, requests: list[JobRequest], timeout: float | None,
               withdrawn: int = 0) -> list[str] | None:
        result: list[str] | None = self._call("submit", [request_to_wire(r) for r in requests],
                                              timeout, withdrawn)
        return result

    def cancel(self, job_id: str, client_id: str | None = None) -> bool:
        return bool(self._call("cancel", job_id, client_id))

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        wire: OutcomeWire | None = self._call("watch", client_id, job_id)
        return None if wire is None else outcome_from_wire(wire)

    def watch_many(self, client_id: str,
                   job_ids: list[str]) -> tuple[list[Outcome], list[str]]:
        """:meth:`watch` for each of ``job_ids``, in one call: the outcomes of those that
        have ended, and the ids of those the manager does not know."""
        wire: list[OutcomeWire]
        unknown: list[str]
        wire, unknown = self._call("watch_many", client_id, job_ids)
        return [outcome_from_wire(w) for w in wire], unknown

    def job(self, job_id: str) -> JobRecord | None:
        result: JobRecord | None = self._call("job", job_id)
        return result

    def jobs(self, state: str | None = None, limit: int | None = None) -> list[JobRecord]:
        result: list[JobRecord] = self._call("jobs", state, limit)
        return result

    def cancel_many(self, job_ids: list[str]) -> list[str]:
        result: list[str] = self._call("cancel_many", job_ids)
        return result

    def not_due(self, client_id: str) -> list[str]:
        result: list[str] = self._call("not_due", client_id)
        return result

    def cancel_client(self, client_id: str, not_due_only: bool = False) -> list[str]:
        result: list[str] = self._call("cancel_client", client_id, not_due_only)
        return result

    def collect(self, client_id: str, timeout: float) -> list[Outcome] | None:
        wire: list[OutcomeWire] | None = self._call("collect", client_id, timeout)
        return None if wire is None else [outcome_from_wire(w) for w in wire]

    def stats(self) -> Stats:
        result: Stats = self._call("stats")
        return result

    def stop(self) -> None:
        self._call("stop")

    def add_schedule(self, spec: ScheduleSpec) -> ScheduleInfo:
        result: ScheduleInfo = self._call("add_schedule", tuple(spec))
        return result

    def list_schedules(self) -> list[ScheduleInfo]:
        result: list[ScheduleInfo] = self._call("list_schedules")
        return result

    def schedule_control(self, schedule_id: str, action: str) -> ScheduleInfo:
        """``action``: "info", "pause", "resume" or "cancel"."""
        result: ScheduleInfo = self._call("schedule_control", schedule_id, action)
        return result

    def schedule_preview(self, schedule_id: str, n: int) -> list[float]:
        result: list[float] = self._call("schedule_preview", schedule_id, n)
        return result

    def schedule_runs(self, schedule_id: str, n: int) -> list[str]:
        result: list[str] = self._call("schedule_runs", schedule_id, n)
        return result

    def payload_options(self) -> PayloadOptions:
        return PayloadOptions(*self._call("payload_options"))


# The object a manager process serves (its ManagerService); set once by serve_object().
_SERVED: object | None = None


def remote(method: F) -> F:
    """Mark a method of the served service as one a peer may call through its proxy.

    What a connection may call is exactly the marked methods of the served object's class
    (:func:`remote_methods`); every other method, however public, is refused by the server.
    Each marked method has one :class:`ServiceProxy` method of the same name that calls it
    (``tests/test_api.py`` checks that the two lists agree, and that a test calls each).
    """
    method.__mpsched_remote__ = True  # type: ignore[attr-defined]
    return method


def remote_methods(service: type) -> tuple[str, ...]:
    """The names of ``service``'s methods marked :func:`remote`, sorted."""
    return tuple(sorted(name for name in dir(service)
                        if getattr(getattr(service, name), "__mpsched_remote__", False)))


def serve_object(service: object) -> None:
    """Make ``service`` what every ``ServiceProxy`` connected to this process calls, and
    its :func:`remote` methods all that a connection may call."""
    global _SERVED
    _SERVED = service
    ServiceManager.register("service", callable=_get_service, proxytype=ServiceProxy,
                            exposed=remote_methods(type(service)))


def _get_service() -> object:
    if _SERVED is None:  # pragma: no cover - only reachable by a misconfigured server
        raise SchedulerShutdownError("this process serves no mpsched manager")
    return _SERVED


class ServiceManager(BaseManager):
    """The ``multiprocessing.managers`` registry for the one served object."""

    _Server = HardenedServer


def serve_nothing() -> None:
    """Until this process serves a service (serve_object), a connection may call nothing:
    the one name exposed is no method's."""
    global _SERVED
    _SERVED = None
    ServiceManager.register("service", callable=_get_service, proxytype=ServiceProxy,
                            exposed=("(no service served)",))


serve_nothing()


def connect_service(address: Any, authkey: bytes) -> ServiceProxy:
    """Connect to a manager and return a proxy of its service, with connections of its own.

    Raises:
        AuthenticationError: wrong key. OSError: nothing answers at ``address``.
    """
    manager = ServiceManager(address=address, authkey=authkey, serializer=SERIALIZER)
    manager.connect()
    proxy: ServiceProxy = manager.service()  # type: ignore[attr-defined]
    return proxy


@dataclass(frozen=True)
class ManagerConfig:
    """How a manager process is set up."""

    authkey: bytes
    workers: int
    mp_method: str
    address: Any = None  # None: a fresh Unix socket
    order: Order = Order.TIME
    max_pending: int | None = None
    start_timeout: float = 60.0
    log_level: int = logging.WARNING
    max_tasks_per_worker: int | None = None
    max_memory_per_worker: int | None = None  # bytes of RSS
    heartbeat_timeout: float = HEARTBEAT_TIMEOUT
    drain_timeout: float = 30.0  # on stop, how long running jobs may take to finish
    tls: TlsConfig | None = None  # TCP only; local workers connect with it too
    store: str | None = None  # a SQLite file that journals every job; None: in memory
    durability: Durability = Durability.SYNC  # SYNC: submits survive a power cut; PROCESS: a crash
    result_ttl: float = 86400.0  # seconds finished jobs' outcomes are kept (store or memory)
    max_pending_bytes: int | None = None  # bound on what pending payloads hold
    shared_memory: bool = False  # large buffers through /dev/shm (local clients, no store)


class ManagerReady(NamedTuple):
    """Sent over the control pipe once the manager listens and its workers have joined."""

    address: Any
    pid: int
    recovered: tuple[str, ...] = ()  # what it got back from its store, a line each


class ManagerFailed(NamedTuple):
    """Sent over the control pipe instead of ManagerReady when start-up failed."""

    reason: str
    error: MpschedError | None = None  # raised as itself by the owner (a StoreError, say)

