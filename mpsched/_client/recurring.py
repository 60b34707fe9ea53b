"""The client side of recurring jobs: building a schedule's spec, and the Schedule handle.

``Client.every()`` and ``Client.cron()`` validate and pickle here, at the call site, and
send a :class:`~mpsched._core.recurring.ScheduleSpec`; the manager
(mpsched._manager.schedules) owns the schedule from then on, so it outlives the client
that added it. A :class:`Schedule` is a handle, by id: each property asks the manager, so
every client sees the same schedule, and two handles to one id at one manager are equal.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from mpsched._client.futures import ClientCore, JobFuture
from mpsched._client.link import ManagerLink
from mpsched._core.job import JobRequest, Priority, check_request
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
    ScheduleCounters,
    ScheduleInfo,
    ScheduleSpec,
    check_spec,
    to_seconds,
    zone,
)
from mpsched._errors import (
    ExtraMissingError,
    InvalidJobError,
    JobNotFoundError,
    ScheduleNotFoundError,
    SchedulerShutdownError,
)
from mpsched._payload.pickling import job_name, pickle_job

EPOCH_FROM = 1e9  # a start= number at least this large is epoch seconds (2001-09-09 on)


class JobOptions:
    """The options every run of a schedule gets, as ``schedule()`` takes them."""

    def __init__(self, priority: Priority | str, timeout: float | None, retries: int) -> None:
        self.priority = Priority.coerce(priority).level
        self.timeout, self.retries = timeout, retries


def build_spec(kind: str, fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any], name: str, options: JobOptions, *,
               schedule_id: str | None, interval: float | timedelta = 0.0,
               mode: ModeLike = "rate", cron: str = "", tz: str | None = None,
               start: float | timedelta | datetime | None = None, jitter: float = 0.0,
               overlap: OverlapLike = "skip", catchup: CatchupLike = "latest",
               on_error: OnErrorLike = "continue") -> ScheduleSpec:
    """A checked spec, its callable pickled; raises as ``Client.every``/``Client.cron``."""
    check_request(JobRequest("x", "x", b"", options.priority, 0.0, None, options.timeout,
                             options.retries, None, name))
    seconds = to_seconds(interval, "interval") if kind == "every" else 0.0
    start_delay, start_at = _start(start)
    if tz is not None and not isinstance(tz, str):
        raise InvalidJobError(f"tz must be a zone name such as 'Europe/Berlin', not {tz!r}")
    if tz:
        zone(tz)
    spec = ScheduleSpec(
        schedule_id=schedule_id or "", kind=kind, interval=seconds, mode=Mode.coerce(mode),
        cron=cron, tz=tz or "", start_delay=start_delay, start_at=start_at,
        jitter=to_seconds(jitter, "jitter"), overlap=Overlap.coerce(overlap),
        catchup=Catchup.coerce(catchup), on_error=OnError.coerce(on_error),
        priority=options.priority, timeout=options.timeout, retries=options.retries,
        name=name, payload=pickle_job(fn, args, kwargs))
    if schedule_id is None:
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
    what = repr((spec.kind, spec.interval, str(spec.mode), spec.cron, spec.tz, spec.start_at))
    digest = hashlib.blake2b(what.encode() + spec.payload, digest_size=4).hexdigest()
    short = spec.name.rpartition(":")[2].replace("@", "_")[:80] or "schedule"
    return f"{short}~{digest}"


class RecurringClient:
    """The recurring-job methods of :class:`~mpsched.Client`."""

    _core: ClientCore

    def job(self, job_id: str) -> JobFuture[Any]:
        raise NotImplementedError

    def every(self, interval: float | timedelta, fn: Callable[..., Any], /, *args: Any,
              mode: ModeLike = "rate", start: float | timedelta | datetime | None = None,
              id: str | None = None, overlap: OverlapLike = "skip", catchup: CatchupLike = "latest",
              jitter: float = 0.0, on_error: OnErrorLike = "continue",
              priority: Priority | str = Priority.MEDIUM, timeout: float | None = None,
              retries: int = 0, **kwargs: Any) -> Schedule:
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
            priority, timeout, retries: as for :meth:`schedule`, for every run.

        Each run is a job with id ``"{id}@{planned UTC time}"``. Returns the
        :class:`Schedule`; it lives in the manager, beyond this client.

        Raises:
            InvalidJobError: a bad interval, start, option or id. JobPicklingError: ``fn``
            or its arguments cannot be pickled. StoreError: it could not be recorded.
        """
        spec = build_spec("every", fn, args, kwargs, job_name(fn),
                          JobOptions(priority, timeout, retries), schedule_id=id,
                          interval=interval, mode=mode, start=start, jitter=jitter,
                          overlap=overlap, catchup=catchup, on_error=on_error)
        return self._add_schedule(spec)

    def cron(self, expr: str, fn: Callable[..., Any], /, *args: Any, tz: str | None = None,
             id: str | None = None, overlap: OverlapLike = "skip", catchup: CatchupLike = "latest",
             jitter: float = 0.0, on_error: OnErrorLike = "continue",
             priority: Priority | str = Priority.MEDIUM, timeout: float | None = None,
             retries: int = 0, **kwargs: Any) -> Schedule:
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
        spec = build_spec("cron", fn, args, kwargs, job_name(fn),
                          JobOptions(priority, timeout, retries), schedule_id=id, cron=expr,
                          tz=tz, jitter=jitter, overlap=overlap, catchup=catchup,
                          on_error=on_error)
        return self._add_schedule(spec)

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
            lambda service: service.schedule_control(schedule_id, "info"))
        return Schedule(self._core.link, info, self.job)

    def _add_schedule(self, spec: ScheduleSpec) -> Schedule:
        if self._core.closed:
            raise SchedulerShutdownError("cannot add schedules after shutdown")
        info = self._core.link.ask(lambda service: service.add_schedule(spec))
        return Schedule(self._core.link, info, self.job)


class Schedule:
    """A recurring schedule in the manager. Each property and method asks the manager, so
    every client sees the same state; ``cancel()`` from any client stops it for all.
    Handles are by id: two handles to one schedule id at one manager (from two ``every()``
    calls that upserted it, from ``schedules()``, from two clients) are equal and hash
    equal.

    Counters: ``runs`` (runs started), ``skipped`` (slots passed over because the previous
    run was still pending or running, with ``overlap="skip"``), ``missed`` (slots not run
    after downtime or a backlog, as ``catchup`` says), ``failed`` (runs that raised or
    crashed after their retries).
    """

    def __init__(self, link: ManagerLink, info: ScheduleInfo,
                 watch: Callable[[str], JobFuture[Any]]) -> None:
        self._link = link  # its client's: the manager's proxy, another after a reconnect
        self._info = info
        self._watch = watch

    def __repr__(self) -> str:
        return f"<Schedule {self.id!r} {self._info.spec}>"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[str, str]:
        return self._link.address, self.id

    @property
    def id(self) -> str:
        """The schedule's id; its runs' job ids are ``"{id}@{planned UTC time}"``."""
        return self._info.schedule_id

    def info(self) -> ScheduleInfo:
        """The schedule as the manager reports it now.

        Raises:
            ScheduleNotFoundError: it was cancelled (its ``cancelled`` is True for
                ``result_ttl``, while its runs stay listable).
            ManagerConnectionLostError: the manager is unreachable.
        """
        self._info = self._control("info")
        return self._info

    @property
    def next_run(self) -> datetime | None:
        """When the next run is planned (aware, in the schedule's zone; UTC for every),
        or None when paused; ``info().next_run``."""
        return self.info().next_run

    @property
    def counters(self) -> ScheduleCounters:
        return self.info().counters

    @property
    def paused(self) -> bool:
        return self.info().paused

    def preview(self, n: int = 5) -> list[datetime]:
        """The next ``n`` planned run times (aware datetimes), without running anything."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 10_000:
            raise InvalidJobError(f"n must be an int in [0, 10000], not {n!r}")
        return [self._datetime(t) for t in self._link.ask(
            lambda service: service.schedule_preview(self.id, n))]

    def pause(self) -> None:
        """Stop planning runs; an armed run that has not started is withdrawn."""
        self._info = self._control("pause")

    def resume(self) -> None:
        """Plan runs again from now on (slots that passed while paused are not run)."""
        self._info = self._control("resume")

    def cancel(self) -> bool:
        """Remove the schedule: no run starts after this returns; a running one finishes.

        Idempotent, as ``Future.cancel()``: True if this call cancelled it, False if it
        was cancelled already (by this handle, another handle or another client), however
        long ago. A handle's id was the manager's, so an id the manager does not know (any
        more) was cancelled: this never raises ScheduleNotFoundError.

        Raises:
            ManagerConnectionLostError: the manager is unreachable.
        """
        try:
            self._info = self._control("cancel")
        except ScheduleNotFoundError:
            return False
        return True

    def runs(self, n: int = 10) -> list[JobFuture[Any]]:
        """Futures of the ``n`` latest runs, oldest first (the last may still be pending;
        a run that has ended is done in the future returned). A cancelled schedule's runs
        stay listable for the manager's ``result_ttl`` (its armed run, withdrawn, is a
        cancelled future).

        Ended runs are kept as any ended job is (for ``result_ttl``; without a store in
        memory, within its bounds, and a schedule's 10 latest outcomes beyond them); older
        ones are left out.

        Raises:
            ScheduleNotFoundError: it was cancelled more than ``result_ttl`` ago.
            ManagerConnectionLostError: the manager is unreachable.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 100:
            raise InvalidJobError(f"n must be an int in [0, 100], not {n!r}")
        futures = []
        for rid in self._link.ask(lambda service: service.schedule_runs(self.id, n)):
            try:
                futures.append(self._watch(rid))
            except JobNotFoundError:
                continue  # finished and forgotten
        return futures

    def _datetime(self, epoch: float) -> datetime:
        tz = zone(self._info.tz) if self._info.tz else timezone.utc
        return datetime.fromtimestamp(epoch, tz)

    def _control(self, action: str) -> ScheduleInfo:
        return self._link.ask(lambda service: service.schedule_control(self.id, action))
