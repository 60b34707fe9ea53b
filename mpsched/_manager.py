"""The manager process: one JobQueue served to clients and workers.

```
 clients                      manager process                          workers
 Scheduler / connect()        heap + lock + condition (JobQueue)       loop: take -> run -> report
   submit(JobRequest) ──────▶  seq, due, priority                ◀──── take(worker_id, report)
   cancel(job_id) ──────────▶  in-flight leases                  ────▶ Assignment(lease, payload)
   result thread ◀──────────   per-client result mailboxes       ◀──── ack / heartbeat (remote)
                               supervisor: local worker sentinels, remote heartbeats
```

Everything crosses through ``multiprocessing.managers``: each proxied call runs in the
server thread of the caller's connection, so a worker blocked in ``take`` blocks only its
own server thread, inside JobQueue's condition wait. No lock, condition or queue object
leaves this process, and job and result payloads stay opaque bytes here: the manager never
imports user code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.managers import BaseManager, BaseProxy
from typing import Any, NamedTuple

import psutil

from mpsched._errors import (
    JobTimeoutError,
    MpschedError,
    SchedulerShutdownError,
    VersionMismatchError,
    WorkerCrashedError,
    WorkerRetiredError,
)
from mpsched._job import Assignment, JobRequest, Lease, Order, Outcome
from mpsched._mailbox import Mailboxes
from mpsched._queue import JobQueue, LostLease, QueueStats
from mpsched._transport import SERIALIZER, HardenedServer, describe_versions, host_name

log = logging.getLogger("mpsched.manager")

# Longest a single proxied call may block in the manager. A caller that went away frees
# its server thread within this; live callers simply call again.
LONG_POLL = 5.0
HEARTBEAT_TIMEOUT = 10.0  # a remote worker silent this long is declared gone
# Workers on this machine get a job this long before it is due and sleep the rest on the
# shared monotonic clock, so the manager's wake-up and the reply's trip do not add to the
# job's lateness. Remote workers' clocks are not ours: they get jobs when due.
EARLY_HANDOFF = 0.002
THROUGHPUT_WINDOW = 10.0  # seconds over which stats() measures throughput


class Report(NamedTuple):
    """A worker's report of one finished lease; it rides on the worker's next ``take``."""

    lease_id: int
    outcome: Outcome


# The messages sent once per job cross as flat tuples: pickling nested NamedTuples
# runs Python code per record (~12 us against ~1 us flat; a JobRequest in a submit batch
# 2.1 us against 0.5). ServiceProxy converts on the client side, ManagerService on the
# manager side; the code on both sides sees records.
JobRequestWire = tuple[str, str, bytes, int, "float | None", "float | None", "float | None",
                       int]
AssignmentWire = tuple[int, str, str, int, bytes, float, "float | None"]
ReportWire = tuple[int, str, bool, bytes, str, "float | None", str]
OutcomeWire = tuple[str, bool, bytes, str, "float | None", str]


def assignment_to_wire(a: Assignment) -> AssignmentWire:
    return (*a.lease, a.payload, a.due, a.timeout)


def assignment_from_wire(w: AssignmentWire) -> Assignment:
    return Assignment(Lease(w[0], w[1], w[2], w[3]), w[4], w[5], w[6])


def report_to_wire(r: Report) -> ReportWire:
    return (r.lease_id, *r.outcome)


def report_from_wire(w: ReportWire) -> Report:
    return Report(w[0], Outcome(*w[1:]))


class WorkerHello(NamedTuple):
    """What a worker says when it joins."""

    worker_id: str
    pid: int
    host: str
    python: str  # "3.11"
    cloudpickle: str
    remote: bool = False  # joined with ``worker --connect``: kept alive by heartbeats


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
class _Worker:
    hello: WorkerHello
    last_seen: float
    jobs_done: int = 0
    current: str | None = None
    acked: int = 0  # remote workers: the last lease id they acknowledged
    load: WorkerLoad | None = None
    proc: psutil.Process | None = field(default=None, repr=False)  # same-host workers


class ManagerService:
    """The object the manager serves; each public method is one proxied call."""

    def __init__(self, queue: JobQueue, *, heartbeat_timeout: float = HEARTBEAT_TIMEOUT) -> None:
        self.queue = queue
        self.mailboxes = Mailboxes()
        self.heartbeat_timeout = heartbeat_timeout
        self.versions = describe_versions()
        self.host = host_name()
        # Guards _workers, _retired and _finished. Nobody waits on it.
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._retired: set[str] = set()
        self._finished: deque[float] = deque(maxlen=100_000)  # completion times
        self._started = time.monotonic()
        # Set once stop() is called; the supervisor sees it through the wake pipe.
        self.stopping = threading.Event()
        self.wake_reader, self._wake_writer = os.pipe()

    def wake_supervisor(self) -> None:
        """Wake the supervisor loop (it waits on ``wake_reader`` with the worker sentinels)."""
        os.write(self._wake_writer, b"x")

    # ------------------------------------------------------------------ workers

    def hello(self, hello: WorkerHello) -> float:
        """Register a worker; returns the heartbeat timeout its heartbeats must beat."""
        self._check_versions(f"worker {hello.worker_id} on {hello.host}",
                             (hello.python, hello.cloudpickle))
        proc = None
        if hello.host == self.host:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(hello.pid)
        with self._lock:
            self._workers[hello.worker_id] = _Worker(hello, time.monotonic(), proc=proc)
        self.wake_supervisor()
        log.info("worker %s joined (pid %d on %s)", hello.worker_id, hello.pid, hello.host)
        return self.heartbeat_timeout

    def take(self, worker_id: str, report: ReportWire | None,
             timeout: float) -> AssignmentWire | None:
        """Report the previous job (if any), then wait for the next due one."""
        local = self._check_in(worker_id, reported=report is not None)
        if report is not None:
            self._complete(report_from_wire(report), same_clock=local)
        # A worker on this machine shares our monotonic clock: it can be handed a job
        # early and sleep the rest itself.
        early = EARLY_HANDOFF if local else 0.0
        assignment = self.queue.take(worker_id, min(timeout, LONG_POLL), early)
        if assignment is not None:
            with self._lock:
                worker = self._workers.get(worker_id)
                if worker is not None:
                    worker.current = assignment.lease.job_id
            if assignment.timeout is not None:
                self.wake_supervisor()  # it sleeps until the earliest job deadline
            return assignment_to_wire(assignment)
        return None

    def ack(self, worker_id: str, lease_id: int) -> None:
        """A remote worker received a lease: from now on losing it counts as an attempt."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.acked = lease_id
                worker.last_seen = time.monotonic()

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        self._check_in(worker_id, reported=False)
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.load = load

    def finish(self, worker_id: str, report: ReportWire | None) -> None:
        """Report the last job of a worker that is leaving to be replaced (recycling)."""
        if report is not None:
            local = self._check_in(worker_id, reported=True)
            self._complete(report_from_wire(report), same_clock=local)

    def leave(self, worker_id: str, report: ReportWire | None) -> None:
        """A remote worker leaves (drained): report its last job and end its leases."""
        self.finish(worker_id, report)
        self.lose_worker(worker_id, exitcode=0)

    def _check_in(self, worker_id: str, *, reported: bool) -> bool:
        """Note a sign of life (and a finished job); True for a worker on this machine.

        Raises:
            WorkerRetiredError: the worker was declared gone (its leases already ended).
        """
        with self._lock:
            if worker_id in self._retired:
                raise WorkerRetiredError(f"worker {worker_id} was declared gone; join again")
            now = time.monotonic()
            if reported:
                self._finished.append(now)
            worker = self._workers.get(worker_id)
            if worker is None:
                return False
            worker.last_seen = now
            if reported:
                worker.current = None
                worker.jobs_done += 1
            return worker.proc is not None

    def _complete(self, report: Report, *, same_clock: bool) -> None:
        # A start stamp from another machine's monotonic clock says nothing about lateness
        # here: such jobs stay out of the lateness and started-early counts.
        stats_outcome = report.outcome if same_clock else report.outcome._replace(started=None)
        job = self.queue.complete(report.lease_id, stats_outcome)
        if job is not None:
            self.mailboxes.post(job.client_id, report.outcome)

    def lose_worker(self, worker_id: str, exitcode: int | None,
                    received: Callable[[Lease], bool] | None = None) -> int:
        """Forget a worker and resolve each job it held; returns how many it held.

        ``received`` tells whether the worker got a lease (local workers: their shared
        acknowledgement slot); by default, the last lease it acknowledged.
        """
        lost = self.queue.release_worker(worker_id)
        with self._lock:
            worker = self._workers.pop(worker_id, None)
            self._retired.add(worker_id)
        acked = worker.acked if worker is not None else 0
        for item in lost:
            got = received(item.lease) if received else item.lease.lease_id == acked
            self._resolve_lost(item, got, exitcode)
        return len(lost)

    def _resolve_lost(self, item: LostLease, received: bool, exitcode: int | None) -> None:
        job, lease = item.job, item.lease
        error: MpschedError
        if item.past_deadline:
            assert job.timeout is not None
            self.queue.fail(job, timed_out=True)
            error = JobTimeoutError(job.job_id, job.timeout)
        elif not received and self.queue.requeue(job, retry=False):
            log.info("job %s never reached worker %s; requeued", job.job_id, lease.worker_id)
            return
        elif received and job.attempt <= job.retries and self.queue.requeue(job, retry=True):
            log.warning("job %s: worker %s died on attempt %d; requeued", job.job_id,
                        lease.worker_id, job.attempt)
            return
        elif self.stopping.is_set():
            self.queue.fail(job)
            error = SchedulerShutdownError(f"the manager stopped before job {job.job_id} ran")
        else:
            self.queue.fail(job)
            error = WorkerCrashedError(job.job_id, lease.worker_id, exitcode)
            log.error("%s", error)
        self.mailboxes.post(job.client_id, Outcome(
            job.job_id, False, pickle.dumps(error), "", None, type(error).__name__))

    def expired_remote(self) -> tuple[list[str], float | None]:
        """Remote workers silent past the heartbeat timeout, and the next such deadline."""
        now = time.monotonic()
        with self._lock:
            deadlines = {wid: w.last_seen + self.heartbeat_timeout
                         for wid, w in self._workers.items() if w.hello.remote}
        late = [wid for wid, deadline in deadlines.items() if deadline <= now]
        ahead = [deadline for deadline in deadlines.values() if deadline > now]
        return late, min(ahead, default=None)

    def worker_count(self) -> int:
        with self._lock:
            return len(self._workers)

    # ------------------------------------------------------------------ clients

    def open_client(self, hello: ClientHello) -> int | None:
        """Register a client; returns the queue's max_pending (a client batches below it)."""
        self._check_versions(f"client {hello.client_id}", (hello.python, hello.cloudpickle))
        self.mailboxes.open(hello.client_id)
        return self.queue.max_pending

    def close_client(self, client_id: str) -> None:
        self.mailboxes.close(client_id)

    def submit(self, requests: list[JobRequestWire], timeout: float | None) -> None:
        """Queue a batch of jobs, all or none (one job is a batch of one)."""
        bounded = LONG_POLL if timeout is None else min(timeout, LONG_POLL)
        self.queue.submit_many([JobRequest._make(r) for r in requests], bounded)

    def cancel(self, job_id: str) -> bool:
        return self.queue.cancel(job_id)

    def cancel_client(self, client_id: str) -> list[str]:
        return self.queue.cancel_client(client_id)

    def collect(self, client_id: str, timeout: float) -> list[OutcomeWire] | None:
        outcomes = self.mailboxes.collect(client_id, min(timeout, LONG_POLL))
        return None if outcomes is None else [tuple(o) for o in outcomes]  # type: ignore[misc]

    def stats(self) -> Stats:
        now = time.monotonic()
        with self._lock:
            workers = list(self._workers.values())
            recent = sum(1 for t in self._finished if t >= now - THROUGHPUT_WINDOW)
        window = min(THROUGHPUT_WINDOW, max(now - self._started, 1e-9))
        return Stats(self.queue.stats(), tuple(_status(w) for w in workers),
                     uptime=now - self._started, throughput=recent / window)

    def stop(self) -> None:
        """Stop handing out jobs; the manager process then drains, stops workers, exits."""
        self.stopping.set()
        self.queue.close()
        self.wake_supervisor()

    def _check_versions(self, peer: str, theirs: tuple[str, str]) -> None:
        if theirs != self.versions:
            error = VersionMismatchError(peer, self.versions, theirs)
            log.warning("refused %s", error)
            raise error


def _status(worker: _Worker) -> WorkerStatus:
    cpu, rss = (worker.load.cpu_percent, worker.load.rss) if worker.load else (0.0, 0)
    if worker.proc is not None:
        with contextlib.suppress(psutil.Error):
            cpu, rss = worker.proc.cpu_percent(None), worker.proc.memory_info().rss
    hello = worker.hello
    return WorkerStatus(hello.worker_id, hello.pid, hello.host, hello.remote,
                        worker.jobs_done, worker.current, cpu, rss)


class ServiceProxy(BaseProxy):
    """Typed client side of ManagerService."""

    _exposed_ = ("hello", "take", "ack", "heartbeat", "finish", "leave", "open_client",
                 "close_client", "submit", "cancel", "cancel_client", "collect", "stats",
                 "stop")

    def _call(self, method: str, *args: Any) -> Any:
        return self._callmethod(method, args)

    def hello(self, hello: WorkerHello) -> float:
        return float(self._call("hello", hello))

    def take(self, worker_id: str, report: Report | None, timeout: float) -> Assignment | None:
        wire = self._call("take", worker_id, None if report is None else report_to_wire(report),
                          timeout)
        return None if wire is None else assignment_from_wire(wire)

    def ack(self, worker_id: str, lease_id: int) -> None:
        self._call("ack", worker_id, lease_id)

    def heartbeat(self, worker_id: str, load: WorkerLoad) -> None:
        self._call("heartbeat", worker_id, load)

    def finish(self, worker_id: str, report: Report | None) -> None:
        self._call("finish", worker_id, None if report is None else report_to_wire(report))

    def leave(self, worker_id: str, report: Report | None) -> None:
        self._call("leave", worker_id, None if report is None else report_to_wire(report))

    def open_client(self, hello: ClientHello) -> int | None:
        result: int | None = self._call("open_client", hello)
        return result

    def close_client(self, client_id: str) -> None:
        self._call("close_client", client_id)

    def submit(self, requests: list[JobRequest], timeout: float | None) -> None:
        self._call("submit", [tuple(r) for r in requests], timeout)

    def cancel(self, job_id: str) -> bool:
        return bool(self._call("cancel", job_id))

    def cancel_client(self, client_id: str) -> list[str]:
        result: list[str] = self._call("cancel_client", client_id)
        return result

    def collect(self, client_id: str, timeout: float) -> list[Outcome] | None:
        wire: list[OutcomeWire] | None = self._call("collect", client_id, timeout)
        return None if wire is None else [Outcome._make(w) for w in wire]

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

    _Server = HardenedServer


ServiceManager.register("service", callable=_get_service, proxytype=ServiceProxy)


def connect_service(address: Any, authkey: bytes) -> ServiceProxy:
    """Connect to a manager and return a proxy of its service.

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


class ManagerReady(NamedTuple):
    """Sent over the control pipe once the manager listens and its workers have joined."""

    address: Any
    pid: int


class ManagerFailed(NamedTuple):
    """Sent over the control pipe instead of ManagerReady when start-up failed."""

    reason: str


def run_manager(config: ManagerConfig, control: Connection | None = None,
                on_ready: Callable[[ManagerReady, ManagerService], None] | None = None) -> int:
    """Run a manager in this process until it is told to stop; returns an exit code.

    Args:
        control: a pipe to the process that started this one. It may send "stop"; when
            it closes (that process died, even by SIGKILL) the manager stops at once.
        on_ready: called once the manager listens and its workers have joined.
    """
    from mpsched._supervisor import Supervisor

    global _SERVICE
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    if control is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner decides when we stop
    service = _SERVICE = ManagerService(
        JobQueue(order=config.order, max_pending=config.max_pending),
        heartbeat_timeout=config.heartbeat_timeout)
    # Not BaseManager.get_server(): it builds a plain Server and ignores _Server.
    server = HardenedServer(ServiceManager._registry, config.address,  # type: ignore[attr-defined]
                            config.authkey, SERIALIZER)
    # serve_client reads stop_event, which only serve_forever would create; we run the
    # accepter ourselves so that this thread can supervise.
    server.stop_event = threading.Event()  # type: ignore[attr-defined]
    threading.Thread(target=server.accepter, name="mpsched-accept", daemon=True).start()
    supervisor = Supervisor(service, config, server.address)
    grace = config.drain_timeout
    try:
        failure = _start(supervisor, config)
        if failure:
            if control is not None:
                control.send(ManagerFailed(failure))
            log.error("manager start-up failed: %s", failure)
            return 1
        ready = ManagerReady(server.address, os.getpid())
        if control is not None:
            control.send(ready)
        if on_ready is not None:
            on_ready(ready, service)
        if supervisor.watch(control) == "owner-gone":
            grace = 0.0
        return 0
    finally:
        service.stop()
        if not service.queue.wait_drained(grace):
            log.warning("jobs still running after %.0f s; stopping their workers", grace)
        supervisor.stop_workers(grace=2.0)
        service.mailboxes.close()
        # Let connected clients take the last outcomes before the sockets close.
        service.mailboxes.wait_collected(0.0 if grace == 0 else 5.0)


def _start(supervisor: Any, config: ManagerConfig) -> str:
    try:
        supervisor.start_workers()
        return str(supervisor.await_workers(config.start_timeout))
    except Exception as exc:
        log.exception("manager start-up failed")
        return f"{type(exc).__name__}: {exc}"
