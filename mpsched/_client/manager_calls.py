"""What a client asks the manager beyond its own submits: schedules, limits, any job by id.

:class:`~mpsched._client.client.Client` gets these methods from :class:`ManagerCalls`:
its recurring jobs (every, cron, schedules, get_schedule), the limits (limits, set_limit),
stats, and any job by id (job, jobs, job_info, requeue, cancel). Each delegates to one of
the client's parts: mpsched._client.recurring, known_limits and lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from mpsched._client.job_future import JobFuture
from mpsched._client.known_limits import KnownLimits
from mpsched._client.lookups import Lookups
from mpsched._client.recurring import RecurringJobs, RunTerms, ScheduleRequest, SlotRules
from mpsched._client.schedule_handle import Schedule
from mpsched._core.job import DEFAULT_QUEUE, JobInfo, JobStateLike, Priority
from mpsched._core.options import CatchupLike, ModeLike, OnErrorLike, OverlapLike
from mpsched._core.recurring import ScheduleKind
from mpsched._core.retrying import RetryPolicy
from mpsched._protocol.records import Stats


class ManagerCalls:
    """The calls of a Client about the manager's schedules, limits and jobs."""

    _recurring: RecurringJobs
    _limits: KnownLimits
    _lookups: Lookups

    def every(
        self,
        interval: float | timedelta,
        fn: Callable[..., Any],
        /,
        *args: Any,
        mode: ModeLike = "rate",
        start: float | timedelta | datetime | None = None,
        id: str | None = None,
        overlap: OverlapLike = "skip",
        catchup: CatchupLike = "latest",
        jitter: float = 0.0,
        on_error: OnErrorLike = "continue",
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        **kwargs: Any,
    ) -> Schedule:
        """Run ``fn(*args, **kwargs)`` every ``interval`` seconds (or a timedelta).

        Args:
            mode: "rate": runs are planned at start + k * interval (no drift); "delay":
                each run is planned ``interval`` after the previous one ended.
            start: the first run: a delay in seconds or a timedelta, epoch seconds (a
                number from 1e9, i.e. 2001, on) or a datetime. Default: one interval from
                now. A start in the past is caught up as ``catchup`` says.
            id: the schedule's name. Adding a schedule whose id exists is an upsert: the
                same spec changes nothing, a changed one replaces it and keeps its last run.
                Default: the callable's name and a digest of what and when it runs.
            overlap: when a slot comes while the previous run is pending or running:
                "skip" it (counted), "queue" it until that run ends, or "allow" both.
            catchup: slots missed (manager down, backlog): "latest" runs one of them (the
                latest), "all" runs each, "skip" none; all are counted and logged.
            jitter: each run starts up to this many seconds after its slot, the same
                offset for a slot whichever manager plans it.
            on_error: "continue" (a failed run does not stop the schedule) or "pause".

        ``priority``, ``timeout``, ``retries``, ``retry``, ``queue`` and ``limit`` are as
        for :meth:`schedule`, for every run; each run gets the retry policy and a budget of
        its own. Each run is a job with id ``"{id}@{planned UTC time}"``. Returns the
        :class:`Schedule`; it lives in the manager, beyond this client.

        Raises:
            InvalidJobError: a bad interval, start, option or id. JobPicklingError: ``fn``
            or its arguments cannot be pickled. StoreError: it could not be recorded.
        """
        asked = ScheduleRequest(
            kind=ScheduleKind.EVERY, interval=interval, mode=mode, start=start, schedule_id=id
        )
        rules = SlotRules(overlap=overlap, catchup=catchup, jitter=jitter, on_error=on_error)
        run = RunTerms(priority, timeout, retries, retry, queue, limit)
        return self._recurring.add(asked._replace(rules=rules, run=run), fn, args, kwargs)

    def cron(
        self,
        expr: str,
        fn: Callable[..., Any],
        /,
        *args: Any,
        tz: str | None = None,
        id: str | None = None,
        overlap: OverlapLike = "skip",
        catchup: CatchupLike = "latest",
        jitter: float = 0.0,
        on_error: OnErrorLike = "continue",
        priority: Priority | str = Priority.MEDIUM,
        timeout: float | None = None,
        retries: int = 0,
        retry: int | RetryPolicy | None = None,
        queue: str = DEFAULT_QUEUE,
        limit: str | None = None,
        **kwargs: Any,
    ) -> Schedule:
        """Run ``fn(*args, **kwargs)`` at the times of a five-field cron expression,
        evaluated in zone ``tz`` (an IANA name; default: the manager's local zone) with
        Debian cron's DST rules: a daily 02:30 job runs at 03:00 on the spring-forward
        day and once on the fall-back day. Needs ``pip install 'mpsched[cron]'``.

        The other options are those of :meth:`every`.

        Raises:
            ExtraMissingError: cronsim is not installed, here or in the manager (an
                ImportError); its message says which process lacks it.
            InvalidJobError: an invalid expression or an unknown zone; as :meth:`every`.
        """
        asked = ScheduleRequest(kind=ScheduleKind.CRON, cron=expr, tz=tz, schedule_id=id)
        rules = SlotRules(overlap=overlap, catchup=catchup, jitter=jitter, on_error=on_error)
        run = RunTerms(priority, timeout, retries, retry, queue, limit)
        return self._recurring.add(asked._replace(rules=rules, run=run), fn, args, kwargs)

    def schedules(self) -> list[Schedule]:
        """Every schedule of the manager, whichever client added it."""
        return self._recurring.all()

    def get_schedule(self, schedule_id: str) -> Schedule:
        """The handle of one schedule of the manager, by its id.

        Raises:
            ScheduleNotFoundError: the manager has no such schedule (its ``cancelled`` is
                True for one cancelled within ``result_ttl``).
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._recurring.get(schedule_id)

    def limits(self) -> dict[str, str]:
        """The manager's limits by name, each in its form (``"2"``, ``"10/s"``,
        ``"2,10/s"``; ``""`` for one without a bound)."""
        return self._limits.fetch()

    def set_limit(
        self, name: str, *, concurrency: int | None = None, rate: str | None = None
    ) -> None:
        """Declare or change the limit ``name`` for every client; a store keeps it.

        Args:
            concurrency: at most this many of its jobs run at once; None: no bound.
            rate: at most N starts a second, minute or hour: ``"10/s"``, ``"N/m"`` or
                ``"N/h"``; None: no bound.

        Raises:
            InvalidJobError: a bad name, a bound below 1, or a rate in another form.
        """
        self._limits.declare(name, concurrency, rate)

    def stats(self) -> Stats:
        """Pending jobs per priority, in flight, completed, failed, workers and lateness.

        Counts include this client's jobs submitted before the call. Lateness is how long
        after its due time a job started, over the last 10,000 jobs. Times are in seconds,
        memory in bytes.

        Raises:
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.stats()

    def job(self, job_id: str) -> JobFuture[Any]:
        """A future for any job the manager knows by id, of any client or from before a restart.

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string.
            JobNotFoundError: no such job, or it ended and was forgotten after ``result_ttl``.
            SchedulerShutdownError: this client is shut down.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.job(job_id)

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
        return self._lookups.jobs(state, limit)

    def job_info(self, job_id: str) -> JobInfo:
        """One job the manager knows, as :meth:`jobs` lists it, looked up by its id.

        Raises:
            InvalidJobError: ``job_id`` is not a non-empty string.
            JobNotFoundError: no such job: unknown, or finished and forgotten.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.job_info(job_id)

    def requeue(self, job_id: str) -> JobFuture[Any]:
        """Run a failed or cancelled job again, under its id, due now, with no attempt made.

        It keeps its priority, timeout, retries and key. Returns a new future; its end comes
        to this client. Its arguments are kept for ``result_ttl``.

        Raises:
            InvalidJobError: ``job_id`` is empty; the job is pending, running or done; its
                arguments were not kept; or another job holds its key now.
            JobNotFoundError: no such job, or it ended and was forgotten.
            ManagerConnectionLostError: the manager is unreachable.
        """
        return self._lookups.requeue(job_id)

    def cancel(self, job_id: str) -> bool:
        """Cancel a pending job by id, of any client; True if it will never run.

        Its future, wherever it is, ends cancelled.

        Raises:
            ManagerConnectionLostError: the manager is unreachable and the job is another
                client's. One of this client's own returns False then, or is taken back if
                it was not sent yet.
        """
        return self._lookups.cancel(job_id)
