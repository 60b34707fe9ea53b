"""SharedQueue: a manager's side of a queue that lives in Redis and several managers share.

It stands where a JobQueue stands for ManagerService (take, complete, requeue, cancel,
stats), but holds no pending job: they are in Redis (mpsched._store.redis). What it keeps
is what only this manager can know: its workers' leases (the in-flight table of
mpsched._core.leases, each with its Redis fencing token), and its takers' waiting.

Waiting is leader/follower across managers and inside this one::

    take ─▶ claim (Lua, server's TIME) ─▶ due jobs (the first, and for a worker of ours
                │                         whose last job was short up to 7 prefetched:
                │                         mpsched._manager.shared_prefetch): leased,
                │                         handed out
                │
                └─ nothing due ─▶ this manager leads (Redis key): one taker sleeps
                                  until the head is due, on this manager's clock
                                  another leads: sleep until its lead lapses
                                  queue empty: sleep until woken
    wake-ups: a submit that makes a new head, a leader that leaves (pub/sub, through
              mpsched._manager.shared_link), a reconnection

A worker's reports that come with its take are recorded in one call that claims its next
batch too (report_ends), which its take then hands out.

Only durations measured on the server's clock (the head's delay, a job's delay) cross to
this manager, which times them on its own monotonic clock: its clock may be hours off
any other's. A taker whose claim found nothing new since the last wake-up waits without
asking Redis again, so idle managers send nothing but their heartbeats (and the leader's
look every LEAD_SPAN seconds while a job waits in the future).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable

from mpsched._core.clock import ahead
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
from mpsched._manager.shared_prefetch import SharedPrefetch
from mpsched._manager.shared_queue_base import BACKOFF
from mpsched._store.redis.records import Claimed, Finish, Reply, Requeue, Take

log = logging.getLogger("mpsched.manager")

GONE_MEMORY = 120.0  # as JobQueue's: a retired worker's late take gets nothing
FOLLOW_GRACE = 0.01  # a follower looks again this long after the leader's lead lapses
ASK = 0.0  # a taker's wait that means: claim now


class SharedQueue(SharedPrefetch):
    """This manager's takers and leases on a shared Redis queue (arguments: as
    SharedPrefetch's)."""

    def take(self, worker_id: str, timeout: float, early: float = 0.0) -> Assignment | None:
        """Claim the next due job for ``worker_id`` under a new lease, waiting at most
        ``timeout`` seconds (see the module docstring); None when none came due.

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
        queues: tuple[str, ...] | None = None,
    ) -> list[Assignment]:
        """:meth:`take`, with up to ``more`` due jobs more claimed in the same call for a
        worker this manager started (prefetched: mpsched._manager.shared_prefetch);
        ``prefetchable`` tells which jobs may be. [] when none came due. ``queues``: as
        JobQueue's.

        Raises:
            SchedulerShutdownError: the queue was closed; the taker should exit.
        """
        deadline = self._clock.now() + timeout
        with self._lock:
            if self._queues.get(worker_id) != (queues or ()):
                self._queues[worker_id] = queues or ()
                self._mixed = len(set(self._queues.values())) > 1
            ready = self._begin_take_locked(worker_id, early, more, prefetchable, deadline)
        if ready is not None and self._fenced(worker_id, ready):
            return ready
        while True:
            batch = self._take_once(worker_id, early, deadline)
            if batch is not None and (not batch or self._fenced(worker_id, batch)):
                return batch

    def _fenced(self, worker_id: str, batch: list[Assignment]) -> bool:
        """Whether ``batch`` may go out: its leases are still this manager's (see
        mpsched._manager.shared_fence; after a pause, wait for a heartbeat's answer).
        Else its leases end here and its jobs are given back (refused by Redis if a
        peer took them back already, put back if not), and False."""
        if self.fence.wait_valid(batch[0].lease.lease_id, self.lease_timeout):
            return True
        back = []
        with self._lock:
            self._prefetched.drop_locked(worker_id)
            for assignment in batch:
                token = self._tokens.pop(assignment.lease.job_id, None)
                if (
                    self.leases.drop_locked(assignment.lease.lease_id) is not None
                    and token is not None
                ):
                    back.append(Requeue(job_id=assignment.lease.job_id, token=token, retry=False))
        log.warning(
            "%d job(s) claimed before this manager was presumed dead (or while "
            "its heartbeats went unanswered) were not handed out",
            len(batch),
        )
        self.give_back(back)
        return False

    def _begin_take_locked(
        self,
        worker_id: str,
        early: float,
        more: int,
        prefetchable: Callable[[Job], bool] | None,
        deadline: float,
    ) -> list[Assignment] | None:
        """A take begins: the batch claimed for the worker with its last ends, if any
        (None: it must claim)."""
        if self.fence.stale_below:
            self._drop_skipped_locked(worker_id)
        self._early[worker_id] = early
        self._more[worker_id] = more
        if prefetchable is not None:
            self._prefetchable = prefetchable  # the same for every take: Dispatch's
        while not self._prefetched.may_hand_locked(worker_id) and not self._closed:
            self._revoke_done.wait(max(deadline - self._clock.now(), 0.001))
        ready = self._ready.pop(worker_id, None)
        if ready is not None and not self._closed:
            return ready  # claimed with its last ends: the table holds its prefetched
        self._prefetched.forget_locked(worker_id)  # its last batch is over
        return None

    def _drop_skipped_locked(self, worker_id: str) -> None:
        """End the stale leases a worker still holds as it takes again: jobs it did not
        start, its manager having been presumed dead (the fence refused them; a peer
        took them back)."""
        for job, lease in self.leases.jobs_locked():
            if lease.worker_id == worker_id and self.fence.stale(lease.lease_id):
                self.leases.drop_locked(lease.lease_id)
                self._tokens.pop(job.job_id, None)

    def _take_once(self, worker_id: str, early: float, deadline: float) -> list[Assignment] | None:
        """One claim (or none, when nothing changed since the last) and the wait after
        it: the batch, [] past the deadline, or None to look again."""
        with self._lock:
            if self._closed:
                raise SchedulerShutdownError("the queue is closed")
            if worker_id in self._gone:
                return []
            gen = self._gen
            wait = self._known_wait_locked()
            want = self._batch_size_locked(worker_id)
            others_wait = self._waiting > 0
        asked = wait == ASK
        reply = self._claim(worker_id, early, want, others_wait) if asked else None
        back: list[Requeue] = []
        try:
            with self._lock:
                if self._closed:
                    back = _requeues(reply)
                    raise SchedulerShutdownError("the queue is closed")
                lead: object | None = None
                if asked:
                    if reply is not None and reply.jobs:
                        batch, back = self._hand_out_locked(worker_id, reply, early)
                        return batch
                    if self._gen != gen:
                        return None  # woken while it claimed: what it saw may be old
                    wait, lead = self._wait_after_locked(reply, early)
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    if lead is not None and self._leader is lead:
                        self._leader = None
                    self._leave_locked()
                    return []
                if wait is None or wait > 0:
                    self._wait_locked(remaining if wait is None else min(wait, remaining), lead)
                return None
        finally:
            self.give_back(back)  # claimed, but not to be handed out (without the lock)

    def _known_wait_locked(self) -> float | None:
        """How long a new taker may wait without asking Redis, nothing having changed
        since it was last asked (None: until woken); ASK when it must ask."""
        if self._mixed:
            return ASK  # what another taker saw says nothing of this one's queues
        if self._leader is not None:
            return None  # follow our own leader, untimed
        if self._idle_gen == self._gen:
            return None  # empty, and nothing was submitted since
        if self._follow_until is not None and self._follow_until > self._clock.now():
            return self._follow_until - self._clock.now()
        return ASK

    def _claim(self, worker_id: str, early: float, want: int, others_wait: bool) -> Reply | None:
        """One claim of up to ``want`` jobs (``others_wait``: another taker of ours waits
        for work); None when Redis failed (the taker then backs off)."""
        claim = self.claim_name()
        try:
            reply = self.store.report(
                self.manager_id,
                self.lease_timeout,
                take=Take(
                    want=want,
                    worker=f"{self.manager_id}/{worker_id}",
                    early=early,
                    lead="wait",
                    waiting=others_wait,
                    claim=claim,
                    queues=self._queues.get(worker_id, ()),
                ),
            )
        except StoreUnavailableError as exc:
            if isinstance(exc, StoreInDoubtError):
                self.in_doubt(claim)
            self.outage(exc)
            return None
        self.outage(None)
        if not reply.registered:
            self._unregistered()
        try:
            return self.with_payloads(reply)
        except StoreUnavailableError as exc:
            self.give_back(_requeues(reply))  # claimed, but not to be handed out
            self.outage(exc)
            return None

    def _hand_out_locked(
        self, worker_id: str, reply: Reply, early: float
    ) -> tuple[list[Assignment], list[Requeue]]:
        """The batch claimed for ``worker_id``, leased here; and the claimed jobs to give
        back (see SharedPrefetch._grant_locked)."""
        now = self._clock.now()
        self._backoff = BACKOFF[0]
        if self._waiting and (
            self._leader is None or (reply.head_in is not None and reply.head_in <= early)
        ):
            self._available.notify()  # more is due, or nobody times the head: pass it on

        def grant(claimed: Claimed) -> Assignment:
            self._tokens[claimed.job_id] = claimed.token
            return self.leases.grant_locked(_job(claimed, now), worker_id, now)

        return self._grant_locked(worker_id, reply.jobs, grant)

    def _wait_after_locked(
        self, reply: Reply | None, early: float
    ) -> tuple[float | None, object | None]:
        """How long a taker that claimed nothing waits (None: until woken; 0.0: it
        claims again at once), and its lead token when it times the head for us."""
        if reply is None:
            wait, self._backoff = self._backoff, min(self._backoff * 2, BACKOFF[1])
            return wait, None
        self._backoff = BACKOFF[0]
        if reply.head_in is None:
            self._idle_gen = self._gen
            return None, None
        if reply.leader:
            self._follow_until = None
            if self._mixed:  # each times the head of its own queues
                return max(ahead(reply.head_in - early), 1e-6), None
            if self._leader is not None:
                return None, None  # another taker of ours times it already
            self._leader = lead = object()
            return max(ahead(reply.head_in - early), 1e-6), lead
        if reply.leader_left is not None:
            self._follow_until = self._clock.now() + reply.leader_left + FOLLOW_GRACE
            return reply.leader_left + FOLLOW_GRACE, None
        return ASK, None  # the head is due: another manager raced us to it

    def _wait_locked(self, timeout: float, lead: object | None) -> None:
        self._waiting += 1
        try:
            self._available.wait(timeout)
        finally:
            self._waiting -= 1
            self._wakeups += 1
            if lead is not None and self._leader is lead:
                self._leader = None  # it looks again now

    def _leave_locked(self) -> None:
        """A taker leaves empty-handed: a waiting taker looks, if nobody leads."""
        if self._waiting and self._leader is None and self._idle_gen != self._gen:
            self._available.notify()

    def wake(self) -> None:
        """Something changed in Redis (a new head, a free lead, a reconnection): one
        waiting taker looks again. Called by the link's subscriber thread."""
        with self._lock:
            self._gen += 1
            self._leader = None
            self._idle_gen = self._follow_until = None
            if self._waiting and self._mixed:
                self._available.notify_all()  # each looks at its own queues
            elif self._waiting:
                self._available.notify()

    def wake_all(self) -> None:
        """The store answers again after an outage: every waiting taker looks at once
        (those backing off included)."""
        with self._lock:
            self._gen += 1
            self._leader = None
            self._idle_gen = self._follow_until = None
            self._backoff = BACKOFF[0]
            self._available.notify_all()

    def report_ends(
        self, finishes: list[Finish], worker_id: str | None, more: int | None = None
    ) -> list[int]:
        """Record jobs' ends under their leases (Finish), and, when their worker's take
        hands them in (``more`` set: it waits for its next jobs) and it holds no other
        job, claim that worker's next due job, with ``more`` jobs beyond it, in the same
        call (its take hands them out). Returns each finish's result (0: the lease was
        stale and nothing was recorded; 1; 2: deliver it here).

        Only a take claims: ends that come while the worker runs more of its batch (its
        reporter's), or after it left, must not hand it a batch, whose claim slot would
        be reopened under the feet of a revocation of the jobs it has not started.

        Raises:
            StoreUnavailableError: Redis did not answer; nothing is known to be recorded.
        """
        with self._lock:
            if worker_id is not None and more is not None:
                self._more[worker_id] = more
            early = self._early.get(worker_id or "")
            want = (
                worker_id is not None
                and more is not None
                and early is not None
                and not self._closed
                and worker_id not in self._gone
                and worker_id not in self._ready
                and self._prefetched.may_hand_locked(worker_id)
                and not any(lease.worker_id == worker_id for _, lease in self.leases.jobs_locked())
            )
            count = self._batch_size_locked(worker_id) if want and worker_id else 0
            others_wait = self._waiting > 0
        take = (
            None
            if not want
            else Take(
                want=count,
                worker=f"{self.manager_id}/{worker_id}",
                early=early or 0.0,
                waiting=others_wait,
                claim=self.claim_name(),
                queues=self._queues.get(worker_id or "", ()),
            )
        )
        try:
            reply = self.store.report(
                self.manager_id, self.lease_timeout, finishes=finishes, take=take
            )
        except StoreInDoubtError:
            if take is not None:
                self.in_doubt(take.claim)
            raise
        if reply.jobs:
            try:
                reply = self.with_payloads(reply)
            except StoreUnavailableError:
                self.give_back(_requeues(reply))  # the ends are recorded: keep them
                return reply.finished
            assert worker_id is not None
            back = _requeues(reply)
            with self._lock:
                if not self._closed and worker_id not in self._gone:
                    self._ready[worker_id], back = self._hand_out_locked(
                        worker_id, reply, early or 0.0
                    )
            self.give_back(back)
        return reply.finished

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put a job whose lease was lost back in Redis (an attempt if ``retry``), at once
        or, when Redis does not answer, once it does (the link sends it again); False
        when Redis refused it (the lease was stale)."""
        token = self.pop_token(job.job_id)
        if token is None:
            return False
        back = Requeue(job_id=job.job_id, token=token, retry=retry)
        try:
            reply = self.store.report(self.manager_id, self.lease_timeout, requeues=[back])
        except StoreUnavailableError:
            with self._lock:
                self._unreturned.append(back)
            self.outage.held("job(s) to put back")
            if not retry:
                job.attempt -= 1
            return True
        if not reply.requeued[0]:
            log.warning("job %s was not put back: another manager took it over", job.job_id)
            return False
        if not retry:
            job.attempt -= 1
        return True

    def return_lease(self, lease_id: int) -> Job | None:
        """Give back a job just handed out that must not run: never received."""
        with self._lock:
            job = self.leases.drop_locked(lease_id)
        if job is not None:
            self.requeue(job, retry=False)
        return job

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds and retire its id (as JobQueue's)."""
        with self._lock:
            now = self._clock.now()
            self._gone[worker_id] = now
            self._ready.pop(worker_id, None)  # its leases are released with the others
            self._prefetched.drop_locked(worker_id)
            self._early.pop(worker_id, None)
            self._more.pop(worker_id, None)
            self._queues.pop(worker_id, None)
            for old, when in list(self._gone.items()):
                if when >= now - GONE_MEMORY:
                    break
                del self._gone[old]
            return self.leases.release_worker_locked(worker_id, now)


def _requeues(reply: Reply | None) -> list[Requeue]:
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
