"""Recurring jobs, the pure part: what a schedule is, how it is named and checked.

A schedule's *slots* are the instants its runs are planned for, as UTC epoch seconds (the
"label" of a slot; a run's job id is ``"{schedule id}@{label as ISO UTC}"``, see
:func:`run_id`); when they fall and which to run next is :mod:`mpsched._core.planning`'s.
Nothing here imports multiprocessing or reads a clock.
"""

from __future__ import annotations

import contextlib
import math
import os
import zoneinfo
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, NamedTuple

from mpsched._core.job import DEFAULT_QUEUE, MAX_EPOCH, MIN_EPOCH
from mpsched._core.options import Catchup, Mode, OnError, Option, Overlap
from mpsched._core.retrying import RetryTerms
from mpsched._errors import ExtraMissingError, InvalidJobError

MAX_ID = 200  # characters in a schedule id
MIN_INTERVAL = 0.001  # seconds: below this a schedule is a busy loop, not a timetable
RUN_SEPARATOR = "@"


class ScheduleKind(Option):
    """How a schedule's slots are given."""

    EVERY = "every"  # an interval (Mode says from what)
    CRON = "cron"  # a five-field cron expression in a zone


class ScheduleAction(Option):
    """What a client asks of one schedule (``ServiceProxy.schedule_control``)."""

    INFO = "info"  # how it stands
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"


class ScheduleSpec(NamedTuple):
    """What a client asks for; the manager resolves the start and keeps it as given."""

    schedule_id: str
    kind: ScheduleKind
    interval: float  # seconds between slots ("every"); 0.0 for cron
    mode: Mode  # RATE or DELAY ("every"); RATE for cron
    cron: str  # the five-field expression; "" for every
    tz: str  # zone name for cron; "" = the manager's local zone
    start_delay: float | None  # seconds after the manager receives it (every)
    start_at: float | None  # UTC epoch seconds of the first slot (every)
    jitter: float  # seconds: each run starts up to this much after its slot
    overlap: Overlap
    catchup: Catchup
    on_error: OnError
    priority: int
    timeout: float | None
    retries: int
    name: str  # the callable's qualified name, for listings
    payload: bytes  # cloudpickled (fn, args, kwargs), as a job's
    retry: RetryTerms | None = None  # every run's retry policy's numbers (JobRequest.retry)
    queue: str = DEFAULT_QUEUE  # the queue of every run
    limit: str | None = None  # the limit every run runs under

    @classmethod
    def of(cls, fields: tuple[Any, ...]) -> ScheduleSpec:
        """A spec from its fields as sent or stored; one stored by an older version lacks
        the last fields, which take their defaults."""
        rest = cls._fields[len(fields) :]
        return cls._make((*fields, *(cls._field_defaults[name] for name in rest)))

    def identity(self) -> ScheduleSpec:
        """The spec without what is relative to the moment it was sent: two adds of one
        program at two starts compare equal (an upsert of the same spec is a no-op)."""
        return self._replace(start_delay=None)

    def describe(self) -> str:
        """One line for listings: ``every 600s (rate)``, ``cron '30 2 * * 1-5' (UTC)``."""
        if self.kind == ScheduleKind.EVERY:
            return f"every {self.interval:g}s ({self.mode})"
        return f"cron '{self.cron}' ({self.tz or 'local'})"


class ScheduleCounters(NamedTuple):
    """What happened to a schedule's slots so far."""

    runs: int  # runs started
    skipped: int  # slots passed over because the previous run was pending or running
    missed: int  # slots not run after downtime or a backlog (catchup "latest" or "skip")
    failed: int  # runs that ended with an error (after their retries)


class ScheduleInfo(NamedTuple):
    """A schedule as the manager reports it (``Client.schedules()``, ``schedules``)."""

    schedule_id: str
    spec: str  # ScheduleSpec.describe()
    name: str
    # When the next run is planned, jitter included: an aware datetime in the schedule's
    # zone (UTC for every); None when paused or cancelled (or past the year 9999).
    next_run: datetime | None
    paused: bool
    cancelled: bool
    counters: ScheduleCounters
    last_run: str | None  # the job id of the latest run that started (None: none yet)
    tz: str  # the zone cron slots are computed in ("" for every)
    # The job id of the run queued for next_run; None when none is queued yet (its
    # previous run has not ended, or the schedule is paused or cancelled).
    next_run_id: str | None = None


def with_options(spec: ScheduleSpec) -> ScheduleSpec:
    """``spec`` with its options as members (its words, as a caller or a store gave them).

    Raises:
        ConfigError: a word that option does not take.
    """
    return spec._replace(
        kind=ScheduleKind.coerce(spec.kind),
        mode=Mode.coerce(spec.mode),
        overlap=Overlap.coerce(spec.overlap),
        catchup=Catchup.coerce(spec.catchup),
        on_error=OnError.coerce(spec.on_error),
    )


def plain(spec: ScheduleSpec) -> tuple[object, ...]:
    """``spec``'s fields as plain data (its options as words), as a store keeps them."""
    return tuple(str(field) if isinstance(field, Option) else field for field in spec)


def check_spec(spec: ScheduleSpec) -> None:
    """Raise InvalidJobError, ConfigError (an option's word) or ExtraMissingError unless
    ``spec`` can be planned."""
    sid = spec.schedule_id
    if (
        not isinstance(sid, str)
        or not sid
        or len(sid) > MAX_ID
        or RUN_SEPARATOR in sid
        or not sid.isprintable()
    ):
        raise InvalidJobError(
            f"schedule id must be 1 to {MAX_ID} printable characters "
            f"without {RUN_SEPARATOR!r}, not {sid!r}"
        )
    if spec.kind not in (ScheduleKind.EVERY, ScheduleKind.CRON):
        raise InvalidJobError(f"unknown schedule kind {spec.kind!r}")
    with_options(spec)  # ConfigError for a word no option takes
    if not (isinstance(spec.jitter, (int, float)) and 0 <= spec.jitter < math.inf):
        raise InvalidJobError(f"jitter must be a number of seconds >= 0, not {spec.jitter!r}")
    if spec.kind == ScheduleKind.EVERY:
        problem = interval_problem(spec.interval)
        if problem:
            raise InvalidJobError(f"interval {problem}")
        if spec.start_at is not None and not MIN_EPOCH <= spec.start_at <= MAX_EPOCH:
            raise InvalidJobError(f"start {spec.start_at!r} is outside the years 1 to 9999")
        if spec.start_delay is not None and not 0 <= spec.start_delay < MAX_EPOCH:
            raise InvalidJobError(f"start delay must be >= 0 seconds, not {spec.start_delay!r}")
    else:
        cron_slots(spec.cron, zone(spec.tz), 0.0)  # raises on a bad expression or zone


def interval_problem(seconds: float) -> str:
    """Why ``seconds`` cannot be the interval of an every-schedule, or "" (the one rule
    ``every()`` and ``submit --every`` hold it to, in the same words)."""
    if not seconds >= MIN_INTERVAL or seconds == math.inf:  # NaN too
        return f"must be a finite number of seconds >= {MIN_INTERVAL:g}, not {seconds:g}"
    if seconds >= MAX_EPOCH:
        return f"must be less than {MAX_EPOCH:g} seconds (the year 9999), not {seconds:g}"
    return ""


def zone(name: str) -> tzinfo:
    """The zone called ``name`` ("" for UTC).

    Raises:
        InvalidJobError: no such zone in the zoneinfo database.
    """
    if not name:
        return timezone.utc
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise InvalidJobError(
            f"unknown time zone {name!r}: use an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from exc


def local_zone_name() -> str:
    """This host's zone as an IANA name (TZ, then /etc/localtime), or "UTC"."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with contextlib.suppress(IndexError, OSError):
        candidates.append(os.path.realpath("/etc/localtime").split("zoneinfo/", 1)[1])
    for name in candidates:
        try:  # one file lookup, not a scan of the whole zone database
            if name and zone(name):
                return name
        except InvalidJobError:
            continue
    return "UTC"


def cron_slots(expr: str, tz: tzinfo, after: float) -> float:
    """The first slot of ``expr`` in ``tz`` strictly after ``after`` (UTC epoch seconds).

    Raises:
        ExtraMissingError: cronsim is not installed.
        InvalidJobError: ``expr`` is not a valid five-field cron expression.
    """
    try:
        from cronsim import CronSim, CronSimError
    except ImportError:
        raise ExtraMissingError("cron schedules", "cron", "cronsim") from None
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise InvalidJobError(
            f"cron expression must have five fields (minute hour "
            f"day-of-month month day-of-week), not {expr!r}"
        )
    try:
        return next(CronSim(expr, datetime.fromtimestamp(after, tz))).timestamp()
    except (CronSimError, ValueError, KeyError) as exc:
        raise InvalidJobError(f"invalid cron expression {expr!r}: {exc}") from exc
    except StopIteration:
        raise InvalidJobError(f"cron expression {expr!r} never fires") from None


def run_id(schedule_id: str, label: float) -> str:
    """The job id of a schedule's run for the slot ``label``: ``nightly@2026-12-03T02:30:00Z``."""
    when = datetime.fromtimestamp(label, timezone.utc)
    text = when.isoformat(timespec="microseconds" if when.microsecond else "seconds")
    return f"{schedule_id}{RUN_SEPARATOR}{text.replace('+00:00', 'Z')}"


def schedule_of(job_id: str) -> str | None:
    """The schedule id a run's job id names, or None for an ordinary job id."""
    sid, sep, _ = job_id.rpartition(RUN_SEPARATOR)
    return sid if sep else None


def to_seconds(value: float | timedelta, what: str) -> float:
    """Seconds from a number or a timedelta; InvalidJobError for anything else."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidJobError(f"{what} must be seconds (a number) or a timedelta, not {value!r}")
    return float(value)
