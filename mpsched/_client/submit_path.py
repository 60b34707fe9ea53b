"""The submit path of a client: a job checked and pickled at the call site, its request
built and sent write-behind (or at once), and ``map()``'s jobs queued all or none."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from mpsched._client.core import ClientCore
from mpsched._client.job_future import JobFuture
from mpsched._client.known_limits import KnownLimits
from mpsched._client.link import DISCONNECTED
from mpsched._client.outbox import Outbox
from mpsched._core.job import (
    DEFAULT_QUEUE,
    JobRequest,
    Priority,
    check_name,
)
from mpsched._core.retrying import RetryFilter, RetryPolicy, RetryTerms, coerce_retry
from mpsched._errors import QueueFullError, SchedulerShutdownError, StoreError
from mpsched._payload.by_value import cloudpickle_dumps
from mpsched._payload.pickling import fast_dumps, job_name, pickle_job
from mpsched._payload.shm import payload_size

MEDIUM = Priority.MEDIUM.level  # submit()'s priority level


class SubmitPath:
    """Turns one call of ``submit``/``schedule``/``map`` into requests and futures."""

    def __init__(self, core: ClientCore, limits: KnownLimits, submit_timeout: float | None) -> None:
        self._core = core
        self._limits = limits
        self._submit_timeout = submit_timeout  # longest a synchronous submit waits for room

    def one(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        delay: float | None,
        at: float | None,
        level: int,
        timeout: float | None = None,
        retries: int = 0,
        key: str | None = None,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
    ) -> JobFuture[Any]:
        """One job without parents; its future. The caller checked ``delay``, ``at`` (as
        ``due_arguments`` returns them), the priority ``level``, ``timeout``, ``retries``
        and ``key`` with ``check_job``, as the manager checks them."""
        self.check_routing(queue, limit)
        core = self._core
        payload, retries, terms = self.payload(fn, args, kwargs, retries, retry)
        # Sent at once, a keyed submit learns which job holds its key; the rest go
        # write-behind (the request is built once, whole: a _replace costs ~1-2 us).
        outbox = None if key is not None else core.outbox
        future = None if outbox is None else core.new_future(payload)
        request = JobRequest(
            job_id="" if future is None else future.id_nowait,
            client_id=core.client_id,
            payload=payload,
            priority=level,
            delay=delay,
            at=at,
            timeout=timeout,
            retries=retries,
            key=key,
            name=job_name(fn),
            retry=terms,
            queue=queue,
            limit=limit,
        )
        if outbox is None or future is None:  # (either both are None or neither)
            [future] = self.send_batch([request])
        elif not outbox.put(request):
            raise core.refuse(future.id_nowait)  # the manager was lost since new_future()
        return future

    def check_routing(self, queue: str, limit: str | None) -> None:
        """Raise here, as the manager would, for a bad queue name or an unknown limit."""
        if queue != DEFAULT_QUEUE:
            check_name("queue", queue)
        if limit is not None:
            self._limits.check(limit)

    def payload(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retries: int,
        retry: int | RetryPolicy | None,
    ) -> tuple[bytes, int, RetryTerms | None]:
        """A job's payload, pickled and checked, with its retry budget and its policy's
        terms: with a policy, the worker gets the policy's filter with the callable."""
        terms = None
        if retry is not None:
            policy = coerce_retry(retry, retries)
            assert policy is not None
            terms, retries, fn = policy.terms(), policy.max_retries, RetryFilter(fn, policy)
        payload = pickle_job(fn, args, kwargs, pool=self._core.pool)
        self._core.check_payload(payload)
        return payload, retries, terms

    def send_batch(self, jobs: list[JobRequest]) -> list[JobFuture[Any]]:
        """Register a future per job and queue them in one call: all or none (their
        ``job_id`` is the future's)."""
        core = self._core
        if core.outbox is not None:
            core.outbox.flush()  # earlier submits first: the seq order is call order
        futures = [core.new_future(request.payload) for request in jobs]
        requests = [
            request._replace(job_id=future.id_nowait)
            for future, request in zip(futures, jobs, strict=True)
        ]
        try:
            holders = self._send(requests)
        except BaseException:
            for future in futures:
                core.forget(future.id_nowait)
            core.release(requests)
            raise
        for i, holder in enumerate(holders or ()):
            if holder != futures[i].id_nowait:  # its key was held: the holder's future stands
                core.ended([futures[i].id_nowait])
                core.forget(futures[i].id_nowait)
                futures[i] = core.watch(holder)
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

    def map(
        self, fn: Callable[..., Any], iterables: tuple[Iterable[Any], ...]
    ) -> list[JobFuture[Any]]:
        """``map()``'s jobs, every item pickled first, then all queued in call order:
        write-behind, or in batches that fit a bounded queue; their futures."""
        jobs = self._map_jobs(fn, iterables)
        outbox = self._core.outbox
        return self._send_all(jobs) if outbox is None else self._put_all(jobs, outbox)

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
                futures += self.send_batch(batches.pop(0))
        except BaseException:
            for future in futures:  # all or nothing: take back the batches already queued
                future.cancel()
            self._core.release([r for batch in batches for r in batch])  # never sent
            raise
        return futures


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
