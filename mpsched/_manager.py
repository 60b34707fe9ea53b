"""The manager process: one JobQueue served to clients and workers.

```
 clients                      manager process                          workers
 Scheduler                    heap + lock + condition (JobQueue)       loop: take -> run -> report
   submit(JobRequest) ──────▶  seq, due, priority                ◀──── take(worker_id, report)
   cancel(job_id) ──────────▶  in-flight leases                  ────▶ Assignment(lease, payload)
   result thread ◀──────────   per-client result mailboxes       ◀──── report rides on next take
                               supervisor: local worker sentinels
```

Everything crosses through ``multiprocessing.managers``: each proxied call runs in the
server thread of the caller's connection, so a worker blocked in ``take`` blocks only its
own server thread, inside JobQueue's condition wait. No lock, condition or queue object
leaves this process, and job and result payloads stay opaque bytes here: the manager never
imports user code.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.managers import BaseManager, BaseProxy
from typing import Any, NamedTuple

from mpsched._errors import SchedulerShutdownError
from mpsched._job import Assignment, JobRequest, Order, Outcome
from mpsched._queue import JobQueue, QueueStats

log = logging.getLogger("mpsched.manager")

# Longest a single proxied call may block in the manager. A caller that went away frees
# its server thread within this; live callers simply call again.
LONG_POLL = 5.0


class Report(NamedTuple):
    """A worker's report of one finished lease; it rides on the worker's next ``take``."""

    lease_id: int
    outcome: Outcome


class WorkerHello(NamedTuple):
    """What a worker says when it connects."""

    worker_id: str
    pid: int
    host: str
    python: str  # "3.11"
    cloudpickle: str


@dataclass(frozen=True)
class WorkerStatus:
    """One connected worker, as ``stats()`` shows it."""

    worker_id: str
    pid: int
    host: str
    jobs_done: int
    current_job: str | None


@dataclass(frozen=True)
class Stats:
    """A snapshot of the whole scheduler: the queue's counters and the workers."""

    queue: QueueStats
    workers: tuple[WorkerStatus, ...]

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


@dataclass(eq=False)
class _Mailbox:
    outcomes: deque[Outcome] = field(default_factory=deque)
    closed: bool = False


class Mailboxes:
    """Outcomes waiting for their submitting client's result thread."""

    def __init__(self) -> None:
        # Guards _boxes and every mailbox in it.
        self._lock = threading.Lock()
        # Each client's result thread waits here in collect(); post() and close wake all,
        # and every waiter re-checks its own mailbox (one result thread per client, so
        # there are as many waiters as connected clients, usually one).
        self._posted = threading.Condition(self._lock)
        self._boxes: dict[str, _Mailbox] = {}

    def open(self, client_id: str) -> None:
        with self._lock:
            self._boxes.setdefault(client_id, _Mailbox())

    def post(self, client_id: str, outcome: Outcome) -> None:
        with self._lock:
            box = self._boxes.get(client_id)
            if box is None or box.closed:
                log.warning("dropped the outcome of job %s: client %s is gone",
                            outcome.job_id, client_id)
                return
            box.outcomes.append(outcome)
            self._posted.notify_all()

    def collect(self, client_id: str, timeout: float) -> list[Outcome] | None:
        """All outcomes waiting for ``client_id``, after at most ``timeout`` seconds.

        Returns None once the mailbox is closed and empty.
        """
        with self._lock:
            box = self._boxes.get(client_id)
            if box is None:
                return None
            self._posted.wait_for(lambda: bool(box.outcomes) or box.closed, timeout)
            if not box.outcomes:
                if box.closed:
                    self._boxes.pop(client_id, None)
                    return None
                return []
            outcomes = list(box.outcomes)
            box.outcomes.clear()
            return outcomes

    def close(self, client_id: str | None = None) -> None:
        """Close one client's mailbox, or all; its result thread returns what is left."""
        with self._lock:
            for cid, box in self._boxes.items():
                if client_id is None or cid == client_id:
                    box.closed = True
            self._posted.notify_all()


class ManagerService:
    """The object the manager serves; each public method is one proxied call."""

    def __init__(self, queue: JobQueue) -> None:
        self.queue = queue
        self.mailboxes = Mailboxes()
        # Guards _workers, _done and _current. Nobody waits on it.
        self._workers_lock = threading.Lock()
        self._workers: dict[str, WorkerHello] = {}
        self._done: dict[str, int] = {}
        self._current: dict[str, str | None] = {}
        # Set once stop() is called; the supervisor loop sees it through the wake pipe.
        self.stopping = threading.Event()
        self.wake_reader, self._wake_writer = os.pipe()

    # ---- workers

    def hello(self, hello: WorkerHello) -> None:
        with self._workers_lock:
            self._workers[hello.worker_id] = hello
            self._done.setdefault(hello.worker_id, 0)
            self._current[hello.worker_id] = None
        self.wake_supervisor()
        log.info("worker %s joined (pid %d on %s)", hello.worker_id, hello.pid, hello.host)

    def take(self, worker_id: str, report: Report | None, timeout: float) -> Assignment | None:
        """Report the previous job (if any), then wait for the next due one."""
        if report is not None:
            self._report(worker_id, report)
        assignment = self.queue.take(worker_id, min(timeout, LONG_POLL))
        if assignment is not None:
            with self._workers_lock:
                self._current[worker_id] = assignment.lease.job_id
            if assignment.timeout is not None:
                self.wake_supervisor()  # it sleeps until the earliest job deadline
        return assignment

    def finish(self, worker_id: str, report: Report | None) -> None:
        """Report the last job of a worker that is leaving (recycling)."""
        if report is not None:
            self._report(worker_id, report)

    def _report(self, worker_id: str, report: Report) -> None:
        job = self.queue.complete(report.lease_id, report.outcome)
        with self._workers_lock:
            self._current[worker_id] = None
            self._done[worker_id] = self._done.get(worker_id, 0) + 1
        if job is not None:
            self.mailboxes.post(job.client_id, report.outcome)

    def forget_worker(self, worker_id: str) -> None:
        with self._workers_lock:
            self._workers.pop(worker_id, None)
            self._current.pop(worker_id, None)
            self._done.pop(worker_id, None)

    def worker_count(self) -> int:
        with self._workers_lock:
            return len(self._workers)

    def wake_supervisor(self) -> None:
        """Wake the supervisor loop (it waits on ``wake_reader`` with the worker sentinels)."""
        os.write(self._wake_writer, b"x")

    # ---- clients

    def open_client(self, client_id: str) -> None:
        self.mailboxes.open(client_id)

    def close_client(self, client_id: str) -> None:
        self.mailboxes.close(client_id)

    def submit(self, request: JobRequest, timeout: float | None) -> None:
        bounded = LONG_POLL if timeout is None else min(timeout, LONG_POLL)
        self.queue.submit(request, bounded)

    def cancel(self, job_id: str) -> bool:
        return self.queue.cancel(job_id)

    def cancel_client(self, client_id: str) -> list[str]:
        return self.queue.cancel_client(client_id)

    def collect(self, client_id: str, timeout: float) -> list[Outcome] | None:
        return self.mailboxes.collect(client_id, min(timeout, LONG_POLL))

    def stats(self) -> Stats:
        with self._workers_lock:
            workers = tuple(
                WorkerStatus(w.worker_id, w.pid, w.host, self._done.get(w.worker_id, 0),
                             self._current.get(w.worker_id))
                for w in self._workers.values()
            )
        return Stats(self.queue.stats(), workers)

    def stop(self) -> None:
        """Stop handing out jobs; the manager process then stops its workers and exits."""
        self.stopping.set()
        self.queue.close()
        self.mailboxes.close()
        self.wake_supervisor()


class ServiceProxy(BaseProxy):
    """Typed client side of ManagerService."""

    _exposed_ = ("hello", "take", "finish", "open_client", "close_client", "submit", "cancel",
                 "cancel_client", "collect", "stats", "stop")

    def _call(self, method: str, *args: Any) -> Any:
        return self._callmethod(method, args)

    def hello(self, hello: WorkerHello) -> None:
        self._call("hello", hello)

    def take(self, worker_id: str, report: Report | None, timeout: float) -> Assignment | None:
        result: Assignment | None = self._call("take", worker_id, report, timeout)
        return result

    def finish(self, worker_id: str, report: Report | None) -> None:
        self._call("finish", worker_id, report)

    def open_client(self, client_id: str) -> None:
        self._call("open_client", client_id)

    def close_client(self, client_id: str) -> None:
        self._call("close_client", client_id)

    def submit(self, request: JobRequest, timeout: float | None) -> None:
        self._call("submit", request, timeout)

    def cancel(self, job_id: str) -> bool:
        return bool(self._call("cancel", job_id))

    def cancel_client(self, client_id: str) -> list[str]:
        result: list[str] = self._call("cancel_client", client_id)
        return result

    def collect(self, client_id: str, timeout: float) -> list[Outcome] | None:
        result: list[Outcome] | None = self._call("collect", client_id, timeout)
        return result

    def stats(self) -> Stats:
        result: Stats = self._call("stats")
        return result

    def stop(self) -> None:
        self._call("stop")


_SERVICE: ManagerService | None = None  # set in the manager process only


def _get_service() -> ManagerService:
    if _SERVICE is None:  # pragma: no cover - only reachable by a misconfigured server
        raise SchedulerShutdownError("this process serves no mpsched manager")
    return _SERVICE


class ServiceManager(BaseManager):
    """The ``multiprocessing.managers`` registry for the one served object."""


ServiceManager.register("service", callable=_get_service, proxytype=ServiceProxy)


def connect_service(address: Any, authkey: bytes) -> ServiceProxy:
    """Connect to a manager and return a proxy of its service."""
    manager = ServiceManager(address=address, authkey=authkey, serializer="pickle")
    manager.connect()
    proxy: ServiceProxy = manager.service()  # type: ignore[attr-defined]
    return proxy


@dataclass(frozen=True)
class ManagerConfig:
    """How a manager process is set up; sent to it when it starts."""

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


class ManagerReady(NamedTuple):
    """Sent over the control pipe once the manager listens and its workers have joined."""

    address: Any
    pid: int


class ManagerFailed(NamedTuple):
    """Sent over the control pipe instead of ManagerReady when start-up failed."""

    reason: str


def run_manager(config: ManagerConfig, control: Connection) -> None:
    """Entry point of the manager process.

    Serves until ``stop`` is called or the process holding the other end of ``control``
    goes away (its end closes, even on SIGKILL), then stops its workers and returns.
    """
    from mpsched._supervisor import Supervisor

    global _SERVICE
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when we stop
    service = _SERVICE = ManagerService(
        JobQueue(order=config.order, max_pending=config.max_pending))
    server = ServiceManager(address=config.address, authkey=config.authkey,
                            serializer="pickle").get_server()
    # serve_client reads stop_event, which only serve_forever would create; we run the
    # accepter ourselves so this thread can supervise.
    server.stop_event = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.accepter, name="mpsched-accept", daemon=True).start()
    supervisor = Supervisor(service, config, server.address)
    try:
        try:
            supervisor.start_workers()
            failure = supervisor.await_workers(config.start_timeout)
        except Exception as exc:
            log.exception("manager start-up failed")
            failure = f"{type(exc).__name__}: {exc}"
        if failure:
            control.send(ManagerFailed(failure))
            return
        control.send(ManagerReady(server.address, os.getpid()))
        supervisor.watch(control)
    finally:
        service.stop()
        supervisor.stop_workers()


def host_name() -> str:
    return socket.gethostname()
