"""Named queues and limits in a RedisStore's scripts: claims in a worker's strict queue
order, jobs of a full limit parked (no lease, no attempt) and let back when a slot frees
or a rate window opens, slots given back with a dead manager's leases."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from redis_queue import LEASE, new, take

from mpsched._core.job import JobState
from mpsched._core.limits import LimitSpec
from mpsched._store.redis.records import Finish, NewJob, Requeue, Take
from mpsched._store.redis.store import RedisStore


@pytest.fixture
def store(open_redis_store: Callable[..., RedisStore]) -> RedisStore:
    made = open_redis_store()
    for manager in ("m1", "m2"):
        made.heartbeat(manager, LEASE, b"")
    return made


def routed(
    job_id: str, queue: str = "default", limit: str | None = None, retries: int = 0
) -> NewJob:
    return new(job_id, retries=retries)._replace(queue=queue, limit=limit)


def ids(reply: object) -> list[str]:
    return [job.job_id for job in reply.jobs]  # type: ignore[attr-defined]


def done(store: RedisStore, manager: str, job: object) -> None:
    store.report(
        manager,
        LEASE,
        finishes=[
            Finish(
                job.job_id,  # type: ignore[attr-defined]
                job.token,  # type: ignore[attr-defined]
                JobState.DONE,
                b"ok",
            )
        ],
    )


def test_a_worker_claims_from_its_queues_in_strict_order(store: RedisStore) -> None:
    store.submit_jobs([routed("d1"), routed("g1", "gpu"), routed("d2"), routed("g2", "gpu")], "m1")
    assert ids(take(store, queues=("gpu",))) == ["g1"]
    assert ids(take(store, queues=("gpu", "default"), want=3)) == ["g2", "d1", "d2"]
    assert take(store, queues=("gpu",)).head_in is None


def test_a_worker_of_every_queue_gets_the_first_due_and_no_other_queue_blocks(
    store: RedisStore,
) -> None:
    store.submit_jobs([routed("r", "reports")], "m1")
    time.sleep(0.01)
    store.submit_jobs([routed("d")], "m1")
    assert ids(take(store, queues=("default",))) == ["d"]  # reports has no worker
    assert store.pending_by_queue() == {"default": 0, "reports": 1}
    assert ids(take(store)) == ["r"]
    assert store.get("r").queue == "reports"  # type: ignore[union-attr]


def test_a_job_of_a_full_limit_is_parked_and_comes_back_when_a_slot_frees(
    store: RedisStore,
) -> None:
    store.set_limit("exports", LimitSpec(concurrency=1))
    store.submit_jobs(
        [routed("e1", limit="exports"), routed("e2", limit="exports"), routed("p")], "m1"
    )
    first = take(store)
    assert ids(first) == ["e1"]
    assert ids(take(store)) == ["p"]  # e2 is passed over
    assert store.parked_limit("e2") == "exports"
    assert store.get("e2").attempt == 0  # type: ignore[union-attr]
    assert take(store).jobs == []
    done(store, "m1", first.jobs[0])
    assert store.parked_limit("e2") is None
    assert ids(take(store, "m2")) == ["e2"]


def test_a_limit_holds_across_managers_and_a_requeue_gives_its_slot_back(store: RedisStore) -> None:
    store.set_limit("x", LimitSpec(concurrency=2))
    store.submit_jobs([routed(f"j{i}", limit="x", retries=1) for i in range(4)], "m1")
    a, b = take(store, "m1"), take(store, "m2")
    assert take(store, "m1").jobs == [] and take(store, "m2").jobs == []
    store.report("m1", LEASE, requeues=[Requeue(a.jobs[0].job_id, a.jobs[0].token, True)])
    got = take(store, "m2")
    assert ids(got) == ["j0"]  # the retry, first among what is due, takes the slot
    assert take(store, "m1").jobs == []
    done(store, "m2", b.jobs[0])
    assert ids(take(store, "m1")) == ["j2"]


def test_a_dead_managers_slots_come_back_with_its_leases(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    store = open_redis_store()
    store.heartbeat("alive", LEASE, b"")
    store.heartbeat("doomed", 0.2, b"")
    store.set_limit("x", LimitSpec(concurrency=1))
    store.submit_jobs([routed("a", limit="x"), routed("b", limit="x")], "alive")
    claimed = store.report("doomed", 0.2, take=Take(want=1, worker="doomed/w1", lead="wait"))
    assert ids(claimed) == ["a"]
    assert take(store, "alive").jobs == []
    time.sleep(0.4)
    store.heartbeat("alive", LEASE, b"")  # reaps doomed: a failed, its slot back
    assert ids(take(store, "alive")) == ["b"]


def test_a_rate_admits_n_per_window_and_the_claim_says_when_it_opens(store: RedisStore) -> None:
    store.set_limit("api", LimitSpec(rate=(2, 1.0)))
    store.submit_jobs([routed(f"r{i}", limit="api") for i in range(3)], "m1")
    first = take(store, want=3)
    assert ids(first) == ["r0", "r1"]  # r2 parked: this claim says when it may start
    assert first.head_in is not None and 0.5 < first.head_in <= 1.0
    reply = take(store)
    assert reply.jobs == [] and reply.head_in is not None and 0.5 < reply.head_in <= 1.0
    time.sleep(reply.head_in + 0.02)
    assert ids(take(store)) == ["r2"]


def test_limits_are_kept_in_the_store_and_cleared(store: RedisStore) -> None:
    store.set_limit("both", LimitSpec(concurrency=2, rate=(10, 60.0)))
    assert store.limits() == {"both": LimitSpec(concurrency=2, rate=(10, 60.0))}
    store.set_limit("both", None)
    assert store.limits() == {}


def test_cancel_finds_a_parked_job(store: RedisStore) -> None:
    store.set_limit("x", LimitSpec(concurrency=1))
    store.submit_jobs([routed("a", limit="x"), routed("b", limit="x")], "m1")
    take(store)
    take(store)
    assert store.parked_limit("b") == "x"
    assert [w.job_id for w in store.cancel_jobs("m1", ["b"])] == ["b"]
    assert store.parked_limit("b") is None


def test_a_due_job_of_a_full_limit_is_parked_as_it_is_submitted(store: RedisStore) -> None:
    store.set_limit("x", LimitSpec(concurrency=1))
    store.submit_jobs([routed("a", limit="x")], "m1")
    first = take(store)
    store.submit_jobs([routed("b", limit="x"), routed("c", limit="x"), routed("p")], "m1")
    assert store.parked_limit("b") == "x" and store.parked_limit("c") == "x"
    assert ids(take(store)) == ["p"]
    done(store, "m1", first.jobs[0])
    assert ids(take(store)) == ["b"]
