"""A manager's side of a shared Redis queue (SharedQueue, SharedJournal, SharedLink), in
this process against a real redis-server: takers that wait without asking Redis, wake-ups
on a new head, one timed waiter across managers, a clock an hour off, and an outage."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from processes import wait_for
from shared_peers import Peer, Taker, state

from mpsched._core.clock import SystemClock
from mpsched._core.job import JobRequest, JobState, Outcome
from mpsched._errors import InvalidJobError, QueueFullError
from mpsched._manager import shared_cancels, shared_prefetch
from mpsched._manager.journal import encode
from mpsched._manager.shared_journal import SharedJournal
from mpsched._manager.shared_queue import SharedQueue
from mpsched._payload import frames
from mpsched._store.redis.records import NewJob
from mpsched._store.redis.store import RedisStore

JOIN = 30.0


class ShiftedClock(SystemClock):
    """The monotonic clock of a machine booted an hour earlier (or later)."""

    def __init__(self, shift: float) -> None:
        self.shift = shift

    def now(self) -> float:
        return super().now() + self.shift


class LateTimerClock(SystemClock):
    """A machine whose timed waits end ``share`` of their length late (seen on a VM:
    0.1-0.3%)."""

    def __init__(self, share: float) -> None:
        self.share = share

    def condition(self, lock: threading.Lock) -> Any:
        return _LateCondition(lock, self.share)


class _LateCondition(threading.Condition):
    def __init__(self, lock: threading.Lock, share: float) -> None:
        super().__init__(lock)
        self.share = share

    def wait(self, timeout: float | None = None) -> bool:
        return super().wait(None if timeout is None else timeout * (1 + self.share))


class Slots:
    """Local workers' claim slots, as mpsched._worker.claims keeps them: each worker's
    last started lease; a revocation refuses it everything after."""

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.revoked: list[tuple[str, int]] = []

    def reopen(self, worker_id: str) -> bool:
        return True

    def revoke(self, worker_id: str, lowest: int) -> int | None:
        cut = max(self.started.get(worker_id, 0) + 1, lowest)
        self.revoked.append((worker_id, cut))
        return cut


def commands(store: RedisStore) -> int:
    """Commands the server has run so far (all of them, scripts counted once)."""
    return int(store.client.info("stats")["total_commands_processed"])


def waiting(queue: SharedQueue, count: int) -> None:
    deadline = time.monotonic() + JOIN
    while queue.stats().waiting < count:
        assert time.monotonic() < deadline, "the takers never waited"
        time.sleep(0.01)


def test_idle_takers_ask_nothing_and_a_submit_wakes_one_at_once(peers: Callable[..., Peer]) -> None:
    first, second = peers("m1"), peers("m2")
    takers = [Taker(first.queue, "w1"), Taker(first.queue, "w2"), Taker(second.queue, "w1")]
    waiting(first.queue, 2)
    waiting(second.queue, 1)
    before = commands(first.store)
    time.sleep(1.0)  # what an idle manager sends in a second: nothing (heartbeats: 10 s)
    assert commands(first.store) - before <= 2  # the INFO calls of this test
    submitted = time.monotonic()
    second.submit("j1")
    deadline = time.monotonic() + JOIN
    while not any(t.got for t in takers):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    [taker] = [t for t in takers if t.got]
    assert taker.got is not None and taker.got.lease.job_id == "j1"
    assert taker.ended is not None and taker.ended - submitted < 0.5
    assert sum(t.got is not None for t in takers) == 1


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_one_manager_times_the_head_and_a_sooner_head_is_taken_on_time(
    peers: Callable[..., Peer],
) -> None:
    first, second = peers("m1"), peers("m2")
    first.submit("later", delay=3.0)
    takers = [Taker(first.queue, "w1"), Taker(second.queue, "w1")]
    waiting(first.queue, 1)
    waiting(second.queue, 1)
    leader = first.store.client.get(first.store.base + "leader")
    assert leader in (b"m1", b"m2")
    submitted = time.monotonic()
    second.submit("sooner", delay=0.3)
    for taker in takers:
        taker.join(JOIN)
    got = {t.got.lease.job_id: t.ended for t in takers if t.got is not None}
    assert got["sooner"] is not None and 0.25 < got["sooner"] - submitted < 1.0
    assert got["later"] is not None and 2.9 < got["later"] - submitted < 4.0


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_a_manager_whose_timers_end_late_times_the_head_on_time(peers: Callable[..., Peer]) -> None:
    # 1.5% late, just under what the waits allow for (AHEAD_SHARE, 1/64).
    peer = peers("m1", clock=LateTimerClock(0.015))
    taker = Taker(peer.queue, "w1")
    waiting(peer.queue, 1)
    submitted = time.monotonic()
    peer.submit("head", delay=3.0)
    taker.join(JOIN)
    assert taker.got is not None and taker.ended is not None
    # One wait of the whole delay would end 45 ms late; waits that end early, then
    # another claim, leave the claim's round trip (and a loaded machine's wake-up).
    assert 3.0 <= taker.ended - submitted < 3.025


def test_a_manager_whose_clock_is_an_hour_off_runs_jobs_on_time(peers: Callable[..., Peer]) -> None:
    ahead = peers("ahead", clock=ShiftedClock(+3600.0))
    behind = peers("behind", clock=ShiftedClock(-3600.0))
    for peer in (ahead, behind):
        submitted = time.monotonic()
        peer.submit(f"due-{peer.queue.manager_id}", delay=0.4)
        taker = Taker(peer.queue, "w1")
        taker.join(JOIN)
        assert taker.got is not None and taker.ended is not None
        assert 0.35 < taker.ended - submitted < 1.5
        # Handed out with its due instant on the manager's own (shifted) clock.
        assert taker.got.due is not None
        assert abs(taker.got.due - peer.queue.clock.now()) < 0.5


def test_an_outage_is_one_warning_and_the_manager_carries_on(
    own_redis: Callable[..., Any], peers: Callable[..., Peer], caplog: pytest.LogCaptureFixture
) -> None:
    server = own_redis()
    peer = peers("m1", url=server.url())
    taker = Taker(peer.queue, "w1", timeout=30.0)
    waiting(peer.queue, 1)
    with caplog.at_level(logging.INFO, logger="mpsched.manager"):
        server.kill()
        time.sleep(1.0)  # the manager notices: its subscriber's connection is gone
        server.start()
        deadline = time.monotonic() + JOIN
        while True:
            try:
                peer.submit("after")
                break
            except Exception:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        taker.join(JOIN)
    assert taker.got is not None and taker.got.lease.job_id == "after"
    warnings = [r for r in caplog.records if "does not answer" in r.message]
    assert len(warnings) == 1
    [back] = [r for r in caplog.records if "answers again after" in r.message]
    assert back.levelno == logging.WARNING


def test_an_end_that_redis_could_not_take_is_sent_again_when_it_is_back(
    own_redis: Callable[..., Any], peers: Callable[..., Peer]
) -> None:
    server = own_redis(appendonly="yes", appendfsync="always")
    peer = peers("m1", url=server.url())
    peer.submit("j1")
    taker = Taker(peer.queue, "w1")
    taker.join(JOIN)
    assert taker.got is not None
    job = peer.queue.complete(taker.got.lease.lease_id, Outcome("j1", True, b"r", "", None))
    assert job is not None
    server.kill()
    assert peer.journal.finished(job, Outcome("j1", True, b"r", "", None)) is not None
    assert peer.journal.has_unsent()
    server.start()
    deadline = time.monotonic() + JOIN
    while peer.journal.has_unsent():
        peer.link.beat_now()
        assert time.monotonic() < deadline, "the end was never sent again"
        time.sleep(0.05)
    record = peer.store.get("j1")
    assert record is not None and record.state is JobState.DONE
    assert record.outcome == encode(Outcome("j1", True, b"r", "", None))


def test_a_jobs_end_and_its_workers_next_job_travel_in_one_call(
    peers: Callable[..., Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    peer = peers("m1")
    for n in range(3):
        peer.submit(f"j{n}")
    first = peer.queue.take("w1", 5.0)
    assert first is not None
    job = peer.queue.complete(first.lease.lease_id, Outcome("j0", True, b"r", "", None), "w1")
    assert job is not None
    calls: list[object] = []
    real = peer.store.report

    def report(*a: Any, **k: Any) -> Any:
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(peer.store, "report", report)
    assert peer.journal.finished(job, Outcome("j0", True, b"r", "", None), "w1") == set()
    second = peer.queue.take("w1", 5.0)  # handed out from what the finish's call claimed
    assert second is not None and second.lease.job_id == "j1"
    assert len(calls) == 1
    record = peer.store.get("j0")
    assert record is not None and record.state is JobState.DONE


def test_a_job_claimed_for_a_worker_that_dies_before_taking_it_goes_back_untouched(
    peers: Callable[..., Peer],
) -> None:
    peer = peers("m1")
    peer.submit("j0")
    peer.submit("j1")
    first = peer.queue.take("w1", 5.0)
    assert first is not None
    job = peer.queue.complete(first.lease.lease_id, Outcome("j0", True, b"", "", None), "w1")
    assert job is not None
    peer.journal.finished(job, Outcome("j0", True, b"", "", None), "w1")  # claims j1 for w1
    [lost] = peer.queue.release_worker("w1")  # w1 died before its next take
    assert lost.job.job_id == "j1"
    assert peer.queue.requeue(lost.job, retry=False)
    again = peer.queue.take("w2", 5.0)
    assert again is not None and again.lease.job_id == "j1" and again.lease.attempt == 1


@pytest.fixture
def no_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefetched jobs are never given back for being held up (the test does it)."""
    monkeypatch.setattr(shared_prefetch, "PREFETCH_HOLD", 3600.0)


def counted_reports(peer: Peer, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    real = peer.store.report

    def report(*a: Any, **k: Any) -> Any:
        calls.append(a)
        return real(*a, **k)

    monkeypatch.setattr(peer.store, "report", report)
    return calls


def test_a_batch_is_claimed_in_one_call_and_its_ends_with_the_next_batch_in_another(
    peers: Callable[..., Peer], monkeypatch: pytest.MonkeyPatch, no_hold: None
) -> None:
    peer = peers("m1", claims=Slots())
    for n in range(6):
        peer.submit(f"j{n}")
    calls = counted_reports(peer, monkeypatch)
    batch = peer.queue.take_batch("w1", 5.0, more=3)
    assert [a.lease.job_id for a in batch] == ["j0", "j1", "j2", "j3"]
    assert len({a.lease.lease_id for a in batch}) == 4 and len(calls) == 1
    ends = []
    for assignment in batch:
        outcome = Outcome(assignment.lease.job_id, True, b"r", "", None)
        job = peer.queue.complete(assignment.lease.lease_id, outcome, "w1")
        assert job is not None
        ends.append((job, outcome))
    assert peer.journal.finished_all(ends, "w1", more=3) == [set()] * 4  # as its take
    assert len(calls) == 2  # four ends, and the next batch claimed with them
    assert [a.lease.job_id for a in peer.queue.take_batch("w1", 5.0, more=3)] == ["j4", "j5"]
    assert len(calls) == 2
    assert [state(peer, f"j{n}")[0] for n in range(4)] == [JobState.DONE] * 4
    assert peer.queue.stats().prefetched == 4


def test_prefetched_jobs_held_up_are_given_back_in_order_and_a_peer_runs_them(
    peers: Callable[..., Peer],
) -> None:
    slots = Slots()
    first, second = peers("m1", claims=slots), peers("m2")
    for n in range(4):
        first.submit(f"j{n}")
    batch = first.queue.take_batch("w1", 5.0, more=3)
    assert [a.lease.job_id for a in batch] == ["j0", "j1", "j2", "j3"]
    slots.started["w1"] = batch[1].lease.lease_id  # it started j1, and is held up in it
    handed = time.monotonic()
    taker = Taker(second.queue, "w1")
    taker.join(JOIN)
    assert taker.got is not None and taker.got.lease.job_id == "j2"  # in order
    assert taker.ended is not None and taker.ended - handed < 0.5  # PREFETCH_HOLD: 5 ms
    assert state(first, "j2") == (JobState.RUNNING, 1)
    assert state(first, "j3") == (JobState.PENDING, 0)  # given back as never started
    assert state(first, "j1") == (JobState.RUNNING, 1)
    # Counted once Redis has answered the give-back, which the peer may see first.
    wait_for(lambda: first.queue.stats().revoked == 2, 10, "the give-back counted")


def test_a_cancel_through_another_manager_takes_a_prefetched_job_back_unless_it_started(
    peers: Callable[..., Peer], no_hold: None
) -> None:
    slots = Slots()
    holder, other = peers("m1", claims=slots), peers("m2")
    for n in range(4):
        holder.submit(f"j{n}")
    batch = holder.queue.take_batch("w1", 5.0, more=3)
    slots.started["w1"] = batch[1].lease.lease_id  # j0 and j1 started
    cancelled = other.queue.cancel_jobs(["j1", "j3"])
    assert [job.job_id for job in cancelled] == ["j3"]
    assert state(holder, "j3")[0] is JobState.CANCELLED
    assert state(holder, "j1")[0] is JobState.RUNNING
    assert state(holder, "j2") == (JobState.PENDING, 0)  # the rest of its batch went back
    assert holder.queue.held() == 2
    # Its own manager cancels at once; nothing waits for an answer.
    for n in range(4, 7):
        holder.submit(f"j{n}")
    holder.queue.take_batch("w2", 5.0, more=3)  # j2, j4, j5, j6
    started = time.monotonic()
    assert [job.job_id for job in holder.queue.cancel_jobs(["j6"])] == ["j6"]
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize("through", ["other", "holder"])
def test_a_cancel_of_a_clients_jobs_takes_back_those_prefetched_unless_started(
    peers: Callable[..., Peer], no_hold: None, through: str
) -> None:
    slots = Slots()
    holder, other = peers("m1", claims=slots), peers("m2")
    for n in range(5):
        holder.submit(f"j{n}", client="c2" if n == 2 else "c1")
    holder.submit("later", delay=60)
    batch = holder.queue.take_batch("w1", 5.0, more=3)  # j0, and j1 to j3 prefetched
    slots.started["w1"] = batch[1].lease.lease_id  # j0 and j1 started
    canceller = other if through == "other" else holder
    started = time.monotonic()
    cancelled = canceller.queue.cancel_client_jobs("c1")
    assert sorted(job.job_id for job in cancelled) == ["j3", "j4", "later"]
    assert all(job.client_id == "c1" for job in cancelled)
    assert time.monotonic() - started < 1.0  # the holder answered: no wait for CANCEL_WAIT
    assert [state(holder, f"j{n}")[0] for n in range(5)] == [
        JobState.RUNNING,
        JobState.RUNNING,
        JobState.PENDING,
        JobState.CANCELLED,
        JobState.CANCELLED,
    ]
    assert state(holder, "j2") == (JobState.PENDING, 0)  # c2's: back in the queue
    assert holder.queue.held() == 2  # j0 and j1 run to their ends
    record = holder.store.get("j1")
    assert record is not None and record.state is JobState.RUNNING
    assert holder.store.client.hget(f"{holder.store.base}j:j1", "cx") is None  # unmarked


def test_a_cancel_of_a_clients_jobs_waits_for_a_silent_holder_no_longer_than_its_bound(
    peers: Callable[..., Peer], no_hold: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    slots = Slots()
    holder, other = peers("m1", claims=slots), peers("m2")
    stalled, resume = threading.Event(), threading.Event()

    def stall(job_ids: list[str], nonce: str | None) -> None:
        stalled.set()
        resume.wait(JOIN)

    monkeypatch.setattr(holder.queue, "give_back_for_cancel", stall)
    try:
        for n in range(4):
            holder.submit(f"j{n}")
        holder.queue.take_batch("w1", 5.0, more=2)  # j0, with j1 and j2 prefetched
        started = time.monotonic()
        assert [job.job_id for job in other.queue.cancel_client_jobs("c1")] == ["j3"]
        took = time.monotonic() - started
        assert stalled.is_set()
        assert shared_cancels.CANCEL_WAIT <= took < shared_cancels.CANCEL_WAIT + 1.0
    finally:
        resume.set()
    # The cancel settled without them: they are unmarked, held by their manager still.
    assert [state(holder, f"j{n}")[0] for n in range(3)] == [JobState.RUNNING] * 3
    assert holder.store.client.hget(f"{holder.store.base}j:j1", "cx") is None


def test_a_worker_that_leaves_gives_back_what_it_did_not_start(
    peers: Callable[..., Peer], no_hold: None
) -> None:
    slots = Slots()
    peer = peers("m1", claims=slots)
    for n in range(4):
        peer.submit(f"j{n}")
    batch = peer.queue.take_batch("w1", 5.0, more=3)
    slots.started["w1"] = batch[0].lease.lease_id
    assert peer.queue.revoke("w1") == 3
    assert [state(peer, f"j{n}") for n in range(1, 4)] == [(JobState.PENDING, 0)] * 3
    [again] = peer.queue.take_batch("w2", 5.0)
    assert again.lease.job_id == "j1"
    # Its end claims w2's next job (j2), which w2 leaves without taking: it goes back too.
    outcome = Outcome("j1", True, b"", "", None)
    job = peer.queue.complete(again.lease.lease_id, outcome, "w2")
    assert job is not None and peer.journal.finished_all([(job, outcome)], "w2", more=0) == [set()]
    assert state(peer, "j2") == (JobState.RUNNING, 1)
    assert peer.queue.revoke("w2") == 1
    assert state(peer, "j2") == (JobState.PENDING, 0)


def test_the_ends_a_worker_hands_in_after_a_long_job_claim_it_one_job(
    peers: Callable[..., Peer], no_hold: None
) -> None:
    peer = peers("m1", claims=Slots())
    for n in range(6):
        peer.submit(f"j{n}")
    ends = []
    for assignment in peer.queue.take_batch("w1", 5.0, more=3):
        outcome = Outcome(assignment.lease.job_id, True, b"r", "", None)
        job = peer.queue.complete(assignment.lease.lease_id, outcome, "w1")
        assert job is not None
        ends.append((job, outcome))
    peer.journal.finished_all(ends, "w1", more=0)  # its take asks for no company now
    assert [a.lease.job_id for a in peer.queue.take_batch("w1", 5.0)] == ["j4"]
    assert state(peer, "j5") == (JobState.PENDING, 0)


def test_ends_a_worker_reports_while_it_runs_its_batch_claim_nothing_for_it(
    peers: Callable[..., Peer], no_hold: None
) -> None:
    # Its reporter's ends, sent while the worker may still claim the rest of its batch
    # (here: all of it was revoked), must not hand it a batch: that would reopen its
    # claim slot, and it could start a job that went back to the queue.
    slots = Slots()
    peer = peers("m1", claims=slots)
    for n in range(6):
        peer.submit(f"j{n}")
    first, second, *_ = peer.queue.take_batch("w1", 5.0, more=3)
    slots.started["w1"] = second.lease.lease_id
    peer.queue.give_back_for_cancel(["j2"], None)  # revokes j2 and j3: not started
    ends = []
    for assignment in (first, second):
        outcome = Outcome(assignment.lease.job_id, True, b"r", "", None)
        job = peer.queue.complete(assignment.lease.lease_id, outcome, "w1")
        assert job is not None
        ends.append((job, outcome))
    assert peer.journal.finished_all(ends, "w1") == [set(), set()]  # its reporter's
    assert peer.queue.held() == 0
    assert [state(peer, f"j{n}") for n in (2, 3, 4)] == [(JobState.PENDING, 0)] * 3


def test_a_bounded_submit_times_out_on_the_bound_it_met_and_one_that_never_fits_at_once(
    redis_url: str,
) -> None:
    store = RedisStore(redis_url)
    queue = SharedQueue(
        store, manager_id="m1", lease_timeout=30.0, max_pending=2, max_pending_bytes=100
    )
    journal = SharedJournal(store, queue)

    def request(job_id: str, size: int) -> JobRequest:
        return JobRequest(job_id, "c1", b"x" * size, 2, 0.0, None)

    try:
        with pytest.raises(InvalidJobError, match="3 jobs can never fit max_pending=2"):
            journal.submit([request(f"j{n}", 1) for n in range(3)], None)
        with pytest.raises(InvalidJobError, match="101 payload bytes can never fit"):
            journal.submit([request("big", 101)], None)
        journal.submit([request("a", 60)], 0)
        with pytest.raises(QueueFullError) as full:
            journal.submit([request("b", 41)], 0.05)
        assert (full.value.max_pending, full.value.unit) == (100, "payload bytes")
        journal.submit([request("b", 40)], 0)
        with pytest.raises(QueueFullError) as full:
            journal.submit([request("c", 0)], 0.05)
        assert (full.value.max_pending, full.value.unit) == (2, "jobs")
        assert [r.job_id for r in store.jobs(JobState.PENDING)] == ["a", "b"]
    finally:
        queue.close()
        store.close()


def test_workers_get_the_frame_of_a_job_held_here_and_no_empty_frame_for_another_s(
    peers: Callable[..., Peer],
) -> None:
    # m1 holds "held" in shared memory (its claim brings no payload: the frame names the
    # segment). A job framed for m1's shared memory but run on m2 loses its empty frame:
    # its client is elsewhere, so a large result goes inline, not into m2's memory.
    owner, other = peers("m1"), peers("m2")
    owner.queue.on_held_payload({"held": b"frame naming a segment"}.get)
    framed = frames.frame("", 0, (), b"pickle")
    owner.store.submit_jobs(
        [NewJob("held", "c1", None, "f", b"inline", 2, 0.0, None, None, 0, held=True)], "m1"
    )
    first = owner.queue.take("w1", 5.0)
    assert first is not None and first.payload == b"frame naming a segment"
    owner.store.submit_jobs(
        [NewJob(f"j{n}", "c1", None, "f", framed, 2, 0.0, None, None, 0) for n in range(2)], "m1"
    )
    mine = owner.queue.take("w2", 5.0)
    assert mine is not None and mine.payload == framed  # its client maps m1's memory
    theirs = other.queue.take("w1", 5.0)
    assert theirs is not None and theirs.payload == b"pickle"
