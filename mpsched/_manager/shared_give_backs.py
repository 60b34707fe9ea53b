"""GiveBacks: the jobs a manager puts back in a shared Redis queue.

A job goes back when its lease was lost (an attempt, or not), or when this manager's
workers never started it: prefetched jobs revoked, a batch claimed for a worker that left,
a claim that came after close. Redis refuses one whose lease is stale (a peer took it
back). One that Redis could not take is kept, and the link's heartbeat sends it again.
"""

from __future__ import annotations

import logging

from mpsched._core.job import Assignment, Job
from mpsched._errors import StoreUnavailableError
from mpsched._manager.shared_leases import SharedLeases
from mpsched._store.redis.records import Requeue

log = logging.getLogger("mpsched.manager")


class GiveBacks:
    """The jobs one manager puts back in Redis, and those Redis could not take yet."""

    def __init__(self, shared: SharedLeases) -> None:
        self._store = shared.store
        self._me = shared.manager_id
        self._lease_timeout = shared.lease_timeout
        self._lock = shared.lock  # guards the fields below
        self._leases = shared.leases
        self._tokens = shared.tokens
        self._outage = shared.outage
        self._unreturned: list[Requeue] = []  # give-backs Redis could not take yet
        self.given_back = 0  # prefetched jobs given back so far (read under the lock)

    def drop_locked(self, lease_id: int, job_id: str, back: list[Requeue]) -> None:
        """End a lease here of a job that never started; add to ``back`` the requeue that
        gives it back to Redis (the caller's to send), if this manager held it."""
        token = self._tokens.pop(job_id, None)
        if self._leases.drop_locked(lease_id) is not None and token is not None:
            back.append(Requeue(job_id=job_id, token=token, retry=False))

    def drop_batch_locked(self, assignments: list[Assignment]) -> list[Requeue]:
        """End the leases of jobs handed out here that never started; the requeues that
        give them back to Redis (the caller's to send)."""
        back: list[Requeue] = []
        for assignment in assignments:
            self.drop_locked(assignment.lease.lease_id, assignment.lease.job_id, back)
        return back

    def give_back(self, requeues: list[Requeue], answers: tuple[str, ...] = ()) -> None:
        """Put jobs this manager's workers never started back in Redis (no attempt), and
        answer the cancels that waited for them, in one call; kept for the heartbeat to
        send again when Redis does not answer."""
        if not requeues and not answers:
            return
        try:
            reply = self._store.report(
                self._me, self._lease_timeout, requeues=requeues, answers=answers
            )
        except StoreUnavailableError:
            with self._lock:
                self._unreturned += requeues
            self._outage.held("job(s) to put back", len(requeues))
            return
        with self._lock:
            self.given_back += sum(1 for r in reply.requeued if r in (1, 2, 4))

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put a job whose lease was lost back in Redis (an attempt if ``retry``), at once
        or, when Redis does not answer, once it does (the link sends it again); False
        when Redis refused it (the lease was stale)."""
        with self._lock:
            token = self._tokens.pop(job.job_id, None)
        if token is None:
            return False
        back = Requeue(job_id=job.job_id, token=token, retry=retry)
        try:
            reply = self._store.report(self._me, self._lease_timeout, requeues=[back])
        except StoreUnavailableError:
            with self._lock:
                self._unreturned.append(back)
            self._outage.held("job(s) to put back")
            if not retry:
                job.attempt -= 1
            return True
        if not reply.requeued[0]:
            log.warning("job %s was not put back: another manager took it over", job.job_id)
            return False
        if not retry:
            job.attempt -= 1
        return True

    def take_unreturned(self) -> list[Requeue]:
        """The give-backs Redis could not take yet (the caller sends them again)."""
        with self._lock:
            unreturned, self._unreturned = self._unreturned, []
            return unreturned

    def put_back_unreturned(self, requeues: list[Requeue]) -> None:
        """Keep give-backs that could not be sent again, before those kept since."""
        with self._lock:
            self._unreturned[:0] = requeues
