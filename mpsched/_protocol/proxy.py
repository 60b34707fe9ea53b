"""``ServiceProxy``, the client side of the manager's ``ManagerService``, and the server
side's registry: :func:`remote` marks what a peer may call, :func:`serve_object` serves it.

Clients, workers, the CLI and the manager all import this package; it imports none of them.
What the calls carry is in :mod:`mpsched._protocol.records` (typed records) and
:mod:`mpsched._protocol.codec` (the flat tuples of the per-job messages).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import weakref
from collections.abc import Callable
from multiprocessing.managers import BaseManager, BaseProxy, State, dispatch  # type: ignore[attr-defined]
from multiprocessing.util import Finalize, ForkAwareLocal
from typing import Any, TypeVar

from mpsched._core.job import (
    After,
    Assignment,
    JobRecord,
    JobRequest,
    Outcome,
    PayloadOptions,
)
from mpsched._core.recurring import ScheduleInfo, ScheduleSpec
from mpsched._errors import SchedulerShutdownError
from mpsched._protocol.closing import close_all, close_one, decref
from mpsched._protocol.codec import (
    OutcomeWire,
    ReportWire,
    assignment_from_wire,
    outcome_from_wire,
    report_to_wire,
    request_to_wire,
)
from mpsched._protocol.records import (
    ClientHello,
    LeftBehind,
    Report,
    Stats,
    WorkerHello,
    WorkerLoad,
)
from mpsched._transport.sockets import SERIALIZER, HardenedServer
from mpsched._transport.wire import FastConnection

F = TypeVar("F", bound=Callable[..., Any])


class ServiceProxy(BaseProxy):
    """Typed client side of the manager's ManagerService (mpsched._manager.service).

    A proxy owns its connections: one per thread that calls through it, opened at that
    thread's first call or before the thread starts (:meth:`open_connection`), closed when
    the proxy is collected or :meth:`discard` ed.
    multiprocessing's proxies share one connection per (address, thread) among every proxy
    of an address, which goes wrong twice here: a new proxy of a manager restarted at the
    same address would call through the dead manager's connection, and collecting any
    proxy closes the connection its thread shares with the others, which a client may
    have just opened with (the manager takes the end of a client's opening connection,
    before its result thread has called, for the client going away).
    """

    def __init__(
        self,
        token: Any,
        serializer: str,
        manager: Any = None,
        authkey: bytes | None = None,
        exposed: Any = None,
        incref: bool = True,
        manager_owned: bool = False,
    ) -> None:
        super().__init__(
            token, serializer, manager, authkey, exposed, incref=False, manager_owned=manager_owned
        )
        # This proxy's own connection in each thread, and the ids BaseProxy._decref looks
        # at before it closes one: this proxy's alone.
        self._tls = ForkAwareLocal()
        self._idset = type(self._idset)()  # type: ignore[has-type]  # a ProcessLocalSet
        # Guards _connections and _discarded; held briefly, by open_connection() and by
        # discard(). Nobody waits on it.
        self._connections_lock = threading.Lock()
        # The connections this proxy opened and has not closed yet: each is closed when
        # the thread that used it ends, or when the proxy is discarded or collected.
        self._connections: set[Any] = set()
        self._discarded = False
        weakref.finalize(self, close_all, self._connections, self._connections_lock)
        if incref:
            self._incref()

    def _incref(self) -> None:
        # BaseProxy._incref, closing its connection and with a decref that closes its own.
        if self._owned_by_manager:  # type: ignore[attr-defined]
            return
        token, authkey = self._token, self._authkey  # type: ignore[attr-defined]
        with contextlib.closing(self._Client(token.address, authkey=authkey)) as conn:  # type: ignore[attr-defined]
            dispatch(conn, None, "incref", (self._id,))  # type: ignore[attr-defined]
        self._idset.add(self._id)  # type: ignore[attr-defined]
        state = self._manager and self._manager._state  # type: ignore[attr-defined]
        self._close = Finalize(
            self,
            decref,
            args=(token, authkey, state, self._idset, self._Client),  # type: ignore[attr-defined]
            exitpriority=10,
        )

    def _connect(self) -> None:
        # A thread's first call, in a thread that was given no connection.
        self.use_connection(self.open_connection(threading.current_thread().name))

    def open_connection(self, thread_name: str) -> FastConnection:
        """A new connection to the manager, authenticated and ready for calls, for the
        thread named ``thread_name``, which takes it with :meth:`use_connection`.

        Whoever starts a thread that will call the manager opens its connection first,
        so that a manager which stalls after (stopped, frozen, swapping) finds no handshake
        of that thread's under way: a handshake gives up after HANDSHAKE_TIMEOUT, and the
        client takes that for a lost manager, where a call on an open connection waits for
        its answer however long the stall lasts.

        Raises:
            EOFError: this proxy was discarded (as every call of it then).
            AuthenticationError, OSError: as :func:`connect_service`.
        """
        with self._connections_lock:
            self._refuse_if_discarded_locked()
        address, authkey = self._token.address, self._authkey  # type: ignore[attr-defined]
        conn: FastConnection = self._Client(address, authkey=authkey)  # type: ignore[attr-defined]
        try:
            name = multiprocessing.current_process().name
            dispatch(conn, None, "accept_connection", (f"{name}|{thread_name}",))
            with self._connections_lock:
                self._refuse_if_discarded_locked()  # discard() closed the others meanwhile
                self._connections.add(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def use_connection(self, connection: FastConnection) -> None:
        """Make ``connection`` (from :meth:`open_connection`) the calling thread's: its
        calls through this proxy go on it. It is closed when the thread ends."""
        self._tls.connection = connection
        weakref.finalize(
            threading.current_thread(),
            close_one,
            self._connections,
            self._connections_lock,
            connection,
        )

    def _refuse_if_discarded_locked(self) -> None:
        if self._discarded:
            raise EOFError("this proxy's manager went away (its connections are closed)")

    def discard(self) -> None:
        """Forget the manager this proxy called: close each of its connections, in every
        thread, and make any later call fail with EOFError rather than connect to whatever
        listens at the address by then (a manager restarted there knows nothing this proxy
        refers to). Nothing is sent when it is collected either."""
        with self._connections_lock:
            self._discarded = True
            connections = list(self._connections)
            self._connections.clear()
        pending_decref = getattr(self, "_close", None)
        if pending_decref is not None:
            pending_decref.cancel()
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

    def take(
        self, worker_id: str, reports: list[Report], timeout: float, more: int = 0
    ) -> list[Assignment]:
        """Report ``reports``, then the next due job with up to ``more`` prefetched (see
        ManagerService.take); [] when none became due within ``timeout``."""
        wires = self._call("take", worker_id, _reports(reports), timeout, more)
        return [assignment_from_wire(wire) for wire in wires]

    def report(self, worker_id: str, reports: list[Report]) -> None:
        self._call("report", worker_id, _reports(reports))

    def ack(self, worker_id: str, lease_id: int) -> None:
        self._call("ack", worker_id, lease_id)

    def progress(self, worker_id: str, updates: list[tuple[int, str, str]]) -> None:
        """The latest progress of jobs the worker runs: (lease id, job id, JSON text)."""
        self._call("progress", worker_id, updates)

    def retry_budget(self, job_id: str) -> int:
        """How many times a job may run again after its current run fails."""
        return int(self._call("retry_budget", job_id))

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        self._call("heartbeat", worker_id, load)

    def finish(self, worker_id: str, reports: list[Report]) -> None:
        self._call("finish", worker_id, _reports(reports))

    def leave(self, worker_id: str, reports: list[Report]) -> None:
        self._call("leave", worker_id, _reports(reports))

    def worker_exited(
        self, worker_id: str, exitcode: int | None, left: LeftBehind | None = None
    ) -> None:
        self._call("worker_exited", worker_id, exitcode, left)

    def open_client(self, hello: ClientHello) -> int | None:
        result: int | None = self._call("open_client", hello)
        return result

    def close_client(self, client_id: str) -> None:
        self._call("close_client", client_id)

    def submit(
        self, requests: list[JobRequest], timeout: float | None, withdrawn: int = 0
    ) -> list[str] | None:
        result: list[str] | None = self._call(
            "submit", [request_to_wire(r) for r in requests], timeout, withdrawn
        )
        return result

    def submit_after(self, requests: list[JobRequest], afters: list[After]) -> None:
        self._call(
            "submit_after", [request_to_wire(r) for r in requests], [tuple(a) for a in afters]
        )

    def cancel(self, job_id: str, client_id: str | None = None) -> bool:
        return bool(self._call("cancel", job_id, client_id))

    def requeue(self, client_id: str, job_id: str) -> None:
        """Put a failed or cancelled job back in the queue; its end goes to ``client_id``."""
        self._call("requeue", client_id, job_id)

    def watch(self, client_id: str, job_id: str) -> Outcome | None:
        wire: OutcomeWire | None = self._call("watch", client_id, job_id)
        return None if wire is None else outcome_from_wire(wire)

    def watch_many(self, client_id: str, job_ids: list[str]) -> tuple[list[Outcome], list[str]]:
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

    def collect(self, client_id: str, timeout: float, waiting: int = 0) -> list[Outcome] | None:
        """The client's outcomes, after at most ``timeout`` s; ``waiting``: how many it
        still waits for (see Mailboxes.collect)."""
        wire: list[OutcomeWire] | None = self._call("collect", client_id, timeout, waiting)
        return None if wire is None else [outcome_from_wire(w) for w in wire]

    def stats(self) -> Stats:
        result: Stats = self._call("stats")
        return result

    def limits(self) -> dict[str, str]:
        result: dict[str, str] = self._call("limits")
        return result

    def set_limit(self, name: str, form: str) -> None:
        self._call("set_limit", name, form)

    def stop(self) -> None:
        self._call("stop")

    def drain_workers(self) -> int:
        result: int = self._call("drain_workers")
        return result

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
        result: PayloadOptions = self._call("payload_options")
        return result


def _reports(reports: list[Report]) -> list[ReportWire] | None:
    return [report_to_wire(r) for r in reports] if reports else None


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
    return tuple(
        sorted(
            name
            for name in dir(service)
            if getattr(getattr(service, name), "__mpsched_remote__", False)
        )
    )


def serve_object(service: object) -> None:
    """Make ``service`` what every ``ServiceProxy`` connected to this process calls, and
    its :func:`remote` methods all that a connection may call."""
    global _SERVED
    _SERVED = service
    ServiceManager.register(
        "service",
        callable=_get_service,
        proxytype=ServiceProxy,
        exposed=remote_methods(type(service)),
    )


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
    ServiceManager.register(
        "service", callable=_get_service, proxytype=ServiceProxy, exposed=("(no service served)",)
    )


serve_nothing()


def connect_service(address: Any, authkey: bytes) -> ServiceProxy:
    """Connect to a manager and return a proxy of its service, with connections of its own.

    Raises:
        AuthenticationError: wrong key. OSError: nothing answers at ``address``.
    """
    # What BaseManager.connect() and manager.service() do, closing each connection they
    # open rather than leaving it to the garbage collector.
    manager = ServiceManager(address=address, authkey=authkey, serializer=SERIALIZER)
    client = manager._Client  # type: ignore[attr-defined]
    with contextlib.closing(client(address, authkey=authkey)) as conn:
        dispatch(conn, None, "dummy")
    manager._state.value = State.STARTED  # type: ignore[attr-defined]
    token, exposed = manager._create("service")  # type: ignore[attr-defined]
    proxy = ServiceProxy(token, SERIALIZER, manager=manager, authkey=authkey, exposed=exposed)
    with contextlib.closing(client(address, authkey=authkey)) as conn:
        dispatch(conn, None, "decref", (token.id,))  # the proxy holds its own reference
    return proxy
