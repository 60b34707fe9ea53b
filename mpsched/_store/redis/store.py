"""RedisStore: the Python side of a queue that lives in Redis and several managers share.

Keys, all under the deployment's hash tag ``{prefix}`` (one Redis Cluster slot)::

    {p}:due          sorted set: pending jobs; score = due time in µs on the server's clock,
                     member = level + seq (16 digits) + ":" + id, so that jobs due at the
                     same µs sort by priority, then seq: the exact (due, priority, seq) order
    {p}:rdy          sorted set, order="priority" only: the pending jobs already due, moved
                     from {p}:due by claims; score = level, member = due µs (16 digits) +
                     seq (16 digits) + ":" + id: the exact (priority, due, seq) order
    {p}:order        the queue's order ("time" when absent), the same for every manager
    {p}:j:<id>       hash: the job (client, owner manager, key, name, payload, level, due,
                     seq, timeout, retries, attempt, state, worker, manager, lease token,
                     prefetched, a cancel's mark, finished, outcome; for a job with large
                     buffers, the manager holding them in shared memory: NewJob.held);
                     expires result_ttl after the job ended
    {p}:k:<key>      the id of the job holding an idempotency key (expires with the job)
    {p}:seq {p}:token  counters: submission order; lease fencing tokens
    {p}:all {p}:ended  sorted sets by seq and by end time: listings, and their pruning
    {p}:c:<client>   sorted set: a client's pending jobs by due time (cancel at its exit)
    {p}:managers     sorted set: live managers by the instant their leases run out
    {p}:m:<mgr>      hash: a manager's last heartbeat and status; {p}:l:<mgr> its leases
    {p}:hb           the instant of the last heartbeat of any manager (a silence of the
                     server counts against no lease: heartbeat.lua)
    {p}:in:<mgr>     list: ids of ended jobs whose clients it serves, or that they watch
    {p}:w:<id>       set: managers (besides the owner) whose clients watch a job
    {p}:leader       the manager whose taker waits, timed, for the head (SET NX PX)
    {p}:idle         sorted set: managers with a taker waiting for work, by when that
                     mark lapses (others prefetch nothing meanwhile)
    {p}:cr:<nonce>   list: answers to a cancel that waits for prefetched jobs (BLPOP)
    {p}:stats        hash: counters across managers (among them pending jobs by level,
                     and pending_bytes: the bytes of their stored payloads)
    {p}:s:spec {p}:s:state {p}:s:order   schedules
    {p}:q:<queue>:due, :rdy   a named queue's pending jobs, as due and rdy; {p}:queues
                     the set of named queues (a job's hash names its queue, field q,
                     and its limit, field lim, only when it has one)
    {p}:limits       hash: each limit's bounds, "concurrency,count,window_us"
    {p}:lim:<name>:run, :starts, :park   a limit's jobs holding a slot (field ls), its
                     recent starts, its due jobs parked while it is full; {p}:lim-opens
                     when each full rate window with parked jobs opens
    channels {p}:wake (the head changed, or the lead is free) and {p}:ch:<mgr> (inbox)

Every change is one Lua script (lua/), atomic, reading the server's ``TIME``: no client's
or manager's clock is ever compared. Redis expires ended jobs itself; ``prune`` only drops
forgotten ids from the listing indexes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from mpsched._core.job import After, JobRecord, JobState, Order
from mpsched._core.limits import LimitSpec
from mpsched._errors import StoreUnavailableError
from mpsched._store.base import Store, StoredSchedule, check_options
from mpsched._store.redis import listings
from mpsched._store.redis.cancels import Cancels
from mpsched._store.redis.job_changes import JobChanges
from mpsched._store.redis.listings import Listings
from mpsched._store.redis.membership import Membership
from mpsched._store.redis.records import (
    Beat,
    Finish,
    Held,
    ManagerRecord,
    NewJob,
    QueueCounts,
    Reply,
    Requeue,
    StoredEnd,
    Take,
    Withdrawn,
)
from mpsched._store.redis.schedules import Schedules
from mpsched._store.redis.scripts import Scripts
from mpsched._store.redis.server import CONNECT_TIMEOUT, OPERATION_TIMEOUT
from mpsched._store.redis.session import Session
from mpsched._store.redis.subscription import Subscription
from mpsched._store.redis.url import RedisURL, parse_redis_url

# An ended job that another manager's inbox names is kept at least this long, whatever
# result_ttl says, so that manager can read its outcome and hand it to its client.
DELIVERY_KEEP = 60.0
# The timed waiter's lead lasts the head's delay, at most LEAD_SPAN seconds (then it
# looks again), plus LEAD_GRACE: a follower that finds it lapsed takes the lead.
LEAD_SPAN = 5.0
LEAD_GRACE = 0.05
# A payload must leave room for the rest of the script's arguments in one Redis request.
PAYLOAD_MARGIN = 64 * 1024


class RedisStore(Store):
    """A queue in Redis that managers share as peers (see the module docstring).

    Submits and claims run here; the rest is its collaborators': ``Session`` (the server,
    its channels, its errors), ``Cancels``, ``Membership`` (heartbeats, the inbox),
    ``JobChanges``, ``Listings`` (what it shows) and ``Schedules``.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL (a string or parsed).
        result_ttl: seconds an ended job (its record, outcome and key) is kept.
        timeout: seconds to connect and check the server; every later command may take
            ``operation_timeout``.
        order: the order of the queue (``Order.PRIORITY``: among due jobs, the highest
            priority first). It is the store's, the same for all its managers: the first
            heartbeat of a manager (``join``) records it, or refuses it while a manager
            with the other order is live.

    Raises:
        ConfigError: a bad URL or ``result_ttl``.
        ExtraMissingError: redis-py is not installed (``pip install 'mpsched[redis]'``).
        StoreError: no usable Redis server answers there (see ``server.connect``).
    """

    def __init__(
        self,
        url: str | RedisURL,
        *,
        result_ttl: float = 86400.0,
        timeout: float = CONNECT_TIMEOUT,
        operation_timeout: float = OPERATION_TIMEOUT,
        order: Order = Order.TIME,
    ) -> None:
        check_options(result_ttl)
        self.url = parse_redis_url(url) if isinstance(url, str) else url
        self.result_ttl = float(result_ttl)
        self.base = "{" + self.url.prefix + "}:"
        # Told of every call that found the server not answering (a manager's outage).
        self.on_unavailable: Callable[[StoreUnavailableError], None] = lambda exc: None
        session = self._session = Session(
            self.url,
            timeout=timeout,
            operation_timeout=operation_timeout,
            on_unavailable=lambda exc: self.on_unavailable(exc),
        )
        self.settings = session.settings
        self.client = session.client
        self.scripts = Scripts(
            self.client, self.base, ttl=self.result_ttl, keep=DELIVERY_KEEP, order=order
        )
        self._cancels = Cancels(session, self.scripts, self.base)
        self._membership = Membership(session, self.scripts)
        self._listings = Listings(session, self.scripts, self.base)
        self._schedules = Schedules(session, self.base)
        self._changes = JobChanges(session, self.scripts)

    def errors(self) -> AbstractContextManager[None]:
        """The store's errors for what redis-py raises: see ``Session.errors``."""
        return self._session.errors()

    # ------------------------------------------------------------------ the queue

    @property
    def max_payload(self) -> int:
        """The largest job or result payload this server takes, in bytes."""
        return self.settings.max_bulk - PAYLOAD_MARGIN

    def submit_after(self, jobs: Sequence[NewJob], afters: Sequence[After], owner: str) -> None:
        """Add jobs that wait for their parents: ``JobChanges.submit_after``."""
        self._changes.submit_after(jobs, afters, owner)

    def submit_jobs(
        self,
        jobs: Sequence[NewJob],
        owner: str,
        *,
        if_absent: bool = False,
        max_pending: int | None = None,
        max_pending_bytes: int | None = None,
        again: bool = False,
    ) -> tuple[list[str], str | None]:
        """Add jobs, all or none, due on the server's clock; ``owner`` is the manager that
        delivers their ends to their clients. The batch is added only if the queue then
        holds at most ``max_pending`` pending jobs and ``max_pending_bytes`` bytes of
        their stored payloads (None: no bound). ``again``: the batch was sent before and
        its answer was lost (StoreInDoubtError): a job whose id is known stands for
        itself, whatever its state (the first one was taken).

        Returns:
            For each job the id of the job that stands for it (its own, or the holder of
            its key; with ``if_absent``, a job whose id exists stands for itself and is
            not added), and the bound the batch would have passed (``"jobs"`` or
            ``"payload bytes"``, QueueFullError's unit): then nothing was added; None
            when it was.
        Raises:
            InvalidJobError: an id already in the store (without ``if_absent``), or
                repeated in the batch; nothing was added.
            StoreUnavailableError, StoreError: as :meth:`errors`.
        """
        with self._session.errors():
            return self.scripts.submit(
                jobs,
                owner,
                if_absent=if_absent,
                max_pending=max_pending,
                max_pending_bytes=max_pending_bytes,
                again=again,
            )

    def report(
        self,
        me: str,
        lease_timeout: float,
        finishes: Sequence[Finish] = (),
        requeues: Sequence[Requeue] = (),
        take: Take | None = None,
        answers: Sequence[str] = (),
    ) -> Reply:
        """End leases, put jobs back, answer the cancels (by nonce) that waited for them,
        then claim (see the claim script), in one call; ``me`` renews its leases for
        ``lease_timeout`` seconds."""
        with self._session.errors():
            return self.scripts.claim(
                me,
                lease_timeout,
                finishes,
                requeues,
                take or Take(),
                span=LEAD_SPAN,
                grace=LEAD_GRACE,
                answers=answers,
            )

    def cancel_jobs(self, me: str, job_ids: Sequence[str]) -> list[Withdrawn]:
        """Cancel pending jobs: ``Cancels.cancel_jobs``."""
        return self._cancels.cancel_jobs(me, job_ids)

    def cancel_or_ask(
        self, me: str, job_ids: Sequence[str], nonce: str
    ) -> tuple[list[Withdrawn], list[Held]]:
        """Cancel pending jobs, ask for prefetched ones: ``Cancels.cancel_or_ask``."""
        return self._cancels.cancel_or_ask(me, job_ids, nonce)

    def settle_cancel(
        self, me: str, nonce: str, job_ids: Sequence[str], *, asked: int, wait: float
    ) -> list[Withdrawn]:
        """Wait for the managers asked, then settle: ``Cancels.settle_cancel``."""
        return self._cancels.settle_cancel(me, nonce, job_ids, asked=asked, wait=wait)

    def cancel_client(
        self, me: str, client_id: str, *, not_due_only: bool = False
    ) -> list[Withdrawn]:
        """Cancel every pending job of a client (only those not yet due)."""
        return self._cancels.cancel_client(me, client_id, not_due_only=not_due_only)

    def cancel_client_or_ask(
        self, me: str, client_id: str, nonce: str
    ) -> tuple[list[Withdrawn], list[Held]]:
        """Cancel a client's jobs, ask for prefetched ones: ``Cancels.cancel_client_or_ask``."""
        return self._cancels.cancel_client_or_ask(me, client_id, nonce)

    def not_yet_due(self, client_id: str) -> list[str]:
        """The ids of a client's pending jobs not yet due by the server's clock."""
        return self._cancels.not_yet_due(client_id)

    def watch(self, me: str, job_id: str) -> StoredEnd | None:
        """Watch a job from ``me``: ``Membership.watch``."""
        return self._membership.watch(me, job_id)

    def drain(self, me: str, count: int = 500, done: int = 0) -> list[StoredEnd]:
        """Ended jobs from ``me``'s inbox: ``Membership.drain``."""
        return self._membership.drain(me, count, done)

    @property
    def order(self) -> Order:
        """The order this manager's claims follow: ``Membership.order``."""
        return self.scripts.order

    def heartbeat(
        self, me: str, lease_timeout: float, status: bytes, *, join: bool = False
    ) -> Beat:
        """Say ``me`` is alive, take back the jobs of the dead: ``Membership.heartbeat``."""
        return self._membership.heartbeat(me, lease_timeout, status, join=join)

    def forget_manager(self, me: str) -> int:
        """Forget a manager that stops: ``Membership.forget_manager``."""
        return self._membership.forget_manager(me)

    def unclaim(self, me: str, claims: Sequence[str]) -> list[str]:
        """Undo the claims whose answers ``me`` never had: ``Membership.unclaim``."""
        return self._membership.unclaim(me, claims)

    def managers(self) -> list[ManagerRecord]:
        """Every live manager, by id, with its last heartbeat."""
        return self._listings.managers()

    def counts(self) -> QueueCounts:
        """The queue's counters across every manager."""
        return self._listings.counts()

    def head(self, n: int) -> list[tuple[JobRecord, float]]:
        """The next ``n`` pending jobs in claim order: ``Listings.head``."""
        return self._listings.head(n, self.order)

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) forget a limit for every manager of the store."""
        with self._session.errors():
            self.scripts.set_limit(name, "" if spec is None else listings.bounds(spec))

    def limits(self) -> dict[str, LimitSpec]:
        """The store's limits by name."""
        return self._listings.limits()

    def parked_limit(self, job_id: str) -> str | None:
        """The limit a pending job waits for, if it is parked behind it."""
        return self._listings.parked_limit(job_id)

    def pending_by_queue(self) -> dict[str, int]:
        """Pending jobs per queue (not those parked behind a limit)."""
        return self._listings.pending_by_queue()

    def subscriber(self) -> Any:
        """A redis-py PubSub on this store's server: ``Session.subscriber``."""
        return self._session.subscriber()

    def subscribe(self, channels: Sequence[str]) -> Subscription:
        """Listen on ``channels``: ``Session.subscribe``."""
        return self._session.subscribe(channels)

    @property
    def location(self) -> str:
        return self.url.redacted

    def size(self) -> int | None:
        """Bytes the Redis server uses (all of it: other data on it included)."""
        return self._listings.size()

    def kept(self) -> int | None:
        return self._listings.kept()

    def flush(self) -> None:
        """Nothing to wait for: every call is done on the server when it returns."""
        self._session.check_open()

    def get(self, job_id: str) -> JobRecord | None:
        return self._listings.get(job_id)

    def payload(self, job_id: str) -> bytes:
        """The payload Redis keeps of job ``job_id`` (b"" for none)."""
        return self._listings.payload(job_id)

    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        return self._listings.jobs(state, limit)

    def requeue_ended(self, me: str, job_id: str, client_id: str) -> int | str:
        """Put an ended job back in the queue: ``JobChanges.requeue_ended``."""
        return self._changes.requeue_ended(me, job_id, client_id)

    def set_progress(self, updates: Sequence[tuple[str, str, str]]) -> int:
        """Record the latest progress of running jobs: ``JobChanges.set_progress``."""
        return self._changes.set_progress(updates)

    def find_key(self, key: str) -> JobRecord | None:
        return self._listings.find_key(key)

    def prune(self, now_wall: float | None = None) -> int:
        """Drop the forgotten ended jobs from the listings: ``Listings.prune``.
        ``now_wall`` is not used: the server's clock decides."""
        return self._listings.prune()

    # ------------------------------------------------------------------ schedules

    def save_schedule(self, schedule: StoredSchedule) -> None:
        self._schedules.save(schedule)

    def save_schedule_unless_same(
        self, schedule: StoredSchedule, same: Callable[[bytes], bool]
    ) -> StoredSchedule | None:
        """Record a schedule unless the same is: ``Schedules.save_unless_same``."""
        return self._schedules.save_unless_same(schedule, same)

    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        self._schedules.update(schedule_id, state)

    def delete_schedule(self, schedule_id: str) -> None:
        self._schedules.delete(schedule_id)

    def schedules(self) -> list[StoredSchedule]:
        return self._schedules.listing()

    def publish_schedule(self, schedule_id: str) -> None:
        """Tell every manager (``{p}:sched``) that a schedule changed in the store."""
        self._schedules.publish(schedule_id)

    def close(self) -> None:
        if not self._session.close():
            return
        self.scripts.close()
        self.client.close()
