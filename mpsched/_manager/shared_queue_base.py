"""SharedQueueBase: what a manager keeps of a queue that lives in Redis, and the calls that
go straight to Redis (listings, counters); SharedPrefetch (mpsched._manager.shared_prefetch)
adds the jobs claimed for a worker beyond the one it takes, and cancels, and SharedQueue
(mpsched._manager.shared_queue) the takers and their waits.

Its lock guards the lease table (mpsched._core.leases) and every field the others add; it
is never held across a call to Redis.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable

from mpsched._core.clock import Clock, SystemClock, Waitable
from mpsched._core.job import (
    Assignment,
    Job,
    JobRequest,
    Lease,
    Outcome,
    Payload,
    QueueStats,
    check_name,
)
from mpsched._core.leases import Leases, percentiles
from mpsched._core.limits import LimitSpec, unknown_limit
from mpsched._manager.shared_fence import LeaseFence
from mpsched._manager.store_outage import StoreOutage
from mpsched._payload import frames
from mpsched._store.redis.records import Reply
from mpsched._store.redis.store import RedisStore

log = logging.getLogger("mpsched.manager")

# A taker's wait after Redis failed, doubling up to the second: the link's look at the
# store (as often) wakes every taker the moment it answers again.
BACKOFF = (0.1, 1.0)


class SharedQueueBase:
    """This manager's leases on a shared Redis queue, and its calls straight to Redis.

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
    ) -> None:
        self.store = store
        self.manager_id = manager_id
        self.lease_timeout = lease_timeout
        self._clock = clock if clock is not None else SystemClock()
        self._max_pending = max_pending
        self._max_pending_bytes = max_pending_bytes
        self.outage = outage if outage is not None else StoreOutage(store.location)
        self._unregistered: Callable[[], None] = lambda: None
        # The framed payload of a job whose large buffers this manager keeps in shared
        # memory (None: not one of those); its claims get no payload for it from Redis.
        self._held_payload: Callable[[str], Payload | None] = lambda job_id: None
        # Guards every field below and the lease table. Never held across a call to
        # Redis: takers claim outside it and take it again to hand the job out.
        self._lock = threading.Lock()
        # Takers wait here: timed by the local leader (the head's delay), until the lead
        # of another manager lapses, or untimed. Notified (one) by a wake-up (a new head,
        # a free lead: wake()), by a taker that leaves while more is due or no taker
        # leads; all by close().
        self._available: Waitable = self._clock.condition(self._lock)
        self.leases = Leases(self._lock, self._clock)
        # Whether this manager's leases are still its own (a pause past its lease):
        # nothing claimed is handed out, or started by a local worker, past it.
        self.fence = LeaseFence(lease_timeout, self._clock.now)
        self._tokens: dict[str, str] = {}  # job id -> its lease's token, in flight here
        # A worker's next job, claimed in the call that recorded its last one's end (one
        # round trip per job instead of two); its next take hands it out.
        self._ready: dict[str, list[Assignment]] = {}
        self._early: dict[str, float] = {}  # worker id -> the hand-off window of its takes
        # worker id -> the queues it serves, in order (): every queue)
        self._queues: dict[str, tuple[str, ...]] = {}
        # Takers of this manager serve different queues: each asks Redis for itself
        # (one's empty claim says nothing of another's queues) and waits timed for the
        # head of its own; a wake-up wakes them all.
        self._mixed = False
        self._known_limits: frozenset[str] = frozenset()  # the store's, as last read
        self._gone: dict[str, float] = {}  # retired workers, as JobQueue's
        self._gen = 0  # wake-ups so far: a claim older than the last one may be stale
        self._leader: object | None = None  # the taker that times the head for us
        self._idle_gen: int | None = None  # the queue was empty at this generation
        self._follow_until: float | None = None  # another manager leads until then
        self._waiting = 0
        self._backoff = BACKOFF[0]
        self._closed = False
        self._withdrawn = self._wakeups = 0
        self._claims_made = itertools.count(1)  # names each claim of this manager's
        # Claims that went out and got no answer (Redis may have run them): undone by
        # the link once Redis answers again (settle_doubtful).
        self._doubtful: list[str] = []
        # Jobs a call whose answer was lost may have ended (a cancel): looked up by the
        # link once Redis answers, and their ends told here.
        self._recheck: list[str] = []
        store.on_unavailable = self.outage

    def claim_name(self) -> str:
        """A name for the next claim (Take.claim), unique in this manager."""
        return str(next(self._claims_made))

    def in_doubt(self, claim: str) -> None:
        """A claim went out and its answer never came: Redis may have leased its jobs to
        this manager without it knowing them."""
        with self._lock:
            self._doubtful.append(claim)

    def recheck(self, job_ids: list[str]) -> None:
        """A call whose answer was lost may have ended these jobs: look them up later."""
        with self._lock:
            self._recheck += job_ids

    def take_recheck(self) -> list[str]:
        with self._lock:
            job_ids, self._recheck = self._recheck, []
        return job_ids

    def settle_doubtful(self) -> int:
        """Undo the claims whose answers never came, now that Redis answered a later call
        (they have run by now, or never will): their jobs go back to the queue. Returns
        how many did.

        Raises:
            StoreUnavailableError: Redis did not answer; they are kept for the next try.
        """
        with self._lock:
            doubtful, self._doubtful = self._doubtful, []
        if not doubtful:
            return 0
        try:
            back = self.store.unclaim(self.manager_id, doubtful)
        except BaseException:
            with self._lock:
                self._doubtful[:0] = doubtful
            raise
        if back:
            log.warning(
                "%d job(s) claimed for this manager in a call whose answer was "
                "lost went back to the queue, never started: %s",
                len(back),
                ", ".join(back),
            )
        return len(back)

    @property
    def clock(self) -> Clock:
        return self._clock

    def on_unregistered(self, callback: Callable[[], None]) -> None:
        """Called when a claim finds this manager presumed dead (it should register again
        at once: mpsched._manager.shared_link beats now)."""
        self._unregistered = callback

    def on_held_payload(self, lookup: Callable[[str], Payload | None]) -> None:
        """Where the payloads of the jobs this manager holds in shared memory come from
        (mpsched._payload.segments.Segments.held_payload): a claim of one of those brings
        no payload from Redis."""
        self._held_payload = lookup

    def with_payloads(self, reply: Reply) -> Reply:
        """``reply`` with each claimed payload as this manager's workers take it:

        - a job held here in shared memory (Redis left its payload out): the framed
          payload that names the segment. One this manager no longer holds (it ended
          here under a lease that had run out, and a peer put it back) is read from Redis;
        - a job another manager's client submitted: without the empty frame that tells a
          worker that the job's client maps this manager's shared memory (it does not:
          a large result then goes inline, rather than into a segment read back at once).

        Any other payload comes back as it is, and so does a reply with only those.

        Raises:
            StoreUnavailableError, StoreError: a payload could not be read from Redis.
        """
        me = self.manager_id
        if all(c.payload and (c.owner == me or c.payload[:4] != frames.MAGIC) for c in reply.jobs):
            return reply
        jobs = []
        for claimed in reply.jobs:
            payload = claimed.payload or self._held_payload(claimed.job_id)
            if payload is None:
                log.info(
                    "job %s was claimed without its payload, which this manager "
                    "no longer holds; it is read from the store",
                    claimed.job_id,
                )
                payload = self.store.payload(claimed.job_id)
            elif claimed.owner != me:
                payload = frames.unframed(payload)
            jobs.append(claimed._replace(payload=payload))
        return reply._replace(jobs=jobs)

    @property
    def max_pending(self) -> int | None:
        return self._max_pending

    @property
    def max_pending_bytes(self) -> int | None:
        return self._max_pending_bytes

    def set_on_returned(self, on_returned: Callable[[Job], None] | None) -> None:
        """Jobs go back to Redis by requeue (SharedQueue.requeue), never by revocation."""

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
        """End a lease with its worker's outcome (the journal reports it to Redis)."""
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
            delay = None if job is None or self._closed else delay_of(job)
            return self.leases.complete_locked(lease_id, outcome, final=delay is None), delay

    def fail(self, job: Job, *, timed_out: bool = False) -> None:
        self.leases.fail(job, timed_out=timed_out)

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

    def cancel_client_jobs(self, client_id: str, *, not_due_only: bool = False) -> list[Job]:
        withdrawn = self.store.cancel_client(self.manager_id, client_id, not_due_only=not_due_only)
        return [
            Job(job_id=w.job_id, client_id=w.client_id, payload=b"", priority=0, due=0.0, seq=0)
            for w in withdrawn
        ]

    def not_due(self, client_id: str) -> list[str]:
        return self.store.not_yet_due(client_id)

    def count_withdrawn(self, count: int) -> None:
        with self._lock:
            self._withdrawn += count

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
            waiting, wakeups = self._waiting, self._wakeups
            prefetched, given_back = self._prefetch_counts_locked()
        return QueueStats(
            pending={
                "high": counts.pending[1],
                "medium": counts.pending[2],
                "low": counts.pending[3],
            },
            in_flight=counts.running,
            submitted=counts.submitted + self._withdrawn,
            completed=counts.done,
            failed=counts.failed,
            cancelled=counts.cancelled + self._withdrawn,
            retried=counts.retried,
            timed_out=done.timed_out,
            started_early=done.started_early,
            next_due_in=counts.head_in,
            lateness=percentiles(done.recent) if lateness else {},
            lateness_samples=done.lateness_samples,
            wakeups=wakeups,
            waiting=waiting,
            crashed=done.crashed,
            prefetched=prefetched,
            revoked=given_back,
            retried_exception=counts.retried_exception,
            retried_later=counts.retried_later,
        )

    def _prefetch_counts_locked(self) -> tuple[int, int]:
        """Prefetched jobs handed out so far, and of those given back (none here)."""
        return 0, 0

    def head(self, n: int) -> list[Job]:
        """The next ``n`` pending jobs in the order claims would take them (a listing),
        due on this manager's clock."""
        now = self._clock.now()
        return [
            Job(
                job_id=r.job_id,
                client_id=r.client_id,
                payload=b"",
                priority=r.priority,
                due=now + due_in,
                seq=r.seq,
                timeout=r.timeout,
                retries=r.retries,
                attempt=r.attempt,
                key=r.key,
                name=r.name,
            )
            for r, due_in in self.store.head(n)
        ]

    def __len__(self) -> int:
        return sum(self.store.counts().pending.values())

    # ------------------------------------------------------------ queues and limits

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Raises InvalidJobError when a request names a queue or a limit that is not
        valid, or a limit the store does not know."""
        for request in requests:
            check_name("queue", request.queue)
            limit = request.limit
            if limit is None or limit in self._known_limits:
                continue
            self._known_limits = frozenset(self.store.limits())
            if limit not in self._known_limits:
                raise unknown_limit(limit, self._known_limits)

    def pending_by_queue(self) -> dict[str, int]:
        return self.store.pending_by_queue()

    def waiting_for(self, job_id: str) -> str | None:
        limit = self.store.parked_limit(job_id)
        return None if limit is None else f"limit {limit}"

    def limits(self) -> dict[str, LimitSpec]:
        found = self.store.limits()
        self._known_limits = frozenset(found)
        return found

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) forget a limit for every manager of the store."""
        self.store.set_limit(name, spec)
        self._known_limits = self._known_limits | {name}

    def close(self) -> None:
        """Stop: every waiting or future ``take`` raises SchedulerShutdownError."""
        with self._lock:
            self._closed = True
            self._available.notify_all()
