"""The worker loop (the seed's "Loop 2"): take a due job, run it, report, repeat.

A worker runs each job in its own process, outside any manager lock, and survives any
exception the job raises. Its report rides on its next ``take`` call, so one round trip
both completes a job and asks for the next.

Local workers are started by the manager's supervisor, which watches their sentinels and
reads their delivery acknowledgements from shared memory; they share the manager's
monotonic clock, so they may be handed a job early and wait for its due time themselves.
Remote workers (``python -m mpsched worker --connect``, see mpsched._worker.remote) acknowledge
each lease with a call, enforce their jobs' timeouts themselves (JobTimeouts), drain on
the first SIGTERM (DrainState), and never read the manager's clock: they get jobs when due.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle
import psutil

from mpsched._core.job import Assignment, Outcome
from mpsched._core.prefetch import BATCH_TIME, PREFETCH
from mpsched._errors import (
    JobError,
    JobUnpicklingError,
    ResultPicklingError,
    SchedulerShutdownError,
)
from mpsched._payload import shm
from mpsched._payload.pickling import dumps_result, loads
from mpsched._protocol.codec import report_to_wire
from mpsched._protocol.proxy import (
    ServiceProxy,
    connect_service,
)
from mpsched._protocol.records import (
    LONG_POLL,
    Report,
    WorkerHello,
)
from mpsched._transport.sockets import describe_versions, host_name
from mpsched._transport.tls import TlsConfig, set_tls
from mpsched._worker.claims import ClaimSlot
from mpsched._worker.reports import Reports

log = logging.getLogger("mpsched.worker")

# A local worker that reports a job waits this long for its next one awake (polling,
# yielding its CPU) before it sleeps: the manager on this machine answers within tens of
# microseconds when a job is due, and waking a CPU that went idle costs about as much as
# the whole hand-off. Idle workers (whose last take found nothing) sleep at once.
REPLY_SPIN = 0.0003

@dataclass(frozen=True)
class WorkerConfig:
    """What a worker process needs to find and join its manager."""

    address: Any
    authkey: bytes
    worker_id: str
    log_level: int = logging.WARNING
    max_tasks: int | None = None  # leave (and be replaced) after this many jobs
    max_memory: int | None = None  # leave after a job that leaves RSS above this (bytes)
    heartbeat_interval: float = 2.0  # remote workers only
    # Local workers: the manager's ManagerService.local_token, said in the hello to prove
    # this worker was started by the manager and so shares its monotonic clock.
    local_token: str = ""
    # Remote workers: wait (with backoff) for an unreachable manager at start instead of
    # failing. Replacements started by a pool are patient; the first workers are not, so a
    # wrong address fails fast.
    wait_for_manager: bool = False
    tls: TlsConfig | None = None  # TLS for a TCP address (mpsched._transport.tls)
    # Local workers of a manager using shared memory: its segment prefix. A large result
    # of a job whose client maps shared memory goes there (mpsched._payload.segments).
    shm_prefix: str = ""


class Draining(Exception):
    """Raised by the SIGTERM handler to interrupt an idle remote worker's wait."""


@dataclass
class DrainState:
    """A remote worker's drain flag, set by its first SIGTERM."""

    draining: bool = False
    waiting: bool = False  # in an interruptible wait: the handler raises Draining into it

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.draining:  # the second SIGTERM kills
            _kill_children()
            os._exit(128 + signum)
        self.draining = True
        if self.waiting:
            raise Draining

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A wait (a take, a reconnect back-off) the first SIGTERM ends with Draining.

        Raises:
            Draining: the worker drains (before or during the wait).
        """
        self.waiting = True
        try:
            if self.draining:  # a SIGTERM that came just before we set ``waiting``
                raise Draining
            yield
        finally:
            self.waiting = False


def setup_process(config: WorkerConfig, lifeline: Connection | None) -> None:
    """Logging, signals and the lifeline thread of a worker process."""
    logging.basicConfig(level=config.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s[%(process)d] %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the owner, which drains
    faulthandler.enable()
    _tighten_timer_slack()
    set_tls(config.tls)  # a process's TLS setting is its own: started processes get none
    if lifeline is not None:
        threading.Thread(target=_exit_with_parent, args=(lifeline,), daemon=True,
                         name="mpsched-lifeline").start()


PR_SET_TIMERSLACK = 29  # linux/prctl.h


def _tighten_timer_slack() -> None:
    """Ask Linux to end this process's sleeps on time: a 1 ns timer slack instead of the
    default 50 µs, which halves how late a timed sleep wakes (a job handed out early
    sleeps until it is due, so the slack would add to its lateness). Elsewhere, or if
    refused, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def make_hello(worker_id: str, *, remote: bool, local_token: str = "") -> WorkerHello:
    """This process's hello under ``worker_id``."""
    python, cp = describe_versions()
    return WorkerHello(worker_id, os.getpid(), host_name(), python, cp, remote, local_token)


def worker_main(config: WorkerConfig, slot: ClaimSlot | None = None,
                lifeline: Connection | None = None) -> None:
    """Entry point of a local worker process: join the manager, serve until it stops.

    Args:
        slot: shared with the manager: the worker records in it each lease it receives or
            starts, so the manager can tell a job that never arrived (requeued untouched)
            from one that started, and claims its prefetched jobs there (None: no prefetch).
        lifeline: the read end of a pipe only the manager writes to; when it closes the
            manager is gone and this worker exits at once, even in the middle of a job.
    """
    setup_process(config, lifeline)
    service = connect_service(config.address, config.authkey)
    service.hello(make_hello(config.worker_id, remote=False, local_token=config.local_token))
    if slot is None:
        serve(service, config, lambda lease_id: None, reply_spin=REPLY_SPIN)
    else:
        serve(service, config, slot.received, reply_spin=REPLY_SPIN, slot=slot)


class JobTimeouts:
    """Ends a remote worker's process when its running job passes its timeout.

    The job runs in this process, so the only way to stop it is to exit (the manager then
    fails it with JobTimeoutError and the pool starts another worker). A timer can fire just
    as its job returns, too late for ``cancel``: it then finds that job no longer running
    and does nothing, instead of killing the next, innocent job.

    Args:
        on_expired: called (in the timer's thread) to end the process; it should not return.
        timer: ``threading.Timer`` or a test's stand-in with the same signature.
    """

    def __init__(self, on_expired: Callable[[], None],
                 timer: Callable[..., Any] = threading.Timer) -> None:
        self._on_expired = on_expired
        self._timer = timer
        # Guards _running. A job's start and end take it in the worker's main thread; an
        # expiring timer takes it, checks its job still runs, and ends the process holding
        # it, so no job can finish or start meanwhile. Nobody waits on it for long.
        self._lock = threading.Lock()
        self._running: object | None = None  # the token of the job under a timeout

    @contextlib.contextmanager
    def guard(self, timeout: float | None) -> Iterator[None]:
        """Run the body as one job that may take ``timeout`` seconds (None: no limit)."""
        if timeout is None:
            yield
            return
        token = object()  # not the lease id: ids start again after a manager restart
        timer = self._timer(timeout, self._expire, args=(token,))
        timer.daemon = True
        with self._lock:
            self._running = token
        timer.start()
        try:
            yield
        finally:
            with self._lock:
                self._running = None
            timer.cancel()

    def _expire(self, token: object) -> None:
        with self._lock:
            if self._running is token:
                self._on_expired()


def _exit_with_parent(lifeline: Connection) -> None:
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv()
    log.warning("worker pid %d: its manager or parent is gone; exiting", os.getpid())
    _kill_children()
    os._exit(1)


def kill_tree(pid: int | None, *, include_root: bool = True) -> None:
    """SIGKILL a process's descendants, then (unless ``include_root`` is False) itself."""
    if pid is None:
        return
    try:
        root = psutil.Process(pid)
        family = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    if include_root:
        family.append(root)
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _kill_children() -> None:
    kill_tree(os.getpid(), include_root=False)


def serve(service: ServiceProxy, config: WorkerConfig, received: Callable[[int], None],
          drain: DrainState | None = None, long_poll: float = LONG_POLL,
          timeouts: JobTimeouts | None = None, reply_spin: float = 0.0,
          slot: ClaimSlot | None = None) -> str:
    """Take, run and report jobs until the manager stops ("stopped") or goes away ("lost"),
    the worker drains ("drained"), or it is time to recycle this process ("recycled":
    ``max_tasks`` / ``max_memory``).

    Reports ride on the next take. A remote worker's take that carries some returns at
    once (a job that is due, or none), and only then does it wait ``long_poll``: when the
    manager goes away, the worker knows whether it had answered for the last reports.

    Args:
        received: acknowledges the first job of each batch as it arrives; an OSError or
            EOFError from it means the manager is gone ("lost"), and the job is not run.
        drain: a remote worker's drain flag (None: a local worker, stopped by its manager).
        timeouts: enforces each job's timeout in this process (None: the manager does).
        reply_spin: after reporting a job, wait for the next one awake this long before
            sleeping (see REPLY_SPIN); 0: sleep at once.
        slot: a local worker's ClaimSlot: with it, a worker whose last job was short asks
            for prefetched jobs too (mpsched._core.prefetch), starts each only if it claims
            it there, and keeps there the reports it holds back meanwhile. None: one job
            per take.
    """
    worker_id = config.worker_id
    reports = Reports(partial(service.report, worker_id))
    state = _Batches(config, slot, service)
    unsent: list[Report] = []
    try:
        while drain is None or not drain.draining:
            unsent = reports.take_all()
            # A remote worker's take that hands in reports does not wait: its answer says
            # they arrived, so an idle worker holds no report its manager may not have.
            wait = 0.0 if unsent and drain is not None else long_poll
            if reply_spin and unsent:
                service.expect_reply_soon(reply_spin)
            try:
                batch = _take(service, worker_id, unsent, wait, drain, state.more())
            except Draining:
                break
            except SchedulerShutdownError:
                return "stopped"
            except (EOFError, OSError) as exc:
                _log_lost(worker_id, exc, _unanswered(unsent))
                return "lost"
            unsent = []
            state.delivered(reports)
            end = state.run_batch(batch, received, reports, timeouts)
            if end:
                if end == "recycled":
                    log.info("worker %s recycles after %d job(s)", worker_id, state.done)
                    unsent = _closed(reports)
                    _leave(config, worker_id, unsent, drain is not None)
                return end
    finally:
        reports.close()
    unsent += _closed(reports)
    _leave(config, worker_id, unsent, drain is not None)
    return "drained"


def _closed(reports: Reports) -> list[Report]:
    """Stop the reporter (after its send under way) and return what it did not send."""
    reports.close()
    return reports.take_all()


def _unanswered(reports: list[Report]) -> str:
    if len(reports) == 1:
        return (f"; the report of job {reports[0].outcome.job_id} got no answer: its "
                f"outcome is lost unless the manager recorded it")
    if reports:
        return (f"; the reports of jobs {', '.join(r.outcome.job_id for r in reports)} got "
                f"no answer: their outcomes are lost unless the manager recorded them")
    return ""


class _Batches:
    """How many jobs a worker asks for at once, and running what it gets."""

    def __init__(self, config: WorkerConfig, slot: ClaimSlot | None,
                 service: ServiceProxy) -> None:
        self._config = config
        self._slot = slot
        self._service = service
        self._last_run = float("inf")  # seconds the last job ran: long until one did
        self.done = 0

    def more(self) -> int:
        """Prefetched jobs to ask for: as many as the last job's run time says fit in
        BATCH_TIME (none after a job that ran that long), within max_tasks."""
        if self._slot is None or self._last_run >= BATCH_TIME:
            return 0
        more = PREFETCH - 1
        if self._last_run > 0:
            more = min(more, int(BATCH_TIME / self._last_run) - 1)
        if self._config.max_tasks is not None:
            more = min(more, self._config.max_tasks - self.done - 1)
        return max(more, 0)

    def run_batch(self, batch: list[Assignment], received: Callable[[int], None],
                  reports: Reports, timeouts: JobTimeouts | None) -> str:
        """Run the jobs of one take in order; returns "" to take again, "lost" (the
        manager is gone) or "recycled" (time to leave)."""
        for i, assignment in enumerate(batch):
            lease_id = assignment.lease.lease_id
            if i and not self._claim_or_stop(lease_id):
                break  # revoked: it and the rest of the batch went to other workers
            if not i:
                try:
                    received(lease_id)
                except (EOFError, OSError) as exc:
                    # Unacknowledged, the job counts as never delivered and may run elsewhere.
                    _log_lost(self._config.worker_id, exc,
                              f"; job {assignment.lease.job_id} is not run here")
                    return "lost"
            report = self._run_one(assignment, timeouts)
            if _should_recycle(self._config, self.done):
                reports.add(report)
                return "recycled"
            if i + 1 < len(batch):
                self._hold(report, reports)
            else:
                reports.add(report)
        return ""

    def delivered(self, reports: Reports) -> None:
        """A take returned: the manager has every report made before it (once a send of
        the reporter's under way has ended), so the kept ones may go."""
        if self._slot is not None:
            reports.settle()
            self._slot.forget_kept()

    def _hold(self, report: Report, reports: Reports) -> None:
        """Hold back the report of a job that the batch goes on after, kept in the slot
        first; when the slot is full, send every report now (this job's included)."""
        assert self._slot is not None  # a batch of more than one job needs it
        if self._slot.keep(pickle.dumps(report_to_wire(report), pickle.HIGHEST_PROTOCOL)):
            reports.hold(report)
            return
        reports.add(report)
        self._service.report(self._config.worker_id, reports.take_all())
        self.delivered(reports)

    def _claim_or_stop(self, lease_id: int) -> bool:
        assert self._slot is not None  # a batch of more than one job needs it
        return self._slot.claim(lease_id)

    def _run_one(self, assignment: Assignment, timeouts: JobTimeouts | None) -> Report:
        start_at = _start_time(assignment)
        segment = _result_segment(self._config, assignment)
        with timeouts.guard(assignment.timeout) if timeouts else contextlib.nullcontext():
            outcome = run(assignment, start_at, segment)
        ended = time.monotonic()
        self._last_run = ended - (start_at if outcome.started is None else outcome.started)
        self.done += 1
        return Report(assignment.lease.lease_id, outcome)


def _log_lost(worker_id: str, exc: BaseException, consequence: str) -> None:
    log.warning("worker %s lost its manager (%s: %s)%s", worker_id, type(exc).__name__, exc,
                consequence)


def _take(service: ServiceProxy, worker_id: str, reports: list[Report], long_poll: float,
          drain: DrainState | None, more: int) -> list[Assignment]:
    if drain is None:
        return service.take(worker_id, reports, long_poll, more)
    with drain.interruptible():
        return service.take(worker_id, reports, long_poll, more)


def _leave(config: WorkerConfig, worker_id: str, reports: list[Report], remote: bool) -> None:
    # A fresh connection: a take interrupted by SIGTERM left the old one mid-reply.
    with contextlib.suppress(Exception):
        service = connect_service(config.address, config.authkey)
        if remote:
            service.leave(worker_id, reports)
        else:
            service.finish(worker_id, reports)


def _start_time(assignment: Assignment) -> float:
    """When to enter the job, on this process's monotonic clock.

    Only a worker that shares the manager's clock is sent ``due`` (an instant on it); any
    other waits the ``delay`` the manager measured, from now.
    """
    if assignment.due is not None:
        return assignment.due
    return time.monotonic() + assignment.delay


def _result_segment(config: WorkerConfig, assignment: Assignment) -> str:
    """Where a large result goes: shared memory when the manager uses it and the job's
    client maps it (its payload is framed); "" for inline."""
    if config.shm_prefix and assignment.payload[:4] == shm.MAGIC:
        return shm.result_name(config.shm_prefix, assignment.lease.lease_id)
    return ""


def _should_recycle(config: WorkerConfig, done: int) -> bool:
    if config.max_tasks is not None and done >= config.max_tasks:
        return True
    if config.max_memory is not None:
        return bool(psutil.Process().memory_info().rss > config.max_memory)
    return False


def run(assignment: Assignment, start_at: float | None = None,
        result_segment: str = "") -> Outcome:
    """Unpickle and run one job; never raises: every failure becomes an Outcome.

    The callable is entered no sooner than ``start_at`` (this process's monotonic clock;
    by default computed from the assignment now, see ``_start_time``). With
    ``result_segment``, the result's large buffers go to that shared-memory segment.
    """
    job_id = assignment.lease.job_id
    try:
        fn, args, kwargs = loads(assignment.payload)
        if isinstance(fn, bytes):  # map(): the callable was pickled once, separately
            fn = cloudpickle.loads(fn)
    except BaseException as exc:
        unpickling = JobUnpicklingError(
            f"job {job_id}: the worker on {host_name()} (pid {os.getpid()}) could not "
            f"unpickle it: {exc!r}{_unpickling_hint(exc)}")
        return _failure(job_id, unpickling, _format(exc), None, "job-unpickling")
    started = _wait_until(_start_time(assignment) if start_at is None else start_at)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        return _failure(job_id, exc, _format(exc), started, "")
    try:
        payload = dumps_result(result, result_segment)
    except BaseException as exc:
        pickling = ResultPicklingError(
            f"job {job_id} returned a {type(result).__qualname__} that could not be pickled: "
            f"{exc!r}")
        return _failure(job_id, pickling, _format(exc), started, "result-pickling")
    return Outcome(job_id, True, payload, "", started)


def _unpickling_hint(exc: BaseException) -> str:
    """What to do about a job whose module (or a name in it) this worker cannot import."""
    if not isinstance(exc, (ImportError, AttributeError)):
        return ""
    return (f". Workers import a job's functions by module name, from their working "
            f"directory and PYTHONPATH (this worker's sys.path: {sys.path}); functions from "
            f"__main__ and lambdas travel by value. For a module only the client has, send "
            f"it by value: submit --by-value MODULE on the command line, or "
            f"cloudpickle.register_pickle_by_value(module) in the submitting program before "
            f"submitting; or install the module where the workers run.")


def _wait_until(due: float) -> float:
    """Sleep until ``due`` (a job handed out early, see EARLY_HANDOFF); return the time.

    ``due`` is on this process's monotonic clock (see ``_start_time``).
    """
    now = time.monotonic()
    while now < due:
        time.sleep(due - now)
        now = time.monotonic()
    return now


def _failure(job_id: str, exc: BaseException, tb: str, started: float | None,
             kind: str) -> Outcome:
    if isinstance(exc, SystemExit):
        exc = JobError(f"job {job_id} called sys.exit({exc.code!r})")
    elif not isinstance(exc, Exception):
        # KeyboardInterrupt and friends must not escape into the client.
        exc = JobError(f"job {job_id} raised {type(exc).__name__}{exc.args!r}")
    try:
        payload = cloudpickle.dumps(exc)
    except BaseException:
        payload = cloudpickle.dumps(JobError(
            f"job {job_id} raised {type(exc).__qualname__}: {exc} (not picklable)"))
    return Outcome(job_id, False, payload, tb, started, kind)


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
