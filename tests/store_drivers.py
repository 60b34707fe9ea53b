"""Drivers of the store contract: the same calls on each backend.

A journal store (MemoryStore, SQLiteStore) is told what its manager decided: which job
is leased, when a job ended (the test's fake wall clock). A shared store (RedisStore)
decides those itself: a claim names the job, its lease carries a token that the finish
must give back, and times come from the server's clock. The Redis driver maps the test's
fake wall clock onto Redis: the clock starts at the server's time, an end "at" a later
fake time moves the job's end and expiry by that much, and advancing the fake clock
shortens every expiry under the test's prefix by as much, so Redis forgets a job exactly
when the fake clock passes its result_ttl.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mpsched._core.job import JobRecord, JobState
from mpsched._store.base import JournalStore, Store, StoredJob, check_finish_state
from mpsched._store.redis.records import Finish, NewJob, Take
from mpsched._store.redis.store import RedisStore

MANAGER = "contract-manager"
T0 = 1.8e9  # the fake wall clock's start, UTC epoch seconds
TTL = 3600.0  # the stores' result_ttl


def job(
    n: int,
    *,
    key: str | None = None,
    priority: int = 2,
    due: float | None = None,
    retries: int = 0,
    payload: bytes | None = None,
) -> StoredJob:
    """Job ``n`` of a test: due at T0 + n, seq n, a timeout when n is odd."""
    return StoredJob(
        f"job-{n}",
        "client-1",
        key,
        "tests.jobs:work",
        payload if payload is not None else f"payload {n}".encode(),
        priority,
        T0 + n if due is None else due,
        n,
        30.0 if n % 2 else None,
        retries,
        0,
        T0,
    )


class Wall:
    """A wall clock that moves only when a test sets ``now``; each move is told to the
    driver that listens (a Redis store ages its keys by as much)."""

    def __init__(self, start: float) -> None:
        self._now = start
        self.on_move: list[object] = []

    @property
    def now(self) -> float:
        return self._now

    @now.setter
    def now(self, value: float) -> None:
        moved, self._now = value - self._now, value
        for driver in self.on_move:
            assert isinstance(driver, RedisDriver)
            driver.age(moved)

    def __call__(self) -> float:
        return self._now


class JournalDriver:
    """The contract's calls on a journal store, as its manager makes them."""

    shared = False

    def __init__(self, store: JournalStore, wall: Wall) -> None:
        self.store: Store = store
        self._journal = store
        self._wall = wall

    def submit(self, jobs: Sequence[StoredJob]) -> list[str]:
        return self._journal.submit(jobs)

    def lease(self, job_id: str, worker_id: str) -> None:
        record = self._journal.get(job_id)
        attempt = 1 if record is None else record.attempt + 1
        self._journal.lease(job_id, worker_id, attempt)

    def finish(self, job_id: str, state: JobState, outcome: bytes | None, at: float) -> None:
        self._journal.finish(job_id, state, outcome, at)

    def cancel(self, job_ids: Sequence[str], at: float) -> None:
        self._journal.cancel(job_ids, at)

    def pending(self) -> list[str]:
        return [j.job_id for j in self._journal.recover().pending]

    def running(self) -> list[str]:
        return [r.job.job_id for r in self._journal.recover().running]

    def when(self, at: float) -> object:
        """What a record says of an event the test placed at ``at`` on its fake clock:
        ``at`` itself, exactly."""
        return at


class RedisDriver:
    """The contract's calls on a RedisStore, as a manager of it makes them."""

    shared = True

    def __init__(self, store: RedisStore, wall: Wall) -> None:
        self.store: Store = store
        self._redis = store
        self._wall = wall
        self._tokens: dict[str, str] = {}
        seconds, micros = store.client.time()
        self._offset = seconds + micros / 1e6 - wall.now  # server time - fake time
        store.heartbeat(MANAGER, 3600.0, b"")
        wall.on_move.append(self)

    def submit(self, jobs: Sequence[StoredJob]) -> list[str]:
        holders, full = self._redis.submit_jobs(
            [
                NewJob(
                    j.job_id,
                    j.client_id,
                    j.key,
                    j.name,
                    j.payload,
                    j.priority,
                    None,
                    j.due_wall + self._offset,
                    j.timeout,
                    j.retries,
                )
                for j in jobs
            ],
            MANAGER,
        )
        assert not full
        return holders

    def lease(self, job_id: str, worker_id: str) -> None:
        reply = self._redis.report(MANAGER, 3600.0, take=Take(worker=worker_id, ids=(job_id,)))
        for job in reply.jobs:
            self._tokens[job.job_id] = job.token

    def finish(self, job_id: str, state: JobState, outcome: bytes | None, at: float) -> None:
        check_finish_state(state)
        self._redis.report(
            MANAGER,
            3600.0,
            finishes=[Finish(job_id, self._tokens.get(job_id, "none"), state, outcome or b"")],
        )
        self._ended_at(job_id, at)

    def cancel(self, job_ids: Sequence[str], at: float) -> None:
        for withdrawn in self._redis.cancel_jobs(MANAGER, job_ids):
            self._ended_at(withdrawn.job_id, at)

    def pending(self) -> list[str]:
        return [r.job_id for r in self._redis.jobs(JobState.PENDING)]

    def running(self) -> list[str]:
        return [r.job_id for r in self._redis.jobs(JobState.RUNNING)]

    def when(self, at: float) -> object:
        """``at`` on the server's clock, give or take the time the calls took."""
        return pytest.approx(at + self._offset, abs=1.0)

    def _ended_at(self, job_id: str, at: float) -> None:
        """Move a job that just ended to ``at`` on the fake clock: its end time and its
        expiry (with its key's) shift by how far ``at`` is from the fake clock's now."""
        shift = at - self._wall.now
        client, base = self._redis.client, self._redis.base
        job_key = f"{base}j:{job_id}"
        ended = client.hget(job_key, "f")
        if ended is None:
            return
        client.hset(job_key, "f", int(ended) + round(shift * 1e6))
        key = client.hget(job_key, "k")
        for name in (job_key, None if key is None else f"{base}k:{key.decode()}"):
            ttl = None if name is None else client.pttl(name)
            if name is not None and ttl is not None and ttl > 0:
                client.pexpire(name, max(1, ttl + round(shift * 1000)))

    def age(self, seconds: float) -> None:
        """The fake clock moved ``seconds``: every expiry under the prefix comes closer."""
        client = self._redis.client
        for name in client.scan_iter(
            match=self._redis.base.replace("{", "\\{").replace("}", "\\}") + "*", count=1000
        ):
            ttl = client.pttl(name)
            if ttl > 0:
                left = ttl - round(seconds * 1000)
                if left > 0:
                    client.pexpire(name, left)
                else:
                    client.delete(name)


def record(driver: JournalDriver | RedisDriver, job_id: str) -> JobRecord | None:
    driver.store.flush()
    return driver.store.get(job_id)
