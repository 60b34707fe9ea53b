"""The queue a RedisStore keeps for several managers: exact order on the server's clock,
claims, the lead of the timed wait, fenced leases, reaping the jobs of a manager presumed
dead, inboxes and watches, and what a caller sees while Redis is down. Every test runs
against a real redis-server (store_drivers, conftest), with managers as plain ids."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from redis_queue import LEASE, new, server_now, take

from mpsched._core.job import JobState
from mpsched._errors import InvalidJobError, StoreUnavailableError
from mpsched._store.redis.records import Finish, Requeue, StoredEnd, Take
from mpsched._store.redis.scripts import parse_ended
from mpsched._store.redis.store import RedisStore


@pytest.fixture
def store(open_redis_store: Callable[..., RedisStore]) -> RedisStore:
    made = open_redis_store()
    for manager in ("m1", "m2", "m3"):
        made.heartbeat(manager, LEASE, b"")
    return made


def test_equal_due_times_run_by_priority_then_submission(store: RedisStore) -> None:
    at = server_now(store) - 1.0  # one instant, already past
    store.submit_jobs([new("low", level=3, at=at), new("med-1", at=at)], "m1")
    store.submit_jobs(
        [new("high", level=1, at=at), new("med-2", at=at), new("earlier", level=3, at=at - 0.5)],
        "m2",
    )
    claimed = [take(store, "m1" if n % 2 else "m2").jobs[0].job_id for n in range(5)]
    assert claimed == ["earlier", "high", "med-1", "med-2", "low"]
    assert take(store).head_in is None


def test_a_job_is_not_claimed_before_its_due_time_on_the_servers_clock(store: RedisStore) -> None:
    store.submit_jobs([new("later", delay=0.3)], "m1")
    reply = take(store)
    assert reply.jobs == [] and 0.2 < (reply.head_in or 0) <= 0.3
    early = take(store, early=0.5)  # within the hand-off window: claimed with its delay
    [job] = early.jobs
    assert job.job_id == "later" and 0.1 < job.delay <= 0.3


def test_a_claim_of_several_takes_them_in_order_and_says_what_is_left(store: RedisStore) -> None:
    store.submit_jobs([new(f"j{n}") for n in range(5)] + [new("later", delay=60)], "m1")
    reply = take(store, want=3)
    assert [j.job_id for j in reply.jobs] == ["j0", "j1", "j2"]
    assert [j.attempt for j in reply.jobs] == [1, 1, 1]
    assert len({j.token for j in reply.jobs}) == 3
    assert reply.head_in is not None and reply.head_in <= 0
    counts = store.counts()
    assert (counts.pending[2], counts.running, counts.submitted) == (3, 3, 6)


def test_a_claim_prefetches_only_jobs_due_now_without_timeout_nor_schedule_run(
    store: RedisStore,
) -> None:
    store.submit_jobs([new("a"), new("b"), new("c")._replace(timeout=5.0), new("d")], "m1")
    reply = take(store, want=4)
    assert [j.job_id for j in reply.jobs] == ["a", "b"]  # stops at the one with a timeout
    assert [store.client.hget(store.base + "j:" + j.job_id, "pf") for j in reply.jobs] == [
        b"0",
        b"1",
    ]
    assert [j.job_id for j in take(store, want=1).jobs] == ["c"]  # first: a timeout is fine
    store.submit_jobs([new("s@2026-01-01T00:00:00Z"), new("e", delay=0.3)], "m1")
    assert [j.job_id for j in take(store, want=4).jobs] == ["d"]  # not a schedule's run
    assert [j.job_id for j in take(store, want=4).jobs] == ["s@2026-01-01T00:00:00Z"]
    # The first may come due within the early window; the prefetched ones must be due.
    store.submit_jobs([new("f", delay=0.3)], "m1")
    reply = take(store, want=4, early=1.0)
    assert [j.job_id for j in reply.jobs] == ["e"] and reply.jobs[0].delay > 0.1


def test_nothing_is_prefetched_while_another_manager_has_a_taker_waiting(store: RedisStore) -> None:
    assert take(store, "m2", want=4).jobs == []  # m2's taker will wait for work
    store.submit_jobs([new(f"j{n}") for n in range(8)], "m1")
    assert [j.job_id for j in take(store, "m1", want=4).jobs] == ["j0"]
    assert [j.job_id for j in take(store, "m1", want=4, waiting=True).jobs] == ["j1"]
    m2_jobs = take(store, "m2", want=1, waiting=True).jobs
    assert [j.job_id for j in m2_jobs] == ["j2"]
    assert [j.job_id for j in take(store, "m1", want=4).jobs] == ["j3"]  # m2 still waits
    m2_jobs += take(store, "m2", want=1).jobs
    assert [j.job_id for j in m2_jobs] == ["j2", "j4"]  # none of m2 waits
    assert [j.job_id for j in take(store, "m1", want=2).jobs] == ["j5", "j6"]
    held = take(store, "m2", want=4).jobs
    assert held[0].job_id == "j7"
    assert take(store, "m2", want=4).jobs == []
    # m2's jobs end (its leases are j2, j4 and j7), then it leaves: it is no taker any more
    store.report(
        "m2",
        LEASE,
        finishes=[Finish(r.job_id, r.token, JobState.DONE, b"") for r in [*m2_jobs, *held]],
    )
    store.forget_manager("m2")
    store.submit_jobs([new("k0"), new("k1")], "m1")
    assert [j.job_id for j in take(store, "m1", want=2).jobs] == ["k0", "k1"]


def test_a_prefetched_job_a_cancel_waits_for_is_cancelled_when_given_back(
    store: RedisStore,
) -> None:
    pubsub = store.subscriber()
    pubsub.subscribe(store.base + "ch:m2")
    pubsub.get_message(timeout=1.0)
    store.submit_jobs([new("a"), new("b"), new("c")], "m1")
    _, b, c = take(store, "m2", want=3).jobs
    withdrawn, held = store.cancel_or_ask("m1", ["a", "b", "c"], "n1")
    assert withdrawn == [] and [(h.job_id, h.holder) for h in held] == [("b", "m2"), ("c", "m2")]
    assert pubsub.get_message(timeout=1.0)["data"] == b"Cn1 b c"  # m2 is asked
    # m2's worker had started c, not b: b goes back, and is cancelled; m2 answers.
    reply = store.report("m2", LEASE, requeues=[Requeue("b", b.token, False)], answers=["n1"])
    assert reply.requeued == [3]
    settled = store.settle_cancel("m1", "n1", ["b", "c"], asked=1, wait=5.0)
    assert [w.job_id for w in settled] == ["b"]
    for job_id, state in (("b", JobState.CANCELLED), ("c", JobState.RUNNING)):
        record = store.get(job_id)
        assert record is not None and record.state is state
    assert store.report(
        "m2", LEASE, finishes=[Finish("c", c.token, JobState.DONE, b"c")]
    ).finished == [1]
    assert store.counts().cancelled == 1 and store.counts().running == 1  # a runs
    # Given back unmarked (the cancel settled first): pending again, not cancelled.
    store.submit_jobs([new("d"), new("e")], "m1")
    _, e = take(store, "m2", want=2).jobs
    _, held = store.cancel_or_ask("m1", ["e"], "n2")
    assert [h.job_id for h in held] == ["e"]
    assert store.settle_cancel("m1", "n2", ["e"], asked=1, wait=0.2) == []  # no answer
    assert store.report("m2", LEASE, requeues=[Requeue("e", e.token, False)]).requeued == [2]
    record = store.get("e")
    assert record is not None and record.state is JobState.PENDING and record.attempt == 0
    pubsub.close()


def test_a_cancel_of_a_clients_jobs_asks_for_those_any_manager_holds_prefetched(
    store: RedisStore,
) -> None:
    pubsub = store.subscriber()
    pubsub.subscribe(store.base + "ch:m2")
    pubsub.get_message(timeout=1.0)
    store.submit_jobs(
        [new("a"), new("b"), new("x", client="c2"), new("c"), new("d"), new("e", delay=60)], "m1"
    )
    _, b, _, c = take(store, "m2", want=4).jobs
    assert [j.job_id for j in take(store, "m1", want=1).jobs] == ["d"]
    # Only due jobs are prefetched: a cancel of those not yet due asks nobody.
    assert [w.job_id for w in store.cancel_client("m3", "c1", not_due_only=True)] == ["e"]
    assert pubsub.get_message(timeout=0.1) is None
    withdrawn, held = store.cancel_client_or_ask("m3", "c1", "n1")
    # Not a or d: each is the job its worker took, not one prefetched; not x: c2's.
    assert withdrawn == []
    assert sorted((h.job_id, h.holder) for h in held) == [("b", "m2"), ("c", "m2")]
    request = pubsub.get_message(timeout=1.0)["data"]
    assert request in (b"Cn1 b c", b"Cn1 c b")
    # m2's worker had started b, not c: c goes back, and is cancelled; m2 answers.
    assert store.report(
        "m2", LEASE, requeues=[Requeue("c", c.token, False)], answers=["n1"]
    ).requeued == [3]
    settled = store.settle_cancel("m3", "n1", ["b", "c"], asked=1, wait=5.0)
    assert [(w.job_id, w.client_id, w.mine) for w in settled] == [("c", "c1", True)]
    states = {j: r.state for j in "abcdx" if (r := store.get(j)) is not None}
    assert states == {
        "a": JobState.RUNNING,
        "b": JobState.RUNNING,
        "c": JobState.CANCELLED,
        "d": JobState.RUNNING,
        "x": JobState.RUNNING,
    }
    assert store.report(
        "m2", LEASE, finishes=[Finish("b", b.token, JobState.DONE, b"b")]
    ).finished == [1]  # unmarked: it ends
    pubsub.close()


def test_one_waiting_manager_leads_the_others_follow_until_its_lead_lapses(
    store: RedisStore,
) -> None:
    store.submit_jobs([new("later", delay=60)], "m1")
    first = take(store, "m1")
    assert first.leader and first.leader_left is None
    second = take(store, "m2")
    assert not second.leader and second.leader_left is not None
    assert 4.0 < second.leader_left <= 5.1  # the lead lasts at most LEAD_SPAN (+ grace)
    store.client.delete(store.base + "leader")  # the leader died: its lead lapsed
    assert take(store, "m2").leader


def test_the_leader_that_claims_gives_up_the_lead_and_wakes_a_peer(store: RedisStore) -> None:
    pubsub = store.subscriber()
    pubsub.subscribe(store.base + "wake")
    assert pubsub.get_message(timeout=1.0)["type"] == "subscribe"
    # "a" is due after the first take, on a loaded machine too: that take leads.
    store.submit_jobs([new("a", delay=0.5), new("b", delay=60)], "m1")
    assert pubsub.get_message(timeout=1.0)["type"] == "message"  # a new head
    assert take(store, "m1").leader
    deadline = time.monotonic() + 5
    while not (reply := take(store, "m1")).jobs:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert [j.job_id for j in reply.jobs] == ["a"] and not reply.leader
    assert store.client.get(store.base + "leader") is None
    assert pubsub.get_message(timeout=1.0)["type"] == "message"  # someone times "b" now
    pubsub.close()


def test_a_submit_that_becomes_the_head_wakes_the_waiters_and_others_do_not(
    store: RedisStore,
) -> None:
    pubsub = store.subscriber()
    pubsub.subscribe(store.base + "wake")
    pubsub.get_message(timeout=1.0)
    store.submit_jobs([new("far", delay=60)], "m1")
    assert pubsub.get_message(timeout=1.0)["type"] == "message"
    store.submit_jobs([new("farther", delay=120)], "m1")
    assert pubsub.get_message(timeout=0.2) is None
    store.submit_jobs([new("sooner", delay=30)], "m2")
    assert pubsub.get_message(timeout=1.0)["type"] == "message"
    pubsub.close()


def test_a_finish_under_a_stale_lease_is_refused(store: RedisStore) -> None:
    store.submit_jobs([new("j", retries=1)], "m1")
    [first] = take(store, "m1").jobs
    reply = store.report("m1", LEASE, requeues=[Requeue("j", first.token, True)])
    assert reply.requeued == [2]
    [again] = take(store, "m2").jobs
    assert again.attempt == 2 and again.token != first.token
    stale = store.report("m1", LEASE, finishes=[Finish("j", first.token, JobState.DONE, b"x")])
    assert stale.finished == [0]
    fresh = store.report("m2", LEASE, finishes=[Finish("j", again.token, JobState.DONE, b"y")])
    assert fresh.finished == [1]  # recorded; its owner m1 delivers it (its inbox)
    record = store.get("j")
    assert record is not None and (record.state, record.outcome) == (JobState.DONE, b"y")


def test_a_job_that_never_reached_its_worker_goes_back_without_an_attempt(
    store: RedisStore,
) -> None:
    store.submit_jobs([new("j")], "m1")
    [job] = take(store).jobs
    store.report("m1", LEASE, requeues=[Requeue("j", job.token, False)])
    [again] = take(store).jobs
    assert again.attempt == 1 and store.counts().retried == 0


def test_a_held_job_is_claimed_without_its_payload_by_its_holder_only(store: RedisStore) -> None:
    # m1 keeps the job's large buffers in shared memory: its workers map them there.
    store.submit_jobs([new("held")._replace(held=True), new("plain")], "m1")
    assert store.client.hget(f"{store.base}j:held", "sh") == b"m1"
    assert b"sh" not in store.client.hkeys(f"{store.base}j:plain")  # the others pay nothing
    held, plain = take(store, "m1", want=2).jobs
    assert (held.job_id, held.payload) == ("held", b"")
    assert (plain.job_id, plain.payload) == ("plain", b"payload plain")
    store.report("m1", LEASE, requeues=[Requeue("held", held.token, False)])
    [again] = take(store, "m2").jobs  # any other manager gets it whole
    assert (again.job_id, again.payload) == ("held", b"payload held")
    assert store.payload("held") == b"payload held"


def test_a_manager_presumed_dead_loses_its_jobs_to_a_peer(store: RedisStore) -> None:
    store.heartbeat("dying", 0.2, b"")
    store.submit_jobs([new("retried", retries=1), new("failed")], "m1")
    reply = store.report("dying", 0.2, take=Take(want=2, worker="dying/w1"))
    assert [j.job_id for j in reply.jobs] == ["retried", "failed"]
    assert store.heartbeat("m2", LEASE, b"").reaped == []  # its lease still runs
    time.sleep(0.25)
    beat = store.heartbeat("m2", LEASE, b"")
    assert beat.reaped == ["dying"] and beat.requeued == 1
    assert beat.failed == [("failed", "dying/w1", "c1", False)]
    record = store.get("failed")
    assert record is not None and record.state is JobState.FAILED
    assert record.worker_id == "dying/w1" and record.outcome is None
    [again] = take(store, "m2").jobs
    assert (again.job_id, again.attempt) == ("retried", 2)
    assert [e.job_id for e in store.drain("m1")] == ["failed"]  # its owner is told
    late = store.report(
        "dying",
        0.2,
        finishes=[Finish(j.job_id, j.token, JobState.DONE, b"late") for j in reply.jobs],
        take=Take(want=1, worker="dying/w1"),
    )
    # "retried" runs again under m2: its late end is refused. "failed" never ran again:
    # the end it ran to under the dying manager replaces the failure the peer recorded.
    assert late.finished == [0, 3] and not late.registered and late.jobs == []
    record = store.get("failed")
    assert record is not None and record.state is JobState.DONE and record.outcome == b"late"
    assert store.heartbeat("m2", LEASE, b"").reaped == []  # reaped once


def test_the_owner_of_a_job_run_elsewhere_hears_of_its_end(store: RedisStore) -> None:
    pubsub = store.subscriber()
    pubsub.subscribe(store.base + "ch:m1")  # m1 listens; m3 does not
    pubsub.get_message(timeout=1.0)
    store.submit_jobs([new("a"), new("b"), new("large")], "m1")
    jobs = take(store, "m2", want=3).jobs
    assert store.watch("m3", "b") is not None  # m3's client watches b
    big = b"x" * 20000  # too large to travel in a message
    reply = store.report(
        "m2",
        LEASE,
        finishes=[
            Finish(
                j.job_id, j.token, JobState.DONE, big if j.job_id == "large" else j.job_id.encode()
            )
            for j in jobs
        ],
    )
    assert reply.finished == [1, 1, 1]
    heard = [pubsub.get_message(timeout=1.0)["data"] for _ in range(2)]
    assert heard[0] == b"1"  # the large one: by id, in the inbox
    assert parse_ended(heard[1]) == [  # the others whole, in one message: nothing to fetch
        StoredEnd("a", JobState.DONE, b"a", None, "c1", ""),
        StoredEnd("b", JobState.DONE, b"b", None, "c1", ""),
    ]
    assert pubsub.get_message(timeout=0.2) is None
    assert [(e.job_id, e.outcome) for e in store.drain("m1")] == [("large", big)]
    assert [e.job_id for e in store.drain("m3")] == ["b"]  # nobody listened: its inbox
    assert store.drain("m1", done=1) == []  # it was delivered: dropped
    pubsub.close()


def test_a_watch_of_an_ended_job_returns_its_end(store: RedisStore) -> None:
    store.submit_jobs([new("j")], "m1")
    [job] = take(store, "m1").jobs
    store.report("m1", LEASE, finishes=[Finish("j", job.token, JobState.FAILED, b"boom")])
    ended = store.watch("m2", "j")
    assert ended is not None and (ended.state, ended.outcome) == (JobState.FAILED, b"boom")
    assert store.drain("m2") == []  # nothing more will come
    assert store.watch("m2", "unknown") is None


def test_the_one_who_finishes_a_job_of_its_own_client_delivers_it(store: RedisStore) -> None:
    store.submit_jobs([new("j")], "m1")
    [job] = take(store, "m1").jobs
    reply = store.report("m1", LEASE, finishes=[Finish("j", job.token, JobState.DONE, b"")])
    assert reply.finished == [2] and store.drain("m1") == []


def test_cancel_by_id_or_by_client_tells_the_owner(store: RedisStore) -> None:
    store.submit_jobs([new("a"), new("b", delay=60), new("c", delay=60, client="c2")], "m1")
    assert store.not_yet_due("c1") == ["b"]
    assert store.cancel_jobs("m2", ["a", "unknown"]) == [("a", "c1", False)]
    assert [e.job_id for e in store.drain("m1")] == ["a"]
    withdrawn = store.cancel_client("m1", "c1", not_due_only=True)
    assert [(w.job_id, w.mine) for w in withdrawn] == [("b", True)]
    assert store.cancel_client("m1", "c1") == []
    assert [r.job_id for r in store.jobs(JobState.PENDING)] == ["c"]
    assert store.counts().cancelled == 2


def test_one_key_submitted_at_once_through_many_managers_is_one_job(
    open_redis_store: Callable[..., RedisStore],
) -> None:
    stores = [open_redis_store() for _ in range(4)]
    holders: list[list[str]] = []
    start = threading.Barrier(len(stores))

    def submit(n: int) -> None:
        start.wait()
        holders.append(stores[n].submit_jobs([new(f"job-{n}", key="once")], f"m{n}")[0])

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len({h[0] for h in holders}) == 1 and len(holders) == 4
    assert len(stores[0].jobs(JobState.PENDING)) == 1


def test_a_schedule_run_created_twice_is_created_once_and_never_after_it_ran(
    store: RedisStore,
) -> None:
    run = new("nightly@2027-01-01T00:00:00Z")
    assert store.submit_jobs([run], "m1", if_absent=True) == ([run.job_id], None)
    assert store.submit_jobs([run], "m2", if_absent=True) == ([run.job_id], None)
    assert [r.job_id for r in store.jobs()] == [run.job_id]
    with pytest.raises(InvalidJobError, match="already in the store"):
        store.submit_jobs([run], "m2")
    [job] = take(store, "m3").jobs
    store.report("m3", LEASE, finishes=[Finish(run.job_id, job.token, JobState.DONE, b"")])
    assert [e.job_id for e in store.drain("m1")] == [run.job_id]  # its creator
    assert [e.job_id for e in store.drain("m2")] == [run.job_id]  # and who armed it too
    assert store.submit_jobs([run], "m2", if_absent=True) == ([""], None)  # it ran
    assert store.counts().pending[2] == 0


def test_a_full_queue_takes_nothing_of_a_batch(store: RedisStore) -> None:
    assert store.submit_jobs([new("a"), new("b")], "m1", max_pending=3) == (["a", "b"], None)
    assert store.submit_jobs([new("c"), new("d")], "m1", max_pending=3)[1] == "jobs"
    assert store.counts().pending[2] == 2


def test_a_manager_is_listed_with_its_last_heartbeat_until_it_leaves(store: RedisStore) -> None:
    store.heartbeat("m9", LEASE, b"status of m9")
    [record] = [m for m in store.managers() if m.manager_id == "m9"]
    assert record.status == b"status of m9" and record.lease_timeout == LEASE
    assert 0 <= record.seen_ago < 1.0
    store.forget_manager("m9")
    assert "m9" not in [m.manager_id for m in store.managers()]


def test_calls_fail_fast_with_a_typed_error_while_redis_is_down(
    own_redis: Callable[..., Any],
) -> None:
    server = own_redis()
    store = RedisStore(server.url())
    try:
        server.kill()
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError, match="job store unix://"):
            store.submit_jobs([new("j")], "m1")
        with pytest.raises(StoreUnavailableError):
            store.get("j")
        assert time.monotonic() - started < 2.0
        server.start()
        assert store.submit_jobs([new("j")], "m1") == (["j"], None)  # scripts load again
    finally:
        store.close()
