"""JobQueue: the heap of pending jobs, and the lock and conditions that guard it.

This is the seed design's ``JobScheduler`` grown up. It is pure: no multiprocessing, no
pickling, and the clock is injected, so ordering, leases and the leader/follower wait are
tested with threads and a fake clock, without sleeping. The manager process serves one
instance of it to workers and clients. A job leaves the heap and goes in flight under a
lease (mpsched._core.leases) in one step, under this queue's lock.

Waiting follows Java's ``DelayedWorkQueue`` (leader/follower): at most one taker, the
*leader*, sleeps with a timeout equal to the head job's remaining delay; every other taker
waits untimed on the same condition. Whoever changes the head, or the leader on its way out,
wakes exactly one waiter. So a due job is never stranded behind a busy or sleeping taker (the
seed's ``signal()`` trap), and each event wakes O(1) threads instead of all of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable

from mpsched._core.clock import Clock, SystemClock, Waitable
from mpsched._core.heap import PendingJobs
from mpsched._core.job import (
    Assignment,
    Job,
    JobRequest,
    Lease,
    Order,
    Outcome,
    Payload,
    Priority,
    QueueStats,
    check_request,
)
from mpsched._core.leases import Leases, LostLease, percentiles
from mpsched._core.prefetch import Claims, Prefetcher
from mpsched._core.room import Room
from mpsched._core.wall_offset import WallOffset
from mpsched._errors import InvalidJobError, SchedulerShutdownError


class JobQueue:
    """Pending jobs in heap order, handed out under leases to takers.

    Args:
        clock: the time source; ``SystemClock()`` by default.
        order: ``"time"`` (due, priority, seq) or ``"priority"`` (among due jobs: priority,
            due, seq).
        max_pending: bound on pending jobs; ``submit`` then waits for room. ``None``: no bound.
        max_pending_bytes: bound on what pending payloads hold, as ``sizer`` measures a
            payload (its length by default); ``submit`` then waits for room the same way.
        claims: how workers claim prefetched jobs (mpsched._core.prefetch); None: no job
            is ever prefetched.
        on_returned: told of each job a revocation put back in the heap, before any taker
            can get it again (the journal records it pending); called with this queue's
            lock held, so it must not block.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        order: Order | str = Order.TIME,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        sizer: Callable[[Payload], int] = len,
        claims: Claims | None = None,
        on_returned: Callable[[Job], None] | None = None,
    ) -> None:
        self._clock = clock if clock is not None else SystemClock()
        self._order = Order.coerce(order)
        # Guards every field below. Held only for heap and table updates, never while a
        # job runs, while anything crosses a process boundary, or for any system call
        # beyond a condition's wait (a timeout kill runs after retire_if_leased, outside;
        # a revocation's Claims.revoke runs with the lock let go). Besides the heap, it
        # covers on_returned (the journal's non-blocking append of a requeue record).
        self._lock = threading.Lock()
        # Takers wait here: untimed when the heap is empty or another taker leads, timed
        # (head's delay) when leading. Notified (one waiter) by a submit that makes a new
        # head, a cancel that removes the head, and a leaving taker when work remains and
        # no leader does; notified all by close().
        self._available = self._clock.condition(self._lock)
        # Jobs in flight, and how the others ended; shares this lock.
        self.leases = Leases(self._lock, self._clock)
        # The pending jobs in heap order (mpsched._core.heap); shares this lock.
        self._pending = PendingJobs(self._order, None if max_pending_bytes is None else sizer)
        # The bounds on pending jobs, and the submitters waiting for room; shares this lock.
        self._room = Room(self._lock, self._clock, self._pending, max_pending,
                          max_pending_bytes, sizer)
        # Due times of jobs asked for at a wall-clock time (mpsched._core.wall_offset).
        self._wall = WallOffset(self._clock)
        # Jobs handed out ahead of time, revocable until started (mpsched._core.prefetch);
        # shares this lock, and lets go of it while it revokes.
        self._prefetch = Prefetcher(self._lock, self._clock, self._pending, self.leases,
                                    self._wall, claims, push=self._push_locked,
                                    pop_due=self._pop_due_locked)
        self._prefetch.on_returned = on_returned
        self._leader: object | None = None  # the taker sleeping until the head is due
        self._waiting = 0  # takers and submitters inside a wait
        self._takers_waiting = 0  # takers inside a wait: while one does, none prefetches
        self._closed = False
        self._seq = itertools.count()
        self._submitted = self._cancelled = self._retried = 0
        self._wakeups = 0

    def set_on_returned(self, on_returned: Callable[[Job], None] | None) -> None:
        """Set the constructor's ``on_returned`` (its journal is made after the queue)."""
        with self._lock:
            self._prefetch.on_returned = on_returned

    @property
    def clock(self) -> Clock:
        """The clock due times are kept on."""
        return self._clock

    @property
    def max_pending(self) -> int | None:
        return self._room.max_pending

    @property
    def max_pending_bytes(self) -> int | None:
        return self._room.max_bytes

    # ----------------------------------------------------------------- submit / cancel

    def submit(self, request: JobRequest, timeout: float | None = None) -> None:
        """Add a job. Waits for room up to ``timeout`` seconds when the queue is bounded.

        The due time is the manager's receipt plus ``delay``, or ``at`` converted with one
        fixed wall-to-monotonic offset; a time already past means due now.

        Raises:
            InvalidJobError: a time that is not a finite number, an unknown priority, or a
                job id already pending.
            QueueFullError: no room appeared within ``timeout``.
            SchedulerShutdownError: the queue was closed.
        """
        self.submit_many([request], timeout)

    def submit_many(self, requests: list[JobRequest], timeout: float | None = None,
                    seqs: list[int] | None = None, due: float | None = None, *,
                    checked: bool = False, refuse_running: bool = False) -> None:
        """Add jobs all at once, in order (consecutive seqs), or none of them.

        ``due``: an instant on this queue's clock that every job of the batch is due at,
        instead of their ``delay``/``at`` (a schedule's run, planned on this clock).

        ``seqs``: the submission counters to use, taken earlier with :meth:`reserve_seqs`
        (a store journals a job with its seq before it enters the heap).

        ``checked``: the caller already ran ``check_request`` on every request.
        ``refuse_running``: refuse the id of a job in flight too (the id of a job that left
        the heap may otherwise be used again).

        A bounded queue waits until there is room for the whole batch. Raises as
        :meth:`submit`, and InvalidJobError for a batch larger than ``max_pending`` or one
        that repeats a job id (in the batch, or of a pending job).
        """
        if not checked:
            for request in requests:
                check_request(request)
        if len({r.job_id for r in requests}) != len(requests):
            raise InvalidJobError("a batch repeats a job id")
        size = self._room.batch_size(requests)
        with self._lock:
            now = self._clock.now()
            dues = [self._wall.due_locked(request, now) if due is None else max(due, now)
                    for request in requests]
            self._room.wait_locked(now, timeout, len(requests), size, self._wait_locked)
            # Checked after the wait: another submitter may have queued an id meanwhile.
            for request in requests:
                if request.job_id in self._pending:
                    raise InvalidJobError(f"job id {request.job_id!r} is already pending")
                if refuse_running and self.leases.find_locked(request.job_id):
                    raise InvalidJobError(f"job id {request.job_id!r} is already running")
            old_head = self._pending.head()
            order = seqs if seqs is not None else [next(self._seq) for _ in requests]
            planned = due is not None  # on this clock: the requests' own times are not used
            jobs = [Job(job_id=request.job_id, client_id=request.client_id,
                        payload=request.payload, priority=request.priority, due=job_due,
                        seq=seq, timeout=request.timeout, retries=request.retries,
                        key=request.key, name=request.name,
                        at=None if planned else request.at)
                    for request, job_due, seq in zip(requests, dues, order, strict=True)]
            for job in jobs:
                self._pending.push(job)
            self._submitted += len(requests)
            if self._pending.head() is not old_head:
                self._new_head_locked()
            due_now = [job for job in jobs if job.due <= now] if self._prefetch else []
            if due_now:  # of those due, only the first in heap order can go before one
                self._prefetch.overtaken_locked(min(due_now, key=self._pending.key), now)
        self._prefetch.revoke_called_for()

    def reserve_seqs(self, count: int) -> list[int]:
        """Take ``count`` submission counters for jobs :meth:`submit_many` will add."""
        with self._lock:
            return [next(self._seq) for _ in range(count)]

    def restore(self, jobs: list[Job], next_seq: int) -> None:
        """Put back jobs recovered from a store (their due, priority and seq kept), before
        any submit; new jobs get seqs from ``next_seq`` on, so they order after these."""
        with self._lock:
            self._pending.restore(jobs)
            self._seq = itertools.count(next_seq)
            self._submitted += len(jobs)
            if len(self._pending):
                self._new_head_locked()

    def return_lease(self, lease_id: int) -> Job | None:
        """Take back a job just handed out that must not run (its lease could not be
        journalled): it goes back to the heap as never received. Returns the job."""
        with self._lock:
            job = self.leases.drop_locked(lease_id)
            if job is None or self._closed:
                return job
            job.attempt -= 1
            self._push_locked(job)
        self._prefetch.revoke_called_for()
        return job

    def count_withdrawn(self, count: int) -> None:
        """Count jobs a client cancelled before sending them: submitted, then cancelled."""
        with self._lock:
            self._submitted += count
            self._cancelled += count

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put back a job whose lease was lost, keeping its due time and seq (so it goes
        first among what is due).

        ``retry``: the worker had received it, so this is another attempt; otherwise it
        never started and its attempt is not counted. Returns False when the queue is closed
        (the job then stays out).
        """
        with self._lock:
            if self._closed:
                return False
            if retry:
                self._retried += 1
            else:
                job.attempt -= 1
            self._push_locked(job)
        self._prefetch.revoke_called_for()
        return True

    def cancel(self, job_id: str) -> bool:
        """Remove a pending job. Returns False when it is not pending (taken, done, unknown).

        The entry is marked, not searched for: the heaps drop it when it reaches their top.
        """
        return bool(self.cancel_jobs([job_id]))

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Remove the pending jobs among ``job_ids``; returns them (as :meth:`cancel`). A
        prefetched job its worker has not started is taken back first, and removed too."""
        with self._lock:
            self._prefetch.cancel_locked(job_ids)
            old_head = self._pending.head()
            jobs = [job for job_id in job_ids if (job := self._pending.remove(job_id))]
            if jobs:
                self._removed_locked(len(jobs), old_head)
        self._prefetch.revoke_called_for()
        return jobs

    def reschedule(self, job_id: str, due: float) -> bool:
        """Move a pending job to another due time (this queue's clock), keeping its seq;
        False when it is not pending. (A cron run after the wall clock jumped.)"""
        with self._lock:
            old_head = self._pending.head()
            job = self._pending.remove(job_id)
            if job is None:
                return False
            self._removed_locked(0, old_head)  # moved, not cancelled
            self._push_locked(dataclasses.replace(job, due=due, cancelled=False))
        self._prefetch.revoke_called_for()
        return True

    def find(self, job_id: str) -> tuple[Job, str | None] | None:
        """A job pending (worker None) or in flight (with its worker's id), by id; None
        when it is neither. The Job is the queue's own record: read it, do not change it."""
        with self._lock:
            job = self._pending.get(job_id)
            if job is not None:
                return job, None
            found = self.leases.find_locked(job_id)
            return None if found is None else (found[0], found[1].worker_id)

    def jobs(self) -> list[tuple[Job, str | None]]:
        """Every job pending (worker None) or in flight (with its worker's id), in
        submission order. The Jobs are the queue's own records: read them only."""
        with self._lock:
            jobs: list[tuple[Job, str | None]] = [(job, None) for job in self._pending]
            jobs += [(job, lease.worker_id) for job, lease in self.leases.jobs_locked()]
        return sorted(jobs, key=lambda entry: entry[0].seq)

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in the order takers would get them, without taking
        any: O(n log n) under the lock however many are pending. The Jobs are the queue's
        own records: read them only."""
        with self._lock:
            return self._pending.first(n)

    def not_due(self, client_id: str) -> list[str]:
        """The ids of one client's pending jobs whose due time is still ahead."""
        with self._lock:
            now = self._clock.now()
            return [j.job_id for j in self._pending
                    if j.client_id == client_id and j.due > now]

    def cancel_client(self, client_id: str, *, not_due_only: bool = False) -> list[str]:
        """Remove every pending job of one client (with ``not_due_only``, only those whose
        due time is still ahead); returns their ids."""
        return [job.job_id for job in self.cancel_client_jobs(client_id,
                                                              not_due_only=not_due_only)]

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        """As :meth:`cancel_client`; returns the jobs removed."""
        with self._lock:
            now = self._clock.now()
            jobs = [j for j in self._pending
                    if j.client_id == client_id and not (not_due_only and j.due <= now)]
            old_head = self._pending.head()
            for job in jobs:
                self._pending.remove(job.job_id)
            if jobs:
                self._removed_locked(len(jobs), old_head)
            return jobs

    # ------------------------------------------------------------------------ take

    def take(self, worker_id: str, timeout: float, early: float = 0.0) -> Assignment | None:
        """Hand out the next due job under a new lease, waiting at most ``timeout`` seconds.

        ``early``: hand a job out up to this many seconds before it is due. The taker must
        then wait for ``Assignment.due`` itself (a worker on this machine, sharing this
        monotonic clock, sleeps the rest): the hand-off latency then overlaps the wait
        instead of adding to the job's lateness.

        Returns None when no job became due in time, so a caller that went away holds no
        server thread (and no job) for longer than one ``timeout``.

        Raises:
            SchedulerShutdownError: the queue was closed; the taker should exit.
        """
        batch = self.take_batch(worker_id, timeout, early)
        return batch[0] if batch else None

    def take_batch(self, worker_id: str, timeout: float, early: float = 0.0, more: int = 0,
                   prefetchable: Callable[[Job], bool] | None = None) -> list[Assignment]:
        """:meth:`take`, then up to ``more`` jobs more that are due already: prefetched,
        each revocable until ``worker_id`` claims it (mpsched._core.prefetch).

        Only jobs with no timeout that ``prefetchable`` accepts are prefetched, only with
        Claims, and only while no other taker waits. A take ends the taker's previous
        batch: it started each of its jobs, or was refused them (revoked). A taker that
        finds nothing due takes back another worker's prefetched jobs and gets the first.

        Returns:
            The assignments in the order to start them; [] when no job became due in time.
        Raises:
            SchedulerShutdownError: the queue was closed; the taker should exit.
        """
        with self._lock:
            self._prefetch.forget_locked(worker_id)
            deadline = self._clock.now() + timeout
            try:
                while True:
                    batch = self._try_take_locked(worker_id, early, more, prefetchable)
                    if batch is not None:
                        return batch
                    if not self._wait_for_work_locked(worker_id, deadline, early):
                        return []
            finally:
                # Pass leadership on: without this, a follower could sleep untimed past
                # the head's due time while no one else is watching the clock. (With
                # nobody waiting there is no one to notify: skip the call, it is per job.)
                if self._waiting and self._leader is None and self._pending \
                        and not self._closed:
                    self._available.notify()

    def _try_take_locked(self, worker_id: str, early: float, more: int,
                         prefetchable: Callable[[Job], bool] | None) -> list[Assignment] | None:
        """One look at the heap for ``take_batch``: the batch to hand out ([] for a retired
        worker), or None when the taker must wait."""
        if self._closed:
            raise SchedulerShutdownError("the queue is closed")
        self._prefetch.revoke_called_for_locked()  # a job put back may go before them
        if self.leases.retired_locked(worker_id):
            # A dead worker's call can outlive it in a server thread; handing it a job
            # would leave that job in flight with no one to run it.
            return []
        if self._prefetch.revoking_locked(worker_id):
            return None
        now = self._clock.now()
        while True:
            if self._prefetch and self._prefetch.take_back_locked(worker_id, now):
                continue  # what went back to the heap goes first: pop it
            job = self._pop_due_locked(now, early)
            if job is None:
                return None
            if job.at is not None and self._held_locked(job, now):
                continue  # back in the heap until the wall clock reaches its time
            first = self.leases.grant_locked(job, worker_id, now)
            if more and not self._takers_waiting:
                return [first, *self._prefetch.hand_locked(worker_id, now, more, prefetchable)]
            return [first]

    def _wait_for_work_locked(self, worker_id: str, deadline: float, early: float) -> bool:
        """Wait for something to take: as the leader (until the head is due, ``early``
        seconds ahead) or a follower (untimed), or, while the taker's own prefetched jobs
        are being revoked, for that to end; False once ``deadline`` has passed."""
        now = self._clock.now()
        remaining = deadline - now
        if remaining <= 0:
            return False
        if self._prefetch.revoking_locked(worker_id):
            self._wait_locked(self._prefetch.revoke_done, remaining)
            return True
        head_due = self._pending.head_due()
        if head_due is None or self._leader is not None:
            self._wait_locked(self._available, remaining, taker=True)
            return True
        me = object()
        self._leader = me
        try:
            self._wait_locked(self._available, min(head_due - early - now, remaining),
                              taker=True)
        finally:
            if self._leader is me:
                self._leader = None
        return True

    def revoke(self, worker_id: str) -> int:
        """Take back the prefetched jobs ``worker_id`` has not started (it leaves); they go
        back to the heap as never received. Returns how many did."""
        with self._lock:
            returned = self._prefetch.revoke_locked(worker_id)
        self._prefetch.revoke_called_for()
        return returned

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds (it died or went away) and return them.

        The worker id is retired: a ``take`` still running for it returns None.
        """
        with self._lock:
            self._prefetch.drop_locked(worker_id)
            return self.leases.release_worker_locked(worker_id, self._clock.now())

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        """Retire ``worker_id`` (no take hands it a job again) if ``lease_id`` is still in
        flight; True if it was.

        A worker about to be killed for a job past its timeout is retired first, so the
        kill can run outside this lock (psutil walking a process tree takes milliseconds,
        and every take would wait on it) and still never hit a job the worker took after
        reporting the late one: it gets none. Its leases end when its process is seen to
        exit (:meth:`release_worker`).
        """
        with self._lock:
            if not self.leases.holds_locked(lease_id):
                return False
            self.leases.retire_locked(worker_id, self._clock.now())
            return True

    def expired(self) -> tuple[list[Lease], float | None]:
        """Leases past their job's timeout, and the earliest deadline still ahead."""
        return self.leases.expired()

    def complete(self, lease_id: int, outcome: Outcome, worker_id: str = "") -> Job | None:
        """End a lease with its worker's outcome; the job, or None if it had ended.
        ``worker_id``: the worker reporting it (it started its batch up to this lease)."""
        with self._lock:
            self._prefetch.started_locked(worker_id, lease_id)
            return self.leases.complete_locked(lease_id, outcome)

    def fail(self, job: Job, *, timed_out: bool = False) -> None:
        """Count ``job`` (its lease already ended) as failed."""
        self.leases.fail(job, timed_out=timed_out)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until no job is in flight; False if some still are after ``timeout``."""
        return self.leases.wait_drained(timeout)

    def close(self) -> None:
        """Stop: every waiting or future ``take``/``submit`` raises SchedulerShutdownError."""
        with self._lock:
            self._closed = True
            self._available.notify_all()
            self._room.close_locked()

    # ----------------------------------------------------------------------- stats

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def stats(self, *, lateness: bool = True) -> QueueStats:
        """Counters, pending jobs per priority and recent lateness percentiles (with
        ``lateness`` False, none: ``QueueStats.lateness`` is empty, and no sample is
        copied or sorted)."""
        with self._lock:
            pending = {p.name.lower(): self._pending.levels[p.level] for p in Priority}
            head_due = self._pending.head_due()
            if self._pending.has_ready():
                head_due = self._clock.now()
            done = self.leases.outcomes_locked(samples=lateness)
            stats = QueueStats(
                pending=pending,
                in_flight=done.in_flight,
                submitted=self._submitted,
                completed=done.completed,
                failed=done.failed,
                cancelled=self._cancelled,
                retried=self._retried,
                timed_out=done.timed_out,
                started_early=done.started_early,
                next_due_in=None if head_due is None else head_due - self._clock.now(),
                lateness={},
                lateness_samples=done.lateness_samples,
                wakeups=self._wakeups,
                waiting=self._waiting,
                crashed=done.crashed,
                prefetched=self._prefetch.handed,
                revoked=self._prefetch.revoked,
            )
        # Sorted here, outside the lock: 10,000 samples take milliseconds, which every
        # take would otherwise wait out.
        return dataclasses.replace(stats, lateness=percentiles(done.recent)) if lateness \
            else stats

    # ------------------------------------------------------- helpers, lock held

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
        self._push_locked(job)
        return True

    def _push_locked(self, job: Job) -> None:
        self._pending.push(job)
        if self._pending.head() is job:
            self._new_head_locked()
        if self._prefetch:
            self._prefetch.overtaken_locked(job, self._clock.now())

    def _new_head_locked(self) -> None:
        # A new head may be due sooner than what the leader sleeps for: hand the lead to
        # one waiter, which re-reads the head.
        self._leader = None
        self._available.notify()

    def _removed_locked(self, cancelled: int, old_head: Job | None) -> None:
        """After jobs left the heap unrun: count them, wake submitters waiting for room,
        and hand the lead on if the head changed (``old_head``: the top before)."""
        self._cancelled += cancelled
        self._room.left_locked()
        if self._pending.head() is not old_head:
            self._new_head_locked()

    def _pop_due_locked(self, now: float, early: float = 0.0) -> Job | None:
        job = self._pending.pop_due(now, early)
        if job is not None:
            self._room.left_locked()
        return job

    def _wait_locked(self, condition: Waitable, timeout: float | None, *,
                     taker: bool = False) -> None:
        if timeout is not None:
            timeout = min(timeout, threading.TIMEOUT_MAX)
        self._waiting += 1
        self._takers_waiting += taker
        try:
            condition.wait(timeout)
        finally:
            self._waiting -= 1
            self._takers_waiting -= taker
            self._wakeups += 1
