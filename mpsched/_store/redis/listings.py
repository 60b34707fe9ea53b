"""What a Redis store shows of itself, read with plain commands (no script but the listing's
and the prune's): the live managers, the counters, the head, its limits and queues, job
records, and the sizes it keeps. A limit's bounds are kept in ``{p}:limits`` as
"concurrency,count,window_us"."""

from __future__ import annotations

from mpsched._core.job import DEFAULT_QUEUE, JobRecord, JobState, Order
from mpsched._core.limits import WINDOWS, LimitSpec
from mpsched._store.redis import views
from mpsched._store.redis.records import ManagerRecord, QueueCounts
from mpsched._store.redis.scripts import US, Scripts
from mpsched._store.redis.session import Session


def bounds(spec: LimitSpec) -> str:
    """A limit's bounds as the scripts read them: "concurrency,count,window_us"."""
    count, window = spec.rate if spec.rate is not None else ("", None)
    return (
        f"{'' if spec.concurrency is None else spec.concurrency},{count},"
        f"{'' if window is None else round(window * US)}"
    )


def spec(bounds: str) -> LimitSpec:
    """The limit that ``bounds`` (as :func:`bounds` writes them) describe."""
    concurrency, count, window = bounds.split(",")
    rate = None if not count else (int(count), int(window) / US)
    if rate is not None and rate[1] not in WINDOWS.values():
        rate = None
    return LimitSpec(concurrency=int(concurrency) if concurrency else None, rate=rate)


class Listings:
    """The store's views of its queue, managers, limits and records, and their pruning."""

    def __init__(self, session: Session, scripts: Scripts, base: str) -> None:
        self._session = session
        self._client = session.client
        self._scripts = scripts
        self._base = base

    def managers(self) -> list[ManagerRecord]:
        """Every live manager, by id, with its last heartbeat."""
        with self._session.errors():
            return views.managers(self._client, self._base)

    def counts(self) -> QueueCounts:
        """The queue's counters across every manager."""
        with self._session.errors():
            return views.counts(self._client, self._base)

    def head(self, n: int, order: Order) -> list[tuple[JobRecord, float]]:
        """The next ``n`` pending jobs in claim order, each with the seconds until it is
        due on the server's clock (<= 0: due). With order="priority", the jobs due
        already come first by (priority, due, seq); of those that came due since the last
        claim, only the first ``n`` by due time are looked at."""
        if n <= 0:
            return []
        with self._session.errors():
            return views.head(self._client, self._base, n, order)

    def limits(self) -> dict[str, LimitSpec]:
        """The store's limits by name."""
        with self._session.errors():
            found = self._client.hgetall(self._base + "limits")
        return {name.decode(): spec(kept.decode()) for name, kept in found.items()}

    def parked_limit(self, job_id: str) -> str | None:
        """The limit a pending job waits for, if it is parked behind it."""
        client, base = self._client, self._base
        with self._session.errors():
            level, seq, limit = client.hmget(f"{base}j:{job_id}", "pr", "s", "lim")
            if limit is None or level is None:
                return None
            member = f"{int(level)}{int(seq):016d}:{job_id}"
            parked = client.zscore(f"{base}lim:{limit.decode()}:park", member)
        return None if parked is None else str(limit.decode())

    def pending_by_queue(self) -> dict[str, int]:
        """Pending jobs per queue (not those parked behind a limit)."""
        client, base = self._client, self._base
        with self._session.errors():
            names = sorted(n.decode() for n in client.smembers(base + "queues"))
            pipe = client.pipeline(transaction=False)
            for name in [DEFAULT_QUEUE, *names]:
                prefix = base if name == DEFAULT_QUEUE else f"{base}q:{name}:"
                pipe.zcard(prefix + "due")
                pipe.zcard(prefix + "rdy")
            counts = pipe.execute()
        return {
            name: counts[2 * k] + counts[2 * k + 1]
            for k, name in enumerate([DEFAULT_QUEUE, *names])
        }

    def size(self) -> int:
        """Bytes the Redis server uses (all of it: other data on it included)."""
        with self._session.errors():
            return int(self._client.info("memory")["used_memory"])

    def kept(self) -> int:
        """The job records this deployment keeps (one ZCARD: its listing index, which
        forgets expired ids at the next prune)."""
        with self._session.errors():
            return int(self._client.zcard(self._base + "all"))

    def get(self, job_id: str) -> JobRecord | None:
        """The record of job ``job_id``, None for one the store does not hold."""
        with self._session.errors():
            return views.get(self._client, self._base, job_id)

    def payload(self, job_id: str) -> bytes:
        """The payload Redis keeps of job ``job_id`` (b"" for none)."""
        with self._session.errors():
            found: bytes | None = self._client.hget(f"{self._base}j:{job_id}", "p")
        return found or b""

    def jobs(self, state: JobState | None, limit: int | None) -> list[JobRecord]:
        """The jobs in ``state`` (None: all), in submission order, at most ``limit``."""
        with self._session.errors():
            rows = self._scripts.jobs(state, limit)
        return [views.record(row[0].decode(), row[1:-1], row[-1] or None) for row in rows]

    def find_key(self, key: str) -> JobRecord | None:
        """The job holding idempotency key ``key``, if any."""
        with self._session.errors():
            holder = self._client.get(f"{self._base}k:{key}")
        return None if holder is None else self.get(holder.decode())

    def prune(self) -> int:
        """Drop from the listings the ended jobs Redis has forgotten (it expires them by
        itself, ``result_ttl`` after they ended); returns how many."""
        dropped = 0
        while True:
            with self._session.errors():
                step = self._scripts.prune(1000)
            dropped += step
            if step < 1000:
                return dropped
