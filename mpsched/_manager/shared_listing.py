"""What a manager reads of the whole shared Redis queue: its counters, the head of its
order, and the limits its jobs run under (the store's, for every manager)."""

from __future__ import annotations

from mpsched._core.job import Job, JobRequest, QueueStats, check_name
from mpsched._core.leases import Outcomes, percentiles
from mpsched._core.limits import LimitSpec, unknown_limit
from mpsched._store.redis.records import QueueCounts
from mpsched._store.redis.store import RedisStore


class KnownLimits:
    """The limits of a Redis store as this manager last read them."""

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._known: frozenset[str] = frozenset()  # the store's, as last read

    def check_routes(self, requests: list[JobRequest]) -> None:
        """Raises InvalidJobError when a request names a queue or a limit that is not
        valid, or a limit the store does not know."""
        for request in requests:
            check_name("queue", request.queue)
            limit = request.limit
            if limit is None or limit in self._known:
                continue
            self._known = frozenset(self._store.limits())
            if limit not in self._known:
                raise unknown_limit(limit, self._known)

    def limits(self) -> dict[str, LimitSpec]:
        """The store's limits, read now."""
        found = self._store.limits()
        self._known = frozenset(found)
        return found

    def set_limit(self, name: str, spec: LimitSpec | None) -> None:
        """Declare, change or (None) forget a limit for every manager of the store."""
        self._store.set_limit(name, spec)
        self._known = self._known | {name}


def shared_stats(
    counts: QueueCounts,
    done: Outcomes,
    lateness: bool,
    withdrawn: int,
    waits: tuple[int, int],
    prefetch: tuple[int, int],
) -> QueueStats:
    """The stats of a shared queue: its counters across every manager (``counts``), with
    the lateness and waits of this one.

    Args:
        done: this manager's outcomes; ``lateness`` False: no percentiles.
        withdrawn: jobs this manager cancelled before Redis counted them.
        waits: takers waiting now, and their wake-ups so far.
        prefetch: prefetched jobs handed out so far, and of those given back.
    """
    waiting, wakeups = waits
    prefetched, given_back = prefetch
    return QueueStats(
        pending={
            "high": counts.pending[1],
            "medium": counts.pending[2],
            "low": counts.pending[3],
        },
        in_flight=counts.running,
        submitted=counts.submitted + withdrawn,
        completed=counts.done,
        failed=counts.failed,
        cancelled=counts.cancelled + withdrawn,
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


def head_jobs(store: RedisStore, n: int, now: float) -> list[Job]:
    """The next ``n`` pending jobs in the order claims would take them (a listing), due
    on this manager's clock (``now``)."""
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
        for r, due_in in store.head(n)
    ]
