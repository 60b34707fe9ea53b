"""ScheduleEvents: what a manager's schedules do when one of their runs starts or ends, and
when the clocks move.

Schedules (mpsched._manager.schedules) answers the calls (add, control, listings); this
half answers the queue and the watcher: a run handed out (``started``: an ``allow``
schedule arms its next), a run's final outcome (``ended``: counted, kept, and the next run
armed unless overlap is allowed), runs that could not be queued (``replan_stalled``), and
cron runs the wall clock has not reached (``too_early``, ``remap_cron``). Both halves
work on one ScheduleBook, under its lock.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from mpsched._core.clock import Clock
from mpsched._core.job import Outcome, OutcomeKind
from mpsched._core.options import Mode, OnError, Overlap
from mpsched._core.planning import Trigger, jitter_offset
from mpsched._core.recurring import ScheduleKind
from mpsched._manager.journal import BaseJournal
from mpsched._manager.schedule_entry import Cancelled, ScheduleEntry
from mpsched._manager.schedule_runs import RunPlanner
from mpsched._manager.wall_clock import WALL_JUMP
from mpsched._store.base import DAY

log = logging.getLogger("mpsched.schedules")


@dataclass(eq=False)
class ScheduleBook:
    """The schedules of one manager, which Schedules and ScheduleEvents share."""

    journal: BaseJournal
    clock: Clock
    planner: RunPlanner
    # Guards entries, gone, every entry and the planner's state. Held while a run is armed
    # (a durable store write), so two clients adding or cancelling one schedule are
    # serialised. Nobody waits on it for long: schedules change at human rates.
    lock: threading.Lock = field(default_factory=threading.Lock)
    entries: dict[str, ScheduleEntry] = field(default_factory=dict)
    # The cancelled ones whose runs stay listable.
    gone: Cancelled = field(default_factory=lambda: Cancelled(result_ttl=DAY))
    # Schedules.close() was called: runs that end change nothing any more (read without
    # the lock).
    closed: bool = False


class ScheduleEvents:
    """The run events of one manager's schedules; every public method is thread-safe."""

    def __init__(self, book: ScheduleBook) -> None:
        self._book = book
        self._lock = book.lock
        self._entries = book.entries
        self._gone = book.gone
        self._planner = book.planner
        self._clock = book.clock
        self._journal = book.journal
        self._queue = book.journal.queue

    def is_run(self, job_id: str) -> bool:
        """Whether ``job_id`` is an armed run of a schedule (read without the lock: one
        dict lookup, for the queue's prefetch, which must not wait for this lock)."""
        return self._planner.is_run(job_id)

    def started(self, job_id: str) -> None:
        """The service handed out a job: for a run of an ``allow`` schedule, arm the next."""
        if not self._planner.is_run(job_id) or self._book.closed:
            return
        with self._lock:
            entry = self._entries.get(self._planner.schedule_locked(job_id))
            if entry is None or job_id not in entry.active:
                return
            entry.runs += 1
            entry.started.add(job_id)
            entry.last_started = job_id
            if (
                entry.spec.overlap == Overlap.ALLOW
                and entry.spec.mode == Mode.RATE
                and not entry.paused
            ):
                self._planner.plan_locked(entry, Trigger.STARTED)
            else:
                self._planner.save_state_locked(entry)

    def ended(self, job_id: str, outcome: Outcome) -> None:
        """A job's outcome is final (or it was cancelled): for a run, count it and, unless
        its schedule allows overlap, arm the next."""
        if not self._planner.is_run(job_id) or self._book.closed:
            return  # closed: runs that end as the manager stops stay as the store has them
        with self._lock:
            sid = self._planner.forget_locked(job_id)
            entry = self._entries.get(sid)
            if entry is None or entry.active.pop(job_id, None) is None:
                # A run that was running when its schedule was cancelled (and maybe added
                # again since, its runs' list carried over): its outcome is kept all the same.
                listed = self._gone.get(sid, self._clock.now()) or entry
                if listed is not None and job_id in listed.recent:
                    listed.keep(outcome)
                return
            entry.started.discard(job_id)
            entry.keep(outcome)
            if not outcome.ok and outcome.error_kind != OutcomeKind.CANCELLED:
                entry.failed += 1
                if entry.spec.on_error == OnError.PAUSE:
                    entry.paused = True
                    self._planner.withdraw_locked(entry)
                    log.warning(
                        "schedule %s paused: run %s failed (%s)",
                        sid,
                        job_id,
                        outcome.error_kind or "its own exception",
                    )
            if entry.paused:
                self._planner.save_state_locked(entry)
            elif (
                entry.spec.overlap != Overlap.ALLOW
                or entry.spec.mode == Mode.DELAY
                or not entry.active
            ):
                self._planner.plan_locked(entry, Trigger.ENDED)
            else:
                self._planner.save_state_locked(entry)

    # ------------------------------------------------------------------ stalls, clocks

    def replan_stalled(self) -> None:
        """Plan again every schedule whose last run could not be queued (a full queue, a
        store error): it has no run armed, so nothing else would."""
        with self._lock:
            for entry in self._entries.values():
                if entry.stalled and not entry.paused and not entry.active:
                    entry.stalled = False
                    self._planner.plan_locked(entry, Trigger.BEGIN)

    def too_early(self, job_id: str, early: float) -> bool:
        """Whether a cron run about to be handed out (up to ``early`` seconds before its
        due time) is early by the wall clock: it jumped back since the run was armed, and
        the watcher has not re-mapped it yet. The caller puts the run back and calls
        ``remap_cron``."""
        if not self._planner.is_run(job_id) or self._journal.shared:
            return False  # a shared store's runs are due by its own clock, in UTC
        with self._lock:
            entry = self._entries.get(self._planner.schedule_locked(job_id))
            label = None if entry is None else entry.active.get(job_id)
            if entry is None or label is None or entry.spec.kind != ScheduleKind.CRON:
                return False
            planned = label + jitter_offset(entry.spec.schedule_id, label, entry.spec.jitter)
            return self._clock.wall() < planned - early - WALL_JUMP / 10

    def remap_cron(self) -> int:
        """Move every armed cron run that has not started to its slot on the wall clock as
        it reads now; returns how many moved."""
        moved = 0
        with self._lock:
            for entry in self._entries.values():
                if entry.spec.kind != ScheduleKind.CRON:
                    continue
                for rid, label in entry.active.items():
                    moved += self._queue.reschedule(rid, self._planner.due(entry, label))
        return moved
