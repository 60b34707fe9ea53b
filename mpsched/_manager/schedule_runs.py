"""How a schedule's runs get into the queue and out of it: ``RunPlanner``.

At each trigger (mpsched._core.planning.plan) it arms the slot to run: a job whose id is
``"{schedule id}@{slot, UTC}"``, submitted through the journal (so it is in the store before
it is in the heap) with the slot as its due time, unless the store knows that run already
(then it is adopted: a slot never runs twice). It withdraws armed runs that have not
started, and knows which job is which schedule's run.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable

from mpsched._core.clock import Clock
from mpsched._core.job import Job, JobRequest
from mpsched._core.planning import Trigger, jitter_offset, plan
from mpsched._core.recurring import ScheduleKind, run_id
from mpsched._errors import MpschedError, StoreError
from mpsched._manager.journal import BaseJournal
from mpsched._manager.schedule_entry import ScheduleEntry
from mpsched._manager.wall_clock import WALL_CHECK

log = logging.getLogger("mpsched.schedules")

CLIENT_PREFIX = "schedule:"  # the client id a schedule's runs are submitted under


class RunPlanner:
    """Arms and withdraws the runs of the schedules of one ``Schedules``.

    It has no lock of its own: every method whose name ends in ``_locked`` is called with
    the lock of the Schedules that owns it held, as are its entries. ``is_run`` is a plain
    look at the run index (a dict), for the service's calls on every job.
    """

    def __init__(
        self, journal: BaseJournal, clock: Clock, cancelled: Callable[[list[Job]], object]
    ) -> None:
        """``cancelled``: journals withdrawn runs and tells whoever watches them."""
        self._journal = journal
        self._queue = journal.queue
        self._clock = clock
        self._cancelled = cancelled
        self._runs: dict[str, str] = {}  # armed run id -> schedule id

    def is_run(self, job_id: str) -> bool:
        """Whether ``job_id`` is an armed run (a plain look, without the lock)."""
        return job_id in self._runs

    def schedule_locked(self, job_id: str) -> str:
        """The id of the schedule whose armed run ``job_id`` is ("" for none)."""
        return self._runs.get(job_id, "")

    def forget_locked(self, job_id: str) -> str:
        """The run ``job_id`` ended: stop following it; its schedule's id ("" for none)."""
        return self._runs.pop(job_id, "")

    def now(self, entry: ScheduleEntry) -> float:
        """Now as a label on the schedule's timeline."""
        if entry.spec.kind == ScheduleKind.CRON:
            return self._clock.wall()
        return self._clock.now() - entry.offset

    def plan_locked(self, entry: ScheduleEntry, trigger: Trigger) -> None:
        decision = plan(
            entry.slots,
            entry.decided,
            entry.owed_until,
            self.now(entry),
            trigger,
            active=bool(entry.active),
        )
        before = entry.decided, entry.owed_until
        entry.decided, entry.owed_until = decision.decided, decision.owed_until
        if decision.cancel_armed:
            self.withdraw_locked(entry)
        if decision.skipped or decision.missed:
            entry.skipped += decision.skipped
            entry.missed += decision.missed
            entry.warn(self._clock.now())
        if decision.arm is not None and not self._arm_locked(entry, decision.arm):
            entry.decided, entry.owed_until = before  # the watcher tries that slot again
        self.save_state_locked(entry)

    def _arm_locked(self, entry: ScheduleEntry, label: float) -> bool:
        """Queue the run of one slot (unless the store knows it: then it is adopted);
        False when it could not be queued."""
        spec = entry.spec
        rid = run_id(spec.schedule_id, label)
        if rid in entry.active:
            return True
        shared = self._journal.shared
        known = None if shared else self._journal.adopt(rid)
        if known is not None:  # armed before (another manager life): never twice
            if known:
                self.track_locked(entry, rid, label)
            return True
        due = self.due(entry, label)
        slot = label + jitter_offset(spec.schedule_id, label, spec.jitter)
        request = JobRequest(
            job_id=rid,
            client_id=CLIENT_PREFIX + spec.schedule_id,
            payload=spec.payload,
            priority=spec.priority,
            # A shared store's clock decides: due at the slot, in UTC.
            delay=None if shared else max(0.0, due - self._clock.now()),
            at=slot if shared else None,
            timeout=spec.timeout,
            retries=spec.retries,
            name=spec.name,
            retry=spec.retry,
            queue=spec.queue,
            limit=spec.limit,
        )
        try:
            # Due at the slot itself: a delay would start from when the queue reads its
            # clock, a little later, and every run would be that much late. A shared
            # store creates a run once, whoever arms it ("" for one that ran already).
            holders = self._journal.submit([request], timeout=0, due=due)
        except (MpschedError, StoreError) as exc:
            if not entry.stalled:
                log.warning(
                    "schedule %s: run %s could not be queued (%s); trying again every %g s",
                    spec.schedule_id,
                    rid,
                    exc,
                    WALL_CHECK,
                )
            entry.stalled = True  # the watcher plans it again
            return False
        if holders != [""]:
            self.track_locked(entry, rid, label)
        return True

    def track_locked(self, entry: ScheduleEntry, rid: str, label: float) -> None:
        """Follow an armed run: its start and end re-plan the schedule."""
        entry.active[rid] = label
        self._runs[rid] = entry.spec.schedule_id
        if rid not in entry.recent:
            entry.recent.append(rid)

    def due(self, entry: ScheduleEntry, label: float) -> float:
        """The monotonic instant a slot's run is due, jitter included."""
        label += jitter_offset(entry.spec.schedule_id, label, entry.spec.jitter)
        if entry.spec.kind == ScheduleKind.CRON:
            return label + self._clock.now() - self._clock.wall()
        return label + entry.offset

    def withdraw_locked(self, entry: ScheduleEntry) -> list[str]:
        """Cancel the entry's armed runs that have not started; running ones stay active,
        so that their end is still counted. Returns the ids of those withdrawn."""
        jobs = self._queue.cancel_jobs(list(entry.active))
        withdrawn = [job.job_id for job in jobs]
        for rid in withdrawn:
            del entry.active[rid]
            self._runs.pop(rid, None)  # first: the cancel's ended() must not re-plan
        if jobs:
            self._cancelled(jobs)
        return withdrawn

    def save_state_locked(self, entry: ScheduleEntry) -> None:
        """Write where the schedule stands to the store (without waiting for it)."""
        self._journal.store.update_schedule(entry.spec.schedule_id, pickle.dumps(entry.state()))
