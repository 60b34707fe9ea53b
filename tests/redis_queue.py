"""What the tests of a RedisStore's queue share (tests/store/test_redis_queue*.py): jobs to
submit, a claim by a manager's worker, and the server's clock (tests/store/conftest.py
opens the stores)."""

from __future__ import annotations

from typing import Any

from mpsched._store.redis.records import NewJob, Take
from mpsched._store.redis.store import RedisStore

LEASE = 30.0
HIGH, MEDIUM, LOW = 1, 2, 3


def new(
    job_id: str,
    *,
    level: int = MEDIUM,
    delay: float | None = 0.0,
    at: float | None = None,
    key: str | None = None,
    retries: int = 0,
    client: str = "c1",
) -> NewJob:
    """A job due after ``delay`` (or ``at`` a UTC instant) whose payload names it."""
    return NewJob(
        job_id,
        client,
        key,
        "tests.jobs:work",
        f"payload {job_id}".encode(),
        level,
        None if at is not None else delay,
        at,
        None,
        retries,
    )


def take(
    store: RedisStore, manager: str = "m1", want: int = 1, lead: str = "wait", **kw: Any
) -> Any:
    """A claim of up to ``want`` jobs by ``manager``'s worker w1, ready to lead the wait."""
    return store.report(
        manager, LEASE, take=Take(want=want, worker=f"{manager}/w1", lead=lead, **kw)
    )


def server_now(store: RedisStore) -> float:
    seconds, micros = store.client.time()
    return float(seconds + micros / 1e6)
