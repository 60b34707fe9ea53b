"""A client of a manager, at its base: the client's core, and what it asks the manager of
jobs by id (``job``, ``job_info``, ``cancel``), of all jobs (``jobs``) and of the whole
(``stats``).

:class:`~mpsched._client.client.Client` builds on it: recurring jobs
(mpsched._client.recurring), closing (mpsched._client.closing), then submitting.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from mpsched._client.core import ClientCore
from mpsched._client.job_future import JobFuture
from mpsched._core.job import (
    JobInfo,
    JobRecord,
    JobState,
    JobStateLike,
    Priority,
    check_name,
)
from mpsched._core.limits import LimitSpec, parse_limit, parse_rate, unknown_limit
from mpsched._core.progress import decode_progress
from mpsched._errors import ConfigError, InvalidJobError, JobNotFoundError
from mpsched._protocol.proxy import ServiceProxy
from mpsched._protocol.records import Stats


class ClientBase:
    """A client's core (its futures, outbox and link to the manager) and its lookups."""

    def __init__(
        self,
        service: ServiceProxy,
        *,
        reconnect: Callable[[], ServiceProxy] | None = None,
        lost_advice: str = "",
    ) -> None:
        """``reconnect`` connects to the manager's address again, after the connection was
        lost (None: the client closes instead, its futures failed with
        ManagerConnectionLostError, whose message ends with ``lost_advice``)."""
        self._core = ClientCore(service, reconnect=reconnect, lost_advice=lost_advice)
        # The limits the manager was last heard to know: a job naming one of them is
        # sent write-behind; any other name is checked with the manager first.
        self._known_limits: frozenset[str] = frozenset()

    def limits(self) -> dict[str, str]:
        """The manager's limits by name, each in its form (``"2"``, ``"10/s"``,
        ``"2,10/s"``; ``""`` for one without a bound)."""
        known = self._core.link.ask(lambda service: service.limits())
        self._known_limits = frozenset(known)
        return known

    def set_limit(
        self, name: str, *, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Declare or change the limit ``name`` on the manager, at once and for every
        client; kept in the store when there is one.

        Args:
            concurrency: at most this many of its jobs run at once (None: no bound).
            rate: at most N starts in any second, minute or hour: ``"10/s"``, ``"N/m"``,
                ``"N/h"`` (None: no bound).

        Raises:
            InvalidJobError: a bad name, a bound below 1, or a rate in another form.
        """
        form = str(LimitSpec(concurrency=_concurrency(concurrency), rate=parse_rate(rate)))
        parse_limit(name, form or LimitSpec())
        self._core.link.ask(lambda service: service.set_limit(name, form))
        self._known_limits = self._known_limits | {name}

    def _check_limit(self, limit: str | None) -> None:
        """Raises InvalidJobError unless the manager knows ``limit`` (None passes)."""
        if limit is None or limit in self._known_limits:
            return
        check_name("limit", limit)
        known = self.limits()
        if limit not in known:
            raise unknown_limit(limit, known)

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

    def jobs(self, state: JobStateLike | None = None, limit: int | None = None) -> list[JobInfo]:
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
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
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
        self._core.wait_sent(job_id)  # a job of this client's own is known there
        record = self._core.link.ask(lambda service: service.job(job_id))
        if record is None:
            raise JobNotFoundError(job_id)
        return _job_info(record)

    def requeue(self, job_id: str) -> JobFuture[Any]:
        """Run a failed or cancelled job again: it is pending again, due now, under the
        same id, with its priority, timeout, retries and key, and no attempt made.

        Returns a new future for it (its end comes to this client, whichever submitted
        it). The job's arguments are kept while the job is (``result_ttl``).

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string; the job is pending,
                running or done; its arguments were not kept (they went through shared
                memory); its key is held by another job now.
            JobNotFoundError: no such job: unknown, or ended and forgotten.
            ManagerConnectionLostError: the manager is unreachable.
        """
        if not isinstance(job_id, str) or not job_id:
            raise InvalidJobError(f"a job id is a non-empty string, not {job_id!r}")
        if self._core.outbox is not None:
            self._core.outbox.flush()  # a job this client just cancelled is known there
        return self._core.requeue(job_id)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job by id, whichever client submitted it; True if it was
        pending and will never run (its future, wherever it is, ends cancelled).

        Raises:
            ManagerConnectionLostError: the manager is unreachable and the job is another
                client's (one of this client's own returns False then, unless it was not
                sent yet: that one is taken back).
        """
        own = self._core.future(job_id)
        if own is not None:
            return own.cancel()
        if self._core.outbox is not None:
            self._core.outbox.flush()
        return self._core.link.ask(lambda service: service.cancel(job_id, self._core.client_id))


def _concurrency(concurrency: object) -> int | None:
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidJobError(f"concurrency must be an int >= 1 or None, not {concurrency!r}")
    return concurrency


def _job_info(record: JobRecord) -> JobInfo:
    return JobInfo(
        job_id=record.job_id,
        name=record.name,
        state=record.state.value,
        due=datetime.fromtimestamp(record.due_wall, timezone.utc),
        priority=Priority(record.priority),
        attempts=record.attempt,
        worker=record.worker_id,
        key=record.key,
        error=record.error,
        progress=decode_progress(record.progress),
        queue=record.queue,
        limit=record.limit,
        waiting_for=record.waiting_for,
    )
