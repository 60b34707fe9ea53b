"""HandOut: a JobQueue's takers, their leader/follower wait, and workers that leave.

A take pops the next due job and puts it in flight under a lease (mpsched._core.leases) in
one step, with up to ``more`` due jobs prefetched (mpsched._core.prefetch). Waiting
follows Java's ``DelayedWorkQueue`` (leader/follower): at most one taker, the *leader*,
sleeps until the head job is due (in a few timed waits, each ending a little early:
mpsched._core.clock.ahead); every other taker waits untimed on the same condition.
Whoever changes the head (:meth:`HandOut.new_head_locked`), or the leader on its way out,
wakes exactly one waiter. So a due job is never stranded behind a busy or sleeping taker
(the trap of a single ``signal()`` for two due jobs), and each event wakes O(1) threads
instead of all of them.
A worker that leaves has its prefetched jobs taken back (revoke) or its leases ended and
its id retired (release_worker, retire_if_leased).

It owns the parts a take consults: the Prefetcher (jobs handed out ahead) and the
Admission (limits). Every part moves jobs into and out of the heap through its
:meth:`HandOut.push_locked` and :meth:`HandOut.pop_due_locked`, which tell the takers,
the prefetched jobs and the waiting submitters what changed.

No lock of its own: it shares its JobQueue's. Methods ending in ``_locked`` are called
with it held; the others take it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mpsched._core.admission import Admission
from mpsched._core.clock import Clock, Waitable, ahead
from mpsched._core.job import Assignment, Job
from mpsched._core.leases import Leases, LostLease
from mpsched._core.limits import Limits
from mpsched._core.prefetch import Claims, Prefetcher
from mpsched._core.queues import PendingQueues, Queues
from mpsched._core.room import Room
from mpsched._core.wall_offset import WallOffset
from mpsched._errors import SchedulerShutdownError


class _Takers:
    """The takers that serve one list of queues: they wait leader/follower among
    themselves, on their own condition, for the heads of their queues."""

    __slots__ = ("available", "leader")

    def __init__(self, available: Waitable) -> None:
        # Takers of these queues wait here: untimed when none of their queues has a job
        # or another of them leads, timed (the head's delay) when leading. Notified (one
        # waiter) by a new head in any queue or a limit's slot that frees, and by a taker
        # of theirs that leaves while work remains and no one leads; all by close_locked().
        self.available = available
        self.leader: object | None = None  # the taker sleeping until the head is due


class HandOut:
    """The taking side of one JobQueue, guarded by that queue's ``lock``: its takers, the
    jobs it hands out ahead (``prefetch``), its limits (``admission``), and the heap's two
    moves every part goes through (:meth:`push_locked`, :meth:`pop_due_locked`).
    """

    def __init__(
        self,
        lock: threading.Lock,
        clock: Clock,
        pending: PendingQueues,
        room: Room,
        wall: WallOffset,
        leases: Leases,
        limits: Limits,
        claims: Claims | None,
    ) -> None:
        self._lock = lock  # the queue's: guards every field below
        self._clock = clock
        self._pending = pending
        self._room = room
        self._wall = wall
        self._leases = leases
        self.admission = Admission(limits, clock, pending, push=self.push_locked)
        leases.on_limited_end = self.admission.ended_locked
        self.prefetch = Prefetcher(
            lock,
            clock,
            pending,
            leases,
            wall,
            claims,
            self.admission,
            push=self.push_locked,
            pop_due=self.pop_due_locked,
        )
        # The takers of each list of queues (None: every queue); the plain path has one.
        self._groups: dict[Queues, _Takers] = {None: _Takers(clock.condition(lock))}
        self.waiting = 0  # takers and submitters inside a wait
        self._takers_waiting = 0  # takers inside a wait: while one does, none prefetches
        self.wakeups = 0  # waits that ended
        self.closed = False  # by close_locked(): takes raise, requeues are refused

    def _group_locked(self, queues: Queues) -> _Takers:
        group = self._groups.get(queues)
        if group is None:
            group = self._groups[queues] = _Takers(self._clock.condition(self._lock))
        return group

    def push_locked(self, job: Job) -> None:
        """Put ``job`` in the heap: a taker is told of a new head, and a prefetched job it
        goes before is to be revoked (``Prefetcher.revoke_called_for``, after the lock)."""
        self._pending.push(job)
        if self._pending.is_head(job):
            self.new_head_locked()
        if self.prefetch:
            self.prefetch.overtaken_locked(job, self._clock.now())

    def pop_due_locked(self, now: float, early: float = 0.0, queues: Queues = None) -> Job | None:
        """The next job due (``early`` seconds ahead) of ``queues`` out of its heap; room
        is made."""
        job = self._pending.pop_due(now, early, queues)
        if job is not None:
            self._room.left_locked()
        return job

    def pass_lead_locked(self, queues: Queues = None) -> None:
        """A taker leaves: if takers wait, work remains and no one leads, wake one, so
        that a follower never sleeps untimed past the head's due time while no one else
        is watching the clock."""
        group = self._groups.get(queues)
        if (
            group is not None
            and self.waiting
            and group.leader is None
            and self._pending
            and not self.closed
        ):
            group.available.notify()

    def try_take_locked(
        self,
        worker_id: str,
        early: float,
        more: int,
        prefetchable: Callable[[Job], bool] | None,
        queues: Queues = None,
    ) -> list[Assignment] | None:
        """One look at the heap for JobQueue.take_batch: the batch to hand out ([] for a retired
        worker), or None when the taker must wait."""
        if self.closed:
            raise SchedulerShutdownError("the queue is closed")
        self.prefetch.revoke_called_for_locked()  # a job put back may go before them
        if self._leases.retired_locked(worker_id):
            # A dead worker's call can outlive it in a server thread; handing it a job
            # would leave that job in flight with no one to run it.
            return []
        if self.prefetch.revoking_locked(worker_id):
            return None
        now = self._clock.now()
        admission = self.admission
        if admission.opens:
            admission.reopen_locked(now)
        while True:
            if self.prefetch and self.prefetch.take_back_locked(worker_id, now, queues):
                continue  # what went back to the heap goes first: pop it
            job = self.pop_due_locked(now, early, queues)
            if job is None:
                return None
            if job.at is not None and self._held_locked(job, now):
                continue  # back in the heap until the wall clock reaches its time
            if job.limit is not None and not admission.admit_locked(job, now):
                continue  # parked until its limit has a slot: the next due job
            first = self._leases.grant_locked(job, worker_id, now)
            if more and not self._takers_waiting:
                return [
                    first,
                    *self.prefetch.hand_locked(worker_id, now, more, prefetchable, queues),
                ]
            return [first]

    def lease_ahead_locked(
        self,
        taker: str,
        now: float,
        horizon: float,
        most: int,
        eligible: Callable[[Job], bool] | None = None,
    ) -> list[Assignment]:
        """Up to ``most`` of the next jobs of every queue, due within ``horizon`` seconds,
        out of the heap in its order and in flight under ``taker``'s leases, in one hold
        of the lock: a run window's fill (docs/design/run-window.md). It stops at the
        first job ``eligible`` refuses, one under a limit, and an ``at=`` job the wall
        clock would start early, so that every job left sorts after those taken.

        Raises:
            SchedulerShutdownError: the queue is closed.
        """
        if self.closed:
            raise SchedulerShutdownError("the queue is closed")
        batch: list[Assignment] = []
        fresh: float | None = None  # the wall clock's offset, read once for the batch
        while len(batch) < most:
            heap = self._pending.due_heap(now, None, horizon)
            job = None if heap is None else heap.peek_due(now, horizon)
            if job is None or job.limit is not None or (eligible and not eligible(job)):
                break
            if job.at is not None:
                fresh = self._wall.fresh() if fresh is None else fresh
                if self._wall.early_locked(job, now, fresh):
                    break  # a take puts it back at its new time
            # From the heap it came from: the one default queue's, or its own queue's,
            # without looking across every queue again.
            own = None if self._pending.only is not None else (job.queue,)
            popped = self.pop_due_locked(now, horizon, own)
            assert popped is job
            batch.append(self._leases.grant_locked(job, taker, now))
        return batch

    def wait_for_work_locked(
        self, worker_id: str, deadline: float, early: float, queues: Queues = None
    ) -> bool:
        """Wait for something to take: as the leader (until the head is due, ``early``
        seconds ahead) or a follower (untimed), or, while the taker's own prefetched jobs
        are being revoked, for that to end; False once ``deadline`` has passed."""
        now = self._clock.now()
        remaining = deadline - now
        if remaining <= 0:
            return False
        if self.prefetch.revoking_locked(worker_id):
            self.wait_locked(self.prefetch.revoke_done, remaining)
            return True
        head_due = self._pending.head_due(queues)
        opens = self.admission.next_open_locked()
        if opens is not None:  # a rate window with parked jobs opens then: a due time too
            head_due = opens if head_due is None else min(head_due, opens)
        group = self._group_locked(queues)
        if head_due is None or group.leader is not None:
            self.wait_locked(group.available, remaining, taker=True)
            return True
        me = object()
        group.leader = me
        try:
            # Handed out ``early``, a job is late only past that: one wait, mostly.
            self.wait_locked(
                group.available, min(ahead(head_due - early - now, early), remaining), taker=True
            )
        finally:
            if group.leader is me:
                group.leader = None
        return True

    def _held_locked(self, job: Job, now: float) -> bool:
        """Put back a job just popped for ``at=`` that would start before its wall-clock
        time (its due time, on this monotonic clock, came from a wall-to-monotonic offset
        the wall clock has since fallen behind); True if it went back. Its new due time
        comes from the offset as it is now, kept for the jobs popped after it (equal ``at``
        values keep equal due times, so ties still break by priority, then FIFO)."""
        due = self._wall.held_due_locked(job, now)
        if due is None:
            return False
        job.due = due
        self.push_locked(job)
        return True

    def lease_ahead(
        self,
        taker: str,
        horizon: float,
        most: int,
        eligible: Callable[[Job], bool] | None = None,
    ) -> list[Assignment]:
        """:meth:`lease_ahead_locked` from now, taking the lock. Not a take: no taker
        waits, and nothing is prefetched or taken back.

        Raises:
            SchedulerShutdownError: the queue is closed.
        """
        with self._lock:
            return self.lease_ahead_locked(taker, self._clock.now(), horizon, most, eligible)

    def revoke(self, worker_id: str) -> int:
        """``worker_id``'s prefetched jobs back in the heap (JobQueue.revoke)."""
        with self._lock:
            returned = self.prefetch.revoke_locked(worker_id)
        self.prefetch.revoke_called_for()
        return returned

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End a gone worker's leases, and retire its id (JobQueue.release_worker)."""
        with self._lock:
            self.prefetch.drop_locked(worker_id)
            return self._leases.release_worker_locked(worker_id, self._clock.now())

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        """Retire ``worker_id`` while ``lease_id`` is in flight
        (JobQueue.retire_if_leased)."""
        with self._lock:
            if not self._leases.holds_locked(lease_id):
                return False
            self._leases.retire_locked(worker_id, self._clock.now())
            return True

    def close_locked(self) -> None:
        """Every waiting and future take raises SchedulerShutdownError."""
        self.closed = True
        for group in self._groups.values():
            group.available.notify_all()

    def new_head_locked(self) -> None:
        """A heap has a new head, which may be due sooner than what a leader sleeps
        for: hand each group's lead to one of its waiters, which re-reads the heads."""
        for group in self._groups.values():
            group.leader = None
            group.available.notify()

    def wait_locked(
        self, condition: Waitable, timeout: float | None, *, taker: bool = False
    ) -> None:
        """Wait on ``condition`` (a taker's, or a submitter's for room), counted."""
        if timeout is not None:
            timeout = min(timeout, threading.TIMEOUT_MAX)
        self.waiting += 1
        self._takers_waiting += taker
        try:
            condition.wait(timeout)
        finally:
            self.waiting -= 1
            self._takers_waiting -= taker
            self.wakeups += 1
