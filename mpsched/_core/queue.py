"""JobQueue: the heap of pending jobs, and the lock and conditions that guard it.

A heap, one lock and a timed wait, as in Java's ``DelayedWorkQueue``. It is pure: no
multiprocessing, no pickling, and the clock is injected, so ordering, leases and the
leader/follower wait are tested with threads and a fake clock, without sleeping. The
manager process serves one instance of it to workers and clients. A job leaves the heap
and goes in flight under a lease (mpsched._core.leases) in one step, under this queue's
lock.

One lock, and parts that share it, each with a responsibility of its own:

```
 JobQueue  (the lock; the public surface, JobQueueLike's and its own)  (queue_like.py)
   Intake       submits, requeues, retries, cancels: into the heap, and out unrun
                                                                         (intake.py)
   HandOut      takes (the leader/follower wait), workers that leave, and the heap's
                two moves, push and pop, that every part goes through    (hand_out.py)
     Prefetcher   jobs handed out ahead, and taking them back            (prefetch.py)
     Admission    limits: a slot per job in flight, starts per window    (admission.py)
   Lookups      reads: a job by id, jobs by state, the stats             (lookups.py)
   PendingQueues  a heap per named queue, and jobs parked behind a limit  (queues.py)
   PendingJobs  the heaps, their order and lazy deletion                 (heap.py)
   Room         the bounds, and submitters waiting for room              (room.py)
   WallOffset   due times of ``at=`` jobs                                (wall_offset.py)
   Leases       jobs in flight, and how jobs ended                       (leases.py)
```

Takers wait leader/follower, as in Java's ``DelayedWorkQueue`` (mpsched._core.hand_out):
one at most sleeps until the head is due, and each event wakes one waiter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

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
    Payload,
    QueueStats,
)
from mpsched._core.leases import Leases, LostLease
from mpsched._core.limits import Limits, LimitSpec
from mpsched._core.lookups import Lookups
from mpsched._core.prefetch import Claims
from mpsched._core.queue_like import JobQueueLike
from mpsched._core.queues import PendingQueues, Queues
from mpsched._core.room import Room
from mpsched._core.wall_offset import WallOffset


class JobQueue(JobQueueLike):
    """Pending jobs in heap order, handed out under leases to takers.

    A method of JobQueueLike (mpsched._core.queue_like) has its contract there; its
    docstring here, if any, says what is this queue's own.

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
        self._clock = clock = clock if clock is not None else SystemClock()
        # Guards the heap and every part below (each shares it; their conditions say who
        # waits on them). Held only for heap and table updates, never while a job runs,
        # while anything crosses a process boundary, or for any system call beyond a
        # condition's wait (a timeout kill runs after retire_if_leased, outside; a
        # revocation's Claims.revoke runs with the lock let go: the Prefetcher lets go of
        # it). Besides the heap, it covers on_returned (the journal's non-blocking append
        # of a requeue record).
        self._lock = lock = threading.Lock()
        self.leases = leases = Leases(lock, clock)
        bytes_of = None if max_pending_bytes is None else sizer
        self._pending = pending = PendingQueues(Order.coerce(order), bytes_of)
        self._room = room = Room(lock, clock, pending, max_pending, max_pending_bytes, sizer)
        self._wall = wall = WallOffset(clock)
        self.hand_out = hand_out = HandOut(
            lock, clock, pending, room, wall, leases, Limits(limits), claims
        )
        self._admission, self._prefetch = hand_out.admission, hand_out.prefetch
        self._prefetch.on_returned = on_returned
        self._intake = intake = Intake(lock, clock, pending, room, wall, leases, hand_out)
        self._lookups = Lookups(lock, clock, pending, leases, intake, hand_out)

    def set_on_returned(self, on_returned: Callable[[Job], None] | None) -> None:
        """Set the constructor's ``on_returned`` (its journal is made after the queue)."""
        with self._lock:
            self._prefetch.on_returned = on_returned

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def max_pending(self) -> int | None:
        return self._room.max_pending

    @property
    def max_pending_bytes(self) -> int | None:
        return self._room.max_bytes

    def submit(self, request: JobRequest, timeout: float | None = None) -> None:
        """Add a job, waiting up to ``timeout`` seconds for room when the queue is bounded.
        Its due time is the manager's receipt plus ``delay``, or ``at`` converted with one
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
        """Add jobs all at once, in order (consecutive seqs), or none of them. A bounded
        queue waits until there is room for the whole batch.

        ``seqs``: counters taken earlier with :meth:`reserve_seqs` (a store journals a job
        with its seq before it enters the heap).
        ``due``: an instant on this queue's clock every job is due at, instead of their
        ``delay``/``at`` (a schedule's run, planned on this clock).
        ``checked``: the caller already ran ``check_request`` on every request.
        ``refuse_running``: refuse the id of a job in flight too.

        Raises as :meth:`submit`, and InvalidJobError for a batch larger than
        ``max_pending`` or one that repeats a job id (in the batch, or of a pending job).
        """
        self._intake.submit_many(requests, timeout, seqs, due, checked, refuse_running)

    def reserve_seqs(self, count: int) -> list[int]:
        """Take ``count`` submission counters for jobs :meth:`submit_many` will add."""
        return self._intake.reserve_seqs(count)

    def restore(self, jobs: list[Job], next_seq: int) -> None:
        """Put back jobs recovered from a store (due, priority and seq kept), before any
        submit; new jobs get seqs from ``next_seq`` on."""
        self._intake.restore(jobs, next_seq)

    def hold_in_flight(self, worker_id: str, jobs: list[Job]) -> None:
        """Put in flight with ``worker_id``, before any take, jobs a store says ran on it
        when the manager before this one died (their attempts as the store has them)."""
        self._intake.hold_in_flight(worker_id, jobs)

    def return_lease(self, lease_id: int) -> Job | None:
        return self._intake.return_lease(lease_id)

    def count_withdrawn(self, count: int) -> None:
        self._intake.count_withdrawn(count)

    def count_submitted(self, count: int) -> None:
        """Count jobs submitted that wait for their parents, out of the heap."""
        self._intake.count_submitted(count)

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Its due time and seq are kept: it goes first among what is due."""
        return self._intake.requeue(job, retry=retry)

    def retry(
        self,
        lease_id: int,
        outcome: Outcome,
        worker_id: str,
        delay_of: Callable[[Job], float | None],
    ) -> tuple[Job | None, float | None]:
        return self._intake.retry(lease_id, outcome, worker_id, delay_of)

    def release(self, jobs: list[Job]) -> None:
        """Put in the heap, at once (no bound waits), jobs whose parents ended (seqs
        taken, each due at its own time or now). Nothing happens once closed."""
        self._intake.release(jobs)

    def cancel(self, job_id: str) -> bool:
        """Remove a pending job; False when it is not pending (taken, done, unknown). The
        entry is marked, not searched for: the heaps drop it when it reaches their top."""
        return bool(self.cancel_jobs([job_id]))

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        return self._intake.cancel_jobs(job_ids)

    def cancel_client(self, client_id: str, *, not_due_only: bool = False) -> list[str]:
        """As :meth:`cancel_client_jobs`; returns the ids of the jobs removed."""
        return [job.job_id for job in self.cancel_client_jobs(client_id, not_due_only=not_due_only)]

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        return self._intake.cancel_client_jobs(client_id, not_due_only=not_due_only)

    def reschedule(self, job_id: str, due: float) -> bool:
        return self._intake.reschedule(job_id, due)

    def not_due(self, client_id: str) -> list[str]:
        return self._intake.not_due(client_id)

    def take(self, worker_id: str, timeout: float, early: float = 0.0) -> Assignment | None:
        """Hand out the next due job under a new lease, waiting at most ``timeout`` seconds
        (``early``: as :meth:`take_batch`). None when none became due in time, so a caller
        that went away holds no server thread (and no job) for longer than one ``timeout``.

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
        """Each prefetched job is revocable until ``worker_id`` claims it, and a take ends
        the taker's previous batch (which jobs, and when: mpsched._core.prefetch). A taker
        handed a job ``early`` waits for ``Assignment.due`` itself."""
        hand_out = self.hand_out
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
        return self.hand_out.revoke(worker_id)

    def release_worker(self, worker_id: str) -> list[LostLease]:
        return self.hand_out.release_worker(worker_id)

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        return self.hand_out.retire_if_leased(worker_id, lease_id)

    def complete(self, lease_id: int, outcome: Outcome, worker_id: str = "") -> Job | None:
        with self._lock:
            self._prefetch.started_locked(worker_id, lease_id)
            return self.leases.complete_locked(lease_id, outcome)

    def fail(self, job: Job, *, timed_out: bool = False, crashed: bool = True) -> None:
        """``crashed`` False: the job never ran (its parent failed)."""
        self.leases.fail(job, timed_out=timed_out, crashed=crashed)

    def expired(self) -> tuple[list[Lease], float | None]:
        return self.leases.expired()

    def set_progress(self, lease_id: int, job_id: str, progress: str) -> bool:
        """Note the latest progress of a job in flight under ``lease_id`` (JSON text);
        False, and nothing changes, when that lease has ended."""
        with self._lock:
            return self.leases.set_progress_locked(lease_id, job_id, progress)

    def wait_drained(self, timeout: float) -> bool:
        return self.leases.wait_drained(timeout)

    def due_of(self, request: JobRequest) -> float:
        """The instant on this queue's clock a request's ``delay`` or ``at`` gives now."""
        with self._lock:
            return self._wall.due_locked(request, self._clock.now())

    def close(self) -> None:
        """Every waiting or future ``submit`` raises SchedulerShutdownError too."""
        with self._lock:
            self.hand_out.close_locked()
            self._room.close_locked()

    def find(self, job_id: str) -> tuple[Job, str | None] | None:
        """A job pending (worker None) or in flight (with its worker's id), by id; None
        when it is neither. The Job is the queue's own record: read it, do not change it."""
        return self._lookups.find(job_id)

    def jobs(
        self, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[Job, str | None]]:
        """The jobs pending (worker None) or in flight (with its worker's id), in
        submission order: those in ``state`` (PENDING or RUNNING; None: both), the first
        ``limit`` of them (None: all). The Jobs are the queue's own records: read them."""
        return self._lookups.jobs(state, limit)

    def head(self, n: int) -> list[Job]:
        """O(n log n) under the lock, however many are pending. The Jobs are the queue's
        own records: read them only."""
        with self._lock:
            return self._pending.first(n)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def stats(self, *, lateness: bool = True) -> QueueStats:
        return self._lookups.stats(lateness=lateness)

    def pending_by_queue(self) -> dict[str, int]:
        """Those waiting for a limit included."""
        with self._lock:
            return self._pending.by_queue()

    def waiting_for(self, job_id: str) -> str | None:
        with self._lock:
            limit = self._pending.parked_limit(job_id)
        return None if limit is None else f"limit {limit}"

    def limits(self) -> dict[str, LimitSpec]:
        with self._lock:
            return self._admission.limits.specs()

    def check_routes(self, requests: list[JobRequest]) -> None:
        self._intake.check_routes(requests)

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Parked jobs it now admits become takeable at once."""
        with self._lock:
            self._admission.set_locked(name, spec)
        self._prefetch.revoke_called_for()
