"""The client side: JobFuture, Client (the Executor API) and connect().

``schedule``/``submit`` validate and pickle the job here, at the call site, send it to the
manager and return a :class:`JobFuture`; one result thread per client collects outcomes
from the manager in batches and resolves the futures.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

import cloudpickle

from mpsched._errors import (
    AuthenticationError,
    ManagerUnreachableError,
    MpschedError,
    QueueFullError,
    ResultUnpicklingError,
    SchedulerShutdownError,
)
from mpsched._job import JobRequest, Outcome, Priority, check_request, due_arguments
from mpsched._outbox import Outbox
from mpsched._payload import fast_dumps, pickle_job, remote_exception
from mpsched._protocol import LONG_POLL, ClientHello, ServiceProxy, Stats, connect_service
from mpsched._transport import (
    AUTHKEY_ENV,
    describe_versions,
    format_address,
    parse_address,
    read_authkey,
)

log = logging.getLogger("mpsched.client")

P = ParamSpec("P")
T = TypeVar("T")

# Errors that mean the manager process is gone.
MAP_BATCH = 256  # jobs per manager call in map()
_DISCONNECTED = (EOFError, OSError)  # OSError covers ConnectionError, BrokenPipeError


class JobFuture(Future[T]):
    """A ``concurrent.futures.Future`` for one job; ``cancel()`` removes it from the heap.

    ``cancel()`` succeeds while the job is pending in the manager's heap and returns False
    once a worker has taken it. ``running()`` stays False: the manager does not report
    starts, only outcomes.
    """

    def __init__(self, client: _ClientCore, job_id: str) -> None:
        super().__init__()
        self._client = client
        self.job_id = job_id

    def cancel(self) -> bool:
        if self.done():
            return self.cancelled()
        if not self._client.cancel_job(self.job_id):
            return False
        return super().cancel()


class _ClientCore:
    """Futures of one client and the thread that resolves them.

    Kept apart from the Scheduler object so the result thread never holds the Scheduler
    alive: dropping the last reference to a Scheduler lets its finalizer stop the manager.
    """

    def __init__(self, service: ServiceProxy) -> None:
        self.service = service
        self.client_id = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        # Guards _futures and closed. Submitters, cancel() and the result thread take it
        # briefly; nobody waits on it across a call to the manager.
        self._lock = threading.Lock()
        self._futures: dict[str, JobFuture[Any]] = {}
        self.closed = False
        python, cp = describe_versions()
        max_pending = service.open_client(ClientHello(self.client_id, python, cp))
        self.batch_size = min(MAP_BATCH, max_pending or MAP_BATCH)
        # A bounded queue must report QueueFullError at the call site: send synchronously.
        self.outbox = None if max_pending is not None else Outbox(service, self._unsent)
        self._thread = threading.Thread(target=self._collect_loop, daemon=True,
                                        name=f"mpsched-results-{self.client_id}")
        self._thread.start()

    def new_future(self) -> JobFuture[Any]:
        """Register a future for a new job id; raises once the client is closed."""
        future: JobFuture[Any] = JobFuture(self, f"{self.client_id}-{next(self._ids)}")
        with self._lock:  # held briefly: the result thread takes it per outcome
            if self.closed:
                raise SchedulerShutdownError("cannot schedule new jobs after shutdown")
            self._futures[future.job_id] = future
        return future

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._futures.pop(job_id, None)

    def outstanding(self) -> list[JobFuture[Any]]:
        with self._lock:
            return list(self._futures.values())

    def _unsent(self, requests: list[JobRequest], error: BaseException) -> None:
        # An unbounded queue refuses a batch only when the manager is gone or stopping.
        with self._lock:
            self.closed = True
            futures = [self._futures.pop(r.job_id) for r in requests if r.job_id in self._futures]
        for future in futures:
            if future.set_running_or_notify_cancel():
                future.set_exception(SchedulerShutdownError(
                    f"job {future.job_id} could not be sent to the manager: {error!r}"))

    def cancel_job(self, job_id: str) -> bool:
        if self.outbox is not None and self.outbox.withdraw(job_id):
            self.forget(job_id)
            return True
        try:
            removed = self.service.cancel(job_id)
        except _DISCONNECTED:
            return False
        if removed:
            self.forget(job_id)
        return removed

    def cancel_pending(self) -> None:
        """Cancel every job of this client still in the heap (shutdown(cancel_futures))."""
        job_ids = []
        if self.outbox is not None:
            job_ids = self.outbox.withdraw_all()
            self.outbox.flush()  # a batch on its way must land before we cancel the rest
        with contextlib.suppress(*_DISCONNECTED):
            job_ids += self.service.cancel_client(self.client_id)
        with self._lock:
            futures = [self._futures.pop(j) for j in job_ids if j in self._futures]
        for future in futures:
            Future.cancel(future)

    def _collect_loop(self) -> None:
        while True:
            try:
                outcomes = self.service.collect(self.client_id, LONG_POLL)
            except _DISCONNECTED:
                with self._lock:
                    self.closed = True
                self._fail_all(SchedulerShutdownError("the mpsched manager went away"))
                return
            if outcomes is None:
                self._fail_all(SchedulerShutdownError("the mpsched manager stopped"))
                return
            for outcome in outcomes:
                self._resolve(outcome)

    def _resolve(self, outcome: Outcome) -> None:
        with self._lock:
            future = self._futures.pop(outcome.job_id, None)
        if future is None or not future.set_running_or_notify_cancel():
            return
        if outcome.ok:
            try:
                future.set_result(cloudpickle.loads(outcome.payload))
            except BaseException as exc:
                future.set_exception(ResultUnpicklingError(
                    f"job {outcome.job_id}: the result could not be unpickled here: {exc!r}"))
            return
        future.set_exception(remote_exception(outcome))

    def _fail_all(self, error: MpschedError) -> None:
        with self._lock:
            futures = list(self._futures.values())
            self._futures.clear()
        for future in futures:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def close(self, timeout: float = 10.0) -> None:
        """Send what is unsent, close this client's mailbox, wait for the result thread."""
        if self.outbox is not None:
            self.outbox.close(timeout)
        with contextlib.suppress(*_DISCONNECTED):
            self.service.close_client(self.client_id)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)


class _MapResults(Iterator[T]):
    """map()'s results in input order; closing it early cancels the jobs not yet started."""

    def __init__(self, futures: list[JobFuture[T]], deadline: float | None) -> None:
        self._futures = futures[::-1]  # pop() from the end gives input order
        self._deadline = deadline

    def __next__(self) -> T:
        if not self._futures:
            raise StopIteration
        future = self._futures.pop()
        remaining = None if self._deadline is None else self._deadline - time.monotonic()
        try:
            return future.result(remaining)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        while self._futures:
            self._futures.pop().cancel()

    def __del__(self) -> None:
        self.close()


class Client(Executor):
    """Submits jobs to a running manager and resolves their futures.

    Use :class:`Scheduler`, which also starts the manager and its workers.
    """

    def __init__(self, service: ServiceProxy, *, submit_timeout: float | None = None) -> None:
        self._core = _ClientCore(service)
        self._submit_timeout = submit_timeout
        # Guards _closer: shutdown() may be called from several threads.
        self._shutdown_lock = threading.Lock()
        self._closer: threading.Thread | None = None

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

        Without ``delay`` and ``at`` the job is due now.

        Raises:
            InvalidJobError: both times, a NaN, infinite or overflowing time, an unknown
                priority, a timeout that is not a positive number, negative retries, or
                ``fn`` not callable.
            JobPicklingError: ``fn`` or its arguments cannot be pickled.
            QueueFullError: ``max_pending`` jobs were pending for all of ``submit_timeout``.
            SchedulerShutdownError: after ``shutdown()``, or when the manager is gone.

        On any error nothing was queued.
        """
        return self._schedule(fn, args, kwargs, delay, at, priority, timeout, retries)

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]:
        """Run ``fn(*args, **kwargs)`` as soon as a worker is free, at MEDIUM priority.

        The ``Executor`` method: every keyword goes to ``fn``. Raises as :meth:`schedule`.
        """
        return self._schedule(fn, args, kwargs, None, None, Priority.MEDIUM)

    def _schedule(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  delay: float | timedelta | None, at: float | datetime | None,
                  priority: Priority | str, timeout: float | None = None,
                  retries: int = 0) -> JobFuture[Any]:
        delay_s, at_s = due_arguments(delay, at)
        request = JobRequest("", "", b"", Priority.coerce(priority).level, delay_s, at_s,
                             timeout, retries)
        check_request(request)  # the manager's own check, here at the call site
        request = request._replace(client_id=self._core.client_id,
                                   payload=pickle_job(fn, args, kwargs))
        outbox = self._core.outbox
        if outbox is None:
            [future] = self._send_batch([(request.payload, request)])
            return future
        future = self._core.new_future()
        outbox.put(request._replace(job_id=future.job_id))
        return future

    def _send_batch(self, jobs: list[tuple[bytes, JobRequest]]) -> list[JobFuture[Any]]:
        """Register a future per job and queue them in one call: all or none."""
        if self._core.outbox is not None:
            self._core.outbox.flush()  # earlier submits first: the seq order is call order
        futures = [self._core.new_future() for _ in jobs]
        requests = [request._replace(job_id=future.job_id)
                    for future, (_, request) in zip(futures, jobs, strict=True)]
        try:
            self._send(requests)
        except BaseException:
            for future in futures:
                self._core.forget(future.job_id)
            raise
        return futures

    def _send(self, requests: list[JobRequest]) -> None:
        # The manager bounds each wait for room; we repeat until our own deadline.
        timeout = self._submit_timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                self._core.service.submit(requests, remaining)
                return
            except QueueFullError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                if self._core.closed:
                    raise SchedulerShutdownError("shut down while waiting for room") from None
            except _DISCONNECTED as exc:
                raise SchedulerShutdownError(f"the mpsched manager is gone: {exc!r}") from exc

    def map(self, fn: Callable[..., T], *iterables: Iterable[Any],
            timeout: float | None = None, chunksize: int = 1) -> Iterator[T]:
        """``Executor.map``: one job per item, due now at MEDIUM, results in input order.

        Every item is pickled first (the callable once), then all jobs are queued in call
        order: handed to the write-behind sender, or with ``max_pending`` sent in batches
        of up to 256 per manager call. ``chunksize`` is accepted for compatibility and
        ignored: each item is still its own job, in heap order. ``timeout`` counts from
        this call; when it passes, or the iterator is closed early, the jobs not yet
        started are cancelled.

        Raises:
            JobPicklingError: ``fn`` or an item cannot be pickled; nothing was queued.
            QueueFullError, SchedulerShutdownError: as :meth:`schedule`; the jobs of this
                call already queued are cancelled (those already started still run).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        level = Priority.MEDIUM.level
        pickle_job(fn, (), {})  # a clear JobPicklingError if the callable cannot pickle
        fn_bytes = fast_dumps(fn) or cloudpickle.dumps(fn)  # pickled once for all items
        jobs = [(payload, JobRequest("", self._core.client_id, payload, level, 0.0, None))
                for payload in (pickle_job(fn, args, {}, fn_bytes)
                                for args in zip(*iterables))]  # noqa: B905 - stop at shortest
        outbox = self._core.outbox
        if outbox is not None:  # every item pickled: now queue them all, write-behind
            futures: list[JobFuture[T]] = []
            for _, request in jobs:
                futures.append(self._core.new_future())
                outbox.put(request._replace(job_id=futures[-1].job_id))
            return _MapResults(futures, deadline)
        futures = []
        size = self._core.batch_size
        try:
            for start in range(0, len(jobs), size):
                futures += self._send_batch(jobs[start:start + size])
        except BaseException:
            for future in futures:  # all or nothing: take back the batches already queued
                future.cancel()
            raise
        return _MapResults(futures, deadline)

    def stats(self) -> Stats:
        """Pending jobs per priority, in flight, completed, failed, workers and lateness.

        Jobs this client submitted before the call are counted.
        """
        if self._core.outbox is not None:
            self._core.outbox.flush()
        try:
            return self._core.service.stats()
        except _DISCONNECTED as exc:
            raise SchedulerShutdownError(f"the mpsched manager is gone: {exc!r}") from exc

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
                self._core.closed = True
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
            closer.join()

    def detach(self) -> None:
        """Close this client without waiting: jobs already submitted still run in the
        manager, but their outcomes are discarded and their futures fail here with
        SchedulerShutdownError. (``submit`` without ``--wait`` uses this.)"""
        with self._shutdown_lock, self._core._lock:
            self._core.closed = True
        self._stop()

    def _drain_and_stop(self) -> None:
        while futures := self._core.outstanding():
            concurrent.futures.wait(futures)
        self._stop()

    def _stop(self) -> None:
        self._core.close()


def connect(address: str | tuple[str, int], *, authkey: bytes | None = None,
            submit_timeout: float | None = None) -> Client:
    """A client of a running manager: the Scheduler API without local workers.

    Args:
        address: as the command line takes it (``"unix:/path"``, ``"host:port"``), or as
            ``Scheduler.address`` gives it (a socket path or a ``(host, port)`` pair).
        authkey: the manager's key; default: the MPSCHED_AUTHKEY environment variable.
        submit_timeout: as for :class:`Scheduler`.

    Raises:
        AuthenticationError: no key, or the manager rejected it.
        VersionMismatchError: this process runs another Python or cloudpickle version.
        ManagerUnreachableError: no manager answers at ``address`` (a ConnectionError):
            an unknown host, nothing listening, or something that is not a manager.
    """
    if isinstance(address, str):
        address = parse_address(address)
    key = authkey if authkey is not None else read_authkey(None)
    if key is None:
        raise AuthenticationError(f"no authkey: pass authkey= or set {AUTHKEY_ENV}")
    try:
        service = connect_service(address, key)
    # AssertionError: Python < 3.12's handshake asserts that the peer sent a challenge.
    except (*_DISCONNECTED, AssertionError) as exc:
        raise ManagerUnreachableError.from_error(format_address(address), exc) from exc
    return Client(service, submit_timeout=submit_timeout)
