"""The client side: Client (the Executor API) and connect().

``schedule``/``submit`` validate and pickle the job here, at the call site, send it to the
manager and return a :class:`~mpsched._client.futures.JobFuture`; the client's result thread
(mpsched._client.futures) collects outcomes and resolves the futures.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar

from mpsched._client.futures import DISCONNECTED, ClientCore, JobFuture, MapResults
from mpsched._client.recurring import RecurringClient
from mpsched._core.job import (
    JobInfo,
    JobRecord,
    JobRequest,
    JobState,
    JobStateLike,
    Payload,
    Priority,
    check_request,
    due_arguments,
)
from mpsched._errors import (
    ConfigError,
    InvalidJobError,
    JobNotFoundError,
    ManagerUnreachableError,
    QueueFullError,
    SchedulerShutdownError,
    StoreError,
)
from mpsched._payload.by_value import cloudpickle_dumps
from mpsched._payload.pickling import fast_dumps, job_name, pickle_job
from mpsched._payload.shm import payload_size
from mpsched._protocol.proxy import (
    ServiceProxy,
    connect_service,
)
from mpsched._protocol.records import (
    Stats,
)
from mpsched._transport.runtime import default_address, require_authkey
from mpsched._transport.sockets import format_address, parse_address

log = logging.getLogger("mpsched.client")

P = ParamSpec("P")
T = TypeVar("T")



class Client(RecurringClient, Executor):
    """Submits jobs to a running manager and resolves their futures.

    Use :class:`Scheduler`, which also starts the manager and its workers.
    """

    def __init__(self, service: ServiceProxy, *, submit_timeout: float | None = None,
                 reconnect: Callable[[], ServiceProxy] | None = None,
                 lost_advice: str = "") -> None:
        """``reconnect`` connects to the manager's address again, after the connection was
        lost (None: the client closes instead, its futures failed with
        ManagerConnectionLostError, whose message ends with ``lost_advice``)."""
        self._core = ClientCore(service, reconnect=reconnect, lost_advice=lost_advice)
        self._submit_timeout = submit_timeout
        # Guards _closer: shutdown() may be called from several threads.
        self._shutdown_lock = threading.Lock()
        self._closer: threading.Thread | None = None
        self._set_aside: list[Any] = []  # manager connections closed by _stop() (_leave_on)
        _close_at_exit(self)

    def schedule(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        delay: float | timedelta | None = None,
        at: float | datetime | None = None,
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        **kwargs: Any,
    ) -> JobFuture[T]:
        """Run ``fn(*args, **kwargs)`` on a worker at a time, returning its future.

        Args:
            delay: seconds (or a timedelta) from now; negative means now.
            at: when, as epoch seconds or a datetime (naive means local time); past means now.
            priority: among jobs due at the same time, HIGH runs before MEDIUM before LOW.
                A Priority or its name, in any case.
            timeout: seconds the job may run (from when a worker takes it); past that its
                worker's process tree is killed, the worker replaced, and the future fails
                with JobTimeoutError.
            retries: how many more times to run the job if its worker dies under it
                (killed, segfault, ``os._exit``). A job that raises is not retried.
            key: an idempotency key. While a job with this key is pending or running (or,
                with a store, its outcome is retained), this returns that job's future
                instead of queueing a duplicate, whichever client submitted it.

        Without ``delay`` and ``at`` the job is due now.

        Raises:
            InvalidJobError: both times, a NaN, infinite or overflowing time, an unknown
                priority, a timeout that is not a positive number, negative retries, or
                ``fn`` not callable.
            JobPicklingError: ``fn`` or its arguments cannot be pickled.
            QueueFullError: ``max_pending`` jobs were pending for all of ``submit_timeout``.
            SchedulerShutdownError: after ``shutdown()``.
            ManagerConnectionLostError: (also a SchedulerShutdownError) the connection to
                the manager is lost: a client of ``connect()`` raises it at once until it
                has reconnected by itself; a Scheduler's client for good.

        On any error nothing was queued, but for one case: a submit sent synchronously
        (``max_pending``, or a ``key``) whose connection broke during its call may have
        reached the manager (submit a keyed job again: its key finds it).
        """
        return self._schedule(fn, args, kwargs, delay, at, priority, timeout, retries, key)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]:
        """Run ``fn(*args, **kwargs)`` as soon as a worker is free, at MEDIUM priority.

        The ``Executor`` method: every keyword goes to ``fn``. Raises as :meth:`schedule`.
        """
        return self._schedule(fn, args, kwargs, None, None, Priority.MEDIUM)

    def _schedule(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  delay: float | timedelta | None, at: float | datetime | None,
                  priority: Priority | str, timeout: float | None = None,
                  retries: int = 0, key: str | None = None) -> JobFuture[Any]:
        delay_s, at_s = due_arguments(delay, at)
        # JobRequest's fields after (job_id, client_id, payload), in its order: each request
        # below is built whole, a namedtuple _replace of ten fields costing ~1-2 us a job.
        rest = (Priority.coerce(priority).level, delay_s, at_s, timeout, retries, key,
                job_name(fn))
        check_request(JobRequest("", "", b"", *rest))  # the manager's check, at the call site
        core = self._core
        payload = pickle_job(fn, args, kwargs, pool=core.pool)
        if core.outbox is None or key is not None:  # a keyed submit learns which job stands
            [future] = self._send_batch([(payload, JobRequest("", core.client_id, payload,
                                                              *rest))])
            return future
        future = core.new_future(payload)
        if not core.outbox.put(JobRequest(future._job_id, core.client_id, payload, *rest)):
            raise core.refuse(future._job_id)  # the manager was lost since new_future()
        return future

    def _send_batch(self, jobs: list[tuple[Payload, JobRequest]]) -> list[JobFuture[Any]]:
        """Register a future per job and queue them in one call: all or none."""
        if self._core.outbox is not None:
            self._core.outbox.flush()  # earlier submits first: the seq order is call order
        futures = [self._core.new_future(payload) for payload, _ in jobs]
        requests = [request._replace(job_id=future._job_id)
                    for future, (_, request) in zip(futures, jobs, strict=True)]
        try:
            holders = self._send(requests)
        except BaseException:
            for future in futures:
                self._core.forget(future._job_id)
            self._core.release(requests)
            raise
        for i, holder in enumerate(holders or ()):
            if holder != futures[i]._job_id:  # its key was held: the holder's future stands
                self._core.ended([futures[i]._job_id])
                self._core.forget(futures[i]._job_id)
                futures[i] = self._core.watch(holder)
        return futures

    def _send(self, requests: list[JobRequest]) -> list[str] | None:
        # The manager bounds each wait for room; we repeat until our own deadline.
        timeout = self._submit_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        service = self._core.service
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return service.submit(requests, remaining)
            except QueueFullError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if self._core.closed:
                    raise SchedulerShutdownError("shut down while waiting for room") from None
            except StoreError:
                raise
            except DISCONNECTED as exc:
                raise self._core.link.lost(
                    exc, service, "the job may have reached the manager (and may run) or "
                                  "not; this client reconnects by itself") from exc

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any],
            timeout: float | None = None, chunksize: int = 1) -> Iterator[T]:
        """``Executor.map``: one job per item, due now at MEDIUM, results in input order.

        Every item is pickled first (the callable once), then all jobs are queued in call
        order: handed to the write-behind sender, or with ``max_pending`` sent in batches
        of up to 256 per manager call. ``chunksize`` is checked as ProcessPoolExecutor
        checks it, then ignored: each item is still its own job, in heap order.
        ``timeout`` counts from this call; when it passes, or the iterator is closed
        early, the jobs not yet started are cancelled.

        Raises:
            InvalidJobError: ``chunksize`` is not an int of at least 1.
            JobPicklingError: ``fn`` or an item cannot be pickled; nothing was queued.
            QueueFullError, SchedulerShutdownError: as :meth:`schedule`; the jobs of this
                call already queued are cancelled (those already started still run).
        """
        if isinstance(chunksize, bool) or not isinstance(chunksize, int) or chunksize < 1:
            raise InvalidJobError(f"chunksize must be an int >= 1, not {chunksize!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        level = Priority.MEDIUM.level
        pickle_job(fn, (), {})  # a clear JobPicklingError if the callable cannot pickle
        fn_bytes = fast_dumps(fn) or cloudpickle_dumps(fn)  # pickled once for all items
        name = job_name(fn)
        jobs: list[tuple[Payload, JobRequest]] = []
        try:
            for args in zip(*iterables):  # noqa: B905 - stop at the shortest
                payload = pickle_job(fn, args, {}, fn_bytes, self._core.pool)
                jobs.append((payload, JobRequest("", self._core.client_id, payload, level,
                                                 0.0, None, name=name)))
        except BaseException:
            self._core.release([request for _, request in jobs])
            raise
        outbox = self._core.outbox
        if outbox is not None:  # every item pickled: now queue them all, write-behind
            futures: list[JobFuture[T]] = []
            try:
                for _, request in jobs:
                    futures.append(self._core.new_future(request.payload))
                    if not outbox.put(request._replace(job_id=futures[-1]._job_id)):
                        error = self._core.refuse(futures.pop()._job_id)
                        for future in futures:  # all or nothing: the manager was lost
                            future.cancel()
                        raise error
            except BaseException:
                self._core.release([request for _, request in jobs[len(futures):]])
                raise
            return MapResults(futures, deadline)
        futures = []
        batches = _batches(jobs, self._core.batch_size, self._core.max_pending_bytes)
        try:
            while batches:
                futures += self._send_batch(batches[0])
                del batches[0]
        except BaseException:
            for future in futures:  # all or nothing: take back the batches already queued
                future.cancel()
            self._core.release([r for batch in batches[1:] for _, r in batch])  # never sent
            raise
        return MapResults(futures, deadline)

    def stats(self) -> Stats:
        """Pending jobs per priority, in flight, completed, failed, workers and lateness.

        Jobs this client submitted (or cancelled) before the call are counted. Lateness is
        how long after its due time a job started, in seconds (p50, p90, p99, max over
        the last 10,000 jobs of workers that share the manager's clock); times are in
        seconds and memory in bytes throughout.

        Raises:
            ManagerConnectionLostError: the manager is unreachable.
        """
        if self._core.outbox is not None:
            self._core.outbox.flush()
        return self._core.link.ask(lambda service: service.stats())

    def job(self, job_id: str) -> JobFuture[Any]:
        """A future for any job this manager knows by id: this client's, another client's
        (``submit`` prints the id), or, with a store, one from before a manager restart.

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string.
            JobNotFoundError: no such job: unknown, or ended and forgotten (ended jobs stay
                known for ``result_ttl``; without a store, the 100,000 latest at most).
            SchedulerShutdownError: this client is shut down.
            ManagerConnectionLostError: the manager is unreachable.
        """
        if not isinstance(job_id, str) or not job_id:
            raise InvalidJobError(f"a job id is a non-empty string, not {job_id!r}")
        if self._core.outbox is not None:
            self._core.outbox.flush()  # a job this client just submitted is known there
        return self._core.watch(job_id)

    def jobs(self, state: JobStateLike | None = None,
             limit: int | None = None) -> list[JobInfo]:
        """The jobs the manager knows, in submission order: every client's, pending and
        running ones, and with a store the finished ones it retains.

        Args:
            state: only jobs in this state: "pending", "running", "done", "failed" or
                "cancelled".
            limit: at most this many.

        Raises:
            ConfigError: an unknown state, or a limit that is not a positive int.
            ManagerConnectionLostError: the manager is unreachable.
        """
        word = None if state is None else str(JobState.coerce(state, "state"))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise ConfigError("limit", limit, "a positive int")
        if self._core.outbox is not None:
            self._core.outbox.flush()
        records = self._core.link.ask(lambda service: service.jobs(word, limit))
        return [_job_info(r) for r in records]

    def job_info(self, job_id: str) -> JobInfo:
        """One job the manager knows, as :meth:`jobs` lists it, looked up by its id.

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string.
            JobNotFoundError: no such job: unknown, or finished and forgotten.
            ManagerConnectionLostError: the manager is unreachable.
        """
        if not isinstance(job_id, str) or not job_id:
            raise InvalidJobError(f"a job id is a non-empty string, not {job_id!r}")
        self._core.sent(job_id)  # a job of this client's own is known there
        record = self._core.link.ask(lambda service: service.job(job_id))
        if record is None:
            raise JobNotFoundError(job_id)
        return _job_info(record)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job by id, whichever client submitted it; True if it was
        pending and will never run (its future, wherever it is, ends cancelled).

        Raises:
            ManagerConnectionLostError: the manager is unreachable and the job is another
                client's (one of this client's own returns False then, unless it was not
                sent yet: that one is taken back).
        """
        with self._core._lock:
            own = self._core._futures.get(job_id)
        if own is not None:
            return own.cancel()
        if self._core.outbox is not None:
            self._core.outbox.flush()
        return self._core.link.ask(lambda service: service.cancel(job_id, self._core.client_id))

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more jobs; stop once every outstanding future is done.

        Args:
            wait: block until all jobs finished and everything stopped. With False this
                returns at once and a background thread finishes the work (the program still
                waits for it before exiting, as with any Executor).
            cancel_futures: first cancel every job still pending in the heap.
        """
        with self._shutdown_lock:
            first = not self._core.closed
            with self._core._lock:
                self._core.shut_locked()
            if first:
                if cancel_futures:
                    self._core.cancel_pending()
                self._closer = threading.Thread(target=self._drain_and_stop,
                                                name="mpsched-shutdown")
                self._closer.start()
            elif cancel_futures:
                self._core.cancel_pending()
            closer = self._closer
        if wait and closer is not None:
            _join(closer)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        """Leaving the ``with`` block: ``shutdown(wait=True)``, unless an exception leaves
        it (or a Ctrl-C comes while it waits): then the jobs not yet started are cancelled
        (as with ``cancel_futures=True``), one line on stderr (a logging warning) names the
        running jobs it waits for, and a Ctrl-C while it waits stops them at once and
        raises SystemExit(130), or KeyboardInterrupt in an interactive session (see
        :meth:`_leave_on`)."""
        if exc is None:
            try:
                self.shutdown(wait=True)
            except KeyboardInterrupt as interrupt:
                self._leave_on(interrupt, "left the with block")
                raise
            return False
        self._leave_on(exc, "left the with block")
        return False

    def _leave_on(self, exc: BaseException, how: str, *, at_exit: bool = False) -> None:
        """An exception ends this client's work: take no more jobs, drop those not yet
        started (:meth:`_drop_not_started`), say so and which running jobs it waits for
        (one warning line, which reaches stderr even where logging is not set up: the
        program was interrupted, and its user must learn why it does not end yet), and
        wait for them. A Ctrl-C during all that stops them now (:meth:`_stop_now`), says
        so in one line, and raises SystemExit(130), as a shell reports a Ctrl-C (in an
        interactive session, KeyboardInterrupt: back to the prompt); at interpreter exit
        it just returns (the exit status is already the program's)."""
        with self._shutdown_lock, self._core._lock:
            self._core.shut_locked()
        again = "again " if isinstance(exc, KeyboardInterrupt) else ""
        try:
            self._set_connection_aside()  # ``exc`` may have cut a call short
            notes = self._drop_not_started()
            self._core.fail_watched(SchedulerShutdownError(
                f"this client stopped waiting for the job: {type(exc).__name__} {how}"))
            running = self._core.outstanding()
            if running:
                notes.append(f"waiting for {count(len(running), 'running job')}: "
                             f"{self._describe(running)}; press Ctrl-C {again}to stop "
                             f"{'it' if len(running) == 1 else 'them'} now")
            if notes:
                log.warning("mpsched: %s %s: %s", type(exc).__name__, how, "; ".join(notes))
            closer = self._closer
            if closer is not None:  # shutdown() began: its thread drains and stops
                _join(closer)
            else:
                self._drain_and_stop()
        except KeyboardInterrupt:
            self._set_connection_aside()
            log.warning("mpsched: Ctrl-C %s: %s", again.strip() or "while waiting",
                        self._stop_now())
            if at_exit:
                return
            if hasattr(sys, "ps1"):  # an interactive session: back to its prompt
                raise KeyboardInterrupt from None
            raise SystemExit(130) from None

    def _set_connection_aside(self) -> None:
        connection = self._core.service.set_connection_aside()
        if connection is not None:
            self._set_aside.append(connection)

    def _drop_not_started(self) -> list[str]:
        """Cancel this client's jobs that have not started; returns what it did, in
        clauses of one line (none for nothing)."""
        cancelled = self._core.cancel_pending()
        return [f"cancelled {count(cancelled, 'job')} not started"] if cancelled else []

    def _stop_now(self) -> str:
        """Stop waiting for this client's running jobs; returns what became of them. They
        belong to a long-running manager: they run on, and their outcomes are dropped."""
        running = self._core.outstanding()
        described = self._describe(running) if running else ""
        self._stop()
        if not running:
            return "stopped waiting"
        runs = "runs" if len(running) == 1 else "run"
        return (f"stopped waiting; {count(len(running), 'running job')} {runs} on in the "
                f"manager: {described}")

    def _describe(self, futures: list[JobFuture[Any]], most: int = 3) -> str:
        """The jobs of ``futures`` as a line names them: callable and id, a few at most."""
        names: dict[str, str] = {}
        with contextlib.suppress(*DISCONNECTED):
            names = {r.job_id: r.name for r in self._core.service.jobs("running", None)}
        shown = [f"{names[f.job_id]} ({f.job_id})" if f.job_id in names else f.job_id
                 for f in futures[:most]]
        more = f" and {len(futures) - most} more" if len(futures) > most else ""
        return ", ".join(shown) + more

    def detach(self) -> None:
        """Close this client without waiting for its jobs: every job already submitted
        reaches the manager and stays queued there, and runs. Futures whose outcome had
        arrived are resolved; every other future fails here with SchedulerShutdownError,
        and that job's outcome is discarded when it comes. (``submit`` without ``--wait``
        uses this.)"""
        with self._shutdown_lock, self._core._lock:
            self._core.shut_locked()
        self._stop()

    def _at_exit(self) -> None:
        """The interpreter is exiting: later submits raise, and what this client already
        submitted is not lost (see :meth:`_exit_work`). A program that ends on Ctrl-C
        (an uncaught KeyboardInterrupt) is treated as leaving a ``with`` block on it
        (:meth:`_leave_on`), and so is a Ctrl-C while the exit waits for jobs."""
        interrupt = _ending_interrupt()
        with self._shutdown_lock, self._core._lock:
            first = not self._core.closed
            self._core.shut_locked()
            self._core.exiting = self._core.exiting or first
            closer = self._closer
        if interrupt is not None and (first or (closer is not None and closer.is_alive())):
            self._leave_on(interrupt, "ended the program", at_exit=True)
        elif first:  # else shut down already; a closer thread is joined by the interpreter
            try:
                self._exit_work()
            except KeyboardInterrupt as exc:
                self._leave_on(exc, "while the program exits", at_exit=True)

    def _exit_work(self) -> None:
        # A client of a long-lived manager: what it submitted is sent, and runs there.
        self._stop()

    def _drain_and_stop(self) -> None:
        while futures := self._core.outstanding():
            concurrent.futures.wait(futures, _wake_interval())
        self._stop()

    def _stop(self) -> None:
        self._core.close()
        while self._set_aside:
            with contextlib.suppress(OSError):
                self._set_aside.pop().close()


# Clients still open, closed (oldest first) when the interpreter exits. The hook runs
# with threading's own exit hooks, as concurrent.futures' executors do: before atexit
# functions (multiprocessing's among them, which would stop a manager) and while the
# clients' daemon threads still run.
_open_clients: weakref.WeakSet[Client] = weakref.WeakSet()
_exit_hook = threading.Lock()  # guards the one-time registration below; nobody waits on it
_exit_hook_registered = False


def _close_at_exit(client: Client) -> None:
    global _exit_hook_registered
    with _exit_hook:
        _open_clients.add(client)
        if not _exit_hook_registered:
            threading._register_atexit(_close_open_clients)  # type: ignore[attr-defined]
            _exit_hook_registered = True


def _close_open_clients() -> None:
    for client in list(_open_clients):
        try:
            client._at_exit()
        except Exception:
            log.exception("could not close %r at interpreter exit", client)


# How often a wait in the main thread wakes up. A signal that lands just as the thread starts
# to block (after Python's last look for signals, before the lock wait) is not seen until
# the wait ends: a Ctrl-C would go unnoticed while a long job runs.
MAIN_THREAD_WAKE = 0.25


def _wake_interval() -> float | None:
    return MAIN_THREAD_WAKE if threading.current_thread() is threading.main_thread() else None


def _join(thread: threading.Thread) -> None:
    """``thread.join()``, in the main thread in slices of MAIN_THREAD_WAKE."""
    while thread.is_alive():
        thread.join(_wake_interval())


def _ending_interrupt() -> KeyboardInterrupt | None:
    """The KeyboardInterrupt the program is ending on, if it is (the interpreter records
    an uncaught exception as ``sys.last_value`` before it runs its exit hooks). Not in an
    interactive session: there it may be any Ctrl-C typed long before."""
    last = getattr(sys, "last_value", None)
    if isinstance(last, KeyboardInterrupt) and not hasattr(sys, "ps1"):
        return last
    return None


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 job", "2 jobs"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"



def _job_info(record: JobRecord) -> JobInfo:
    return JobInfo(record.job_id, record.name, record.state.value,
                   datetime.fromtimestamp(record.due_wall, timezone.utc),
                   Priority(record.priority), record.attempt, record.worker_id, record.key)


def _batches(jobs: list[tuple[Payload, JobRequest]], count: int,
             max_bytes: int | None) -> list[list[tuple[Payload, JobRequest]]]:
    """``jobs`` in consecutive batches of at most ``count`` jobs and (when bounded) at most
    ``max_bytes`` payload bytes, so that each batch can fit a bounded queue."""
    batches: list[list[tuple[Payload, JobRequest]]] = []
    size = 0
    for job in jobs:
        weight = payload_size(job[0]) if max_bytes is not None else 0
        if not batches or len(batches[-1]) >= count or (
                max_bytes is not None and size + weight > max_bytes):
            batches.append([])
            size = 0
        batches[-1].append(job)
        size += weight
    return batches


def connect(address: str | tuple[str, int] | None = None, *,
            authkey: bytes | str | None = None,
            submit_timeout: float | None = None) -> Client:
    """A client of a running manager: the Scheduler API without local workers.

    When the connection to the manager is lost (it was killed, stopped or restarted, or
    the network failed), the client reconnects by itself, retrying the address after
    0.1 s, then twice as long each time up to 5 s, with one WARNING per outage and one
    INFO line when it is back. Meanwhile every call that needs the manager (submit,
    ``map``, ``job``, ``stats``...) raises ManagerConnectionLostError at once and changes
    nothing. With a store, the manager knows the client's jobs after a restart: each
    outstanding future is re-attached by its job id and resolves when its job ends, and
    jobs not yet sent (or whose batch's reply was lost and which the manager never got)
    are sent once it is back. Without a store, every outstanding future fails with
    ManagerConnectionLostError when the connection is lost (a job not yet sent did not
    run; a job sent may have run, or may still run). A client that is shut down, or a
    manager there that refuses the client's key or versions, ends the reconnecting: the
    client then closes, its futures failed.

    Args:
        address: as the command line takes it (``"unix:/path"``, ``"host:port"``), or as
            ``Scheduler.address`` gives it (a socket path or a ``(host, port)`` pair);
            default: this user's local manager (``python -m mpsched serve`` without
            ``--address``), on its socket in the per-user runtime directory.
        authkey: the manager's key, as bytes or as text (``open(key_file).read()``,
            encoded in UTF-8 as the key file's bytes are); surrounding whitespace, such
            as the newline a key file ends with, is stripped. Default: the
            MPSCHED_AUTHKEY variable, else, for a local address (a Unix socket, loopback
            TCP), this user's local key that ``serve`` keeps in the runtime directory.
        submit_timeout: as for :class:`Scheduler`.

    Raises:
        AuthenticationError: no key, an unsafe key file or runtime directory, or the
            manager rejected the key.
        VersionMismatchError: this process runs another Python or cloudpickle version.
        ManagerUnreachableError: no manager answers at ``address`` (a ConnectionError):
            an unknown host, nothing listening, no answer to a TCP connect within
            ``CONNECT_TIMEOUT`` (10 s, mpsched._transport.sockets), something that is not a
            manager, or a manager turning connections away (too many handshakes pending
            from this address); with no address, also when no local manager has ever run
            as this user.
    """
    if address is None:
        address = default_address()
    elif isinstance(address, str):
        address = parse_address(address)
    if isinstance(authkey, str):  # the text of a key file: its bytes are UTF-8
        authkey = authkey.encode()
    # Surrounding whitespace is stripped, as from a key file (its trailing newline).
    key = (authkey.strip() if authkey is not None
           else require_authkey(address, give="pass authkey="))
    try:
        service = connect_service(address, key)
    # AssertionError: Python < 3.12's handshake asserts that the peer sent a challenge.
    except (*DISCONNECTED, AssertionError) as exc:
        raise ManagerUnreachableError.from_error(format_address(address), exc) from exc
    return Client(service, submit_timeout=submit_timeout,
                  reconnect=functools.partial(connect_service, address, key))
