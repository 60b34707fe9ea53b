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

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mpsched._core.job import DEFAULT_QUEUE, After, JobRecord, JobState, Order
from mpsched._core.limits import WINDOWS, LimitSpec
from mpsched._errors import (
    ConfigError,
    InvalidJobError,
    JobNotFoundError,
    StoreError,
    StoreInDoubtError,
    StoreUnavailableError,
)
from mpsched._store.base import Store, StoredSchedule, check_options
from mpsched._store.redis import schedules as stored_schedules
from mpsched._store.redis import views
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
from mpsched._store.redis.scripts import US, Scripts, Unanswered
from mpsched._store.redis.server import (
    CONNECT_TIMEOUT,
    OPERATION_TIMEOUT,
    ServerSettings,
    check_settings,
    describe,
    open_client,
    redis_module,
    warn_persistence,
)
from mpsched._store.redis.subscription import Subscription
from mpsched._store.redis.url import RedisURL, parse_redis_url

log = logging.getLogger("mpsched.store")

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
        self._redis = redis_module()
        checking = open_client(self.url, timeout=timeout)
        try:
            self.settings: ServerSettings = check_settings(checking, self.url)
        finally:
            checking.close()
        warn_persistence(self.url, self.settings)
        self.client = open_client(self.url, timeout=operation_timeout)
        self.scripts = Scripts(
            self.client, self.base, ttl=self.result_ttl, keep=DELIVERY_KEEP, order=order
        )
        # Guards _closed; nobody waits on it.
        self._lock = threading.Lock()
        self._closed = False
        # Told of every call that found the server not answering (a manager's outage).
        self.on_unavailable: Callable[[StoreUnavailableError], None] = lambda exc: None

    # ------------------------------------------------------------------ errors

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Turn what redis-py raises into the store's errors: StoreUnavailableError when
        the server does not answer (StoreInDoubtError when it took a script and gave no
        answer: it may have run it), InvalidJobError for a job the store refused, else
        StoreError; all naming the URL without its password."""
        if self._closed:
            raise StoreError(self.url.redacted, "the store is closed")
        try:
            yield
        except Unanswered as exc:
            doubt = StoreInDoubtError(self.url.redacted, describe(exc.cause))
            self.on_unavailable(doubt)
            raise doubt from None
        except (self._redis.ConnectionError, self._redis.TimeoutError, OSError) as exc:
            if isinstance(exc, StoreError):
                raise
            if not isinstance(exc, self._redis.TimeoutError):
                # The server went away: its idle pooled connections are stale too.
                self.client.connection_pool.disconnect(inuse_connections=False)
            error = StoreUnavailableError(self.url.redacted, describe(exc))
            self.on_unavailable(error)
            raise error from None
        except self._redis.ResponseError as exc:
            text = str(exc)
            if "DUPLICATE" in text:
                raise InvalidJobError(text.split("DUPLICATE ", 1)[-1]) from None
            raise StoreError(self.url.redacted, describe(exc)) from None
        except self._redis.RedisError as exc:
            raise StoreError(self.url.redacted, describe(exc)) from None

    # ------------------------------------------------------------------ the queue

    @property
    def max_payload(self) -> int:
        """The largest job or result payload this server takes, in bytes."""
        return self.settings.max_bulk - PAYLOAD_MARGIN

    def submit_after(self, jobs: Sequence[NewJob], afters: Sequence[After], owner: str) -> None:
        """Add jobs that wait for their parents (``afters``, one each), all or none: each
        becomes due once its last parent ended (see after.lua).

        Raises:
            JobNotFoundError: a parent the store does not know; nothing was added.
            InvalidJobError: a job id the store holds already.
            StoreUnavailableError, StoreError: as :meth:`submit_jobs`.
        """
        try:
            with self.errors():
                self.scripts.submit_after(jobs, afters, owner)
        except StoreError as exc:
            if "NOTFOUND " in str(exc):
                parent = str(exc).split("NOTFOUND ", 1)[1].split()[0].rstrip(")'\"")
                raise JobNotFoundError(parent) from None
            raise

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
        with self.errors():
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
        with self.errors():
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
        """Cancel those of ``job_ids`` that are pending; the managers of their clients and
        watchers are told (``me`` tells its own: ``Withdrawn.mine``)."""
        with self.errors():
            return self.scripts.cancel(me, job_ids)[0]

    def cancel_or_ask(
        self, me: str, job_ids: Sequence[str], nonce: str
    ) -> tuple[list[Withdrawn], list[Held]]:
        """:meth:`cancel_jobs`; and those a manager holds prefetched are marked under
        ``nonce``, and that manager asked to give them back (see the cancel script):
        :meth:`settle_cancel` says which were."""
        with self.errors():
            return self.scripts.cancel(me, job_ids, nonce=nonce)

    def settle_cancel(
        self, me: str, nonce: str, job_ids: Sequence[str], *, asked: int, wait: float
    ) -> list[Withdrawn]:
        """Wait up to ``wait`` seconds for the ``asked`` managers that :meth:`cancel_or_ask`
        asked to answer (on a list of the server's: no polling), then settle: those of
        ``job_ids`` that were given back and cancelled; the others had started (their
        cancel failed), or their manager did not answer in time."""
        with self.errors():
            answer = f"{self.base}cr:{nonce}"
            deadline = time.monotonic() + wait
            while asked > 0 and (left := deadline - time.monotonic()) > 0:
                if self.client.blpop([answer], timeout=max(left, 0.001)) is None:
                    break
                asked -= 1
            self.client.delete(answer)
            return self.scripts.cancel(me, job_ids, nonce=nonce, settle=True)[0]

    def cancel_client(
        self, me: str, client_id: str, *, not_due_only: bool = False
    ) -> list[Withdrawn]:
        """Cancel every pending job of a client (only those not yet due)."""
        with self.errors():
            return self.scripts.cancel(me, (), client_id, not_due_only)[0]

    def cancel_client_or_ask(
        self, me: str, client_id: str, nonce: str
    ) -> tuple[list[Withdrawn], list[Held]]:
        """:meth:`cancel_client`; and the client's jobs that any live manager holds
        prefetched (found among the managers' leases) are marked under ``nonce`` and
        their managers asked, as by :meth:`cancel_or_ask`."""
        with self.errors():
            return self.scripts.cancel(me, (), client_id, nonce=nonce)

    def not_yet_due(self, client_id: str) -> list[str]:
        """The ids of a client's pending jobs not yet due by the server's clock."""
        with self.errors():
            now_s, now_us = self.client.time()
            now = now_s * US + now_us
            ids = self.client.zrangebyscore(f"{self.base}c:{client_id}", f"({now}", "+inf")
        return [i.decode() for i in ids]

    def watch(self, me: str, job_id: str) -> StoredEnd | None:
        """Watch a job from ``me``: None for an unknown job, else where it stands
        (``StoredEnd.state``); unless it has ended, ``me`` is told when it ends (its inbox)."""
        with self.errors():
            return self.scripts.watch(me, job_id)

    def drain(self, me: str, count: int = 500, done: int = 0) -> list[StoredEnd]:
        """Up to ``count`` ended jobs from the head of ``me``'s inbox, once the ``done``
        ones the last call returned are dropped (``me`` delivered them): an answer that
        was lost is answered again."""
        with self.errors():
            return self.scripts.drain(me, count, done)

    @property
    def order(self) -> Order:
        """The order this manager's claims follow: its own, or the store's once a
        heartbeat found that to be another (see :meth:`heartbeat`)."""
        return self.scripts.order

    def heartbeat(
        self, me: str, lease_timeout: float, status: bytes, *, join: bool = False
    ) -> Beat:
        """Say ``me`` is alive for ``lease_timeout`` more seconds, with its status; take
        back the jobs of managers presumed dead. The store takes :attr:`order` when no
        other manager is live; else a manager that joins (``join``) with another order
        is refused, and one that beats again after it was presumed dead follows the
        store's (logged).

        Raises:
            ConfigError: (``join``) a live manager of the store has another order.
            StoreUnavailableError, StoreError: as :meth:`errors`.
        """
        with self.errors():
            try:
                beat = self.scripts.heartbeat(me, lease_timeout, status, join=join)
            except self._redis.ResponseError as exc:
                theirs = str(exc).partition("ORDER ")[2].split()
                if not theirs:
                    raise
                raise ConfigError(
                    "order",
                    self.order.value,
                    f"{theirs[0]!r} (the order of the live managers of the store "
                    f"{self.url.redacted})",
                ) from None
        if beat.order is not self.order:
            log.error(
                "the job store %s has order=%r now (a manager started with it while "
                "this one was presumed dead): this manager follows it",
                self.url.redacted,
                beat.order.value,
            )
            self.scripts.order = beat.order
        return beat

    def forget_manager(self, me: str) -> int:
        """Forget a manager that stops; a job still leased to it (a claim whose answer
        it never had) goes back to the queue, its attempt not counted. Returns how many
        did."""
        with self.errors():
            return self.scripts.leave(me)

    def unclaim(self, me: str, claims: Sequence[str]) -> list[str]:
        """Undo the claims (by Take.claim) whose answers ``me`` never had: their jobs
        still leased to it go back to the queue, their attempts not counted. Call it
        once the server has answered a later call (every such claim has run by then, or
        never will). Returns the ids put back."""
        with self.errors():
            return self.scripts.unclaim(me, claims)

    def managers(self) -> list[ManagerRecord]:
        """Every live manager, by id, with its last heartbeat."""
        with self.errors():
            return views.managers(self.client, self.base)

    def counts(self) -> QueueCounts:
        """The queue's counters across every manager."""
        with self.errors():
            return views.counts(self.client, self.base)

    def head(self, n: int) -> list[tuple[JobRecord, float]]:
        """The next ``n`` pending jobs in claim order, each with the seconds until it is
        due on the server's clock (<= 0: due). With order="priority", the jobs due
        already come first by (priority, due, seq); of those that came due since the last
        claim, only the first ``n`` by due time are looked at."""
        if n <= 0:
            return []
        with self.errors():
            return views.head(self.client, self.base, n, self.order)

    # ------------------------------------------------------------ queues and limits

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) forget a limit for every manager of the store."""
        with self.errors():
            self.scripts.set_limit(name, "" if spec is None else _bounds(spec))

    def limits(self) -> dict[str, LimitSpec]:
        """The store's limits by name."""
        with self.errors():
            found = self.client.hgetall(self.base + "limits")
        return {name.decode(): _spec(bounds.decode()) for name, bounds in found.items()}

    def parked_limit(self, job_id: str) -> str | None:
        """The limit a pending job waits for, if it is parked behind it."""
        with self.errors():
            level, seq, limit = self.client.hmget(f"{self.base}j:{job_id}", "pr", "s", "lim")
            if limit is None or level is None:
                return None
            member = f"{int(level)}{int(seq):016d}:{job_id}"
            parked = self.client.zscore(f"{self.base}lim:{limit.decode()}:park", member)
        return None if parked is None else limit.decode()

    def pending_by_queue(self) -> dict[str, int]:
        """Pending jobs per queue (not those parked behind a limit)."""
        with self.errors():
            names = sorted(n.decode() for n in self.client.smembers(self.base + "queues"))
            pipe = self.client.pipeline(transaction=False)
            for name in [DEFAULT_QUEUE, *names]:
                prefix = self.base if name == DEFAULT_QUEUE else f"{self.base}q:{name}:"
                pipe.zcard(prefix + "due")
                pipe.zcard(prefix + "rdy")
            counts = pipe.execute()
        return {
            name: counts[2 * k] + counts[2 * k + 1]
            for k, name in enumerate([DEFAULT_QUEUE, *names])
        }

    def publish_schedule(self, schedule_id: str) -> None:
        """Tell every manager (``{p}:sched``) that a schedule changed in the store."""
        with self.errors():
            self.client.publish(self.base + "sched", schedule_id)

    def subscriber(self) -> Any:
        """A redis-py PubSub on this store's server (the caller subscribes and reads it)."""
        with self.errors():
            return self.client.pubsub(ignore_subscribe_messages=False)

    def subscribe(self, channels: Sequence[str]) -> Subscription:
        """Listen on ``channels`` (on a connection of its own), once the server confirmed
        each subscription.

        Raises:
            StoreUnavailableError, StoreError: as :meth:`errors`.
        """
        with self.errors():
            pubsub = self.client.pubsub()
            try:
                return Subscription(pubsub, channels, self.errors)
            except BaseException:
                pubsub.close()
                raise

    # ------------------------------------------------------------------ records

    @property
    def location(self) -> str:
        return self.url.redacted

    def size(self) -> int | None:
        """Bytes the Redis server uses (all of it: other data on it included)."""
        with self.errors():
            return int(self.client.info("memory")["used_memory"])

    def kept(self) -> int | None:
        """The job records this deployment keeps (one ZCARD: its listing index, which
        forgets expired ids at the next prune)."""
        with self.errors():
            return int(self.client.zcard(self.base + "all"))

    def flush(self) -> None:
        """Nothing to wait for: every call is done on the server when it returns."""
        if self._closed:
            raise StoreError(self.url.redacted, "the store is closed")

    def get(self, job_id: str) -> JobRecord | None:
        with self.errors():
            return views.get(self.client, self.base, job_id)

    def payload(self, job_id: str) -> bytes:
        """The payload Redis keeps of job ``job_id`` (b"" for none)."""
        with self.errors():
            return self.client.hget(f"{self.base}j:{job_id}", "p") or b""

    def jobs(self, state: JobState | None = None, limit: int | None = None) -> list[JobRecord]:
        with self.errors():
            rows = self.scripts.jobs(state, limit)
        return [views.record(row[0].decode(), row[1:-1], row[-1] or None) for row in rows]

    def requeue_ended(self, me: str, job_id: str, client_id: str) -> int | str:
        """Put a failed or cancelled job back in the queue, due now (requeue.lua): 1, or 2
        when it became the head; else the word that says why not."""
        with self.errors():
            return self.scripts.requeue(me, job_id, client_id)

    def set_progress(self, updates: Sequence[tuple[str, str, str]]) -> int:
        """Record the latest progress of running jobs: (job id, its lease's token, JSON
        text) each; an update of a job that no longer runs under that lease is dropped.
        Returns how many were recorded."""
        with self.errors():
            return self.scripts.progress(updates)

    def find_key(self, key: str) -> JobRecord | None:
        with self.errors():
            holder = self.client.get(f"{self.base}k:{key}")
        return None if holder is None else self.get(holder.decode())

    def prune(self, now_wall: float | None = None) -> int:
        """Drop from the listings the ended jobs Redis has forgotten (it expires them by
        itself, ``result_ttl`` after they ended); returns how many. ``now_wall`` is not
        used: the server's clock decides."""
        dropped = 0
        while True:
            with self.errors():
                step = self.scripts.prune(1000)
            dropped += step
            if step < 1000:
                return dropped

    def save_schedule(self, schedule: StoredSchedule) -> None:
        with self.errors():
            stored_schedules.save(self.client, self.base, schedule)

    def save_schedule_unless_same(
        self, schedule: StoredSchedule, same: Callable[[bytes], bool]
    ) -> StoredSchedule | None:
        """Record a schedule, unless one with its id is recorded already whose spec
        ``same`` says is this one's: then that one, as recorded (its timeline), is
        returned and nothing is written. One step across managers: of two that add the
        same schedule at once, one writes and the other gets what it wrote."""
        with self.errors():
            return stored_schedules.save_unless_same(self.client, self.base, schedule, same)

    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        with self.errors():
            stored_schedules.update(self.client, self.base, schedule_id, state)

    def delete_schedule(self, schedule_id: str) -> None:
        with self.errors():
            stored_schedules.delete(self.client, self.base, schedule_id)

    def schedules(self) -> list[StoredSchedule]:
        with self.errors():
            return stored_schedules.listing(self.client, self.base)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.scripts.close()
        self.client.close()


def _bounds(spec: LimitSpec) -> str:
    """A limit's bounds as the scripts read them: "concurrency,count,window_us"."""
    count, window = spec.rate if spec.rate is not None else ("", None)
    return (
        f"{'' if spec.concurrency is None else spec.concurrency},{count},"
        f"{'' if window is None else round(window * US)}"
    )


def _spec(bounds: str) -> LimitSpec:
    concurrency, count, window = bounds.split(",")
    rate = None if not count else (int(count), int(window) / US)
    if rate is not None and rate[1] not in WINDOWS.values():
        rate = None
    return LimitSpec(concurrency=int(concurrency) if concurrency else None, rate=rate)
