"""Takers: how the takers of a manager claim jobs from a shared Redis queue and hand them
out to its workers.

A take claims with one script call (claim.lua, on the server's TIME), leases what it got
here under each job's fencing token, and hands the batch out if the fence says its leases
are still this manager's (mpsched._manager.shared_fence). A worker's reports that come
with its take are recorded in one call that claims its next batch too (SharedQueue.
report_ends): that batch waits here, ready, for the take that follows.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable

from mpsched._core.job import Assignment, Job, JobState, Outcome, OutcomeKind
from mpsched._core.leases import LostLease
from mpsched._core.result_of import attach_inputs
from mpsched._core.retrying import RetryState
from mpsched._errors import (
    JobError,
    SchedulerShutdownError,
    StoreInDoubtError,
    StoreUnavailableError,
)
from mpsched._manager.shared_doubts import LostAnswers
from mpsched._manager.shared_fence import LeaseFence
from mpsched._manager.shared_give_backs import GiveBacks
from mpsched._manager.shared_leases import SharedLeases
from mpsched._manager.shared_payloads import ClaimedPayloads
from mpsched._manager.shared_prefetch import SharedPrefetch
from mpsched._manager.shared_waits import ASK, TakerWaits
from mpsched._store.redis.records import Claimed, Reply, Requeue, Take

log = logging.getLogger("mpsched.manager")

GONE_MEMORY = 120.0  # as JobQueue's: a retired worker's late take gets nothing


class Takers:
    """The claims and hand-outs of one manager's takers on a shared queue (``shared``:
    the queue's lock, which guards every field here, its leases and tokens)."""

    def __init__(
        self,
        shared: SharedLeases,
        fence: LeaseFence,
        waits: TakerWaits,
        prefetch: SharedPrefetch,
        give_backs: GiveBacks,
        doubts: LostAnswers,
    ) -> None:
        self._store = shared.store
        self._me = shared.manager_id
        self._lease_timeout = shared.lease_timeout
        self._lock = shared.lock
        self._clock = shared.clock
        self._leases = shared.leases
        self._tokens = shared.tokens
        self._outage = shared.outage
        self._fence = fence
        self._waits = waits
        self._prefetch = prefetch
        self._give_backs = give_backs
        self._doubts = doubts
        self.payloads = ClaimedPayloads(shared.store, shared.manager_id)
        # Called when a claim finds this manager presumed dead (it registers again).
        self.unregistered: Callable[[], None] = lambda: None
        # A worker's next job, claimed in the call that recorded its last one's end (one
        # round trip per job instead of two); its next take hands it out.
        self._ready: dict[str, list[Assignment]] = {}
        self._early: dict[str, float] = {}  # worker id -> the hand-off window of its takes
        # worker id -> the queues it serves, in order (): every queue)
        self._queues: dict[str, tuple[str, ...]] = {}
        self._gone: dict[str, float] = {}  # retired workers, as JobQueue's

    # ------------------------------------------------------------------ a take

    def begin_locked(
        self,
        worker_id: str,
        early: float,
        more: int,
        prefetchable: Callable[[Job], bool] | None,
        queues: tuple[str, ...] | None,
        deadline: float,
    ) -> list[Assignment] | None:
        """A take begins: the batch claimed for the worker with its last ends, if any
        (None: it must claim)."""
        if self._queues.get(worker_id) != (queues or ()):
            self._queues[worker_id] = queues or ()
            self._waits.set_mixed_locked(len(set(self._queues.values())) > 1)
        if self._fence.stale_below:
            self._drop_skipped_locked(worker_id)
        self._early[worker_id] = early
        self._prefetch.asked_locked(worker_id, more, prefetchable)
        self._prefetch.wait_revoked_locked(worker_id, deadline)
        ready = self._ready.pop(worker_id, None)
        if ready is not None and not self._waits.closed:
            return ready  # claimed with its last ends: the table holds its prefetched
        self._prefetch.forget_locked(worker_id)  # its last batch is over
        return None

    def _drop_skipped_locked(self, worker_id: str) -> None:
        """End the stale leases a worker still holds as it takes again: jobs it did not
        start, its manager having been presumed dead (the fence refused them; a peer
        took them back)."""
        for job, lease in self._leases.jobs_locked():
            if lease.worker_id == worker_id and self._fence.stale(lease.lease_id):
                self._leases.drop_locked(lease.lease_id)
                self._tokens.pop(job.job_id, None)

    def fenced(self, worker_id: str, batch: list[Assignment]) -> bool:
        """Whether ``batch`` may go out: its leases are still this manager's (see
        mpsched._manager.shared_fence; after a pause, wait for a heartbeat's answer).
        Else its leases end here and its jobs are given back (refused by Redis if a
        peer took them back already, put back if not), and False."""
        if self._fence.wait_valid(batch[0].lease.lease_id, self._lease_timeout):
            return True
        with self._lock:
            self._prefetch.drop_locked(worker_id)
            back = self._give_backs.drop_batch_locked(batch)
        log.warning(
            "%d job(s) claimed before this manager was presumed dead (or while "
            "its heartbeats went unanswered) were not handed out",
            len(batch),
        )
        self._give_backs.give_back(back)
        return False

    def take_once(self, worker_id: str, early: float, deadline: float) -> list[Assignment] | None:
        """One claim (or none, when nothing changed since the last) and the wait after
        it: the batch, [] past the deadline, or None to look again."""
        waits = self._waits
        with self._lock:
            if waits.closed:
                raise SchedulerShutdownError("the queue is closed")
            if worker_id in self._gone:
                return []
            gen = waits.gen
            wait = waits.known_wait_locked()
            want = self._prefetch.batch_size_locked(worker_id, waits.waiting)
            others_wait = waits.waiting > 0
        asked = wait == ASK
        reply = self._claim(worker_id, early, want, others_wait) if asked else None
        back: list[Requeue] = []
        try:
            with self._lock:
                if waits.closed:
                    back = requeues_of(reply)
                    raise SchedulerShutdownError("the queue is closed")
                lead: object | None = None
                if asked:
                    if reply is not None and reply.jobs:
                        batch, back = self._hand_out_locked(worker_id, reply, early)
                        return batch
                    if waits.gen != gen:
                        return None  # woken while it claimed: what it saw may be old
                    wait, lead = waits.after_locked(reply, early)
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    waits.leave_locked(lead)
                    return []
                if wait is None or wait > 0:
                    waits.wait_locked(remaining if wait is None else min(wait, remaining), lead)
                return None
        finally:
            self._give_backs.give_back(back)  # claimed, but not to be handed out (without the lock)

    def _claim(self, worker_id: str, early: float, want: int, others_wait: bool) -> Reply | None:
        """One claim of up to ``want`` jobs (``others_wait``: another taker of ours waits
        for work); None when Redis failed (the taker then backs off)."""
        claim = self._doubts.claim_name()
        try:
            reply = self._store.report(
                self._me,
                self._lease_timeout,
                take=Take(
                    want=want,
                    worker=f"{self._me}/{worker_id}",
                    early=early,
                    lead="wait",
                    waiting=others_wait,
                    claim=claim,
                    queues=self._queues.get(worker_id, ()),
                ),
            )
        except StoreUnavailableError as exc:
            if isinstance(exc, StoreInDoubtError):
                self._doubts.in_doubt(claim)
            self._outage(exc)
            return None
        self._outage(None)
        if not reply.registered:
            self.unregistered()
        try:
            return self.payloads.of(reply)
        except StoreUnavailableError as exc:
            self._give_backs.give_back(requeues_of(reply))  # claimed, but not to be handed out
            self._outage(exc)
            return None

    def _hand_out_locked(
        self, worker_id: str, reply: Reply, early: float
    ) -> tuple[list[Assignment], list[Requeue]]:
        """The batch claimed for ``worker_id``, leased here; and the claimed jobs to give
        back (see SharedPrefetch.grant_locked)."""
        now = self._clock.now()
        self._waits.handed_locked(reply.head_in, early)

        def grant(claimed: Claimed) -> Assignment:
            self._tokens[claimed.job_id] = claimed.token
            return self._leases.grant_locked(_job(claimed, now), worker_id, now)

        return self._prefetch.grant_locked(worker_id, reply.jobs, grant)

    # ------------------------------------------------------------------ with reports

    def next_take_locked(self, worker_id: str | None, more: int | None) -> Take | None:
        """The claim that goes with a worker's reports: only when its take hands them in
        (``more`` set) and it holds no other job (see SharedQueue.report_ends).

        Only a take claims: ends that come while the worker runs more of its batch (its
        reporter's), or after it left, must not hand it a batch, whose claim slot would
        be reopened under the feet of a revocation of the jobs it has not started.
        """
        if worker_id is not None and more is not None:
            self._prefetch.asked_locked(worker_id, more)
        early = self._early.get(worker_id or "")
        if (
            worker_id is None
            or more is None
            or early is None
            or self._waits.closed
            or worker_id in self._gone
            or worker_id in self._ready
            or not self._prefetch.may_hand_locked(worker_id)
            or any(lease.worker_id == worker_id for _, lease in self._leases.jobs_locked())
        ):
            return None
        waiting = self._waits.waiting
        return Take(
            want=self._prefetch.batch_size_locked(worker_id, waiting) if worker_id else 0,
            worker=f"{self._me}/{worker_id}",
            early=early,
            waiting=waiting > 0,
            claim=self._doubts.claim_name(),
            queues=self._queues.get(worker_id, ()),
        )

    def hand_in(self, worker_id: str, reply: Reply, early: float) -> None:
        """Keep the batch claimed with ``worker_id``'s reports for its next take; give
        it back if its payloads cannot be read, or the worker left or the queue closed."""
        try:
            reply = self.payloads.of(reply)
        except StoreUnavailableError:
            self._give_backs.give_back(requeues_of(reply))  # the ends are recorded: keep them
            return
        back = requeues_of(reply)
        with self._lock:
            if not self._waits.closed and worker_id not in self._gone:
                self._ready[worker_id], back = self._hand_out_locked(worker_id, reply, early)
        self._give_backs.give_back(back)

    # ------------------------------------------------------------------ workers

    def revoke(self, worker_id: str) -> int:
        """A worker leaves to be replaced: give back the prefetched jobs it did not start
        and the batch claimed for it that it never took; returns how many."""
        with self._lock:
            back = self._give_backs.drop_batch_locked(self._ready.pop(worker_id, []))
        back += self._prefetch.revoke(worker_id)
        self._give_backs.give_back(back)
        return len(back)

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        """Retire ``worker_id`` if it holds ``lease_id``: a late take of it gets nothing."""
        with self._lock:
            if not self._leases.holds_locked(lease_id):
                return False
            self._gone.pop(worker_id, None)
            self._gone[worker_id] = self._clock.now()
            return True

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds and retire its id (as JobQueue's)."""
        with self._lock:
            now = self._clock.now()
            self._gone[worker_id] = now
            self._ready.pop(worker_id, None)  # its leases are released with the others
            self._prefetch.forget_worker_locked(worker_id)
            self._early.pop(worker_id, None)
            self._queues.pop(worker_id, None)
            for old, when in list(self._gone.items()):
                if when >= now - GONE_MEMORY:
                    break
                del self._gone[old]
            return self._leases.release_worker_locked(worker_id, now)


def requeues_of(reply: Reply | None) -> list[Requeue]:
    """Give-backs of every job a reply claimed (none was handed out)."""
    return (
        []
        if reply is None
        else [Requeue(job_id=c.job_id, token=c.token, retry=False) for c in reply.jobs]
    )


def stored_outcome(job_id: str, state: str, outcome: bytes) -> Outcome:
    """A parent's outcome as Redis keeps it (the manager's own encoding, plain data):
    cancelled, kept, or a failure saying it is no longer kept."""
    if state == JobState.CANCELLED.value:
        return Outcome(job_id, False, b"", "", None, OutcomeKind.CANCELLED.value)
    if outcome:
        return Outcome._make(pickle.loads(outcome))
    error = JobError(f"job {job_id} ended, but its outcome is no longer kept (result_ttl)")
    return Outcome(job_id, False, pickle.dumps(error), "", None, OutcomeKind.OUTCOME_NOT_KEPT.value)


def _job(claimed: Claimed, now: float) -> Job:
    """The in-flight record of a claimed job, due ``claimed.delay`` from ``now`` on this
    manager's clock (its attempt is counted again when the lease is granted)."""
    payload = claimed.payload
    if claimed.inputs is not None:
        payload = attach_inputs(
            payload, {i: stored_outcome(i, st, out) for i, st, out in claimed.inputs}
        )
    job = Job(
        job_id=claimed.job_id,
        client_id=claimed.client_id,
        payload=payload,
        priority=claimed.priority,
        due=now + claimed.delay,
        seq=claimed.seq,
        timeout=claimed.timeout,
        retries=claimed.retries,
        attempt=claimed.attempt - 1,
        key=claimed.key,
        name=claimed.name,
    )
    if claimed.retry is not None:
        job.retry, job.error, job.notes = RetryState.decode(claimed.retry)
    return job
