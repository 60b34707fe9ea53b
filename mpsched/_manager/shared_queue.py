"""SharedQueue: a manager's side of a queue that lives in Redis and several managers share.

It stands where a JobQueue stands for ManagerService (take, complete, requeue, cancel,
stats), but holds no pending job: they are in Redis (mpsched._store.redis). What it keeps
is what only this manager can know: its workers' leases (the in-flight table of
mpsched._core.leases, each with its Redis fencing token), and its takers' waiting.

Waiting is leader/follower across managers and inside this one::

    take ─▶ claim (Lua, server's TIME) ─▶ a due job: leased, handed out
                │
                └─ nothing due ─▶ this manager leads (Redis key): one taker sleeps
                                  until the head is due, on this manager's clock
                                  another leads: sleep until its lead lapses
                                  queue empty: sleep until woken
    wake-ups: a submit that makes a new head, a leader that leaves (pub/sub, through
              mpsched._manager.shared_link), a reconnection

Only durations measured on the server's clock (the head's delay, a job's delay) cross to
this manager, which times them on its own monotonic clock: its clock may be hours off
any other's. A taker whose claim found nothing new since the last wake-up waits without
asking Redis again, so idle managers send nothing but their heartbeats (and the leader's
look every LEAD_SPAN seconds while a job waits in the future).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from mpsched._core.clock import Clock, SystemClock, Waitable
from mpsched._core.job import Assignment, Job, Lease, Outcome, QueueStats
from mpsched._core.leases import Leases, LostLease, percentiles
from mpsched._errors import SchedulerShutdownError, StoreUnavailableError
from mpsched._store.redis.records import Claimed, Reply, Requeue, Take
from mpsched._store.redis.store import RedisStore

log = logging.getLogger("mpsched.manager")

GONE_MEMORY = 120.0  # as JobQueue's: a retired worker's late take gets nothing
FOLLOW_GRACE = 0.01  # a follower looks again this long after the leader's lead lapses
BACKOFF = (0.1, 5.0)  # a taker's wait after Redis failed, doubling up to the second
ASK = 0.0  # a taker's wait that means: claim now


class Outage:
    """One WARNING when Redis stops answering, one INFO line when it is back."""

    def __init__(self, location: str) -> None:
        self._location = location
        # Guards _since; nobody waits on it.
        self._lock = threading.Lock()
        self._since: StoreUnavailableError | None = None

    def __call__(self, error: StoreUnavailableError | None) -> None:
        with self._lock:
            was, self._since = self._since, error if error is not None else None
            if was is None and error is not None:
                log.warning("the job store does not answer (%s); retrying with back-off, "
                            "jobs that run go on", error)
            elif was is not None and error is None:
                log.info("the job store %s answers again", self._location)

    @property
    def down(self) -> bool:
        with self._lock:
            return self._since is not None


class SharedQueue:
    """This manager's takers and leases on a shared Redis queue.

    Args:
        store: the RedisStore (its connection is shared by every taker thread).
        manager_id: this manager's id in the store.
        lease_timeout: seconds after its last renewal that peers presume this manager
            dead and take its jobs back.
        outage: told of each failed call to Redis and each that succeeds (one warning
            per outage).
    """

    def __init__(self, store: RedisStore, *, manager_id: str, lease_timeout: float,
                 clock: Clock | None = None, max_pending: int | None = None,
                 outage: Outage | None = None) -> None:
        self.store = store
        self.manager_id = manager_id
        self.lease_timeout = lease_timeout
        self._clock = clock if clock is not None else SystemClock()
        self._max_pending = max_pending
        self.outage = outage if outage is not None else Outage(store.location)
        self._unregistered: Callable[[], None] = lambda: None
        # Guards every field below and the lease table. Never held across a call to
        # Redis: takers claim outside it and take it again to hand the job out.
        self._lock = threading.Lock()
        # Takers wait here: timed by the local leader (the head's delay), until the lead
        # of another manager lapses, or untimed. Notified (one) by a wake-up (a new head,
        # a free lead: wake()), by a taker that leaves while more is due or no taker
        # leads; all by close().
        self._available: Waitable = self._clock.condition(self._lock)
        self.leases = Leases(self._lock, self._clock)
        self._tokens: dict[str, str] = {}  # job id -> its lease's token, in flight here
        self._gone: dict[str, float] = {}  # retired workers, as JobQueue's
        self._gen = 0  # wake-ups so far: a claim older than the last one may be stale
        self._leader: object | None = None  # the taker that times the head for us
        self._idle_gen: int | None = None  # the queue was empty at this generation
        self._follow_until: float | None = None  # another manager leads until then
        self._waiting = 0
        self._backoff = BACKOFF[0]
        self._closed = False
        self._cancelled = self._withdrawn = self._wakeups = 0

    @property
    def clock(self) -> Clock:
        return self._clock

    def on_unregistered(self, callback: Callable[[], None]) -> None:
        """Called when a claim finds this manager presumed dead (it should register again
        at once: mpsched._manager.shared_link beats now)."""
        self._unregistered = callback

    @property
    def max_pending(self) -> int | None:
        return self._max_pending

    @property
    def max_pending_bytes(self) -> int | None:
        return None

    # ------------------------------------------------------------------ take

    def take(self, worker_id: str, timeout: float, early: float = 0.0) -> Assignment | None:
        """Claim the next due job for ``worker_id`` under a new lease, waiting at most
        ``timeout`` seconds (see the module docstring); None when none came due.

        Raises:
            SchedulerShutdownError: the queue was closed; the taker should exit.
        """
        deadline = self._clock.now() + timeout
        while True:
            with self._lock:
                if self._closed:
                    raise SchedulerShutdownError("the queue is closed")
                if worker_id in self._gone:
                    return None
                gen = self._gen
                wait = self._known_wait_locked()
            asked = wait == ASK
            reply = self._claim(worker_id, early) if asked else None
            with self._lock:
                if self._closed:
                    raise SchedulerShutdownError("the queue is closed")
                lead: object | None = None
                if asked:
                    if reply is not None and reply.jobs:
                        return self._hand_out_locked(worker_id, reply, early)
                    if self._gen != gen:
                        continue  # woken while it claimed: what it saw may be old
                    wait, lead = self._wait_after_locked(reply, early)
                remaining = deadline - self._clock.now()
                if remaining <= 0:
                    if lead is not None and self._leader is lead:
                        self._leader = None
                    self._leave_locked()
                    return None
                if wait is not None and wait <= 0:
                    continue
                self._wait_locked(remaining if wait is None else min(wait, remaining), lead)

    def take_batch(self, worker_id: str, timeout: float, early: float = 0.0, more: int = 0,
                   prefetchable: Callable[[Job], bool] | None = None) -> list[Assignment]:
        """:meth:`take`, as a batch of one: a shared queue prefetches nothing (``more`` is
        not used), since a job held by one manager's worker could not be taken back by
        another manager whose worker is free (mpsched._core.prefetch's promise)."""
        assignment = self.take(worker_id, timeout, early)
        return [] if assignment is None else [assignment]

    def revoke(self, worker_id: str) -> int:
        """Nothing is ever prefetched here, so nothing is taken back (see take_batch)."""
        return 0

    def set_on_returned(self, on_returned: Callable[[Job], None] | None) -> None:
        """Jobs go back to Redis by requeue (SharedQueue.requeue), never by revocation."""

    def _known_wait_locked(self) -> float | None:
        """How long a new taker may wait without asking Redis, nothing having changed
        since it was last asked (None: until woken); ASK when it must ask."""
        if self._leader is not None:
            return None  # follow our own leader, untimed
        if self._idle_gen == self._gen:
            return None  # empty, and nothing was submitted since
        if self._follow_until is not None and self._follow_until > self._clock.now():
            return self._follow_until - self._clock.now()
        return ASK

    def _claim(self, worker_id: str, early: float) -> Reply | None:
        """One claim; None when Redis failed (the taker then backs off)."""
        try:
            reply = self.store.report(self.manager_id, self.lease_timeout, take=Take(
                want=1, worker=f"{self.manager_id}/{worker_id}", early=early, lead="wait"))
        except StoreUnavailableError as exc:
            self.outage(exc)
            return None
        self.outage(None)
        if not reply.registered:
            self._unregistered()
        return reply

    def _hand_out_locked(self, worker_id: str, reply: Reply, early: float) -> Assignment:
        [claimed] = reply.jobs
        now = self._clock.now()
        self._backoff = BACKOFF[0]
        if self._waiting and (self._leader is None or (
                reply.head_in is not None and reply.head_in <= early)):
            self._available.notify()  # more is due, or nobody times the head: pass it on
        self._tokens[claimed.job_id] = claimed.token
        return self.leases.grant_locked(_job(claimed, now), worker_id, now)

    def _wait_after_locked(self, reply: Reply | None,
                           early: float) -> tuple[float | None, object | None]:
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
            if self._leader is not None:
                return None, None  # another taker of ours times it already
            self._leader = lead = object()
            return max(reply.head_in - early, 1e-6), lead
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
            if self._waiting:
                self._available.notify()

    # ------------------------------------------------------------------ leases

    def token_of(self, job_id: str) -> str | None:
        """The token of a lease of this manager's on ``job_id`` (kept until its end is
        reported to Redis: pop_token)."""
        with self._lock:
            return self._tokens.get(job_id)

    def pop_token(self, job_id: str) -> str | None:
        with self._lock:
            return self._tokens.pop(job_id, None)

    def complete(self, lease_id: int, outcome: Outcome, worker_id: str = "") -> Job | None:
        """End a lease with its worker's outcome (the journal reports it to Redis)."""
        return self.leases.complete(lease_id, outcome)

    def fail(self, job: Job, *, timed_out: bool = False) -> None:
        self.leases.fail(job, timed_out=timed_out)

    def requeue(self, job: Job, *, retry: bool) -> bool:
        """Put a job whose lease was lost back in Redis (an attempt if ``retry``); False
        when Redis refused it (the lease was stale) or could not be reached (then its
        lease runs out and a peer, or this manager, takes it back)."""
        token = self.pop_token(job.job_id)
        if token is None:
            return False
        try:
            reply = self.store.report(self.manager_id, self.lease_timeout,
                                      requeues=[Requeue(job.job_id, token, retry)])
        except StoreUnavailableError as exc:
            log.error("job %s could not be put back in the queue (%s); it will be when "
                      "its lease runs out", job.job_id, exc)
            return False
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
            for old, when in list(self._gone.items()):
                if when >= now - GONE_MEMORY:
                    break
                del self._gone[old]
            return self.leases.release_worker_locked(worker_id, now)

    def retire_if_leased(self, worker_id: str, lease_id: int) -> bool:
        with self._lock:
            if not self.leases.holds_locked(lease_id):
                return False
            self._gone.pop(worker_id, None)
            self._gone[worker_id] = self._clock.now()
            return True

    def expired(self) -> tuple[list[Lease], float | None]:
        return self.leases.expired()

    def wait_drained(self, timeout: float) -> bool:
        return self.leases.wait_drained(timeout)

    def held(self) -> int:
        """Jobs in flight here."""
        return len(self.leases.held())

    # ------------------------------------------------------------------ cancel

    def cancel_jobs(self, job_ids: list[str]) -> list[Job]:
        """Cancel those of ``job_ids`` that are pending (in any manager); the jobs
        cancelled (their ids and clients) whose end this manager tells."""
        withdrawn = self.store.cancel_jobs(self.manager_id, job_ids)
        with self._lock:
            self._cancelled += len(withdrawn)
        return [Job(job_id=w.job_id, client_id=w.client_id, payload=b"", priority=0, due=0.0,
                    seq=0) for w in withdrawn]

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        withdrawn = self.store.cancel_client(self.manager_id, client_id,
                                             not_due_only=not_due_only)
        return [Job(job_id=w.job_id, client_id=w.client_id, payload=b"", priority=0, due=0.0,
                    seq=0) for w in withdrawn]

    def not_due(self, client_id: str) -> list[str]:
        return self.store.not_yet_due(client_id)

    def count_withdrawn(self, count: int) -> None:
        with self._lock:
            self._withdrawn += count

    def reschedule(self, job_id: str, due: float) -> bool:
        """Nothing to move: due times in Redis are UTC on the server's clock, which a
        jump of this manager's wall clock does not change."""
        return False

    # ------------------------------------------------------------------ stats, stop

    def stats(self, *, lateness: bool = True) -> QueueStats:
        """The queue's counters across every manager; lateness and waits of this one
        (``lateness`` False: no percentiles, as JobQueue.stats)."""
        counts = self.store.counts()
        with self._lock:
            done = self.leases.outcomes_locked(samples=lateness)
            waiting, wakeups = self._waiting, self._wakeups
        return QueueStats(
            pending={"high": counts.pending[1], "medium": counts.pending[2],
                     "low": counts.pending[3]},
            in_flight=counts.running, submitted=counts.submitted + self._withdrawn,
            completed=counts.done, failed=counts.failed,
            cancelled=counts.cancelled + self._withdrawn, retried=counts.retried,
            timed_out=done.timed_out, started_early=done.started_early,
            next_due_in=counts.head_in,
            lateness=percentiles(done.recent) if lateness else {},
            lateness_samples=done.lateness_samples, wakeups=wakeups, waiting=waiting,
            crashed=done.crashed)

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in the order claims would take them (a listing),
        due on this manager's clock."""
        now = self._clock.now()
        return [Job(job_id=r.job_id, client_id=r.client_id, payload=b"", priority=r.priority,
                    due=now + due_in, seq=r.seq, timeout=r.timeout, retries=r.retries,
                    attempt=r.attempt, key=r.key, name=r.name)
                for r, due_in in self.store.head(n)]

    def __len__(self) -> int:
        return sum(self.store.counts().pending.values())

    def close(self) -> None:
        """Stop: every waiting or future ``take`` raises SchedulerShutdownError."""
        with self._lock:
            self._closed = True
            self._available.notify_all()


def _job(claimed: Claimed, now: float) -> Job:
    """The in-flight record of a claimed job, due ``claimed.delay`` from ``now`` on this
    manager's clock (its attempt is counted again when the lease is granted)."""
    return Job(job_id=claimed.job_id, client_id=claimed.client_id, payload=claimed.payload,
               priority=claimed.priority, due=now + claimed.delay, seq=claimed.seq,
               timeout=claimed.timeout, retries=claimed.retries, attempt=claimed.attempt - 1,
               key=claimed.key, name=claimed.name)
