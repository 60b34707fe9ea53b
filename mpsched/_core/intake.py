"""Intake: jobs into a JobQueue's heap, and out of it unrun.

Submits (due times, seqs, the wait for room of a bounded queue), jobs put back
(recovered from a store, requeued after a lost lease, retried after a failed attempt,
handed out but not journalled), jobs a store says are in flight, cancels and moves; the
submission counter, and the submitted, cancelled and retried counts. A change of the
heap's head hands the lead on to a taker (``HandOut.new_head_locked``), and a job that
enters due may go before a prefetched one, whose worker is then revoked once the lock is
let go (mpsched._core.prefetch).

No lock of its own: it shares its JobQueue's. Methods ending in ``_locked`` are called
with it held; the others take it.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Callable

from mpsched._core.clock import Clock
from mpsched._core.hand_out import HandOut
from mpsched._core.job import Job, JobRequest, Outcome, OutcomeKind, check_name, check_request
from mpsched._core.leases import Leases
from mpsched._core.queues import PendingQueues
from mpsched._core.room import Room
from mpsched._core.wall_offset import WallOffset
from mpsched._errors import InvalidJobError


class Intake:
    """The submitting side of one JobQueue, guarded by that queue's ``lock``. Jobs go in
    by ``HandOut.push_locked``, which tells takers of a new head, and prefetched jobs of
    one that goes before them."""

    def __init__(
        self,
        lock: threading.Lock,
        clock: Clock,
        pending: PendingQueues,
        room: Room,
        wall: WallOffset,
        leases: Leases,
        hand_out: HandOut,
    ) -> None:
        self._lock = lock  # the queue's: guards every field below
        self._clock = clock
        self._pending = pending
        self._room = room
        self._wall = wall
        self._leases = leases
        self._prefetch = hand_out.prefetch
        self._hand_out = hand_out
        self._limits = hand_out.admission.limits
        self._push = hand_out.push_locked
        self._wait_locked = hand_out.wait_locked  # a submitter's wait for room, counted
        self._seq = itertools.count()
        self.submitted = self.cancelled = self.retried = 0
        # Attempts run again by a retry policy: the job raised, or raised RetryLater.
        self.retried_exception = self.retried_later = 0

    def submit_many(
        self,
        requests: list[JobRequest],
        timeout: float | None,
        seqs: list[int] | None,
        due: float | None,
        checked: bool,
        refuse_running: bool,
    ) -> None:
        """Add jobs all at once, or none of them (JobQueue.submit_many)."""
        if not checked:
            for request in requests:
                check_request(request)
        if len({r.job_id for r in requests}) != len(requests):
            raise InvalidJobError("a batch repeats a job id")
        size = self._room.batch_size(requests)
        with self._lock:
            now = self._clock.now()
            dues = [
                self._wall.due_locked(request, now) if due is None else max(due, now)
                for request in requests
            ]
            self._room.wait_locked(now, timeout, len(requests), size, self._wait_locked)
            # Checked after the wait: another submitter may have queued an id meanwhile.
            self._check_new_locked(requests, refuse_running)
            old_head = self._pending.heads()
            order = seqs if seqs is not None else [next(self._seq) for _ in requests]
            planned = due is not None  # on this clock: the requests' own times are not used
            jobs = [
                Job(
                    job_id=request.job_id,
                    client_id=request.client_id,
                    payload=request.payload,
                    priority=request.priority,
                    due=job_due,
                    seq=seq,
                    timeout=request.timeout,
                    retries=request.retries,
                    key=request.key,
                    name=request.name,
                    at=None if planned else request.at,
                    retry=request.retry,
                    queue=request.queue,
                    limit=request.limit,
                )
                for request, job_due, seq in zip(requests, dues, order, strict=True)
            ]
            for job in jobs:
                self._pending.push(job)
            self.submitted += len(requests)
            if self._pending.heads() != old_head:
                self._hand_out.new_head_locked()
            due_now = [job for job in jobs if job.due <= now] if self._prefetch else []
            if due_now:  # of those due, only the first in heap order can go before one
                self._prefetch.overtaken_locked(min(due_now, key=self._pending.key), now)
        self._prefetch.revoke_called_for()

    def _check_new_locked(self, requests: list[JobRequest], refuse_running: bool) -> None:
        """Refuse a batch that names an unknown limit, or the id of a pending job (of a
        job in flight too, with ``refuse_running``)."""
        for request in requests:
            if request.limit is not None:
                self._limits.check(request.limit)
            if request.job_id in self._pending:
                raise InvalidJobError(f"job id {request.job_id!r} is already pending")
            if refuse_running and self._leases.find_locked(request.job_id):
                raise InvalidJobError(f"job id {request.job_id!r} is already running")

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Refuse a request naming an invalid queue or limit, or an undeclared limit
        (JobQueue.check_routes)."""
        for request in requests:
            check_name("queue", request.queue)
        with self._lock:
            for request in requests:
                self._limits.check(request.limit)

    def reserve_seqs(self, count: int) -> list[int]:
        """``count`` submission counters, taken now (JobQueue.reserve_seqs)."""
        with self._lock:
            return [next(self._seq) for _ in range(count)]

    def restore(self, jobs: list[Job], next_seq: int) -> None:
        """Jobs recovered from a store into the heap (JobQueue.restore)."""
        with self._lock:
            self._pending.restore(jobs)
            self._seq = itertools.count(next_seq)
            self.submitted += len(jobs)
            if len(self._pending):
                self._hand_out.new_head_locked()

    def hold_in_flight(self, worker_id: str, jobs: list[Job]) -> None:
        """Jobs a store says ran on ``worker_id`` put in flight with it, each with its
        limit's slot (JobQueue.hold_in_flight)."""
        with self._lock:
            now = self._clock.now()
            for job in jobs:
                if job.limit is not None:
                    self._limits.hold_locked(job.limit)
                self._leases.hold_locked(job, worker_id, now)

    def return_lease(self, lease_id: int) -> Job | None:
        """A job just handed out back in the heap, as never received
        (JobQueue.return_lease)."""
        with self._lock:
            job = self._leases.drop_locked(lease_id)
            if job is None or self._hand_out.closed:
                return job
            job.attempt -= 1
            self._push(job)
        self._prefetch.revoke_called_for()
        return job

    def release(self, jobs: list[Job]) -> None:
        """Jobs whose parents ended into the heap (JobQueue.release)."""
        with self._lock:
            if self._hand_out.closed:
                return
            now = self._clock.now()
            for job in jobs:
                job.due = max(job.due, now)
                self._push(job)
        self._prefetch.revoke_called_for()

    def count_submitted(self, count: int) -> None:
        """Jobs that wait for parents out of the heap (JobQueue.count_submitted)."""
        with self._lock:
            self.submitted += count

    def count_withdrawn(self, count: int) -> None:
        """Jobs a client took back before sending them (JobQueue.count_withdrawn)."""
        with self._lock:
            self.submitted += count
            self.cancelled += count

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """A job whose lease was lost back in the heap (JobQueue.requeue)."""
        with self._lock:
            if self._hand_out.closed:
                return False
            if retry:
                self.retried += 1
            else:
                job.attempt -= 1
            self._push(job)
        self._prefetch.revoke_called_for()
        return True

    def retry(
        self,
        lease_id: int,
        outcome: Outcome,
        worker_id: str,
        delay_of: Callable[[Job], float | None],
    ) -> tuple[Job | None, float | None]:
        """A failed attempt's lease ended, and its job back in the heap in the same step,
        due ``delay_of(job)`` seconds from now; or ended for good (JobQueue.retry)."""
        with self._lock:
            self._prefetch.started_locked(worker_id, lease_id)
            job = self._leases.job_locked(lease_id)
            delay = None if job is None or self._hand_out.closed else delay_of(job)
            if delay is None:
                return self._leases.complete_locked(lease_id, outcome), None
            self._leases.complete_locked(lease_id, outcome, final=False)
            assert job is not None
            job.due, job.at = self._clock.now() + delay, None  # the wall clock's is behind it
            if outcome.error_kind == OutcomeKind.RETRYABLE:
                self.retried_exception += 1
            else:  # it asked for it, by RetryLater
                self.retried_later += 1
            self._push(job)
        self._prefetch.revoke_called_for()
        return job, delay

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """The pending jobs among ``job_ids`` out of the heap (JobQueue.cancel_jobs)."""
        with self._lock:
            self._prefetch.cancel_locked(job_ids)
            old_head = self._pending.heads()
            jobs = [job for job_id in job_ids if (job := self._pending.remove(job_id))]
            if jobs:
                self._removed_locked(len(jobs), old_head)
        self._prefetch.revoke_called_for()
        return jobs

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool) -> list[Job]:
        """One client's pending jobs out of the heap (JobQueue.cancel_client_jobs)."""
        with self._lock:
            now = self._clock.now()
            jobs = [
                j
                for j in self._pending
                if j.client_id == client_id and not (not_due_only and j.due <= now)
            ]
            old_head = self._pending.heads()
            for job in jobs:
                self._pending.remove(job.job_id)
            if jobs:
                self._removed_locked(len(jobs), old_head)
            return jobs

    def not_due(self, client_id: str) -> list[str]:
        """The ids of one client's pending jobs not due yet (JobQueue.not_due)."""
        with self._lock:
            now = self._clock.now()
            return [j.job_id for j in self._pending if j.client_id == client_id and j.due > now]

    def reschedule(self, job_id: str, due: float) -> bool:
        """A pending job moved to another due time (JobQueue.reschedule)."""
        with self._lock:
            old_head = self._pending.heads()
            job = self._pending.remove(job_id)
            if job is None:
                return False
            self._removed_locked(0, old_head)  # moved, not cancelled
            self._push(dataclasses.replace(job, due=due, cancelled=False))
        self._prefetch.revoke_called_for()
        return True

    def _removed_locked(self, cancelled: int, old_head: tuple[object, ...]) -> None:
        """After jobs left the heap unrun: count them, wake submitters waiting for room,
        and hand the lead on if the head changed (``old_head``: the top before)."""
        self.cancelled += cancelled
        self._room.left_locked()
        if self._pending.heads() != old_head:
            self._hand_out.new_head_locked()
