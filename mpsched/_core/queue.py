"""JobQueue: the heap of pending jobs, and the lock and conditions that guard it.

A heap, one lock and a timed wait, as in Java's ``DelayedWorkQueue``. It is pure: no
multiprocessing, no pickling, and the clock is injected, so ordering, leases and the
leader/follower wait are tested with threads and a fake clock, without sleeping. The
manager process serves one instance of it to workers and clients. A job leaves the heap
and goes in flight under a lease (mpsched._core.leases) in one step, under this queue's
lock.

One lock, and parts that share it, each with a responsibility of its own:

```
 JobQueue  (the lock; lookups, reports, stats)
   Intake       submits, requeues, cancels: into the heap, and out unrun (intake.py)
   HandOut      takes (the leader/follower wait), workers that leave     (hand_out.py)
   PendingQueues  a heap per named queue, and jobs parked behind a limit  (queues.py)
   PendingJobs  the heaps, their order and lazy deletion                 (heap.py)
   Admission    limits: a slot per job in flight, starts per window      (admission.py)
   Room         the bounds, and submitters waiting for room              (room.py)
   WallOffset   due times of ``at=`` jobs                                (wall_offset.py)
   Prefetcher   jobs handed out ahead, and taking them back              (prefetch.py)
   Leases       jobs in flight, and how jobs ended                       (leases.py)
```

Takers wait leader/follower, as in Java's ``DelayedWorkQueue`` (mpsched._core.hand_out):
one at most sleeps until the head is due, and each event wakes one waiter.
"""

from __future__ import annotations

import dataclasses
import heapq
import operator
import threading
from collections.abc import Callable, Iterable

from mpsched._core.admission import Admission
from mpsched._core.clock import Clock, SystemClock
from mpsched._core.hand_out import HandOut
from mpsched._core.intake import Intake
from mpsched._core.job import (
    Assignment,
    Job,
    JobRequest,
    JobState,
    Lease,
    Order,
    Outcome,
    OutcomeKind,
    Payload,
    Priority,
    QueueStats,
    check_name,
)
from mpsched._core.leases import Leases, LostLease, percentiles
from mpsched._core.limits import Limits, LimitSpec
from mpsched._core.prefetch import Claims, Prefetcher
from mpsched._core.queues import PendingQueues, Queues
from mpsched._core.room import Room
from mpsched._core.wall_offset import WallOffset

_by_seq = operator.attrgetter("seq")


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
        limits: the limits jobs may name, by name (mpsched._core.limits).
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
        limits: dict[str, LimitSpec] | None = None,
    ) -> None:
        self._clock = clock if clock is not None else SystemClock()
        # Guards the heap and every part below (each shares it; their conditions say who
        # waits on them). Held only for heap and table updates, never while a job runs,
        # while anything crosses a process boundary, or for any system call beyond a
        # condition's wait (a timeout kill runs after retire_if_leased, outside; a
        # revocation's Claims.revoke runs with the lock let go: the Prefetcher lets go of
        # it). Besides the heap, it covers on_returned (the journal's non-blocking append
        # of a requeue record).
        self._lock = threading.Lock()
        self.leases = Leases(self._lock, self._clock)
        self._pending = PendingQueues(
            Order.coerce(order), None if max_pending_bytes is None else sizer
        )
        self._room = Room(
            self._lock, self._clock, self._pending, max_pending, max_pending_bytes, sizer
        )
        self._wall = WallOffset(self._clock)
        self._admission = Admission(
            Limits(limits), self._clock, self._pending, push=self._push_locked
        )
        self.leases.on_limited_end = self._admission.ended_locked
        self._prefetch = Prefetcher(
            self._lock,
            self._clock,
            self._pending,
            self.leases,
            self._wall,
            claims,
            self._admission,
            push=self._push_locked,
            pop_due=self._pop_due_locked,
        )
        self._prefetch.on_returned = on_returned
        self._hand_out = HandOut(
            self._lock,
            self._clock,
            self._pending,
            self._wall,
            self.leases,
            self._prefetch,
            self._admission,
            push=self._push_locked,
            pop_due=self._pop_due_locked,
        )
        self._intake = Intake(
            self._lock,
            self._clock,
            self._pending,
            self._room,
            self._wall,
            self.leases,
            self._prefetch,
            self._hand_out,
            self._admission.limits,
            push=self._push_locked,
        )

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

    def submit_many(
        self,
        requests: list[JobRequest],
        timeout: float | None = None,
        seqs: list[int] | None = None,
        due: float | None = None,
        *,
        checked: bool = False,
        refuse_running: bool = False,
    ) -> None:
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
        self._intake.submit_many(requests, timeout, seqs, due, checked, refuse_running)

    def reserve_seqs(self, count: int) -> list[int]:
        """Take ``count`` submission counters for jobs :meth:`submit_many` will add."""
        return self._intake.reserve_seqs(count)

    def restore(self, jobs: list[Job], next_seq: int) -> None:
        """Put back jobs recovered from a store (their due, priority and seq kept), before
        any submit; new jobs get seqs from ``next_seq`` on, so they order after these."""
        self._intake.restore(jobs, next_seq)

    def hold_in_flight(self, worker_id: str, jobs: list[Job]) -> None:
        """Put in flight with ``worker_id`` jobs a store says were running on it when the
        manager before this one died (a remote worker that may still run them), before
        any take: their attempts as the store has them."""
        with self._lock:
            now = self._clock.now()
            for job in jobs:
                if job.limit is not None:
                    self._admission.limits.hold_locked(job.limit)
                self.leases.hold_locked(job, worker_id, now)

    def return_lease(self, lease_id: int) -> Job | None:
        """Take back a job just handed out that must not run (its lease could not be
        journalled): it goes back to the heap as never received. Returns the job."""
        return self._intake.return_lease(lease_id)

    def count_withdrawn(self, count: int) -> None:
        """Count jobs a client cancelled before sending them: submitted, then cancelled
        (and jobs cancelled while they waited for their parents)."""
        self._intake.count_withdrawn(count)

    def count_submitted(self, count: int) -> None:
        """Count jobs submitted that wait for their parents, out of the heap."""
        self._intake.count_submitted(count)

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put back a job whose lease was lost, keeping its due time and seq (so it goes
        first among what is due).

        ``retry``: the worker had received it, so this is another attempt; otherwise it
        never started and its attempt is not counted. Returns False when the queue is closed
        (the job then stays out).
        """
        return self._intake.requeue(job, retry=retry)

    def cancel(self, job_id: str) -> bool:
        """Remove a pending job. Returns False when it is not pending (taken, done, unknown).

        The entry is marked, not searched for: the heaps drop it when it reaches their top.
        """
        return bool(self.cancel_jobs([job_id]))

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Remove the pending jobs among ``job_ids``; returns them (as :meth:`cancel`). A
        prefetched job its worker has not started is taken back first, and removed too."""
        return self._intake.cancel_jobs(job_ids)

    def reschedule(self, job_id: str, due: float) -> bool:
        """Move a pending job to another due time (this queue's clock), keeping its seq;
        False when it is not pending. (A cron run after the wall clock jumped.)"""
        return self._intake.reschedule(job_id, due)

    def cancel_client(self, client_id: str, *, not_due_only: bool = False) -> list[str]:
        """Remove every pending job of one client (with ``not_due_only``, only those whose
        due time is still ahead); returns their ids."""
        return [job.job_id for job in self.cancel_client_jobs(client_id, not_due_only=not_due_only)]

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        """As :meth:`cancel_client`; returns the jobs removed."""
        return self._intake.cancel_client_jobs(client_id, not_due_only=not_due_only)

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

    def take_batch(
        self,
        worker_id: str,
        timeout: float,
        early: float = 0.0,
        more: int = 0,
        prefetchable: Callable[[Job], bool] | None = None,
        queues: Queues = None,
    ) -> list[Assignment]:
        """:meth:`take`, then up to ``more`` jobs more that are due already: prefetched,
        each revocable until ``worker_id`` claims it (mpsched._core.prefetch).

        ``queues``: the queues the taker serves, in order (None: every queue). It gets
        the due jobs of the first of them that has one.

        Only jobs with no timeout that ``prefetchable`` accepts are prefetched, only with
        Claims, and only while no other taker waits. A take ends the taker's previous
        batch: it started each of its jobs, or was refused them (revoked). A taker that
        finds nothing due takes back another worker's prefetched jobs and gets the first.

        Returns:
            The assignments in the order to start them; [] when no job became due in time.
        Raises:
            SchedulerShutdownError: the queue was closed; the taker should exit.
        """
        hand_out = self._hand_out
        with self._lock:
            self._prefetch.forget_locked(worker_id)
            deadline = self._clock.now() + timeout
            try:
                while True:
                    batch = hand_out.try_take_locked(worker_id, early, more, prefetchable, queues)
                    if batch is not None:
                        return batch
                    if not hand_out.wait_for_work_locked(worker_id, deadline, early, queues):
                        return []
            finally:  # pass the lead on (nobody waiting: skip the call, it is per job)
                if hand_out.waiting:
                    hand_out.pass_lead_locked(queues)

    def revoke(self, worker_id: str) -> int:
        """Take back the prefetched jobs ``worker_id`` has not started (it leaves); they go
        back to the heap as never received. Returns how many did."""
        return self._hand_out.revoke(worker_id)

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds (it died or went away) and return them.

        The worker id is retired: a ``take`` still running for it returns None.
        """
        return self._hand_out.release_worker(worker_id)

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        """Retire ``worker_id`` (no take hands it a job again) if ``lease_id`` is still in
        flight; True if it was.

        A worker about to be killed for a job past its timeout is retired first, so the
        kill can run outside this lock (psutil walking a process tree takes milliseconds,
        and every take would wait on it) and still never hit a job the worker took after
        reporting the late one: it gets none. Its leases end when its process is seen to
        exit (:meth:`release_worker`).
        """
        return self._hand_out.retire_if_leased(worker_id, lease_id)

    def expired(self) -> tuple[list[Lease], float | None]:
        """Leases past their job's timeout, and the earliest deadline still ahead."""
        return self.leases.expired()

    def complete(self, lease_id: int, outcome: Outcome, worker_id: str = "") -> Job | None:
        """End a lease with its worker's outcome; the job, or None if it had ended.
        ``worker_id``: the worker reporting it (it started its batch up to this lease)."""
        with self._lock:
            self._prefetch.started_locked(worker_id, lease_id)
            return self.leases.complete_locked(lease_id, outcome)

    def retry(
        self,
        lease_id: int,
        outcome: Outcome,
        worker_id: str,
        delay_of: Callable[[Job], float | None],
    ) -> tuple[Job | None, float | None]:
        """End a lease whose job failed in a way that may run again, and in the same step
        put the job back in the heap, due ``delay_of(job)`` seconds from now; when that is
        None (or the queue is closed), end it as :meth:`complete` does. Returns the job
        (None for a lease that had ended) and the delay (None: it ended for good)."""
        with self._lock:
            self._prefetch.started_locked(worker_id, lease_id)
            job = self.leases.job_locked(lease_id)
            delay = None if job is None or self._hand_out.closed else delay_of(job)
            if delay is None:
                return self.leases.complete_locked(lease_id, outcome), None
            self.leases.complete_locked(lease_id, outcome, final=False)
            assert job is not None
            self._intake.retry_locked(
                job, self._clock.now() + delay, later=outcome.error_kind != OutcomeKind.RETRYABLE
            )
        self._prefetch.revoke_called_for()
        return job, delay

    def fail(self, job: Job, *, timed_out: bool = False, crashed: bool = True) -> None:
        """Count ``job`` (its lease already ended, or it never ran: ``crashed`` False) as
        failed."""
        self.leases.fail(job, timed_out=timed_out, crashed=crashed)

    def due_of(self, request: JobRequest) -> float:
        """The instant on this queue's clock a request's ``delay`` or ``at`` gives now."""
        with self._lock:
            return self._wall.due_locked(request, self._clock.now())

    def release(self, jobs: list[Job]) -> None:
        """Put in the heap jobs that waited for their parents (submitted, seqs taken,
        each ``due`` its own time), at once: no bound makes them wait. A time already
        past means due now. Nothing happens once the queue is closed."""
        self._intake.release(jobs)

    def wait_drained(self, timeout: float) -> bool:
        """Wait until no job is in flight; False if some still are after ``timeout``."""
        return self.leases.wait_drained(timeout)

    def close(self) -> None:
        """Stop: every waiting or future ``take``/``submit`` raises SchedulerShutdownError."""
        with self._lock:
            self._hand_out.close_locked()
            self._room.close_locked()

    # -------------------------------------------------------------- lookups, stats

    def find(self, job_id: str) -> tuple[Job, str | None] | None:
        """A job pending (worker None) or in flight (with its worker's id), by id; None
        when it is neither. The Job is the queue's own record: read it, do not change it."""
        with self._lock:
            job = self._pending.get(job_id)
            if job is not None:
                return job, None
            found = self.leases.find_locked(job_id)
            return None if found is None else (found[0], found[1].worker_id)

    def set_progress(self, lease_id: int, job_id: str, progress: str) -> bool:
        """Note the latest progress of a job in flight under ``lease_id`` (JSON text);
        False, and nothing changes, when that lease has ended."""
        with self._lock:
            found = self.leases.find_locked(job_id)
            if found is None or found[1].lease_id != lease_id:
                return False
            found[0].progress = progress
            return True

    def jobs(
        self, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[Job, str | None]]:
        """The jobs pending (worker None) or in flight (with its worker's id), in
        submission order: those in ``state`` (PENDING or RUNNING; None: both), the first
        ``limit`` of them (None: all). The lock is held for a copy of the heap's list;
        choosing the first ``limit`` (O(n log limit)) happens after. The Jobs are the
        queue's own records: read them only."""
        with self._lock:
            # A snapshot: iterating PendingJobs copies its jobs when the iterator is made.
            pending: Iterable[Job] = (
                iter(self._pending) if state in (None, JobState.PENDING) else ()
            )
            running: list[tuple[Job, str | None]] = (
                [(job, lease.worker_id) for job, lease in self.leases.jobs_locked()]
                if state in (None, JobState.RUNNING)
                else []
            )
        if limit is not None:
            pending = heapq.nsmallest(limit, pending, key=_by_seq)
        jobs: list[tuple[Job, str | None]] = [(job, None) for job in pending]
        jobs += running
        jobs.sort(key=lambda entry: entry[0].seq)
        return jobs if limit is None else jobs[:limit]

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in the order takers would get them, without taking
        any: O(n log n) under the lock however many are pending. The Jobs are the queue's
        own records: read them only."""
        with self._lock:
            return self._pending.first(n)

    def not_due(self, client_id: str) -> list[str]:
        """The ids of one client's pending jobs whose due time is still ahead."""
        return self._intake.not_due(client_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    # ------------------------------------------------------------ queues and limits

    def pending_by_queue(self) -> dict[str, int]:
        """Pending jobs per queue (those waiting for a limit included)."""
        with self._lock:
            return self._pending.by_queue()

    def waiting_for(self, job_id: str) -> str | None:
        """``"limit NAME"`` for a pending job parked behind its full limit; else None."""
        with self._lock:
            limit = self._pending.parked_limit(job_id)
        return None if limit is None else f"limit {limit}"

    def limits(self) -> dict[str, LimitSpec]:
        """The limits jobs may name, by name."""
        with self._lock:
            return self._admission.limits.specs()

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Raises InvalidJobError when a request names a queue or a limit that is not
        valid, or a limit that is not declared."""
        for request in requests:
            check_name("queue", request.queue)
        with self._lock:
            for request in requests:
                self._admission.limits.check(request.limit)

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) remove a limit; parked jobs it now admits become
        takeable at once."""
        with self._lock:
            self._admission.set_locked(name, spec)
        self._prefetch.revoke_called_for()

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
                submitted=self._intake.submitted,
                completed=done.completed,
                failed=done.failed,
                cancelled=self._intake.cancelled,
                retried=self._intake.retried,
                retried_exception=self._intake.retried_exception,
                retried_later=self._intake.retried_later,
                timed_out=done.timed_out,
                started_early=done.started_early,
                next_due_in=None if head_due is None else head_due - self._clock.now(),
                lateness={},
                lateness_samples=done.lateness_samples,
                wakeups=self._hand_out.wakeups,
                waiting=self._hand_out.waiting,
                crashed=done.crashed,
                prefetched=self._prefetch.handed,
                revoked=self._prefetch.revoked,
            )
        # Sorted here, outside the lock: 10,000 samples take milliseconds, which every
        # take would otherwise wait out.
        return dataclasses.replace(stats, lateness=percentiles(done.recent)) if lateness else stats

    # ------------------------------------------------ the heap's two moves, lock held

    def _push_locked(self, job: Job) -> None:
        """Put ``job`` in the heap: a taker is told of a new head, and a prefetched job it
        goes before is to be revoked (``Prefetcher.revoke_called_for``, after the lock)."""
        self._pending.push(job)
        if self._pending.is_head(job):
            self._hand_out.new_head_locked()
        if self._prefetch:
            self._prefetch.overtaken_locked(job, self._clock.now())

    def _pop_due_locked(self, now: float, early: float = 0.0, queues: Queues = None) -> Job | None:
        """The next job due (``early`` seconds ahead) of ``queues`` out of its heap; room
        is made."""
        job = self._pending.pop_due(now, early, queues)
        if job is not None:
            self._room.left_locked()
        return job
