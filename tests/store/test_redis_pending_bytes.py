"""The payload bytes of the jobs pending in a RedisStore (what ``max_pending_bytes``
bounds): one counter across managers, kept by every script that moves a job into the due
set or out of it, and the bound a submit checks against it. Against a real redis-server
(conftest's ``redis_url``), with managers as plain ids."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from mpsched._core.job import JobState
from mpsched._store.redis.records import NewJob, Requeue, Take
from mpsched._store.redis.store import RedisStore

LEASE = 30.0


def sized(
    job_id: str,
    size: int,
    *,
    delay: float = 0.0,
    retries: int = 0,
    client: str = "c1",
    key: str | None = None,
) -> NewJob:
    """A job due after ``delay`` whose payload is ``size`` bytes."""
    return NewJob(
        job_id, client, key, "tests.jobs:work", b"x" * size, 2, delay, None, None, retries
    )


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    made = RedisStore(redis_url)
    for manager in ("m1", "m2"):
        made.heartbeat(manager, LEASE, b"")
    yield made
    made.close()


def take(store: RedisStore, manager: str, want: int = 1) -> Any:
    return store.report(manager, LEASE, take=Take(want=want, worker=f"{manager}/w1"))


def counted(store: RedisStore) -> int:
    """The counter, once checked against what it counts: the stored payloads of the
    jobs pending now."""
    stored = sum(
        store.client.hstrlen(f"{store.base}j:{r.job_id}", "p") for r in store.jobs(JobState.PENDING)
    )
    count = store.counts().pending_bytes
    assert count == stored
    return count


def test_the_counter_follows_every_move_into_and_out_of_the_queue(store: RedisStore) -> None:
    store.submit_jobs(
        [
            sized("a", 100, retries=1),
            sized("b", 200),
            sized("c", 300),
            sized("d", 400),
            sized("e", 500, delay=60, client="c2"),
            sized("f", 600, delay=60, client="c2"),
        ],
        "m1",
    )
    assert counted(store) == 2100
    [a] = take(store, "m1").jobs  # a claim
    assert counted(store) == 2000
    store.report("m1", LEASE, requeues=[Requeue("a", a.token, True)])  # a retry
    assert counted(store) == 2100
    a, b, c = take(store, "m2", want=3).jobs  # b and c prefetched
    assert counted(store) == 1500
    store.report("m2", LEASE, requeues=[Requeue("c", c.token, False)])  # given back
    assert counted(store) == 1800
    # A cancel waits for prefetched b: given back, it is cancelled, never pending again.
    _, held = store.cancel_or_ask("m1", ["b"], "n1")
    assert [h.job_id for h in held] == ["b"]
    store.report("m2", LEASE, requeues=[Requeue("b", b.token, False)], answers=["n1"])
    assert [w.job_id for w in store.settle_cancel("m1", "n1", ["b"], asked=1, wait=5.0)] == ["b"]
    assert counted(store) == 1800
    assert [w.job_id for w in store.cancel_jobs("m2", ["d"])] == ["d"]  # by id
    assert counted(store) == 1400
    store.submit_jobs([sized("g", 700, client="c2")], "m1")
    c, g = take(store, "m2", want=2).jobs  # g prefetched
    assert counted(store) == 1100
    # A cancel of all of c2's jobs: e and f pending, g held by m2, given back cancelled.
    withdrawn, held = store.cancel_client_or_ask("m1", "c2", "n2")
    assert {w.job_id for w in withdrawn} == {"e", "f"} and [h.job_id for h in held] == ["g"]
    assert counted(store) == 0
    store.report("m2", LEASE, requeues=[Requeue("g", g.token, False)], answers=["n2"])
    assert [w.job_id for w in store.settle_cancel("m1", "n2", ["g"], asked=1, wait=5.0)] == ["g"]
    assert counted(store) == 0


def test_the_jobs_of_a_manager_presumed_dead_count_again_once_taken_back(store: RedisStore) -> None:
    store.heartbeat("dying", 0.2, b"")
    store.submit_jobs(
        [sized("failed", 100), sized("retried", 200, retries=1), sized("waits", 400, delay=60)],
        "m1",
    )
    reply = store.report("dying", 0.2, take=Take(want=2, worker="dying/w1"))
    assert [j.job_id for j in reply.jobs] == ["failed", "retried"]
    assert counted(store) == 400
    deadline = time.monotonic() + 10
    while not (beat := store.heartbeat("m2", LEASE, b"")).reaped:  # its lease runs out
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert beat.requeued == 1 and [f[0] for f in beat.failed] == ["failed"]
    assert counted(store) == 600


def test_a_store_written_before_the_counter_is_counted_by_the_first_manager_to_join(
    store: RedisStore,
) -> None:
    store.submit_jobs([sized("a", 100), sized("b", 200, delay=60)], "m1")
    store.client.hdel(f"{store.base}stats", "pending_bytes")  # as before the counter
    store.heartbeat("m1", LEASE, b"")  # a beat that is no join counts nothing
    assert store.counts().pending_bytes == 0
    store.heartbeat("m3", LEASE, b"", join=True)
    assert counted(store) == 300
    store.heartbeat("m4", LEASE, b"", join=True)  # counted once: not again
    take(store, "m1")
    assert counted(store) == 200


def test_a_batch_that_would_pass_max_pending_bytes_takes_nothing(store: RedisStore) -> None:
    assert store.submit_jobs([sized("a", 60)], "m1", max_pending_bytes=100) == (["a"], None)
    full = store.submit_jobs([sized("b", 30), sized("c", 20)], "m2", max_pending_bytes=100)
    assert full[1] == "payload bytes" and counted(store) == 60
    assert [r.job_id for r in store.jobs(JobState.PENDING)] == ["a"]
    # Another manager's batch that reaches the bound exactly fits; a job whose key a
    # pending job holds adds nothing, so it fits a full queue.
    assert store.submit_jobs(
        [sized("b", 30, key="k"), sized("c", 10)], "m2", max_pending_bytes=100
    ) == (["b", "c"], None)
    assert store.submit_jobs([sized("d", 50, key="k")], "m1", max_pending_bytes=100) == (
        ["b"],
        None,
    )
    assert store.submit_jobs([sized("e", 1)], "m1", max_pending_bytes=100)[1] == "payload bytes"
    assert counted(store) == 100
    take(store, "m2")  # a claim of "a" makes room
    assert store.submit_jobs([sized("e", 60)], "m1", max_pending_bytes=100) == (["e"], None)
    assert counted(store) == 100
    # A manager without the bound submits what it likes; the bounded one waits for room.
    assert store.submit_jobs([sized("f", 500)], "m2") == (["f"], None)
    assert store.submit_jobs([sized("g", 1)], "m1", max_pending_bytes=600)[1] == "payload bytes"
    assert counted(store) == 600
