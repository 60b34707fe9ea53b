"""One schedule inside the manager: its spec, where it stands, what it reports.

``ScheduleEntry`` is guarded by the lock of the ``ScheduleBook`` that holds it
(mpsched._manager.schedule_events); ``State`` is the part a store keeps, as plain data.
``CancelledSchedule`` is what is left of an entry once it is cancelled: its latest runs
and their outcomes, which ``Cancelled`` keeps for ``result_ttl``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from mpsched._core.job import Outcome
from mpsched._core.planning import Slots, jitter_offset
from mpsched._core.recurring import ScheduleCounters, ScheduleInfo, ScheduleSpec, zone

log = logging.getLogger("mpsched.schedules")

RECENT = 100  # run ids kept per schedule for Schedule.runs()
KEPT_OUTCOMES = 10  # outcomes of the latest runs kept in memory (a store keeps them all)
KEPT_CANCELLED = 1000  # cancelled schedules remembered at most (the latest cancelled)
WARN_EVERY = 60.0  # seconds between two warnings of one schedule's skipped or missed slots


class State(NamedTuple):
    """Where a schedule stands, as the store keeps it (plain data)."""

    anchor: float
    tz: str
    decided: float | None
    owed_until: float | None
    paused: bool
    counters: ScheduleCounters
    active: tuple[tuple[str, float], ...]  # run id, slot: armed and not ended
    recent: tuple[str, ...]
    last_started: str | None = None  # absent from the states of older stores


@dataclass(eq=False)
class ScheduleEntry:
    spec: ScheduleSpec
    slots: Slots
    tz: str
    offset: float  # monotonic minus wall, fixed while this manager runs (every-schedules)
    decided: float | None = None
    owed_until: float | None = None
    paused: bool = False
    runs: int = 0
    skipped: int = 0
    missed: int = 0
    failed: int = 0
    active: dict[str, float] = field(default_factory=dict)
    started: set[str] = field(default_factory=set)  # active runs handed to a worker
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT))
    last_started: str | None = None  # the id of the latest run handed to a worker
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    stalled: bool = False  # a run could not be queued: the watcher plans it again
    # The last warning (when, skipped, missed), or the counters of an earlier life of the
    # schedule (from -inf): the next warning says what was skipped or missed since.
    warned: tuple[float, int, int] | None = None

    def state(self) -> State:
        return State(
            anchor=self.slots.anchor,
            tz=self.tz,
            decided=self.decided,
            owed_until=self.owed_until,
            paused=self.paused,
            counters=self.counters(),
            active=tuple(self.active.items()),
            recent=tuple(self.recent),
            last_started=self.last_started,
        )

    def counters(self) -> ScheduleCounters:
        return ScheduleCounters(
            runs=self.runs, skipped=self.skipped, missed=self.missed, failed=self.failed
        )

    def restore(self, counters: ScheduleCounters) -> None:
        """Go on from the counters a store kept for this schedule (a manager restarted on
        it): they keep counting, and the next warning says only what this outage, or what
        comes after it, skipped or missed."""
        self.runs, self.skipped, self.missed, self.failed = counters
        self.warned = (-math.inf, self.skipped, self.missed)

    def info(self, now: float, *, cancelled: bool = False) -> ScheduleInfo:
        """The schedule as clients see it; ``now`` is a label on its timeline."""
        spec = self.spec
        next_run: datetime | None = None
        next_run_id: str | None = None
        if not (self.paused or cancelled):
            armed = {rid: label for rid, label in self.active.items() if rid not in self.started}
            if armed:
                next_run_id = min(armed, key=armed.__getitem__)
                label = armed[next_run_id]
            else:
                label = self.slots.after(now if self.decided is None else max(self.decided, now))
            label += jitter_offset(spec.schedule_id, label, spec.jitter)
            with contextlib.suppress(OverflowError, OSError, ValueError):  # past 9999: None
                next_run = datetime.fromtimestamp(label, zone(self.tz))
        return ScheduleInfo(
            schedule_id=spec.schedule_id,
            spec=spec.describe(),
            name=spec.name,
            next_run=next_run,
            paused=self.paused,
            cancelled=cancelled,
            counters=self.counters(),
            last_run=self.last_started,
            tz=self.tz,
            next_run_id=next_run_id,
        )

    def keep(self, outcome: Outcome) -> None:
        """Keep a run's outcome, the KEPT_OUTCOMES latest only."""
        keep_outcome(self.outcomes, outcome)

    def warn(self, now: float) -> None:
        """Log what was skipped or missed: at once, then at most once a WARN_EVERY with
        what accumulated (a schedule that always overlaps is not a flood). ``now``: the
        monotonic clock."""
        if self.warned is not None and now - self.warned[0] < WARN_EVERY:
            return
        skipped, missed = (
            (self.skipped, self.missed)
            if self.warned is None
            else (self.skipped - self.warned[1], self.missed - self.warned[2])
        )
        self.warned = (now, self.skipped, self.missed)
        if skipped:
            log.warning(
                "schedule %s: %d slot(s) skipped: the previous run was still pending "
                "or running (overlap=%r)",
                self.spec.schedule_id,
                skipped,
                str(self.spec.overlap),
            )
        if missed:
            log.warning(
                "schedule %s: %d slot(s) missed (the manager was down or busy) and "
                "not run (catchup=%r)",
                self.spec.schedule_id,
                missed,
                str(self.spec.catchup),
            )


@dataclass(eq=False)
class CancelledSchedule:
    """A cancelled schedule as its manager remembers it until ``forget_at``: the ids of its
    latest runs and the outcomes of the KEPT_OUTCOMES latest (a run that was running when
    it was cancelled adds its own when it ends)."""

    recent: deque[str]
    outcomes: dict[str, Outcome]
    forget_at: float  # on the manager's monotonic clock

    def keep(self, outcome: Outcome) -> None:
        keep_outcome(self.outcomes, outcome)


class Cancelled:
    """The cancelled schedules a manager remembers: each for ``result_ttl`` seconds after
    its cancel, the KEPT_CANCELLED latest cancelled at most. Guarded, as the entries, by
    the lock of the ``Schedules`` that holds it; ``now`` is the manager's monotonic clock."""

    def __init__(self, result_ttl: float) -> None:
        self.result_ttl = result_ttl
        # By schedule id, in cancel order: an id leaves (pop) before it is cancelled again.
        self._by_id: dict[str, CancelledSchedule] = {}

    def keep_for(self, result_ttl: float) -> None:
        """Remember the schedules cancelled from now on for ``result_ttl`` seconds."""
        self.result_ttl = result_ttl

    def remember(self, entry: ScheduleEntry, now: float) -> None:
        self._by_id[entry.spec.schedule_id] = CancelledSchedule(
            entry.recent, entry.outcomes, now + self.result_ttl
        )
        self._forget(now)

    def get(self, schedule_id: str, now: float) -> CancelledSchedule | None:
        self._forget(now)
        return self._by_id.get(schedule_id)

    def pop(self, schedule_id: str, now: float) -> CancelledSchedule | None:
        """Forget one (its id is added again); what it remembered, if anything."""
        self._forget(now)
        return self._by_id.pop(schedule_id, None)

    def _forget(self, now: float) -> None:
        """Forget those past their ``forget_at``, and the earliest beyond KEPT_CANCELLED.
        In cancel order with one ttl for all, the first is always the first to go."""
        while self._by_id:
            schedule_id, first = next(iter(self._by_id.items()))
            if first.forget_at > now and len(self._by_id) <= KEPT_CANCELLED:
                return
            del self._by_id[schedule_id]


def keep_outcome(outcomes: dict[str, Outcome], outcome: Outcome) -> None:
    """Add a run's outcome to ``outcomes`` and drop the oldest beyond KEPT_OUTCOMES."""
    outcomes.pop(outcome.job_id, None)  # a run kept again counts as the latest
    outcomes[outcome.job_id] = outcome
    while len(outcomes) > KEPT_OUTCOMES:
        del outcomes[next(iter(outcomes))]
