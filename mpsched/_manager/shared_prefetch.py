"""SharedPrefetch: the jobs a manager claims from Redis for a worker of its own beyond the
one it takes (prefetched, as mpsched._core.prefetch explains), and giving them back.

A claim of a batch is one script call for up to PREFETCH due jobs, each under a lease and
a fencing token of its own, in the queue's order; the worker claims each job
beyond the first in its claim slot (mpsched._worker.claims) before it starts it, as with a
queue in memory. What a peer manager cannot do is take them back: its idle worker, or an
earlier or more urgent job it holds, cannot reach into this manager's table. So this
manager gives back, by itself, what its workers have not started:

- a batch still held PREFETCH_HOLD after it was handed out (its worker is held up by a
  job that ran far longer than the last one): the watcher thread revokes the rest and
  puts it back in Redis at its place in the order (a requeue that is no attempt), where
  any manager's taker finds it; so no prefetched job waits more than PREFETCH_HOLD plus
  one Redis call behind the worker that holds it;
- a worker that leaves (recycled, or gone): what it did not start, and the batch claimed
  for it that it never took;
- a cancel, from any manager: the cancel script marks the job and asks its manager (a
  message on its channel) to give back what its worker has not started; a job given back
  while marked is cancelled (see lua/cancel.lua), and the manager answers the canceller.
  A cancel of every job of a client (its exit, shutdown(cancel_futures=True)) finds the
  client's prefetched jobs among the managers' leases in Redis and asks for them alike.

A revocation has the three steps of mpsched._core.prefetch (begin under the lock, the
worker's slot without it, end under it); a give-back is one report call, made without
the lock. One that Redis could not take is kept and sent again by the link's heartbeat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mpsched._core.job import Assignment, Job
from mpsched._core.prefetch import PREFETCH_HOLD, Claims, Prefetched
from mpsched._manager.shared_give_backs import GiveBacks
from mpsched._manager.shared_leases import SharedLeases
from mpsched._store.redis.records import Claimed, Requeue

log = logging.getLogger("mpsched.manager")


class SharedPrefetch:
    """The prefetched jobs of one manager on a shared queue.

    Args:
        shared: the queue's lock (it guards every field here), leases and tokens.
        give_backs: where the jobs its workers never started go back to Redis.
        claims: the local workers' claim slots (None: nothing is ever prefetched).
    """

    def __init__(self, shared: SharedLeases, give_backs: GiveBacks, claims: Claims | None) -> None:
        self._lock = shared.lock
        self._clock = shared.clock
        self._give_backs = give_backs
        self._claims = claims
        self._prefetched = Prefetched()  # under self._lock, as every field below
        self._prefetchable: Callable[[Job], bool] | None = None  # Dispatch's predicate
        self._more: dict[str, int] = {}  # worker id -> jobs beyond one its takes ask for
        self._batches = 0  # batches with prefetched jobs handed out so far
        self._handed = 0  # prefetched jobs handed out so far
        self._closed = False
        self._hold_idle = True  # the watcher waits untimed: a batch handed must wake it
        self._hold_thread: threading.Thread | None = None
        # The hold watcher waits here: for the oldest batch held to reach PREFETCH_HOLD
        # (timed), for the next look while batches follow each other (timed), or, idle,
        # for a batch to be handed out (untimed). Notified by a batch handed out while it
        # is idle, and by close() (all).
        self._holds = self._clock.condition(self._lock)
        # A taker whose worker's prefetched jobs are being revoked waits here until that
        # ends; notified (all) at the end of every revocation.
        self._revoke_done = self._clock.condition(self._lock)

    # ------------------------------------------------------------------ handing out

    def asked_locked(
        self, worker_id: str, more: int, prefetchable: Callable[[Job], bool] | None = None
    ) -> None:
        """A take of ``worker_id`` asks for ``more`` jobs beyond one (``prefetchable``:
        which jobs may be, the same for every take)."""
        self._more[worker_id] = more
        if prefetchable is not None:
            self._prefetchable = prefetchable

    def batch_size_locked(self, worker_id: str, others_wait: int) -> int:
        """How many jobs to claim for ``worker_id`` at once: 1, or with prefetched ones
        when its worker asks for them, no other taker of ours waits for work
        (``others_wait``), and no revocation of it is under way."""
        more = self._more.get(worker_id, 0)
        if (
            more <= 0
            or self._claims is None
            or others_wait
            or not self._prefetched.may_hand_locked(worker_id)
        ):
            return 1
        return 1 + more

    def may_hand_locked(self, worker_id: str) -> bool:
        """Whether no revocation of ``worker_id``'s prefetched jobs is under way."""
        return self._prefetched.may_hand_locked(worker_id)

    def wait_revoked_locked(self, worker_id: str, deadline: float) -> None:
        """Wait until no revocation of ``worker_id``'s jobs is under way, or close."""
        while not self._prefetched.may_hand_locked(worker_id) and not self._closed:
            self._revoke_done.wait(max(deadline - self._clock.now(), 0.001))

    def grant_locked(
        self, worker_id: str, jobs: list[Claimed], grant: Callable[[Claimed], Assignment]
    ) -> tuple[list[Assignment], list[Requeue]]:
        """Lease ``jobs`` to ``worker_id`` (``grant`` leases one); returns the batch, and
        the jobs to give back: those after the first that may not be prefetched (a
        schedule's run), or all but the first for a worker that cannot claim them."""
        first, *rest = jobs
        keep = 0
        if (
            rest
            and self._claims is not None
            and self._prefetched.may_hand_locked(worker_id)
            and self._claims.reopen(worker_id)
        ):
            while keep < len(rest) and (
                self._prefetchable is None or self._prefetchable(_stub(rest[keep]))
            ):
                keep += 1
        batch = [grant(claimed) for claimed in (first, *rest[:keep])]
        if len(batch) > 1:
            now = self._clock.now()
            self._prefetched.handed_locked(
                worker_id, [(a.lease.lease_id, _job_of(a)) for a in batch[1:]], now
            )
            self._batches += 1
            self._handed += len(batch) - 1
            self._start_watching_locked()
        return batch, [Requeue(job_id=c.job_id, token=c.token, retry=False) for c in rest[keep:]]

    def _start_watching_locked(self) -> None:
        if self._hold_thread is None:
            self._hold_thread = threading.Thread(
                target=self._watch_holds, daemon=True, name="mpsched-prefetch-hold"
            )
            self._hold_thread.start()
        elif self._hold_idle:
            self._holds.notify()

    def started_locked(self, worker_id: str, lease_id: int) -> None:
        """``worker_id`` started every job of its batch up to ``lease_id``."""
        self._prefetched.started_locked(worker_id, lease_id)

    def forget_locked(self, worker_id: str) -> None:
        """``worker_id``'s last batch is over."""
        self._prefetched.forget_locked(worker_id)

    def drop_locked(self, worker_id: str) -> None:
        """``worker_id`` left, or its batch was not handed out: forget its entries."""
        self._prefetched.drop_locked(worker_id)

    def forget_worker_locked(self, worker_id: str) -> None:
        """``worker_id`` is released: forget its entries and what its takes asked for."""
        self._prefetched.drop_locked(worker_id)
        self._more.pop(worker_id, None)

    def counts_locked(self) -> tuple[int, int]:
        """Prefetched jobs handed out so far, and of those given back."""
        return self._handed, self._give_backs.given_back

    # ------------------------------------------------------------------ giving back

    def revoke(self, worker_id: str) -> list[Requeue]:
        """Revoke the prefetched jobs ``worker_id`` has not started (the three steps of
        mpsched._core.prefetch); their leases end here, and the requeues that give them
        back to Redis are the caller's to send. Called without the lock."""
        with self._lock:
            lowest = self._prefetched.begin_revoke_locked(worker_id)
        if lowest is None:
            return []
        assert self._claims is not None  # nothing is prefetched without
        cut: int | None = None
        try:
            cut = self._claims.revoke(worker_id, lowest)
        finally:
            with self._lock:
                entries = self._prefetched.end_revoke_locked(worker_id, cut)
                self._revoke_done.notify_all()
                back: list[Requeue] = []
                for lease_id, job in entries:
                    self._give_backs.drop_locked(lease_id, job.job_id, back)
        return back

    def give_back_for_cancel(self, job_ids: list[str], nonce: str | None) -> None:
        """A cancel waits for ``job_ids``: give back the unstarted prefetched jobs of
        the workers that hold any (the cancel script cancels those it marked), then
        answer it (``nonce``: another manager's cancel waits for the answer)."""
        with self._lock:
            holders = {
                w for job_id in job_ids if (w := self._prefetched.holder_locked(job_id)) is not None
            }
        back: list[Requeue] = []
        for worker_id in sorted(holders):
            back += self.revoke(worker_id)
        self._give_backs.give_back(back, () if nonce is None else (nonce,))

    # ------------------------------------------------------------------ the watcher

    def _watch_holds(self) -> None:
        """Give back the rest of each batch still held PREFETCH_HOLD after it was handed
        out. While batches follow each other it looks every PREFETCH_HOLD on its own; it
        sleeps untimed once one such look found none handed out."""
        with self._lock:
            while not self._closed:
                first = self._prefetched.first_handed_locked()
                if first is None:
                    if self._hold_idle:
                        self._holds.wait()
                    else:
                        seen = self._batches
                        self._holds.wait(PREFETCH_HOLD)
                        self._hold_idle = seen == self._batches and not self._prefetched
                    continue
                self._hold_idle = False
                now = self._clock.now()
                if first + PREFETCH_HOLD > now:
                    self._holds.wait(first + PREFETCH_HOLD - now)
                    continue
                held = self._prefetched.held_since_locked(now - PREFETCH_HOLD)
                self._lock.release()
                try:
                    back: list[Requeue] = []
                    for worker_id in held:
                        back += self.revoke(worker_id)
                    self._give_backs.give_back(back)
                except Exception:  # the watcher must outlive any error of its own
                    log.exception("giving back prefetched jobs failed")
                finally:
                    self._lock.acquire()

    def close(self) -> None:
        """Stop the watcher, and every taker waiting for a revocation to end."""
        with self._lock:
            self._closed = True
            self._holds.notify_all()
            self._revoke_done.notify_all()


def _stub(claimed: Claimed) -> Job:
    """Enough of a claimed job for Dispatch's prefetchable predicate (it reads the id)."""
    return Job(
        job_id=claimed.job_id,
        client_id=claimed.client_id,
        payload=b"",
        priority=claimed.priority,
        due=0.0,
        seq=claimed.seq,
    )


def _job_of(assignment: Assignment) -> Job:
    """The in-flight job of an assignment, as the prefetch table records it (the table
    names jobs by id)."""
    return Job(
        job_id=assignment.lease.job_id, client_id="", payload=b"", priority=0, due=0.0, seq=0
    )
