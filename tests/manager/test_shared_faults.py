"""A manager's side of a shared Redis queue when Redis is paused past the operation
timeout: calls whose answers were lost, though Redis ran them when it resumed. Each test
has a redis-server of its own that it pauses, and managers whose commands time out after
a second (shared_peers.Peer)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from processes import wait_for
from shared_peers import Peer, Taker, state

from mpsched._core.job import JobRequest, JobState, Outcome, OutcomeKind
from mpsched._errors import StoreUnavailableError
from mpsched._manager.journal import encode

JOIN = 30.0
TIMEOUT = 1.0  # the managers' operation timeout, in seconds


@pytest.fixture
def paused(own_redis: Callable[..., Any], peers: Callable[..., Peer]) -> Any:
    """A redis-server of the test's own and a manager on it whose calls time out after
    TIMEOUT; ``paused.server`` is resumed when the test ends, whatever happened."""
    server = own_redis()

    class Paused:
        def __init__(self) -> None:
            self.server = server
            self.peer = peers("m1", url=server.url(), operation_timeout=TIMEOUT)

    return Paused()


def test_a_claim_whose_answer_was_lost_gives_its_job_back_and_a_taker_gets_it(paused: Any) -> None:
    peer = paused.peer
    got: list[Any] = []
    connected, go = threading.Event(), threading.Event()

    def takes() -> None:
        # A first claim on this thread's connection: the next goes out whole.
        got.append(peer.queue.take("w1", JOIN))
        connected.set()
        go.wait(JOIN)
        got.append(peer.queue.take("w2", JOIN))

    peer.submit("j0")
    thread = threading.Thread(target=takes, daemon=True)
    thread.start()
    assert connected.wait(JOIN)
    peer.submit("j1")
    paused.server.pause()
    try:
        go.set()
        # Its claim times out: Redis runs it when it resumes, for nobody.
        wait_for(lambda: peer.queue.outage.down, 10, "the claim timed out")
    finally:
        paused.server.resume()
    thread.join(JOIN)
    assert got[1] is not None, "the job claimed in the lost call never came back"
    assert got[1].lease.job_id == "j1" and got[1].lease.attempt == 1
    assert state(peer, "j1") == (JobState.RUNNING, 1)


def test_a_submit_whose_answer_was_lost_is_taken_once_and_said_to_be(paused: Any) -> None:
    peer = paused.peer
    failed: list[BaseException] = []
    returned: list[object] = []
    connected, go = threading.Event(), threading.Event()

    def submit() -> None:
        # A first submit on this thread's connection: the next goes out whole.
        peer.journal.submit([JobRequest("j0", "c1", b"payload", 2, 0.0, None)], None)
        connected.set()
        go.wait(JOIN)
        try:
            returned.append(
                peer.journal.submit([JobRequest("j1", "c1", b"payload", 2, 0.0, None)], None)
            )
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    assert connected.wait(JOIN)
    paused.server.pause()
    try:
        go.set()
        wait_for(lambda: failed or peer.queue.outage.down, 10, "the submit timed out")
        time.sleep(TIMEOUT)  # a resend of it times out too, and runs when Redis resumes
    finally:
        paused.server.resume()
    thread.join(JOIN)
    assert not failed, f"a submit that Redis took was reported failed: {failed}"
    assert returned == [None]  # taken, as asked
    assert [r.job_id for r in peer.store.jobs()] == ["j0", "j1"]
    assert state(peer, "j1") == (JobState.PENDING, 0)


def test_an_end_whose_answer_was_lost_is_sent_again_without_a_false_warning(
    paused: Any, caplog: pytest.LogCaptureFixture
) -> None:
    peer = paused.peer
    peer.submit("j1")
    got = peer.queue.take("w1", 5.0)
    assert got is not None
    outcome = Outcome("j1", True, b"r", "", None)
    job = peer.queue.complete(got.lease.lease_id, outcome)
    assert job is not None
    with caplog.at_level(logging.INFO, logger="mpsched.manager"):
        paused.server.pause()
        try:
            assert peer.journal.finished(job, outcome) == set()  # its clients have it
        finally:
            paused.server.resume()
        deadline = time.monotonic() + JOIN
        while peer.journal.has_unsent():
            peer.link.beat_now()
            assert time.monotonic() < deadline, "the end was never sent again"
            time.sleep(0.05)
    assert state(peer, "j1") == (JobState.DONE, 1)
    assert not [r for r in caplog.records if "too late" in r.message], caplog.text


def test_a_listing_while_redis_is_paused_fails_in_time_and_the_outage_is_said_at_once(
    paused: Any, caplog: pytest.LogCaptureFixture
) -> None:
    peer = paused.peer
    with caplog.at_level(logging.INFO, logger="mpsched.manager"):
        paused.server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                peer.journal.jobs(None, None)
            assert time.monotonic() - started < TIMEOUT + 5.0
            assert [r for r in caplog.records if "does not answer" in r.message]
        finally:
            paused.server.resume()


def test_a_job_whose_worker_left_while_redis_was_down_goes_back_when_it_answers(
    own_redis: Callable[..., Any], peers: Callable[..., Peer]
) -> None:
    server = own_redis(appendonly="yes", appendfsync="always")
    peer = peers("m1", url=server.url())
    peer.submit("j1")
    got = peer.queue.take("w1", 5.0)
    assert got is not None
    server.kill()
    [lost] = peer.queue.release_worker("w1")  # it never had the job
    assert peer.queue.requeue(lost.job, retry=False)  # once Redis answers
    server.start()
    taker = Taker(peer.queue, "w2", timeout=JOIN)
    taker.join(JOIN)
    assert taker.got is not None and taker.got.lease.job_id == "j1"
    assert taker.got.lease.attempt == 1


def test_a_manager_paused_past_its_lease_hands_out_nothing_it_claimed_before(
    peers: Callable[..., Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    paused = peers("paused", lease=1.0)
    peer = peers("peer")  # takes back the paused manager's jobs when its lease runs out
    for job_id in ("j0", "j1"):
        paused.submit(job_id)
    first = paused.queue.take("w1", 5.0)
    assert first is not None
    outcome = Outcome("j0", True, b"", "", None)
    job = paused.queue.complete(first.lease.lease_id, outcome, "w1")
    assert job is not None
    assert paused.journal.finished(job, outcome, "w1") == set()  # j1 claimed for w1 with it
    resume = threading.Event()
    beat = paused.store.heartbeat

    def stalled(*args: Any, **kwargs: Any) -> Any:
        resume.wait(JOIN)  # the manager's heartbeats stall: it is presumed dead
        return beat(*args, **kwargs)

    monkeypatch.setattr(paused.store, "heartbeat", stalled)
    try:
        wait_for(
            lambda: state(peer, "j1") == (JobState.FAILED, 1),
            30,
            "the peer took the paused manager's job back",
        )
    finally:
        resume.set()
    assert paused.queue.take("w1", 1.0) is None  # j1 is not handed out: it was taken back
    assert state(peer, "j1") == (JobState.FAILED, 1)


def ended_message(job_id: str, outcome: bytes) -> bytes:
    """A job's end as the scripts publish it on its owner's channel (common.lua)."""
    fields = [job_id.encode(), b"done", b"c1", b"", outcome]
    return b"E" + b"".join(str(len(f)).encode() + b":" + f for f in fields)


def test_a_drain_that_fails_keeps_the_subscription_and_the_ends_it_carries(
    peers: Callable[..., Peer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Right after a restart of Redis a thread's old connection fails once: the ends
    # already published to this manager must not go with the subscription.
    peer = peers("m1")
    real = peer.store.drain
    failures = [StoreUnavailableError("redis://x", "Connection closed by server.")]

    def drain(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args, **kwargs)

    monkeypatch.setattr(peer.store, "drain", drain)
    outcome = encode(Outcome("x", True, b"r", "", None))
    pipe = peer.store.client.pipeline(transaction=False)
    pipe.publish(peer.store.base + "ch:m1", "1")  # its inbox has ends: a drain, that fails
    pipe.publish(peer.store.base + "ch:m1", ended_message("x", outcome))
    assert pipe.execute() == [1, 1]
    wait_for(
        lambda: [o for _, o in peer.delivered if o.job_id == "x"],
        10,
        "the end published after the failed drain was delivered",
    )


@pytest.mark.slow  # seconds of waiting: out of make test-fast
def test_a_cancel_whose_answer_was_lost_tells_the_jobs_client_once_redis_answers(
    paused: Any,
) -> None:
    peer = paused.peer
    peer.submit("j0", delay=600)
    peer.submit("j1", delay=600)
    assert [j.job_id for j in peer.queue.cancel_jobs(["j0"])] == ["j0"]  # its connection
    paused.server.pause()
    try:
        with pytest.raises(StoreUnavailableError):
            peer.queue.cancel_jobs(["j1"])  # Redis cancels it when it resumes
    finally:
        paused.server.resume()
    wait_for(
        lambda: [o for _, o in peer.delivered if o.job_id == "j1"],
        30,
        "the client of the job cancelled in the lost call was told",
    )
    [(client, outcome)] = [(c, o) for c, o in peer.delivered if o.job_id == "j1"]
    assert client == "c1" and outcome.error_kind == OutcomeKind.CANCELLED
    assert state(peer, "j1")[0] is JobState.CANCELLED
