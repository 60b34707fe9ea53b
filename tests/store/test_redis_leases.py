"""Managers' leases in a RedisStore across faults of the server or of a manager: what a
take-back may and may not do, what a call that timed out may have done, and who hears of
a job's end. Each test drives the scripts directly, against a redis-server of its own
where it pauses or restarts it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from redis_queue import new

from mpsched._core.job import JobState
from mpsched._store.redis.records import Finish, Take
from mpsched._store.redis.store import RedisStore

SHORT = 1.0  # seconds: the lease of the managers in these tests


def claim(store: RedisStore, manager: str, lease: float = SHORT, want: int = 1, **kw: Any) -> Any:
    return store.report(manager, lease, take=Take(want=want, worker=f"{manager}/w1", **kw))


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_time_the_server_was_paused_counts_against_no_managers_lease(
    own_redis: Callable[..., Any], open_redis_store: Callable[..., RedisStore]
) -> None:
    server = own_redis()
    first, second = open_redis_store(server.url()), open_redis_store(server.url())
    first.heartbeat("m1", SHORT, b"", join=True)
    second.heartbeat("m2", SHORT, b"", join=True)
    second.submit_jobs([new("j1")], "m2")
    [job] = claim(second, "m2").jobs
    server.pause()
    time.sleep(2.5 * SHORT)  # nobody can beat: every lease ran out on the server's clock
    server.resume()
    beat = first.heartbeat("m1", SHORT, b"")
    assert beat.reaped == []  # the first beat after the silence takes nobody for dead
    record = first.get(job.job_id)
    assert record is not None and record.state is JobState.RUNNING
    deadline = time.monotonic() + 10 * SHORT
    reaped: list[str] = []
    while not reaped:  # m2 stays silent: it is taken back one lease later
        assert time.monotonic() < deadline, "the silent manager was never taken back"
        time.sleep(SHORT / 4)
        reaped = first.heartbeat("m1", SHORT, b"").reaped
    assert reaped == ["m2"]
    record = first.get(job.job_id)
    assert record is not None and record.state is JobState.FAILED


def test_a_manager_that_leaves_gives_back_the_jobs_still_leased_to_it(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    # A claim whose answer was lost leaves a job leased to a manager that never knew it.
    store = open_redis_store()
    store.heartbeat("m1", SHORT, b"", join=True)
    store.submit_jobs([new("j1")], "m1")
    claim(store, "m1", lease=30.0)
    assert store.forget_manager("m1") == 1
    record = store.get("j1")
    assert record is not None and (record.state, record.attempt) == (JobState.PENDING, 0)
    store.heartbeat("m2", SHORT, b"", join=True)
    [again] = claim(store, "m2", lease=30.0).jobs
    assert (again.job_id, again.attempt) == ("j1", 1)


def test_a_manager_presumed_dead_finds_every_end_its_clients_are_owed_when_it_is_back(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    store = open_redis_store()
    store.heartbeat("owner", 0.3, b"", join=True)  # it will be paused past its lease
    store.heartbeat("peer", 30.0, b"", join=True)
    store.submit_jobs([new("runs-on-peer"), new("runs-on-owner")], "owner")
    [on_peer] = claim(store, "peer", lease=30.0).jobs
    [on_owner] = claim(store, "owner", lease=0.3).jobs
    deadline = time.monotonic() + 10.0
    while "owner" not in store.heartbeat("peer", 30.0, b"").reaped:
        assert time.monotonic() < deadline, "the owner was never presumed dead"
        time.sleep(0.05)
    # While the owner is presumed dead, its job on the peer ends.
    store.report(
        "peer", 30.0, finishes=[Finish(on_peer.job_id, on_peer.token, JobState.DONE, b"result")]
    )
    store.heartbeat("owner", 30.0, b"")  # back
    ended = {end.job_id: end.state for end in store.drain("owner")}
    assert ended == {on_peer.job_id: JobState.DONE, on_owner.job_id: JobState.FAILED}


def test_an_end_from_a_manager_presumed_dead_replaces_the_failure_its_peer_recorded(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    store = open_redis_store()
    store.heartbeat("paused", 0.3, b"", join=True)
    store.heartbeat("peer", 30.0, b"", join=True)
    store.submit_jobs([new("ran-to-its-end")], "peer")
    [job] = claim(store, "paused", lease=0.3).jobs
    deadline = time.monotonic() + 10.0
    while not store.heartbeat("peer", 30.0, b"").failed:  # retries=0: failed as crashed
        assert time.monotonic() < deadline, "the paused manager's job was never taken back"
        time.sleep(0.05)
    record = store.get(job.job_id)
    assert record is not None and record.state is JobState.FAILED
    failed = store.counts().failed
    reply = store.report(
        "paused", 30.0, finishes=[Finish(job.job_id, job.token, JobState.DONE, b"its result")]
    )
    assert reply.finished == [3]  # recorded, in place of the failure
    record = store.get(job.job_id)
    assert record is not None and record.state is JobState.DONE
    assert record.outcome == b"its result" and record.worker_id == "paused/w1"
    assert store.counts().failed == failed - 1
    ended = {end.job_id: end.state for end in store.drain("peer")}
    assert ended == {job.job_id: JobState.DONE}  # its owner is told what happened


def test_a_take_back_counts_each_dead_managers_jobs_on_its_own(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    store = open_redis_store()
    store.heartbeat("peer", 30.0, b"", join=True)
    store.submit_jobs([new("a1", retries=1), new("a2"), new("b1")], "peer")
    store.heartbeat("a", 0.3, b"", join=True)
    store.heartbeat("b", 0.5, b"", join=True)
    claim(store, "a", lease=0.3, want=2)  # a1 (retried), a2 (failed)
    claim(store, "b", lease=0.5)  # b1 (failed)
    deadline = time.monotonic() + 10.0
    taken: dict[str, Any] = {}
    while len(taken) < 2:
        assert time.monotonic() < deadline, "the silent managers were never taken back"
        time.sleep(0.05)
        taken.update({t.manager: t for t in store.heartbeat("peer", 30.0, b"").taken_back})
    assert (taken["a"].requeued, taken["a"].failed, taken["a"].lease_timeout) == (1, 1, 0.3)
    assert (taken["b"].requeued, taken["b"].failed, taken["b"].lease_timeout) == (0, 1, 0.5)


def test_a_store_counts_the_jobs_it_keeps_at_one_command_a_look(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    store = open_redis_store()
    store.heartbeat("m1", 30.0, b"", join=True)
    assert store.kept() == 0
    store.submit_jobs([new(f"j{n}") for n in range(3)], "m1")
    [job] = claim(store, "m1", lease=30.0).jobs
    store.report("m1", 30.0, finishes=[Finish(job.job_id, job.token, JobState.DONE, b"")])
    assert store.kept() == 3  # two pending, one ended and kept for result_ttl


def test_ends_in_an_inbox_stay_there_until_a_drain_says_they_were_delivered(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    # A drain whose answer was lost (Redis paused past the manager's timeout) must not
    # take the ends with it: the next drain hands them over again.
    store = open_redis_store()
    store.heartbeat("owner", 30.0, b"", join=True)
    store.heartbeat("peer", 30.0, b"", join=True)
    store.submit_jobs([new("j1")], "owner")
    [job] = claim(store, "peer", lease=30.0).jobs
    store.report("peer", 30.0, finishes=[Finish("j1", job.token, JobState.DONE, b"r")])
    assert [e.job_id for e in store.drain("owner")] == ["j1"]  # its answer "lost"
    assert [e.job_id for e in store.drain("owner")] == ["j1"]  # handed over again
    assert store.drain("owner", done=1) == []
