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
- SharedPrefetch (mpsched._manager.shared_prefetch): jobs claimed beyond one, give-backs;
- LostAnswers (mpsched._manager.shared_doubts): calls whose answers Redis lost;
- ClaimedPayloads (mpsched._manager.shared_payloads): the payloads of claimed jobs;
- KnownLimits (mpsched._manager.shared_listing): the store's limits, as last read.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable

from mpsched._core.clock import Clock, SystemClock
from mpsched._core.job import Assignment, Job, JobRequest, Lease, Outcome, Payload, QueueStats
from mpsched._core.leases import Leases, LostLease
from mpsched._core.limits import LimitSpec
from mpsched._core.prefetch import Claims
from mpsched._errors import StoreInDoubtError, StoreUnavailableError
from mpsched._manager.shared_doubts import LostAnswers
from mpsched._manager.shared_fence import LeaseFence
from mpsched._manager.shared_listing import KnownLimits, head_jobs, shared_stats
from mpsched._manager.shared_payloads import ClaimedPayloads
from mpsched._manager.shared_prefetch import SharedPrefetch, withdrawn_jobs
from mpsched._manager.shared_takers import Takers
from mpsched._manager.shared_waits import TakerWaits
from mpsched._manager.store_outage import StoreOutage
from mpsched._store.redis.records import Finish, Requeue
from mpsched._store.redis.store import RedisStore

log = logging.getLogger("mpsched.manager")


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
        self._clock = clock if clock is not None else SystemClock()
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes
        self.outage = outage if outage is not None else StoreOutage(store.location)
        # Guards this manager's leases and takers' state: the lease table, the tokens,
        # and every field of the helpers below. Never held across a call to Redis:
        # takers claim outside it and take it again to hand the job out.
        self._lock = threading.Lock()
        self.leases = Leases(self._lock, self._clock)
        # Whether this manager's leases are still its own (a pause past its lease):
        # nothing claimed is handed out, or started by a local worker, past it.
        self.fence = LeaseFence(lease_timeout, self._clock.now)
        self._tokens: dict[str, str] = {}  # job id -> its lease's token, in flight here
        self._withdrawn = 0  # jobs cancelled here before Redis counted them
        self._limits = KnownLimits(store)
        # The calls whose answers were lost, and this manager's prefetched jobs and
        # give-backs: the link sends again what Redis could not take.
        self.doubts = LostAnswers(store, manager_id, self._lock)
        self._payloads = ClaimedPayloads(store, manager_id)
        self._waits = TakerWaits(self._lock, self._clock)
        self.prefetch = SharedPrefetch(
            store,
            manager_id=manager_id,
            lease_timeout=lease_timeout,
            lock=self._lock,
            clock=self._clock,
            leases=self.leases,
            tokens=self._tokens,
            outage=self.outage,
            claims=claims,
        )
        self._takers = Takers(
            store,
            manager_id=manager_id,
            lease_timeout=lease_timeout,
            lock=self._lock,
            clock=self._clock,
            leases=self.leases,
            fence=self.fence,
            tokens=self._tokens,
            outage=self.outage,
            prefetch=self.prefetch,
            waits=self._waits,
            doubts=self.doubts,
            payloads=self._payloads,
        )
        store.on_unavailable = self.outage

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def max_pending(self) -> int | None:
        return self._max_pending

    @property
    def max_pending_bytes(self) -> int | None:
        return self._max_pending_bytes

    def on_unregistered(self, callback: Callable[[], None]) -> None:
        """Called when a claim finds this manager presumed dead (it should register again
        at once: mpsched._manager.shared_link beats now)."""
        self._takers.unregistered = callback

    def on_held_payload(self, lookup: Callable[[str], Payload | None]) -> None:
        """Where the payloads of the jobs this manager holds in shared memory come from
        (mpsched._payload.segments.Segments.held_payload): a claim of one of those brings
        no payload from Redis."""
        self._payloads.held_payload = lookup

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
        deadline = self._clock.now() + timeout
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
        call (its take hands them out). Returns each finish's result (0: the lease was
        stale and nothing was recorded; 1; 2: deliver it here).

        Only a take claims: ends that come while the worker runs more of its batch (its
        reporter's), or after it left, must not hand it a batch, whose claim slot would
        be reopened under the feet of a revocation of the jobs it has not started.

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
                self.prefetch.started_locked(worker_id, lease_id)
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
            self.prefetch.keep_unreturned([back])
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

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        with self._lock:
            if not self.leases.holds_locked(lease_id):
                return False
            self._takers.retire_locked(worker_id, self._clock.now())
            return True

    def release_worker(self, worker_id: str) -> list[LostLease]:
        """End every lease a worker holds and retire its id (as JobQueue's)."""
        with self._lock:
            now = self._clock.now()
            self._takers.release_locked(worker_id, now)
            self.prefetch.forget_worker_locked(worker_id)
            return self.leases.release_worker_locked(worker_id, now)

    def expired(self) -> tuple[list[Lease], float | None]:
        return self.leases.expired()

    def wait_drained(self, timeout: float) -> bool:
        return self.leases.wait_drained(timeout)

    def held(self) -> int:
        """Jobs in flight here."""
        return len(self.leases.held())

    # ------------------------------------------------------------------ giving back

    def revoke(self, worker_id: str) -> int:
        """A worker leaves to be replaced: give back the prefetched jobs it did not start
        and the batch claimed for it that it never took; returns how many."""
        with self._lock:
            back = self.prefetch.drop_leases_locked(self._takers.pop_ready_locked(worker_id))
        back += self.prefetch.revoke(worker_id)
        self.prefetch.give_back(back)
        return len(back)

    def give_back_for_cancel(self, job_ids: list[str], nonce: str | None) -> None:
        """A cancel waits for ``job_ids`` (see SharedPrefetch.give_back_for_cancel)."""
        self.prefetch.give_back_for_cancel(job_ids, nonce)

    # ------------------------------------------------------------------ cancels

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Cancel those of ``job_ids`` that are pending, or prefetched by any manager and
        not started yet (that manager gives them back first, within CANCEL_WAIT); the
        jobs cancelled (their ids and clients) whose end this manager tells."""
        nonce = secrets.token_hex(8)
        try:
            withdrawn, asked = self.store.cancel_or_ask(self.manager_id, job_ids, nonce)
        except StoreInDoubtError:
            self.doubts.recheck(job_ids)  # cancelled, maybe: its clients are told once it answers
            raise
        return self.prefetch.settle_cancel(nonce, withdrawn, asked)

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        """Cancel every pending job of a client, and those of its jobs that any manager
        holds prefetched and has not started (as :meth:`cancel_jobs`: within CANCEL_WAIT;
        a job that started runs to its end). With ``not_due_only``, only its pending jobs
        not yet due: a prefetched job is due."""
        if not_due_only:
            return withdrawn_jobs(
                self.store.cancel_client(self.manager_id, client_id, not_due_only=True)
            )
        nonce = secrets.token_hex(8)
        withdrawn, asked = self.store.cancel_client_or_ask(self.manager_id, client_id, nonce)
        return self.prefetch.settle_cancel(nonce, withdrawn, asked)

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
            waiting, wakeups = self._waits.counts_locked()
            prefetched, given_back = self.prefetch.counts_locked()
            withdrawn = self._withdrawn
        return shared_stats(
            counts,
            done,
            lateness=lateness,
            withdrawn=withdrawn,
            waiting=waiting,
            wakeups=wakeups,
            prefetched=prefetched,
            given_back=given_back,
        )

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in the order claims would take them (a listing),
        due on this manager's clock."""
        return head_jobs(self.store, n, self._clock.now())

    def __len__(self) -> int:
        return sum(self.store.counts().pending.values())

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Raises InvalidJobError when a request names a queue or a limit that is not
        valid, or a limit the store does not know."""
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
        self.prefetch.close()
