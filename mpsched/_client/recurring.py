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

from mpsched._client.core import ClientCore
from mpsched._client.job_future import JobFuture
from mpsched._client.known_limits import KnownLimits
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


class SlotRules(NamedTuple):
    """What a schedule does with its slots, as ``every()`` or ``cron()`` is asked."""

    overlap: OverlapLike = "skip"
    catchup: CatchupLike = "latest"
    jitter: float = 0.0
    on_error: OnErrorLike = "continue"


class RunTerms(NamedTuple):
    """The terms of each run of a schedule, as ``every()`` or ``cron()`` is asked."""

    priority: Priority | str = Priority.MEDIUM
    timeout: float | None = None
    retries: int = 0
    retry: int | RetryPolicy | None = None
    queue: str = DEFAULT_QUEUE
    limit: str | None = None


class ScheduleRequest(NamedTuple):
    """A schedule as ``every()`` or ``cron()`` is asked for it, before any check."""

    kind: ScheduleKind
    interval: float | timedelta = 0.0  # every
    mode: ModeLike = "rate"  # every
    start: float | timedelta | datetime | None = None  # every
    cron: str = ""  # cron: the expression
    tz: str | None = None  # cron
    schedule_id: str | None = None  # None: default_id()
    rules: SlotRules = SlotRules()
    run: RunTerms = RunTerms()


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
    rules, run = asked.rules, asked.run
    priority = Priority.coerce(run.priority).level
    check_run(priority, run.timeout, run.retries)
    policy = coerce_retry(run.retry, run.retries)
    retries = run.retries if policy is None else policy.max_retries
    check_name("queue", run.queue)
    if run.limit is not None:
        check_name("limit", run.limit)
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
        jitter=to_seconds(rules.jitter, "jitter"),
        overlap=Overlap.coerce(rules.overlap),
        catchup=Catchup.coerce(rules.catchup),
        on_error=OnError.coerce(rules.on_error),
        priority=priority,
        timeout=run.timeout,
        retries=retries,
        name=job_name(fn),
        payload=pickle_job(fn if policy is None else RetryFilter(fn, policy), args, kwargs),
        retry=None if policy is None else policy.terms(),
        queue=run.queue,
        limit=run.limit,
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


class RecurringJobs:
    """Adds a client's schedules to the manager and hands out their handles."""

    def __init__(
        self, core: ClientCore, limits: KnownLimits, watch: Callable[[str], JobFuture[Any]]
    ) -> None:
        self._core = core
        self._link = core.link
        self._limits = limits
        self._watch = watch  # a future for a run, by its job id (Client.job)

    def add(
        self,
        asked: ScheduleRequest,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Schedule:
        """Check ``asked`` (raises as ``Client.every``), then add it; its handle."""
        self._limits.check(asked.run.limit)
        spec = build_spec(asked, fn, args, kwargs)
        if self._core.closed:
            raise SchedulerShutdownError("cannot add schedules after shutdown")
        info = self._link.ask(lambda service: service.add_schedule(spec))
        return Schedule(self._link, info, self._watch)

    def all(self) -> list[Schedule]:
        """Every schedule of the manager, whichever client added it."""
        infos = self._link.ask(lambda service: service.list_schedules())
        return [Schedule(self._link, info, self._watch) for info in infos]

    def get(self, schedule_id: str) -> Schedule:
        """The handle of one schedule, by id; raises as ``Client.get_schedule``."""
        info = self._link.ask(
            lambda service: service.schedule_control(schedule_id, ScheduleAction.INFO)
        )
        return Schedule(self._link, info, self._watch)
