"""order="priority" on a RedisStore shared by several managers: the jobs already due by the
server's clock are claimed by (priority, due, seq) whichever manager claims, the others
wait for their time; retries, give-backs, cancels, listings and bounds find a job that
waits among the due ones; and the order is the store's, never one manager's. Every test
runs against a real redis-server (conftest), with managers as plain ids."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis_queue import HIGH, LEASE, LOW, new, server_now, take

from mpsched._core.job import JobState, Order
from mpsched._errors import ConfigError
from mpsched._store.redis.records import Finish, Requeue
from mpsched._store.redis.store import RedisStore


@pytest.fixture
def managers(open_redis_store: Callable[..., RedisStore]) -> list[RedisStore]:
    """Two managers, m1 and m2, of one store in priority order, both live."""
    made = [open_redis_store(order=Order.PRIORITY) for _ in range(2)]
    for name, store in zip(("m1", "m2"), made, strict=True):
        store.heartbeat(name, LEASE, b"", join=True)
    return made


def ids(reply: Any) -> list[str]:
    return [job.job_id for job in reply.jobs]


def backlog(store: RedisStore) -> None:
    """The queue tests' overdue backlog (tests/core/test_queue.py), due 5 s ago and
    later, and one HIGH job due in 5 s."""
    t0 = server_now(store) - 5.0
    store.submit_jobs(
        [
            new("medium-1a", at=t0 + 1),
            new("high-future", level=HIGH, delay=5),
            new("high-3", level=HIGH, at=t0 + 3),
            new("high-2", level=HIGH, at=t0 + 2),
        ],
        "m1",
    )
    store.submit_jobs([new("low-0", level=LOW, at=t0), new("medium-1b", at=t0 + 1)], "m2")


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        (Order.TIME, ["low-0", "medium-1a", "medium-1b", "high-2", "high-3"]),
        (Order.PRIORITY, ["high-2", "high-3", "medium-1a", "medium-1b", "low-0"]),
    ],
    ids=["time", "priority"],
)
def test_an_overdue_backlog_is_claimed_in_the_orders_key_by_any_manager(
    open_redis_store: Callable[..., RedisStore], order: Order, expected: list[str]
) -> None:
    stores = [open_redis_store(order=order) for _ in range(2)]
    for name, store in zip(("m1", "m2"), stores, strict=True):
        store.heartbeat(name, LEASE, b"", join=True)
    backlog(stores[0])
    claimed = [ids(take(stores[n % 2], f"m{n % 2 + 1}"))[0] for n in range(5)]
    assert claimed == expected
    reply = take(stores[0], "m1")  # the job not yet due waits for its time
    assert reply.jobs == [] and 4.0 < (reply.head_in or 0) <= 5.0


def test_claims_take_the_due_jobs_by_priority_and_say_when_more_is_due(
    managers: list[RedisStore],
) -> None:
    m1, _ = managers
    at = server_now(m1) - 1.0
    m1.submit_jobs(
        [
            new("low", level=LOW, at=at - 1),
            new("med", at=at),
            new("high", level=HIGH, at=at),
            new("later", level=HIGH, delay=30),
        ],
        "m1",
    )
    first = take(m1, "m1")
    assert ids(first) == ["high"] and first.head_in is not None and first.head_in <= 0
    reply = take(m1, "m1", want=8)  # what is due, not what is due next
    assert ids(reply) == ["med", "low"]
    assert reply.jobs[1].delay == 0 and reply.head_in is not None and reply.head_in > 25


def test_equal_due_times_run_by_priority_then_submission(managers: list[RedisStore]) -> None:
    m1, m2 = managers
    at = server_now(m1) + 0.2  # one instant, not yet due
    m1.submit_jobs([new("low", level=LOW, at=at), new("med-1", at=at)], "m1")
    m2.submit_jobs([new("high", level=HIGH, at=at), new("med-2", at=at)], "m2")
    assert take(m1, "m1").jobs == []
    time.sleep(max(at - server_now(m1), 0) + 0.01)  # the server's clock must pass it
    claimed = [ids(take(m2 if n % 2 else m1, "m2" if n % 2 else "m1"))[0] for n in range(4)]
    assert claimed == ["high", "med-1", "med-2", "low"]


def test_a_retry_and_a_give_back_go_back_to_their_place_among_the_due_jobs(
    managers: list[RedisStore],
) -> None:
    m1, m2 = managers
    at = server_now(m1) - 1.0
    m1.submit_jobs(
        [
            new("high", level=HIGH, at=at, retries=1),
            new("med", at=at - 1),
            new("low", level=LOW, at=at - 2),
        ],
        "m1",
    )
    [high] = take(m1, "m1").jobs
    assert high.job_id == "high"
    m1.report("m1", LEASE, requeues=[Requeue("high", high.token, True)])  # an attempt
    again = take(m2, "m2")
    assert ids(again) == ["high"] and again.jobs[0].attempt == 2
    [med] = take(m1, "m1").jobs  # waited in rdy meanwhile
    assert med.job_id == "med"
    m1.report("m1", LEASE, requeues=[Requeue("med", med.token, False)])  # never started
    assert ids(take(m2, "m2", want=8)) == ["med", "low"]
    assert m1.counts().retried == 1


def test_a_job_among_the_due_ones_is_listed_pending_and_cancels_by_id_or_client(
    managers: list[RedisStore],
) -> None:
    m1, m2 = managers
    at = server_now(m1) - 1.0
    m1.submit_jobs(
        [
            new("a", level=HIGH, at=at),
            new("b", at=at),
            new("c", at=at),
            new("d", at=at, client="c2"),
            new("later", delay=30, client="c2"),
        ],
        "m1",
    )
    assert ids(take(m1, "m1")) == ["a"]  # b, c and d now wait among the due jobs
    pending = [r.job_id for r in m2.jobs(JobState.PENDING)]
    assert pending == ["b", "c", "d", "later"]
    assert [r.job_id for r, _ in m2.head(3)] == ["b", "c", "d"]
    head_in = m2.counts().head_in
    assert head_in is not None and head_in <= 0
    assert [w.job_id for w in m2.cancel_jobs("m2", ["c"])] == ["c"]
    assert [w.job_id for w in m2.cancel_client("m2", "c2")] == ["d", "later"]
    assert m1.get("c").state is JobState.CANCELLED  # type: ignore[union-attr]
    assert ids(take(m2, "m2", want=8)) == ["b"]
    assert take(m2, "m2").head_in is None
    assert m1.counts().pending == {1: 0, 2: 0, 3: 0}


def test_max_pending_counts_the_jobs_among_the_due_ones(managers: list[RedisStore]) -> None:
    m1, _ = managers
    m1.submit_jobs([new("a"), new("b"), new("c")], "m1")
    take(m1, "m1")  # b and c wait among the due jobs
    assert m1.submit_jobs([new("d"), new("e")], "m1", max_pending=3)[1] == "jobs"  # full
    assert m1.submit_jobs([new("d")], "m1", max_pending=3) == (["d"], None)


def test_a_manager_with_another_order_is_refused_while_one_is_live(
    open_redis_store: Callable[..., RedisStore], redis_url: str
) -> None:
    first = open_redis_store(order=Order.PRIORITY)
    first.heartbeat("m1", LEASE, b"", join=True)
    second = open_redis_store(order=Order.TIME)
    with pytest.raises(ConfigError) as refused:
        second.heartbeat("m2", LEASE, b"", join=True)
    assert refused.value.option == "order" and refused.value.value == "time"
    assert "'priority'" in str(refused.value) and "prefix=" in str(refused.value)
    assert [m.manager_id for m in first.managers()] == ["m1"]  # m2 was not registered
    same = open_redis_store(order=Order.PRIORITY)
    same.heartbeat("m3", LEASE, b"", join=True)  # the same order joins
    assert {m.manager_id for m in first.managers()} == {"m1", "m3"}


def test_with_no_manager_live_the_order_changes_and_nothing_is_stranded(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    first = open_redis_store(order=Order.PRIORITY)
    first.heartbeat("m1", LEASE, b"", join=True)
    at = server_now(first) - 1.0
    first.submit_jobs(
        [new("low", level=LOW, at=at - 1), new("high", level=HIGH, at=at), new("med", at=at)], "m1"
    )
    [high] = take(first, "m1").jobs  # low and med now wait among the due jobs
    assert high.job_id == "high"
    first.report("m1", LEASE, finishes=[Finish("high", high.token, JobState.DONE, b"")])
    first.forget_manager("m1")  # it holds nothing
    second = open_redis_store(order=Order.TIME)
    second.heartbeat("m2", LEASE, b"", join=True)
    taken = take(second, "m2", want=8).jobs
    assert [j.job_id for j in taken] == ["low", "med"]  # back in time order
    second.submit_jobs([new("low-2", level=LOW, at=at - 1), new("high-2", level=HIGH, at=at)], "m2")
    second.report(
        "m2", LEASE, finishes=[Finish(j.job_id, j.token, JobState.DONE, b"") for j in taken]
    )
    second.forget_manager("m2")  # it holds nothing
    third = open_redis_store(order=Order.PRIORITY)
    third.heartbeat("m3", LEASE, b"", join=True)
    assert ids(take(third, "m3", want=8)) == ["high-2", "low-2"]


def test_a_manager_back_from_the_dead_follows_the_stores_order(
    open_redis_store: Callable[..., RedisStore], caplog: pytest.LogCaptureFixture
) -> None:
    late = open_redis_store(order=Order.TIME)
    late.heartbeat("late", 0.2, b"", join=True)
    time.sleep(0.25)  # its lease runs out: it is presumed dead
    other = open_redis_store(order=Order.PRIORITY)
    other.heartbeat("m2", LEASE, b"", join=True)  # nobody live: the store's order changes
    at = server_now(other) - 1.0
    other.submit_jobs([new("low", level=LOW, at=at - 1), new("high", level=HIGH, at=at)], "m2")
    with caplog.at_level(logging.ERROR, logger="mpsched.store"):
        beat = late.heartbeat("late", LEASE, b"")
    assert beat.order is Order.PRIORITY and late.order is Order.PRIORITY
    assert "order='priority'" in caplog.text
    assert ids(take(late, "late")) == ["high"]
