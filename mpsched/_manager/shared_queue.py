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

SharedQueue defines every method its callers use, and holds one helper per role, all
under its lock:

- ``leases`` (mpsched._core.leases): the in-flight table; ``fence``
  (mpsched._manager.shared_fence): whether those leases are still this manager's;
- Takers (mpsched._manager.shared_takers): claims, and hand-outs to workers;
- TakerWaits (mpsched._manager.shared_waits): when takers ask Redis, how long they wait;
- SharedPrefetch (mpsched._manager.shared_prefetch): jobs claimed beyond one;
- GiveBacks (mpsched._manager.shared_give_backs): jobs put back in Redis;
- SharedCancels (mpsched._manager.shared_cancels): cancels, which may ask peers;
- LostAnswers (mpsched._manager.shared_doubts): calls whose answers Redis lost;
- ClaimedPayloads (mpsched._manager.shared_payloads): the payloads of claimed jobs;
- KnownLimits (mpsched._manager.shared_listing): the store's limits, as last read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from mpsched._core.clock import Clock, SystemClock
from mpsched._core.job import Assignment, Job, JobRequest, Lease, Outcome, Payload, QueueStats
from mpsched._core.leases import Leases, LostLease
from mpsched._core.limits import LimitSpec
from mpsched._core.prefetch import Claims
from mpsched._errors import StoreInDoubtError
from mpsched._manager.shared_cancels import SharedCancels
from mpsched._manager.shared_doubts import LostAnswers
from mpsched._manager.shared_fence import LeaseFence
from mpsched._manager.shared_give_backs import GiveBacks
from mpsched._manager.shared_leases import SharedLeases
from mpsched._manager.shared_listing import KnownLimits, head_jobs, shared_stats
from mpsched._manager.shared_prefetch import SharedPrefetch
from mpsched._manager.shared_takers import Takers
from mpsched._manager.shared_waits import TakerWaits
from mpsched._manager.store_outage import StoreOutage
from mpsched._store.redis.records import Finish
from mpsched._store.redis.store import RedisStore


class SharedQueue:
    """This manager's takers and leases on a shared Redis queue.

    Args:
        store: the RedisStore (its connection is shared by every taker thread).
        manager_id: this manager's id in the store.
        lease_timeout: seconds after its last renewal that peers presume this manager
            dead and take its jobs back.
        max_pending, max_pending_bytes: the bounds this manager's submits keep the whole
            queue under (jobs pending in Redis, the bytes of their stored payloads; None:
            no bound). They are checked in Redis, against every manager's jobs.
        outage: told of each failed call to Redis and each that succeeds (one warning
            per outage).
        claims: the local workers' claim slots (None: nothing is ever prefetched).
    """

    def __init__(
        self,
        store: RedisStore,
        *,
        manager_id: str,
        lease_timeout: float,
        clock: Clock | None = None,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        outage: StoreOutage | None = None,
        claims: Claims | None = None,
    ) -> None:
        self.store = store
        self.manager_id = manager_id
        self.lease_timeout = lease_timeout
        self.clock = clock if clock is not None else SystemClock()
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.outage = outage if outage is not None else StoreOutage(store.location)
        # Guards this manager's leases and takers' state: the lease table, the tokens,
        # and every field of the helpers below. Never held across a call to Redis:
        # takers claim outside it and take it again to hand the job out.
        self._lock = threading.Lock()
        self.leases = Leases(self._lock, self.clock)
        # Whether this manager's leases are still its own (a pause past its lease):
        # nothing claimed is handed out, or started by a local worker, past it.
        self.fence = LeaseFence(lease_timeout, self.clock.now)
        self._withdrawn = 0  # jobs cancelled here before Redis counted them
        shared = SharedLeases(
            store, manager_id, lease_timeout, self._lock, self.clock, self.leases, self.outage
        )
        self._tokens = shared.tokens  # job id -> its lease's token, in flight here
        self._limits = KnownLimits(store)
        self._waits = TakerWaits(self._lock, self.clock)
        # What the link sends again once Redis answers: the calls whose answers were
        # lost, and the jobs Redis could not take back.
        self.doubts = LostAnswers(shared)
        self.give_backs = GiveBacks(shared)
        self._prefetch = SharedPrefetch(shared, self.give_backs, claims)
        self._takers = Takers(
            shared, self.fence, self._waits, self._prefetch, self.give_backs, self.doubts
        )
        self._cancels = SharedCancels(store, manager_id, self._prefetch, self.doubts)
        store.on_unavailable = self.outage

    def on_unregistered(self, callback: Callable[[], None]) -> None:
        """Called when a claim finds this manager presumed dead (it should register again
        at once: mpsched._manager.shared_link beats now)."""
        self._takers.unregistered = callback

    def on_held_payload(self, lookup: Callable[[str], Payload | None]) -> None:
        """Where the payloads of jobs held in shared memory here come from
        (mpsched._payload.segments): a claim of one of those brings no payload from Redis."""
        self._takers.payloads.held_payload = lookup

    def set_on_returned(self, on_returned: Callable[[Job], None] | None) -> None:
        """Jobs go back to Redis by requeue (SharedQueue.requeue), never by revocation."""

    # ------------------------------------------------------------------ takes

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
        takers = self._takers
        deadline = self.clock.now() + timeout
        with self._lock:
            ready = takers.begin_locked(worker_id, early, more, prefetchable, queues, deadline)
        if ready is not None and takers.fenced(worker_id, ready):
            return ready
        while True:
            batch = takers.take_once(worker_id, early, deadline)
            if batch is not None and (not batch or takers.fenced(worker_id, batch)):
                return batch

    def report_ends(
        self, finishes: list[Finish], worker_id: str | None, more: int | None = None
    ) -> list[int]:
        """Record jobs' ends under their leases (Finish), and, when their worker's take
        hands them in (``more`` set: it waits for its next jobs) and it holds no other
        job, claim that worker's next due job, with ``more`` jobs beyond it, in the same
        call (its take hands them out; see Takers.next_take_locked). Returns each
        finish's result (0: the lease was stale and nothing was recorded; 1; 2: deliver
        it here).

        Raises:
            StoreUnavailableError: Redis did not answer; nothing is known to be recorded.
        """
        with self._lock:
            take = self._takers.next_take_locked(worker_id, more)
        try:
            reply = self.store.report(
                self.manager_id, self.lease_timeout, finishes=finishes, take=take
            )
        except StoreInDoubtError:
            if take is not None:
                self.doubts.in_doubt(take.claim)
            raise
        if reply.jobs:
            assert worker_id is not None and take is not None
            self._takers.hand_in(worker_id, reply, take.early)
        return reply.finished

    def wake(self) -> None:
        """Something changed in Redis: one waiting taker looks again (TakerWaits.wake)."""
        self._waits.wake()

    def wake_all(self) -> None:
        """Redis answers again after an outage: every waiting taker looks at once."""
        self._waits.wake_all()

    # ------------------------------------------------------------------ leases

    def next_lease_id(self) -> int:
        """The id of the next lease this manager grants (every earlier one is lower)."""
        with self._lock:
            return self.leases.next_id_locked()

    def note_progress(self, lease_id: int, job_id: str, progress: str) -> None:
        """Note a job's latest progress on its lease here (this manager's page reads it)."""
        with self._lock:
            found = self.leases.find_locked(job_id)
            if found is not None and found[1].lease_id == lease_id:
                found[0].progress = progress

    def token_of(self, job_id: str) -> str | None:
        """The token of a lease of this manager's on ``job_id`` (kept until its end is
        reported to Redis: pop_token)."""
        with self._lock:
            return self._tokens.get(job_id)

    def pop_token(self, job_id: str) -> str | None:
        with self._lock:
            return self._tokens.pop(job_id, None)

    def complete(self, lease_id: int, outcome: Outcome, worker_id: str = "") -> Job | None:
        """End a lease with its worker's outcome (the journal reports it to Redis): it
        started every job of its batch up to this one."""
        with self._lock:
            if worker_id:
                self._prefetch.started_locked(worker_id, lease_id)
        return self.leases.complete(lease_id, outcome)

    def retry(
        self,
        lease_id: int,
        outcome: Outcome,
        worker_id: str,
        delay_of: Callable[[Job], float | None],
    ) -> tuple[Job | None, float | None]:
        """As JobQueue.retry, for this manager's lease: the job goes back to Redis when the
        journal records the end of its attempt (SharedJournal.retried), under its lease's
        token, in one step there."""
        with self._lock:
            job = self.leases.job_locked(lease_id)
            delay = None if job is None or self._waits.closed else delay_of(job)
            return self.leases.complete_locked(lease_id, outcome, final=delay is None), delay

    def fail(self, job: Job, *, timed_out: bool = False) -> None:
        self.leases.fail(job, timed_out=timed_out)

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put a job whose lease was lost back in Redis (see GiveBacks.requeue)."""
        return self.give_backs.requeue(job, retry=retry)

    def return_lease(self, lease_id: int) -> Job | None:
        """Give back a job just handed out that must not run: never received."""
        with self._lock:
            job = self.leases.drop_locked(lease_id)
        if job is not None:
            self.requeue(job, retry=False)
        return job

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        return self._takers.retire_if_leased(worker_id, lease_id)

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds and retire its id (as JobQueue's)."""
        return self._takers.release_worker(worker_id)

    def expired(self) -> tuple[list[Lease], float | None]:
        return self.leases.expired()

    def wait_drained(self, timeout: float) -> bool:
        return self.leases.wait_drained(timeout)

    def held(self) -> int:
        """Jobs in flight here."""
        return len(self.leases.held())

    # ------------------------------------------------------------------ giving back, cancels

    def revoke(self, worker_id: str) -> int:
        """A worker leaves to be replaced: give back what it did not start (Takers.revoke)."""
        return self._takers.revoke(worker_id)

    def give_back_for_cancel(self, job_ids: list[str], nonce: str | None) -> None:
        """A cancel waits for ``job_ids`` (see SharedPrefetch.give_back_for_cancel)."""
        self._prefetch.give_back_for_cancel(job_ids, nonce)

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Cancel pending jobs, and prefetched ones (see SharedCancels.cancel_jobs)."""
        return self._cancels.cancel_jobs(job_ids)

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        """Cancel a client's jobs (see SharedCancels.cancel_client_jobs)."""
        return self._cancels.cancel_client_jobs(client_id, not_due_only=not_due_only)

    def not_due(self, client_id: str) -> list[str]:
        return self.store.not_yet_due(client_id)

    def count_withdrawn(self, count: int) -> None:
        with self._lock:
            self._withdrawn += count

    # ------------------------------------------------------------------ listings and limits

    def reschedule(self, job_id: str, due: float) -> bool:
        """Nothing to move: due times in Redis are UTC on the server's clock, which a
        jump of this manager's wall clock does not change."""
        return False

    def stats(self, *, lateness: bool = True) -> QueueStats:
        """The queue's counters across every manager; lateness and waits of this one
        (``lateness`` False: no percentiles, as JobQueue.stats)."""
        counts = self.store.counts()
        with self._lock:
            done = self.leases.outcomes_locked(samples=lateness)
            waits, prefetch = self._waits.counts_locked(), self._prefetch.counts_locked()
            withdrawn = self._withdrawn
        return shared_stats(counts, done, lateness, withdrawn, waits, prefetch)

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in claim order (see shared_listing.head_jobs)."""
        return head_jobs(self.store, n, self.clock.now())

    def __len__(self) -> int:
        return sum(self.store.counts().pending.values())

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Check the queues and limits requests name (see KnownLimits.check_routes)."""
        self._limits.check_routes(requests)

    def pending_by_queue(self) -> dict[str, int]:
        return self.store.pending_by_queue()

    def waiting_for(self, job_id: str) -> str | None:
        limit = self.store.parked_limit(job_id)
        return None if limit is None else f"limit {limit}"

    def limits(self) -> dict[str, LimitSpec]:
        return self._limits.limits()

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) forget a limit for every manager of the store."""
        self._limits.set_limit(name, spec)

    def close(self) -> None:
        """Stop: every waiting or future ``take`` raises SchedulerShutdownError."""
        self._waits.close()
        self._prefetch.close()
