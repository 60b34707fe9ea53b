"""What a Redis store's listings read off the server with plain commands (pipelined, no
script, changing nothing): the live managers, the queue's counters and head, a job's
record. The caller (RedisStore) maps redis-py's errors to the store's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpsched._core.job import DEFAULT_QUEUE, JobRecord, JobState, Order
from mpsched._core.retrying import RetryState
from mpsched._store.redis.records import AFTER, ManagerRecord, QueueCounts

US = 1_000_000  # microseconds per second
# As jobs.lua's FIELDS; "rs": a job's retry state, for a job with a retry policy; "pg": its
# latest progress; "q", "lim": its queue and limit, for a job that names one; "wn": how
# many parents a job waiting for them waits for.
RECORD_FIELDS = (
    "c",
    "k",
    "n",
    "pr",
    "d",
    "s",
    "to",
    "r",
    "a",
    "sub",
    "st",
    "w",
    "f",
    "x",
    "rs",
    "pg",
    "q",
    "lim",
    "wn",
)


def managers(client: Any, base: str) -> list[ManagerRecord]:
    """Every live manager, by id, with its last heartbeat."""
    ids = [m.decode() for m in client.zrange(base + "managers", 0, -1)]
    pipe = client.pipeline(transaction=False)
    pipe.time()
    for manager in ids:
        pipe.hmget(f"{base}m:{manager}", "seen", "lease_ms", "status")
    (now_s, now_us), *rows = pipe.execute()
    now = now_s * US + now_us
    return [
        ManagerRecord(
            manager_id=manager,
            seen_ago=(now - int(seen)) / US,
            lease_timeout=int(lease) / 1000,
            status=status or b"",
        )
        for manager, (seen, lease, status) in zip(ids, rows, strict=True)
        if seen is not None
    ]


def counts(client: Any, base: str) -> QueueCounts:
    """The queue's counters across every manager."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(base + "stats")
    pipe.zrange(base + "due", 0, 0, withscores=True)
    pipe.time()
    pipe.zrange(base + "managers", 0, -1)
    pipe.zrange(base + "rdy", 0, 0)
    stats, top, (now_s, now_us), live, ready = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for manager in live:
        pipe.scard(f"{base}l:{manager.decode()}")
    running = sum(pipe.execute())
    number = {k.decode(): int(v) for k, v in stats.items()}
    first = _ready_due(ready[0]) if ready else top[0][1] if top else None
    head_in = None if first is None else first / US - (now_s + now_us / US)
    return QueueCounts(
        pending={level: number.get(f"pending:{level}", 0) for level in (1, 2, 3)},
        pending_bytes=number.get("pending_bytes", 0),
        running=running,
        submitted=number.get("submitted", 0),
        done=number.get("done", 0),
        failed=number.get("failed", 0),
        cancelled=number.get("cancelled", 0),
        retried=number.get("retried", 0),
        head_in=head_in,
        retried_exception=number.get("retried:exception", 0),
        retried_later=number.get("retried:retry_later", 0),
    )


def head(client: Any, base: str, n: int, order: Order) -> list[tuple[JobRecord, float]]:
    """The next ``n`` (> 0) pending jobs in claim order, each with the seconds until it is
    due on the server's clock (RedisStore.head)."""
    pipe = client.pipeline(transaction=False)
    pipe.zrange(base + "rdy", 0, n - 1)
    pipe.zrange(base + "due", 0, n - 1)
    pipe.time()
    ready, members, (now_s, now_us) = pipe.execute()
    now = now_s + now_us / US
    records = [
        job for job in (get(client, base, m.decode()[33:]) for m in ready) if job is not None
    ]
    later = []
    for member in members:
        job = get(client, base, member.decode()[18:])
        if job is None:
            continue
        if job.due_wall <= now and order is Order.PRIORITY:
            records.append(job)  # due: a claim moves it among the ready ones
        else:
            later.append(job)
    records.sort(key=lambda r: (r.priority, r.due_wall, r.seq))
    return [(job, job.due_wall - now) for job in (records + later)[:n]]


def get(client: Any, base: str, job_id: str) -> JobRecord | None:
    """A job's record, with its outcome; None for a job the store does not know."""
    row = client.hmget(f"{base}j:{job_id}", *RECORD_FIELDS, "out")
    if row[10] is None:
        return None
    return record(job_id, row[:-1], row[-1])


def _ready_due(member: bytes) -> int:
    """The due time in µs of a member of ``{p}:rdy`` (its first 16 digits)."""
    return int(member[:16])


def record(job_id: str, row: Sequence[Any], outcome: bytes | None) -> JobRecord:
    (
        client,
        key,
        name,
        level,
        due,
        seq,
        timeout,
        retries,
        attempt,
        submitted,
        state,
        worker,
        finished,
        crashed,
        retry,
        progress,
        queue,
        limit,
        waiting,
    ) = row
    if crashed is not None and crashed.startswith(AFTER.encode()):
        crashed = None  # failed after a parent: no worker ran it
    return JobRecord(
        job_id=job_id,
        client_id=client.decode(),
        key=None if key is None else key.decode(),
        name=name.decode(),
        priority=int(level),
        due_wall=int(due) / US,
        seq=int(seq),
        timeout=float(timeout) if timeout else None,
        retries=int(retries),
        attempt=int(attempt),
        submitted_wall=int(submitted) / US,
        state=JobState(state.decode()),
        worker_id=(worker or crashed or b"").decode() or None,
        finished_wall=None if finished is None else int(finished) / US,
        outcome=outcome,
        error=None if retry is None else RetryState.decode(retry.decode()).error,
        progress=None if progress is None else progress.decode(),
        queue=DEFAULT_QUEUE if queue is None else queue.decode(),
        limit=None if limit is None else limit.decode(),
        waiting_for=f"after {int(waiting)} jobs" if waiting else None,
    )
