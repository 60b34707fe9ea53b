"""The client side of recurring jobs: what ``every()`` and ``cron()`` ask for, checked and
turned into a :class:`~mpsched._core.recurring.ScheduleSpec` here, at the call site.

The manager (mpsched._manager.schedules) owns a schedule once it is added, so it outlives
the client that added it; a :class:`~mpsched._client.schedule_handle.Schedule` is a
handle to it, by id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from mpsched._client.base import ClientBase
from mpsched._client.schedule_handle import Schedule
from mpsched._core.job import DEFAULT_QUEUE, Priority, check_name, check_run
from mpsched._core.options import (
    Catchup,
    CatchupLike,
    Mode,
    ModeLike,
    OnError,
    OnErrorLike,
    Overlap,
    OverlapLike,
)
from mpsched._core.recurring import (
    ScheduleAction,
    ScheduleKind,
    ScheduleSpec,
    check_spec,
    to_seconds,
    zone,
)
from mpsched._core.result_of import result_parents
from mpsched._core.retrying import RetryFilter, RetryPolicy, coerce_retry
from mpsched._errors import ExtraMissingError, InvalidJobError, SchedulerShutdownError
from mpsched._payload.pickling import job_name, pickle_job

EPOCH_FROM = 1e9  # a start= number at least this large is epoch seconds (2001-09-09 on)


class ScheduleRequest(NamedTuple):
    """A schedule as ``every()`` or ``cron()`` is asked for it, before any check."""

    kind: ScheduleKind
    interval: float | timedelta = 0.0  # every
    mode: ModeLike = "rate"  # every
    start: float | timedelta | datetime | None = None  # every
    cron: str = ""  # cron: the expression
    tz: str | None = None  # cron
    schedule_id: str | None = None  # None: default_id()
    overlap: OverlapLike = "skip"
    catchup: CatchupLike = "latest"
    jitter: float = 0.0
    on_error: OnErrorLike = "continue"
    priority: Priority | str = Priority.MEDIUM
    timeout: float | None = None
    retries: int = 0
    retry: int | RetryPolicy | None = None
    queue: str = DEFAULT_QUEUE
    limit: str | None = None


def build_spec(
    asked: ScheduleRequest, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ScheduleSpec:
    """The checked spec of ``asked``, its runs calling ``fn(*args, **kwargs)`` (pickled
    here); raises as ``Client.every``/``Client.cron``."""
    if "after" in kwargs or "allow_failure" in kwargs or result_parents(args, kwargs):
        raise InvalidJobError(
            "a schedule cannot have parents (after=, allow_failure=, "
            "ResultOf): its runs may be the parents of other jobs"
        )
    priority = Priority.coerce(asked.priority).level
    check_run(priority, asked.timeout, asked.retries)
    policy = coerce_retry(asked.retry, asked.retries)
    retries = asked.retries if policy is None else policy.max_retries
    check_name("queue", asked.queue)
    if asked.limit is not None:
        check_name("limit", asked.limit)
    kind = ScheduleKind.coerce(asked.kind)
    interval = to_seconds(asked.interval, "interval") if kind == ScheduleKind.EVERY else 0.0
    start_delay, start_at = _start(asked.start)
    tz = asked.tz
    if tz is not None and not isinstance(tz, str):
        raise InvalidJobError(f"tz must be a zone name such as 'Europe/Berlin', not {tz!r}")
    if tz:
        zone(tz)
    spec = ScheduleSpec(
        schedule_id=asked.schedule_id or "",
        kind=kind,
        interval=interval,
        mode=Mode.coerce(asked.mode),
        cron=asked.cron,
        tz=tz or "",
        start_delay=start_delay,
        start_at=start_at,
        jitter=to_seconds(asked.jitter, "jitter"),
        overlap=Overlap.coerce(asked.overlap),
        catchup=Catchup.coerce(asked.catchup),
        on_error=OnError.coerce(asked.on_error),
        priority=priority,
        timeout=asked.timeout,
        retries=retries,
        name=job_name(fn),
        payload=pickle_job(fn if policy is None else RetryFilter(fn, policy), args, kwargs),
        retry=None if policy is None else policy.terms(),
        queue=asked.queue,
        limit=asked.limit,
    )
    if asked.schedule_id is None:
        spec = spec._replace(schedule_id=default_id(spec))
    try:
        check_spec(spec)
    except ExtraMissingError as exc:
        raise exc.missing_in("this process (the client)") from None
    return spec


def _start(start: float | timedelta | datetime | None) -> tuple[float | None, float | None]:
    """``(start_delay, start_at)`` from a delay, a timedelta, epoch seconds or a datetime."""
    if start is None:
        return None, None
    if isinstance(start, datetime):
        try:
            return None, start.timestamp()
        except (OverflowError, OSError, ValueError) as exc:
            raise InvalidJobError(f"start={start!r} is out of range: {exc}") from None
    seconds = to_seconds(start, "start")
    if seconds >= EPOCH_FROM:
        return None, seconds
    return max(0.0, seconds), None


def default_id(spec: ScheduleSpec) -> str:
    """An id for a schedule added without one: the callable's name and a digest of what
    it runs and when, so that a program adding it at every start upserts, not stacks."""
    what = repr((str(spec.kind), spec.interval, str(spec.mode), spec.cron, spec.tz, spec.start_at))
    digest = hashlib.blake2b(what.encode() + spec.payload, digest_size=4).hexdigest()
    short = spec.name.rpartition(":")[2].replace("@", "_")[:80] or "schedule"
    return f"{short}~{digest}"


class RecurringClient(ClientBase):
    """The recurring-job methods of :class:`~mpsched.Client`."""

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
            priority, timeout, retries, retry, queue, limit: as for :meth:`schedule`,
                for every run; each run gets the retry policy and a budget of its own.

        Each run is a job with id ``"{id}@{planned UTC time}"``. Returns the
        :class:`Schedule`; it lives in the manager, beyond this client.

        Raises:
            InvalidJobError: a bad interval, start, option or id. JobPicklingError: ``fn``
            or its arguments cannot be pickled. StoreError: it could not be recorded.
        """
        asked = ScheduleRequest(
            kind=ScheduleKind.EVERY,
            interval=interval,
            mode=mode,
            start=start,
            schedule_id=id,
            overlap=overlap,
            catchup=catchup,
            jitter=jitter,
            on_error=on_error,
            priority=priority,
            timeout=timeout,
            retries=retries,
            retry=retry,
            queue=queue,
            limit=limit,
        )
        self._check_limit(limit)
        return self._add_schedule(build_spec(asked, fn, args, kwargs))

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
        asked = ScheduleRequest(
            kind=ScheduleKind.CRON,
            cron=expr,
            tz=tz,
            schedule_id=id,
            overlap=overlap,
            catchup=catchup,
            jitter=jitter,
            on_error=on_error,
            priority=priority,
            timeout=timeout,
            retries=retries,
            retry=retry,
            queue=queue,
            limit=limit,
        )
        self._check_limit(limit)
        return self._add_schedule(build_spec(asked, fn, args, kwargs))

    def schedules(self) -> list[Schedule]:
        """Every schedule of the manager, whichever client added it."""
        infos = self._core.link.ask(lambda service: service.list_schedules())
        return [Schedule(self._core.link, info, self.job) for info in infos]

    def get_schedule(self, schedule_id: str) -> Schedule:
        """The handle of one schedule of the manager, by its id.

        Raises:
            ScheduleNotFoundError: the manager has no such schedule (its ``cancelled`` is
                True for one cancelled within ``result_ttl``).
            ManagerConnectionLostError: the manager is unreachable.
        """
        info = self._core.link.ask(
            lambda service: service.schedule_control(schedule_id, ScheduleAction.INFO)
        )
        return Schedule(self._core.link, info, self.job)

    def _add_schedule(self, spec: ScheduleSpec) -> Schedule:
        if self._core.closed:
            raise SchedulerShutdownError("cannot add schedules after shutdown")
        info = self._core.link.ask(lambda service: service.add_schedule(spec))
        return Schedule(self._core.link, info, self.job)
