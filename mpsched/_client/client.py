"""The client side: Client (the Executor API) and connect().

``schedule``/``submit``/``map`` validate and pickle the job here, at the call site, send it
to the manager and return a :class:`~mpsched._client.job_future.JobFuture`; the client's
result thread (mpsched._client.core) collects outcomes and resolves the futures.

A Client is built in layers, each a module: its core and lookups by id
(mpsched._client.base), recurring jobs (mpsched._client.recurring), closing
(mpsched._client.closing), and here submitting.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Executor
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar, overload

from mpsched._client.closing import ClosingClient
from mpsched._client.job_future import JobFuture, MapResults
from mpsched._client.link import DISCONNECTED
from mpsched._client.outbox import Outbox
from mpsched._core.job import (
    DEFAULT_QUEUE,
    After,
    JobRequest,
    Priority,
    check_job,
    check_name,
    due_arguments,
)
from mpsched._core.result_of import made as result_of_made
from mpsched._core.result_of import result_parents
from mpsched._core.retrying import RetryFilter, RetryPolicy, coerce_retry
from mpsched._errors import (
    InvalidJobError,
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
from mpsched._transport.address import format_address, parse_address
from mpsched._transport.runtime import default_address, require_authkey

log = logging.getLogger("mpsched.client")

P = ParamSpec("P")
T = TypeVar("T")


class Client(ClosingClient, Executor):
    """Submits jobs to a running manager and resolves their futures.

    Use :class:`Scheduler`, which also starts the manager and its workers. The path of one
    job from :meth:`submit` to its result, step by step: docs/architecture.md.
    """

    def __init__(
        self,
        service: ServiceProxy,
        *,
        submit_timeout: float | None = None,
        reconnect: Callable[[], ServiceProxy] | None = None,
        lost_advice: str = "",
    ) -> None:
        """``submit_timeout``: as for :class:`Scheduler`; ``reconnect``, ``lost_advice``:
        see :class:`~mpsched._client.base.ClientBase`."""
        self._submit_timeout = submit_timeout
        super().__init__(service, reconnect=reconnect, lost_advice=lost_advice)

    @overload
    def schedule(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        /,
        *args: Any,
        delay: float | timedelta | None = None,
        at: float | datetime | None = None,
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        after: Iterable[JobFuture[Any] | str] | None = None,
        allow_failure: bool = False,
        **kwargs: Any,
    ) -> JobFuture[T]: ...

    @overload
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
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        after: Iterable[JobFuture[Any] | str] | None = None,
        allow_failure: bool = False,
        **kwargs: Any,
    ) -> JobFuture[T]: ...

    def schedule(
        self,
        fn: Callable[..., Any],
        /,
        *args: Any,
        delay: float | timedelta | None = None,
        at: float | datetime | None = None,
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        after: Iterable[JobFuture[Any] | str] | None = None,
        allow_failure: bool = False,
        **kwargs: Any,
    ) -> JobFuture[Any]:
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
                (killed, segfault, ``os._exit``). A job that raises is not retried by it.
            retry: a :class:`RetryPolicy`, or an int n for ``RetryPolicy(n)``: run the job
                again, with back-off, when it raises what the policy retries; a worker's
                death counts against the same budget. Not with ``retries``.
            key: an idempotency key. While a job with this key is pending or running (or,
                with a store, its outcome is retained), this returns that job's future
                instead of queueing a duplicate, whichever client submitted it.
            queue: the queue it waits in: only workers that serve this queue run it
                (1 to 64 characters of letters, digits and ``_.:-``).
            limit: a limit the manager declares (``Scheduler(limits=...)``): the job
                starts only while that limit has room, and waits pending meanwhile.
            after: jobs this one runs after: their futures (of any client) or job ids.
                It waits until each has ended, then becomes due at its own time (``delay``
                and ``at`` count from this call; a time past means at once). A
                ``ResultOf(f)`` among the arguments adds ``f`` to them, and stands for its
                result when the job starts.
            allow_failure: run the job even when a parent failed or was cancelled (its
                ``ResultOf`` is then the parent's exception). Without it the job fails at
                once with DependencyFailedError, and so do the jobs after it.

        Without ``delay`` and ``at`` the job is due now.

        Raises:
            InvalidJobError: both times, a NaN, infinite or overflowing time, an unknown
                priority, a timeout that is not a positive number, negative retries,
                ``retry`` with ``retries``, a bad queue name, a limit the manager does not
                know, or ``fn`` not callable.
            JobPicklingError: ``fn`` or its arguments cannot be pickled.
            JobNotFoundError: a parent the manager does not know (never, or forgotten).
            QueueFullError: ``max_pending`` jobs, or ``max_pending_bytes`` bytes of their
                payloads, were pending for all of ``submit_timeout`` (``unit`` says which).
            SchedulerShutdownError: after ``shutdown()``.
            ManagerConnectionLostError: (also a SchedulerShutdownError) the connection to
                the manager is lost: a client of ``connect()`` raises it at once until it
                has reconnected by itself; a Scheduler's client for good.

        On any error nothing was queued, but for one case: a submit sent synchronously
        (``max_pending``, or a ``key``) whose connection broke during its call may have
        reached the manager (submit a keyed job again: its key finds it).
        """
        if (
            after is not None
            or allow_failure
            or (result_of_made() and result_parents(args, kwargs))
        ):
            return self._schedule_after(
                fn,
                args,
                kwargs,
                delay,
                at,
                priority,
                timeout,
                retries,
                key,
                after,
                allow_failure,
                retry,
                queue,
                limit,
            )
        return self._schedule(
            fn,
            args,
            kwargs,
            delay,
            at,
            priority,
            timeout,
            retries,
            key,
            retry=retry,
            queue=queue,
            limit=limit,
        )

    def _schedule_after(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | timedelta | None,
        at: float | datetime | None,
        priority: Priority | str,
        timeout: float | None,
        retries: int,
        key: str | None,
        after: Iterable[JobFuture[Any] | str] | None,
        allow_failure: bool,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
    ) -> JobFuture[Any]:
        """:meth:`schedule` of a job with parents: sent at once, so that an unknown
        parent raises here."""
        if not isinstance(allow_failure, bool):
            raise InvalidJobError(f"allow_failure must be a bool, not {allow_failure!r}")
        results = result_parents(args, kwargs)
        parents = dict.fromkeys([*_parent_ids(after), *results])
        if not parents:  # after=[]: a first job of a loop that builds a graph
            return self._schedule(
                fn,
                args,
                kwargs,
                delay,
                at,
                priority,
                timeout,
                retries,
                key,
                retry=retry,
                queue=queue,
                limit=limit,
            )
        if key is not None:
            raise InvalidJobError("a job with parents (after=, ResultOf) cannot have a key")
        delay_s, at_s = due_arguments(delay, at)
        level = Priority.coerce(priority).level
        check_job(level, delay_s, at_s, timeout, retries)
        if queue != DEFAULT_QUEUE:
            check_name("queue", queue)
        if limit is not None:
            self._check_limit(limit)
        core = self._core
        terms = None
        if retry is not None:  # the worker gets the policy's filter with the callable
            policy = coerce_retry(retry, retries)
            assert policy is not None
            terms, retries, fn_run = policy.terms(), policy.max_retries, RetryFilter(fn, policy)
        payload = pickle_job(fn if terms is None else fn_run, args, kwargs, pool=core.pool)
        core.check_payload(payload)
        if core.outbox is not None:
            core.outbox.flush()  # parents this client just submitted are known there
        future = core.new_future(payload)
        request = JobRequest(
            job_id=future.id_nowait,
            client_id=core.client_id,
            payload=payload,
            priority=level,
            delay=delay_s,
            at=at_s,
            timeout=timeout,
            retries=retries,
            name=job_name(fn),
            retry=terms,
            queue=queue,
            limit=limit,
        )
        links = After(tuple(parents), tuple(results), allow_failure)
        service = core.service
        try:
            service.submit_after([request], [links])
        except BaseException as exc:
            core.forget(future.id_nowait)
            core.release([request])
            if isinstance(exc, DISCONNECTED):
                raise core.link.lost(
                    exc, service, "the job may have reached the manager (and may run) or not"
                ) from exc
            raise
        return future

    @overload
    def submit(
        self, fn: Callable[P, Coroutine[Any, Any, T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> JobFuture[T]: ...

    @overload
    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[T]: ...

    def submit(self, fn: Callable[P, Any], /, *args: P.args, **kwargs: P.kwargs) -> JobFuture[Any]:
        """Run ``fn(*args, **kwargs)`` as soon as a worker is free, at MEDIUM priority.

        The ``Executor`` method: every keyword goes to ``fn``. A ``ResultOf`` among the
        arguments makes it wait for that job, as with :meth:`schedule`. Raises as
        :meth:`schedule`.
        """
        if result_of_made() and result_parents(args, kwargs):
            return self._schedule_after(
                fn, args, kwargs, None, None, Priority.MEDIUM, None, 0, None, None, False
            )
        return self._schedule(fn, args, kwargs, None, None, Priority.MEDIUM)

    def _schedule(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | timedelta | None,
        at: float | datetime | None,
        priority: Priority | str,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
    ) -> JobFuture[Any]:
        delay_s, at_s = due_arguments(delay, at)
        level = Priority.coerce(priority).level
        check_job(level, delay_s, at_s, timeout, retries, key)  # the manager's check, here
        if queue != DEFAULT_QUEUE:
            check_name("queue", queue)
        if limit is not None:
            self._check_limit(limit)
        core = self._core
        terms = None
        if retry is not None:  # the worker gets the policy's filter with the callable
            policy = coerce_retry(retry, retries)
            assert policy is not None
            terms, retries, fn_run = policy.terms(), policy.max_retries, RetryFilter(fn, policy)
        payload = pickle_job(fn if terms is None else fn_run, args, kwargs, pool=core.pool)
        core.check_payload(payload)
        # Sent at once, a keyed submit learns which job holds its key; the rest go
        # write-behind (the request is built once, whole: a _replace costs ~1-2 us).
        outbox = None if key is not None else core.outbox
        future = None if outbox is None else core.new_future(payload)
        request = JobRequest(
            job_id="" if future is None else future.id_nowait,
            client_id=core.client_id,
            payload=payload,
            priority=level,
            delay=delay_s,
            at=at_s,
            timeout=timeout,
            retries=retries,
            key=key,
            name=job_name(fn),
            retry=terms,
            queue=queue,
            limit=limit,
        )
        if outbox is None or future is None:  # (either both are None or neither)
            [future] = self._send_batch([request])
        elif not outbox.put(request):
            raise core.refuse(future.id_nowait)  # the manager was lost since new_future()
        return future

    def _send_batch(self, jobs: list[JobRequest]) -> list[JobFuture[Any]]:
        """Register a future per job and queue them in one call: all or none (their
        ``job_id`` is the future's)."""
        if self._core.outbox is not None:
            self._core.outbox.flush()  # earlier submits first: the seq order is call order
        futures = [self._core.new_future(request.payload) for request in jobs]
        requests = [
            request._replace(job_id=future.id_nowait)
            for future, request in zip(futures, jobs, strict=True)
        ]
        try:
            holders = self._send(requests)
        except BaseException:
            for future in futures:
                self._core.forget(future.id_nowait)
            self._core.release(requests)
            raise
        for i, holder in enumerate(holders or ()):
            if holder != futures[i].id_nowait:  # its key was held: the holder's future stands
                self._core.ended([futures[i].id_nowait])
                self._core.forget(futures[i].id_nowait)
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
                    exc,
                    service,
                    "the job may have reached the manager (and may run) or "
                    "not; this client reconnects by itself",
                ) from exc

    @overload
    def map(
        self,
        fn: Callable[..., Coroutine[Any, Any, T]],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]: ...

    @overload
    def map(
        self,
        fn: Callable[..., T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[T]: ...

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
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
        jobs = self._map_jobs(fn, iterables)
        # Every item pickled: now queue them all, write-behind or in batches.
        outbox = self._core.outbox
        futures = self._send_all(jobs) if outbox is None else self._put_all(jobs, outbox)
        return MapResults(self._core, futures, deadline)

    def _map_jobs(
        self, fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...]
    ) -> list[JobRequest]:
        """map()'s jobs, one per item, each pickled (the callable once for all); on an
        error, the segments of those pickled already are released."""
        pickle_job(fn, (), {})  # a clear JobPicklingError if the callable cannot pickle
        fn_bytes = fast_dumps(fn) or cloudpickle_dumps(fn)  # pickled once for all items
        name = job_name(fn)
        jobs: list[JobRequest] = []
        try:
            for args in zip(*iterables):  # noqa: B905 - stop at the shortest
                payload = pickle_job(fn, args, {}, fn_bytes, self._core.pool)
                self._core.check_payload(payload)
                jobs.append(
                    JobRequest(
                        job_id="",
                        client_id=self._core.client_id,
                        payload=payload,
                        priority=Priority.MEDIUM.level,
                        delay=0.0,
                        at=None,
                        name=name,
                    )
                )
        except BaseException:
            self._core.release(jobs)
            raise
        return jobs

    def _put_all(self, jobs: list[JobRequest], outbox: Outbox) -> list[JobFuture[Any]]:
        """Hand every job to ``outbox``, all or none; their futures."""
        futures: list[JobFuture[Any]] = []
        try:
            for request in jobs:
                futures.append(self._core.new_future(request.payload))
                if not outbox.put(request._replace(job_id=futures[-1].id_nowait)):
                    error = self._core.refuse(futures.pop().id_nowait)
                    for future in futures:  # all or nothing: the manager was lost
                        future.cancel()
                    raise error
        except BaseException:
            self._core.release(jobs[len(futures) :])
            raise
        return futures

    def _send_all(self, jobs: list[JobRequest]) -> list[JobFuture[Any]]:
        """Send every job in batches that fit a bounded queue, all or none; their futures."""
        futures: list[JobFuture[Any]] = []
        batches = _batches(jobs, self._core.batch_size, self._core.max_pending_bytes)
        try:
            while batches:
                futures += self._send_batch(batches.pop(0))
        except BaseException:
            for future in futures:  # all or nothing: take back the batches already queued
                future.cancel()
            self._core.release([r for batch in batches for r in batch])  # never sent
            raise
        return futures


def _parent_ids(after: Iterable[JobFuture[Any] | str] | JobFuture[Any] | str | None) -> list[str]:
    """The job ids ``after=`` names: futures or ids, or one of them alone."""
    if after is None:
        return []
    if isinstance(after, (str, JobFuture)):
        after = [after]
    try:
        items = list(after)
    except TypeError:
        raise InvalidJobError(f"after= takes JobFutures or job ids, not {after!r}") from None
    ids: list[str] = []
    for item in items:
        if isinstance(item, JobFuture):
            ids.append(item.id_nowait)
        elif isinstance(item, str) and item:
            ids.append(item)
        else:
            raise InvalidJobError(f"after= takes JobFutures or job ids, not {item!r}")
    return ids


def _batches(jobs: list[JobRequest], count: int, max_bytes: int | None) -> list[list[JobRequest]]:
    """``jobs`` in consecutive batches of at most ``count`` jobs and (when bounded) at most
    ``max_bytes`` payload bytes, so that each batch can fit a bounded queue."""
    batches: list[list[JobRequest]] = []
    size = 0
    for job in jobs:
        weight = payload_size(job.payload) if max_bytes is not None else 0
        if (
            not batches
            or len(batches[-1]) >= count
            or (max_bytes is not None and size + weight > max_bytes)
        ):
            batches.append([])
            size = 0
        batches[-1].append(job)
        size += weight
    return batches


def connect(
    address: str | tuple[str, int] | None = None,
    *,
    authkey: bytes | str | None = None,
    submit_timeout: float | None = None,
) -> Client:
    """A client of a running manager: the Scheduler API without local workers.

    Every connection the client needs is open when this returns (its result and sender
    threads' too): a manager that stops answering for a while after (SIGSTOP, a frozen VM)
    and then goes on only delays the client's calls and jobs.

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
            ``CONNECT_TIMEOUT`` (10 s, mpsched._transport.connect), something that is not
            a manager, or one that stops answering (stalled, gone) while the client opens
            its threads' connections; with no address, also when no local manager has
            ever run as this user.
        ManagerBusyError: (a ManagerUnreachableError) the manager closed each of the
            client's connections during its handshake, tried again with back-off for
            ``CONNECT_TIMEOUT``: it made room for newer connections (a flood of idle
            ones), or it was stopping.
    """
    if address is None:
        address = default_address()
    elif isinstance(address, str):
        address = parse_address(address)
    if isinstance(authkey, str):  # the text of a key file: its bytes are UTF-8
        authkey = authkey.encode()
    # Surrounding whitespace is stripped, as from a key file (its trailing newline).
    key = authkey.strip() if authkey is not None else require_authkey(address, give="pass authkey=")
    try:
        service = connect_service(address, key)
    # AssertionError: Python < 3.12's handshake asserts that the peer sent a challenge.
    except (*DISCONNECTED, AssertionError) as exc:
        raise ManagerUnreachableError.from_error(format_address(address), exc) from exc
    try:
        return Client(
            service,
            submit_timeout=submit_timeout,
            reconnect=functools.partial(connect_service, address, key),
        )
    except ManagerUnreachableError:  # dropped a thread's connection: it said why
        service.discard()
        raise
    except DISCONNECTED as exc:
        # It answered the first connection, then not the client's threads' (a stall
        # longer than a handshake may take, or it went away).
        service.discard()
        raise ManagerUnreachableError(
            format_address(address),
            "it answered, then stopped answering while the client "
            f"opened its connections ({type(exc).__name__}: {exc})",
        ) from exc
