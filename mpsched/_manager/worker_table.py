"""The workers a manager knows: who joined, from where, whether it shares the manager's
clock, what it runs, when it was last heard of, and whether it was dismissed (its pool is
to leave: ``drain-workers``, or a stop with ``--drain-workers-on-stop``) and told so.

Each worker has a *slot* among the workers of its host (0, 1, ...: the lowest one free when
it joins), which the worker that replaces it takes again: metrics label a worker's series
by host and slot, so a pool that recycles its workers keeps as many series as it has
workers, whatever their ids.

Used by ManagerService (mpsched._manager.service) from the server threads of the workers'
connections, and by the supervisor's thread for heartbeat deadlines.
"""

from __future__ import annotations

import bisect
import contextlib
import hmac
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import psutil

from mpsched._errors import WorkerRetiredError
from mpsched._protocol.records import (
    WorkerHello,
    WorkerLoad,
    WorkerStatus,
)

log = logging.getLogger("mpsched.manager")

CPU_SPAN = 1.0  # seconds a local worker's CPU % is averaged over, at least


@dataclass
class CpuMeter:
    """A process's CPU %, from readings of its CPU time: the average since a base reading
    at least CPU_SPAN seconds older, which then moves up to this one. Readings closer than
    that get the same figure, so that every reader (status, the page, a scrape) sees one
    figure over a second or more, whoever asked last. Nothing reads it in the background:
    after a silence, the first reading averages over the silence."""

    since: float  # when the base reading was taken (monotonic)
    base: float  # CPU seconds at the base reading
    percent: float = 0.0

    def read(self, now: float, cpu_seconds: float) -> float:
        """The CPU % with a reading of ``cpu_seconds`` taken at ``now``. (A reading older
        than the base, from a reader that was overtaken, only gets the figure.)"""
        span = now - self.since
        if span >= CPU_SPAN:
            self.percent = max(0.0, 100.0 * (cpu_seconds - self.base) / span)
            self.since, self.base = now, cpu_seconds
        return self.percent


@dataclass(eq=False)
class _Registered:
    hello: WorkerHello
    last_seen: float
    slot: int  # its place among the workers of its host, taken again by its replacement
    jobs_done: int = 0
    current: str | None = None
    acked: int = 0  # remote workers: the last lease id they acknowledged
    load: WorkerLoad | None = None
    local: bool = False  # started by this manager: shares its monotonic clock
    dismissed: bool = False  # its pool is to leave (remote workers only)
    # A remote worker that held jobs when the manager died: not joined (yet), awaited under
    # its old id until its pool or its next join says what became of them, or it is silent
    # past the heartbeat timeout (its heartbeat thread may beat under that id meanwhile).
    awaited: bool = False
    told: bool = False  # a take of it was answered with its dismissal or the stop
    proc: psutil.Process | None = field(default=None, repr=False)  # local workers only
    cpu: CpuMeter | None = None  # local workers only; read and moved under the table's lock


class WorkerTable:
    """The registered workers, by id. Thread-safe."""

    def __init__(self, local_token: str, clock: Callable[[], float] = time.monotonic) -> None:
        # What the workers this manager starts say in their hello (WorkerConfig.local_token):
        # the proof that they share this process's monotonic clock.
        self.local_token = local_token
        self._clock = clock
        # Guards _workers (with each one's CPU meter) and _finished.
        self._lock = threading.Lock()
        # A stopping manager waits here (wait_told) until every remote worker has been told
        # of its dismissal or of the stop; dismissal() and told_stop() notify it each time.
        self._told = threading.Condition(self._lock)
        self._workers: dict[str, _Registered] = {}
        self._finished: deque[float] = deque(maxlen=100_000)  # completion times

    def join(self, hello: WorkerHello) -> None:
        """Register a worker (again, under a new id, after it was declared gone)."""
        proc, cpu = None, None
        local = self._started_here(hello)
        if local:
            with contextlib.suppress(psutil.Error, OSError):
                proc = psutil.Process(hello.pid)
                cpu = CpuMeter(since=self._clock(), base=_cpu_seconds(proc))
        elif not hello.remote:
            log.warning(
                "worker %s (pid %d on %s) did not come from this manager; its clock "
                "is treated as another machine's",
                hello.worker_id,
                hello.pid,
                hello.host,
            )
        with self._lock:
            taken = {
                w.slot
                for wid, w in self._workers.items()
                if w.hello.host == hello.host and wid != hello.worker_id
            }
            slot = next(n for n in itertools.count() if n not in taken)
            self._workers[hello.worker_id] = _Registered(
                hello, time.monotonic(), slot=slot, local=local, proc=proc, cpu=cpu
            )

    def await_worker(self, worker_id: str) -> None:
        """Register ``worker_id`` as awaited (see _Registered.awaited): it counts as a
        remote worker last heard of now, but is not listed, counted or dismissed."""
        host = worker_id.rsplit(":", 1)[0] if ":" in worker_id else ""
        hello = WorkerHello(
            worker_id=worker_id, pid=0, host=host, python="", cloudpickle="", remote=True
        )
        with self._lock:
            taken = {w.slot for w in self._workers.values() if w.hello.host == host}
            slot = next(n for n in itertools.count() if n not in taken)
            self._workers.setdefault(
                worker_id, _Registered(hello, time.monotonic(), slot=slot, awaited=True)
            )

    def queues_of(self, worker_id: str) -> tuple[str, ...] | None:
        """The queues ``worker_id`` serves, in order (None: every queue, or unknown)."""
        worker = self._workers.get(worker_id)  # one dict read: atomic, no lock needed
        return None if worker is None else worker.hello.queues

    def subscriptions(self) -> list[tuple[str, ...] | None]:
        """What each worker listed serves (None: every queue)."""
        with self._lock:
            return [w.hello.queues for w in self._workers.values() if not w.awaited]

    def _started_here(self, hello: WorkerHello) -> bool:
        # A host name proves nothing about clocks: two containers or VMs may share one.
        return not hello.remote and hmac.compare_digest(
            hello.local_token.encode(), self.local_token.encode()
        )

    def check_in(self, worker_id: str, *, reported: int, busy: bool = False) -> bool:
        """Note a sign of life (and ``reported`` finished jobs); True for a worker this
        manager started. ``busy``: it still runs a job of its batch (it reports early).

        Raises:
            WorkerRetiredError: the worker is not (or no longer) registered: it was
                declared gone and its leases already ended, so it must join again. (No set
                of retired ids is kept: worker ids are never reused.)
        """
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                raise WorkerRetiredError(
                    f"worker {worker_id} was declared gone (or never joined); join again"
                )
            now = time.monotonic()
            worker.last_seen = now
            if reported:
                self._finished.extend(itertools.repeat(now, reported))
                worker.jobs_done += reported
                if not busy:
                    worker.current = None
            return worker.local

    def update(
        self,
        worker_id: str,
        *,
        current: str | None = None,
        acked: int | None = None,
        load: WorkerLoad | None = None,
    ) -> None:
        """Record what a worker now runs, the last lease it acknowledged, or its load."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return
            if current is not None:
                worker.current = current
            if acked is not None:
                worker.acked, worker.last_seen = acked, time.monotonic()
            if load is not None:
                worker.load = load

    def dismiss_remote(self) -> int:
        """Dismiss every remote worker registered now: its next take tells it that its pool
        leaves. Returns how many there are."""
        with self._lock:
            remote = [w for w in self._workers.values() if w.hello.remote and not w.awaited]
            for worker in remote:
                worker.dismissed = True
            return len(remote)

    def dismissal(self, worker_id: str) -> bool:
        """Whether ``worker_id`` was dismissed; if so, it is noted as told."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None or not worker.dismissed:
                return False
            worker.told = True
            self._told.notify_all()
            return True

    def told_stop(self, worker_id: str) -> None:
        """Note that a take of ``worker_id`` was answered with the manager's stop."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.told = True
                self._told.notify_all()

    def wait_told(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every remote worker still registered has
        been told of its dismissal or of the stop, but for those running a job that were
        not dismissed. A pool not told would take the closed sockets for a lost manager."""

        def waited_for(worker: _Registered) -> bool:
            if not worker.hello.remote or worker.awaited:
                return False
            return worker.dismissed or worker.current is None

        with self._lock:
            return self._told.wait_for(
                lambda: all(w.told for w in self._workers.values() if waited_for(w)), timeout
            )

    def busy(self) -> set[str]:
        """The ids of the workers that run a job."""
        with self._lock:
            return {wid for wid, w in self._workers.items() if w.current is not None}

    def remove(self, worker_id: str) -> int | None:
        """Forget a worker; returns the last lease id it acknowledged (0: none), or None
        for an awaited one: each of its leases may have reached it."""
        with self._lock:
            worker = self._workers.pop(worker_id, None)
        if worker is None:
            return 0
        return None if worker.awaited else worker.acked

    def expired_remote(self, heartbeat_timeout: float) -> tuple[list[str], float | None]:
        """Remote workers silent past the heartbeat timeout, and the next such deadline."""
        now = time.monotonic()
        with self._lock:
            deadlines = {
                wid: w.last_seen + heartbeat_timeout
                for wid, w in self._workers.items()
                if w.hello.remote
            }
        late = [wid for wid, deadline in deadlines.items() if deadline <= now]
        ahead = [deadline for deadline in deadlines.values() if deadline > now]
        return late, min(ahead, default=None)

    def __len__(self) -> int:
        """How many workers are registered (awaited ones are not)."""
        with self._lock:
            return sum(not w.awaited for w in self._workers.values())

    def statuses(self, since: float) -> tuple[tuple[WorkerStatus, ...], int]:
        """Every worker as ``stats()`` shows it, and how many jobs finished after ``since``
        (monotonic)."""
        with self._lock:
            workers = [w for w in self._workers.values() if not w.awaited]
            # Completion times are appended in time order: a bisection (in C, over the
            # deque's blocks) finds the recent ones without a pass over 100,000 of them.
            recent = len(self._finished) - bisect.bisect_left(self._finished, since)
        # /proc is read outside the lock, which every job's report takes.
        usage = [self._usage(w) for w in workers]
        with self._lock:
            percents = [_percent_locked(w, u) for w, u in zip(workers, usage, strict=True)]
        return tuple(
            _status(w, u, p) for w, u, p in zip(workers, usage, percents, strict=True)
        ), recent

    def _usage(self, worker: _Registered) -> _Usage | None:
        """A local worker's RSS and CPU seconds, read from its process now; None for a
        remote worker (its heartbeat brings them) or a process that cannot be read."""
        if worker.proc is None:
            return None
        with contextlib.suppress(psutil.Error, OSError):  # e.g. no fd left to read /proc
            proc = worker.proc
            with proc.oneshot():
                return _Usage(
                    rss=proc.memory_info().rss,
                    cpu_seconds=_cpu_seconds(proc),
                    read_at=self._clock(),
                )
        return None


class _Usage(NamedTuple):
    """A local worker's process, as read from /proc."""

    rss: int
    cpu_seconds: float
    read_at: float  # the table's clock, just after the reading


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _percent_locked(worker: _Registered, usage: _Usage | None) -> float:
    """A worker's CPU %: a local one's from its meter, a remote one's from its heartbeat."""
    if worker.cpu is not None and usage is not None:
        return worker.cpu.read(usage.read_at, usage.cpu_seconds)
    return worker.load.cpu_percent if worker.load is not None else 0.0


def _status(worker: _Registered, usage: _Usage | None, percent: float) -> WorkerStatus:
    load = worker.load
    if usage is not None:
        rss, seconds = usage.rss, usage.cpu_seconds
    else:
        rss, seconds = (load.rss, load.cpu_seconds) if load is not None else (0, 0.0)
    hello = worker.hello
    return WorkerStatus(
        worker_id=hello.worker_id,
        pid=hello.pid,
        host=hello.host,
        remote=hello.remote,
        jobs_done=worker.jobs_done,
        current_job=worker.current,
        cpu_percent=percent,
        rss=rss,
        cpu_seconds=seconds,
        slot=worker.slot,
    )
