"""Jobs with parents (``after=``, ``ResultOf``): checked, then sent at once, so that an
unknown parent raises at the call site."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from mpsched._client.core import ClientCore
from mpsched._client.job_future import JobFuture
from mpsched._client.link import DISCONNECTED
from mpsched._client.submit_path import SubmitPath
from mpsched._core.job import (
    DEFAULT_QUEUE,
    After,
    JobRequest,
    Priority,
    check_job,
    due_arguments,
)
from mpsched._core.result_of import result_parents
from mpsched._core.retrying import RetryPolicy
from mpsched._errors import InvalidJobError
from mpsched._payload.pickling import job_name


class DependentJobs:
    """``schedule()`` and ``submit()`` of a job that runs after others."""

    def __init__(self, core: ClientCore, submits: SubmitPath) -> None:
        self._core = core
        self._submits = submits  # a job whose after= names no parent is an ordinary one

    def schedule(
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
        """:meth:`Client.schedule` of a job with parents: sent at once, so that an
        unknown parent raises here."""
        if not isinstance(allow_failure, bool):
            raise InvalidJobError(f"allow_failure must be a bool, not {allow_failure!r}")
        results = result_parents(args, kwargs)
        parents = dict.fromkeys([*_parent_ids(after), *results])
        if parents and key is not None:
            raise InvalidJobError("a job with parents (after=, ResultOf) cannot have a key")
        delay, at = due_arguments(delay, at)  # checked: seconds from now, or epoch seconds
        level = Priority.coerce(priority).level
        check_job(level, delay, at, timeout, retries, key)  # the manager's check, here
        if not parents:  # after=[]: a first job of a loop that builds a graph
            return self._submits.one(
                fn, args, kwargs, delay, at, level, timeout, retries, key, retry, queue, limit
            )
        self._submits.check_routing(queue, limit)
        payload, retries, terms = self._submits.payload(fn, args, kwargs, retries, retry)
        request = JobRequest(
            job_id="",
            client_id=self._core.client_id,
            payload=payload,
            priority=level,
            delay=delay,
            at=at,
            timeout=timeout,
            retries=retries,
            name=job_name(fn),
            retry=terms,
            queue=queue,
            limit=limit,
        )
        return self._send(request, After(tuple(parents), tuple(results), allow_failure))

    def _send(self, request: JobRequest, links: After) -> JobFuture[Any]:
        """Register the job's future and send it with its parents, now."""
        core = self._core
        if core.outbox is not None:
            core.outbox.flush()  # parents this client just submitted are known there
        future = core.new_future(request.payload)
        request = request._replace(job_id=future.id_nowait)
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
