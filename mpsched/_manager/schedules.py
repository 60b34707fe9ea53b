"""Schedules: the manager's recurring jobs, each run an ordinary job of the queue.

A schedule keeps one run armed: a job whose id is ``"{schedule id}@{slot, UTC}"``, submitted
through the journal (so it is in the store before it is in the heap) with its slot as due
time; the heap's timed wait starts it on time, like any scheduled job. What arms the next run
(``mpsched._core.planning.plan``) depends on ``overlap``::

    add / resume / recovery ──▶ plan(BEGIN) ──▶ arm run k ──▶ heap ──▶ worker
                                                   ▲            │
    overlap "skip"/"queue", mode "delay":  run k ended ─────────┤ plan(ENDED)
    overlap "allow":                       run k started ───────┘ plan(STARTED)

Run ids are deterministic, and a slot is armed only if the store does not know its run:
a slot never runs twice, whoever adds the schedule and however often the manager restarts.
Every-schedules map slots to the monotonic clock with one offset per manager lifetime;
cron runs are re-mapped when the wall clock jumps (a watcher thread compares the clocks:
mpsched._manager.wall_clock). Arming and withdrawing runs is the planner's
(mpsched._manager.schedule_runs), what runs starting and ending do is ScheduleEvents'
(mpsched._manager.schedule_events, on the same ScheduleBook); here, the schedules and
their calls.

A cancelled schedule leaves the store, but this manager remembers its latest runs and their
outcomes for ``result_ttl`` (at most KEPT_CANCELLED schedules), so that its handles can
still list them and a manager without a store can still give a run's outcome by id.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
from collections.abc import Callable

from mpsched._core.clock import Clock
from mpsched._core.job import Job, Outcome
from mpsched._core.planning import Slots, Trigger, jitter_offset, resolve_anchor
from mpsched._core.recurring import (
    ScheduleAction,
    ScheduleInfo,
    ScheduleKind,
    ScheduleSpec,
    check_spec,
    local_zone_name,
    plain,
    schedule_of,
    with_options,
)
from mpsched._errors import (
    ExtraMissingError,
    InvalidJobError,
    ScheduleNotFoundError,
)
from mpsched._manager.journal import BaseJournal, cancelled
from mpsched._manager.schedule_entry import ScheduleEntry, State
from mpsched._manager.schedule_events import ScheduleBook, ScheduleEvents
from mpsched._manager.schedule_runs import RunPlanner
from mpsched._manager.wall_clock import WallClockWatcher
from mpsched._store.base import IN_MEMORY, StoredSchedule

log = logging.getLogger("mpsched.schedules")


class Schedules:
    """The recurring schedules of one manager; every public method is thread-safe."""

    def __init__(
        self, journal: BaseJournal, clock: Clock, cancelled: Callable[[list[Job]], object]
    ) -> None:
        """``cancelled``: journals withdrawn runs and tells whoever watches them."""
        self._book = book = ScheduleBook(journal, clock, RunPlanner(journal, clock, cancelled))
        self._journal = journal
        self._clock = clock
        self._lock = book.lock  # see ScheduleBook
        self._entries = book.entries
        self._gone = book.gone
        self._planner = book.planner
        # What runs starting and ending do (the queue's side of the schedules).
        self.events = ScheduleEvents(book)
        self._watcher = WallClockWatcher(clock, self.events.replan_stalled, self.events.remap_cron)

    # ------------------------------------------------------------------ lifecycle

    def recover(self) -> str:
        """Load the store's schedules and plan each after the downtime; a summary line."""
        stored = self._journal.store.schedules()
        with self._lock:
            for schedule in stored:
                self._recover_locked(schedule)
        self._watcher.start()
        if not stored:
            return ""
        return f"recovered {len(stored)} schedule(s)"

    def _recover_locked(self, stored: StoredSchedule) -> None:
        spec = with_options(ScheduleSpec.of(pickle.loads(stored.spec)))
        state = State(*pickle.loads(stored.state))  # fields added since take defaults
        entry = self._entry(spec, state.anchor, state.tz)
        entry.decided, entry.owed_until, entry.paused = (
            state.decided,
            state.owed_until,
            state.paused,
        )
        entry.restore(state.counters)
        entry.recent.extend(state.recent)
        entry.last_started = state.last_started
        for rid, label in state.active:
            if self._journal.adopt(rid):
                self._planner.track_locked(entry, rid, label)
        self._entries[spec.schedule_id] = entry
        if not entry.paused:
            self._planner.plan_locked(entry, Trigger.BEGIN)

    def sync(self, schedule_id: str) -> None:
        """A manager of a shared store added, replaced, paused, resumed or cancelled a
        schedule (this one too: then nothing changes): take it as the store has it now.
        Every manager plans every schedule of the store; a slot's run is created once
        (its id), and each manager that armed it hears of its end."""
        stored = next(
            (s for s in self._journal.store.schedules() if s.schedule_id == schedule_id), None
        )
        with self._lock:
            entry = self._entries.get(schedule_id)
            if stored is None:
                if entry is not None:  # cancelled elsewhere (its runs withdrawn there)
                    del self._entries[schedule_id]
                    for rid in entry.active:
                        self._planner.forget_locked(rid)
                    self._gone.remember(entry, self._clock.now())
                return
            spec = with_options(ScheduleSpec.of(pickle.loads(stored.spec)))
            if entry is None or entry.spec.identity() != spec.identity():
                if entry is not None:
                    for rid in entry.active:
                        self._planner.forget_locked(rid)
                self._recover_locked(stored)
                return
            paused = State(*pickle.loads(stored.state)).paused
            if paused and not entry.paused:
                entry.paused = True
                self._planner.withdraw_locked(entry)
            elif entry.paused and not paused:
                entry.paused = False
                self._planner.plan_locked(entry, Trigger.BEGIN)

    def keep_cancelled_for(self, result_ttl: float) -> None:
        """How long a cancelled schedule's latest runs and their outcomes stay listable:
        the manager's ``result_ttl`` (a day unless told)."""
        with self._lock:
            self._gone.keep_for(result_ttl)

    def close(self) -> None:
        """Stop planning: runs that end from now on leave the store as it is."""
        if self._entries and self._journal.store.location == IN_MEMORY:
            log.info(
                "%d schedule(s) end with this manager: without a store nothing keeps them",
                len(self._entries),
            )
        self._book.closed = True
        self._watcher.stop()

    # ------------------------------------------------------------------ calls

    def add(self, spec: ScheduleSpec) -> ScheduleInfo:
        """Add a schedule, or upsert one with its id: the same spec changes nothing; a
        changed one replaces it and keeps its last run (and its counters).

        Raises:
            InvalidJobError: a spec that cannot be planned.
            ExtraMissingError: a cron schedule, and this process lacks cronsim (its
                message names the manager).
            StoreError: it could not be recorded; nothing changed.
        """
        try:
            check_spec(spec)
        except ExtraMissingError as exc:
            raise exc.missing_in(
                f"the manager (pid {os.getpid()} on {socket.gethostname()})"
            ) from None
        spec = with_options(spec)
        tz = spec.tz or (local_zone_name() if spec.kind == ScheduleKind.CRON else "")
        with self._lock:
            old = self._entries.get(spec.schedule_id)
            if old is not None and old.spec.identity() == spec.identity():
                return self._info_locked(old)
            anchor = resolve_anchor(spec, self._clock.wall())
            if (
                old is not None
                and old.spec.kind == spec.kind == ScheduleKind.EVERY
                and spec.start_at is None
            ):
                anchor = old.slots.anchor if old.spec.interval == spec.interval else anchor
            entry = self._entry(spec, anchor, tz)
            if old is not None:
                self._carry_over_locked(old, entry)
            elif (gone := self._gone.pop(spec.schedule_id, self._clock.now())) is not None:
                entry.recent, entry.outcomes = gone.recent, gone.outcomes  # its runs' list
            if not self._record_locked(entry, old):
                return self._info_locked(self._entries[spec.schedule_id])
            self._entries[spec.schedule_id] = entry
            log.info(
                "schedule %s %s: %s",
                spec.schedule_id,
                "replaced" if old else "added",
                spec.describe(),
            )
            self._planner.plan_locked(entry, Trigger.BEGIN)
            self._journal.schedule_changed(spec.schedule_id)
            return self._info_locked(entry)

    def _record_locked(self, entry: ScheduleEntry, old: ScheduleEntry | None) -> bool:
        """Record a schedule added here; False when another manager of a shared store had
        added the same one first: this manager then takes that one (its timeline, so that
        each slot is one run id, whoever plans it)."""
        spec = entry.spec
        first = self._journal.store.save_schedule_unless_same(
            StoredSchedule(
                schedule_id=spec.schedule_id,
                spec=pickle.dumps(plain(spec)),
                state=pickle.dumps(entry.state()),
            ),
            lambda stored: same_spec(stored, spec),
        )
        if first is None:
            return True
        if old is not None:
            for rid in old.active:
                self._planner.forget_locked(rid)
        self._recover_locked(first)
        return False

    def _carry_over_locked(self, old: ScheduleEntry, new: ScheduleEntry) -> None:
        """A replaced schedule keeps its counters and last run; its armed run that has not
        started is withdrawn (the new spec plans the next one)."""
        new.runs, new.skipped, new.missed, new.failed = old.counters()
        new.warned = old.warned  # what it warned of stays said, and its pace
        new.recent, new.outcomes, new.paused = old.recent, old.outcomes, old.paused
        new.last_started = old.last_started
        new.decided = old.decided
        self._planner.withdraw_locked(old)
        new.active, new.started = old.active, old.started

    def control(self, schedule_id: str, action: ScheduleAction | str) -> ScheduleInfo:
        """PAUSE, RESUME or CANCEL a schedule (INFO changes nothing); returns it as it is
        now.

        Pause and cancel withdraw its armed run unless it started: no run starts after
        this returns; a running one finishes. A cancelled schedule's runs stay listable
        (``runs``, ``outcome``) for ``result_ttl``.

        Raises:
            ScheduleNotFoundError: no such schedule: it was cancelled already (with
                ``cancelled`` set while this manager remembers that), or never added.
            InvalidJobError: an unknown action.
        """
        with self._lock:
            entry = self._get_locked(schedule_id)
            if action == ScheduleAction.INFO:
                pass
            elif action == ScheduleAction.PAUSE:
                entry.paused = True
                self._planner.withdraw_locked(entry)
                self._planner.save_state_locked(entry)
                self._journal.schedule_changed(schedule_id)
            elif action == ScheduleAction.RESUME:
                if entry.paused:
                    entry.paused = False
                    entry.decided = (
                        None
                        if entry.decided is None
                        else max(entry.decided, self._planner.now(entry))
                    )
                    self._planner.plan_locked(entry, Trigger.BEGIN)
                    self._journal.schedule_changed(schedule_id)
            elif action == ScheduleAction.CANCEL:
                for rid in self._planner.withdraw_locked(entry):
                    entry.keep(cancelled(rid))
                del self._entries[schedule_id]
                self._journal.store.delete_schedule(schedule_id)
                self._gone.remember(entry, self._clock.now())
                self._journal.schedule_changed(schedule_id)
                log.info("schedule %s cancelled", schedule_id)
                return self._info_locked(entry, cancelled=True)
            else:
                raise InvalidJobError(f"unknown schedule action {action!r}")
            return self._info_locked(entry)

    def info(self, schedule_id: str) -> ScheduleInfo:
        with self._lock:
            return self._info_locked(self._get_locked(schedule_id))

    def listing(self) -> list[ScheduleInfo]:
        with self._lock:
            return [self._info_locked(e) for e in self._entries.values()]

    def preview(self, schedule_id: str, n: int) -> list[float]:
        """The next ``n`` slots (UTC epoch seconds, jitter included) without running any."""
        with self._lock:
            entry = self._get_locked(schedule_id)
            after = (
                max(entry.decided, self._planner.now(entry)) if entry.decided is not None else None
            )
            armed = sorted(entry.active.values())
            labels = [a for a in armed if a > self._planner.now(entry)][:n]
            labels += entry.slots.preview(after if not labels else labels[-1], n - len(labels))
            sid, jitter = entry.spec.schedule_id, entry.spec.jitter
            return [label + jitter_offset(sid, label, jitter) for label in labels]

    def runs(self, schedule_id: str, n: int) -> list[str]:
        """The ids of the ``n`` latest runs, oldest first; of a schedule cancelled less
        than ``result_ttl`` ago too.

        Raises:
            ScheduleNotFoundError: no such schedule (never added, or forgotten).
        """
        with self._lock:
            listed = self._entries.get(schedule_id) or self._gone.get(
                schedule_id, self._clock.now()
            )
            if listed is None:
                raise ScheduleNotFoundError(schedule_id)
            recent = list(listed.recent)
            return recent[-n:] if n > 0 else []

    def outcome(self, job_id: str) -> Outcome | None:
        """The kept outcome of a recent run (a manager without a store forgets jobs), of a
        schedule cancelled less than ``result_ttl`` ago too."""
        with self._lock:
            sid = schedule_of(job_id) or ""
            for listed in (self._entries.get(sid), self._gone.get(sid, self._clock.now())):
                if listed is not None and job_id in listed.outcomes:
                    return listed.outcomes[job_id]
            return None

    # ------------------------------------------------------------------ planning

    def _entry(self, spec: ScheduleSpec, anchor: float, tz: str) -> ScheduleEntry:
        return ScheduleEntry(
            spec, Slots(spec, anchor, tz), tz, offset=self._clock.now() - self._clock.wall()
        )

    def _get_locked(self, schedule_id: str) -> ScheduleEntry:
        entry = self._entries.get(schedule_id)
        if entry is None:
            gone = self._gone.get(schedule_id, self._clock.now())
            raise ScheduleNotFoundError(schedule_id, cancelled=gone is not None)
        return entry

    def _info_locked(self, entry: ScheduleEntry, *, cancelled: bool = False) -> ScheduleInfo:
        return entry.info(self._planner.now(entry), cancelled=cancelled)


def same_spec(stored: bytes, spec: ScheduleSpec) -> bool:
    """Whether a spec as the store keeps it is ``spec``, but for when it was sent."""
    try:
        kept = with_options(ScheduleSpec.of(pickle.loads(stored)))
    except Exception:  # a spec of another version: not this one
        return False
    return kept.identity() == spec.identity()
