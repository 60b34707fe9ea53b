"""The write-behind outbox, against a fake manager whose submit the test can hold."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from mpsched._client.outbox import Outbox
from mpsched._core.job import JobRequest

WAIT = 10.0


class FakeService:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.entered = threading.Semaphore(0)  # released each time a submit starts
        self.release = threading.Event()  # submits block until set
        self.fail_with: BaseException | None = None
        self.withdrawn = 0  # requests the manager was told were taken back unsent

    def open_connection(self, thread_name: str) -> object:
        return object()  # calls go to this object, whichever thread makes them

    def use_connection(self, connection: object) -> None:
        pass

    def submit(self, requests: list[JobRequest], timeout: float | None, withdrawn: int = 0) -> None:
        self.withdrawn += withdrawn
        self.entered.release()
        assert self.release.wait(WAIT)
        if self.fail_with is not None:
            raise self.fail_with
        self.batches.append([r.job_id for r in requests])


def req(job_id: str) -> JobRequest:
    return JobRequest(job_id, "c", b"", 2, 0.0, None)


@pytest.fixture
def outbox() -> Iterator[tuple[Outbox, FakeService, list[tuple[list[str], BaseException]]]]:
    service = FakeService()
    failures: list[tuple[list[str], BaseException]] = []
    box = Outbox(service, lambda batch, exc: failures.append(([r.job_id for r in batch], exc)))  # type: ignore[arg-type]
    yield box, service, failures
    service.release.set()
    box.close()


def test_requests_queued_during_a_send_go_in_the_next_batch_in_order(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)  # "a" is on its way; the sender is busy
    for job_id in "bcd":
        box.put(req(job_id))
    service.release.set()
    assert box.flush(WAIT)
    assert service.batches == [["a"], ["b", "c", "d"]]


def test_a_request_not_yet_sent_can_be_withdrawn(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)
    box.put(req("b"))
    box.put(req("c"))
    assert box.withdraw("b") is True
    service.release.set()
    assert box.flush(WAIT)
    assert service.batches == [["a"], ["c"]]


def test_flush_waits_for_the_batch_in_flight(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)
    assert box.flush(0.05) is False
    service.release.set()
    assert box.flush(WAIT) is True


def test_a_failed_send_reports_its_batch(outbox):
    box, service, failures = outbox
    service.fail_with = ConnectionResetError("gone")
    service.release.set()
    box.put(req("a"))
    assert box.flush(WAIT)
    assert failures and failures[0][0] == ["a"]
    assert isinstance(failures[0][1], ConnectionResetError)


def test_close_sends_what_is_left(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)
    box.put(req("b"))
    service.release.set()
    box.close()
    assert service.batches == [["a"], ["b"]]


def test_withdrawing_a_request_on_its_way_waits_until_it_landed(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)  # "a" is on its way
    result: list[bool] = []
    withdrawer = threading.Thread(target=lambda: result.append(box.withdraw("a")))
    withdrawer.start()
    withdrawer.join(0.05)
    assert withdrawer.is_alive()  # waits for the send: the manager must see "a" first
    service.release.set()
    withdrawer.join(WAIT)
    assert result == [False] and service.batches == [["a"]]


def test_the_manager_hears_how_many_requests_were_taken_back_unsent(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)
    for job_id in "bcd":
        box.put(req(job_id))
    assert box.withdraw("b") is True
    assert box.withdraw_all() == ["c", "d"]
    service.release.set()
    assert box.flush(WAIT)  # a batch with no request still carries the count
    assert service.batches[0] == ["a"]
    assert service.withdrawn == 3


class CountHeldService(FakeService):
    """Also holds a call that carries only a count of requests taken back."""

    def __init__(self) -> None:
        super().__init__()
        self.count_sending = threading.Event()
        self.count_release = threading.Event()

    def submit(self, requests: list[JobRequest], timeout: float | None, withdrawn: int = 0) -> None:
        if not requests:
            self.count_sending.set()
            assert self.count_release.wait(WAIT)
        super().submit(requests, timeout, withdrawn)


def test_flush_waits_for_a_count_on_its_way_without_any_request() -> None:
    service = CountHeldService()
    box = Outbox(service, lambda batch, exc: None)  # type: ignore[arg-type]
    try:
        box.put(req("x"))
        assert service.entered.acquire(timeout=WAIT)  # "x" is on its way, held
        box.put(req("y"))
        assert box.withdraw("y") is True
        service.release.set()
        assert service.count_sending.wait(WAIT)  # then the count alone is on its way
        assert box.flush(0.05) is False  # not there yet: stats() would miss it
        service.count_release.set()
        assert box.flush(WAIT)
        assert service.withdrawn == 1
    finally:
        service.release.set()
        service.count_release.set()
        box.close()


# ------------------------------------------------------------------------------ paused


def test_a_paused_outbox_refuses_requests_and_sends_nothing_after_the_call_on_its_way(outbox):
    box, service, _ = outbox
    assert box.put(req("a")) is True
    assert service.entered.acquire(timeout=WAIT)  # "a" is on its way
    assert box.put(req("b")) is True
    box.pause()
    assert box.put(req("c")) is False  # refused: nothing queued
    service.release.set()
    box.wait_idle()  # "a" was answered
    assert service.batches == [["a"]]
    assert box.unsent() == {"b"}
    assert not service.entered.acquire(timeout=0.2)  # "b" stays unsent: no call began


def test_flush_and_wait_sent_return_at_once_while_paused(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)  # "a" is on its way, held
    box.put(req("b"))
    box.pause()
    # Nothing more can be sent: a caller waiting for a send would wait out the outage.
    assert box.flush(WAIT) is False
    assert box.wait_sent("b", WAIT) is False
    assert box.wait_sent("never-queued", WAIT) is True


def test_resume_sends_the_requests_to_send_again_first_to_the_new_service(outbox):
    box, service, failures = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)  # "a" is on its way, held
    box.put(req("c"))  # left unsent by the outage
    box.pause()
    service.release.set()
    box.wait_idle()
    later = FakeService()
    later.release.set()
    box.resume(later, [req("x"), req("y")])  # a batch the lost manager never got
    assert box.put(req("d")) is True
    assert box.flush(WAIT)
    assert [job for batch in later.batches for job in batch] == ["x", "y", "c", "d"]
    assert service.batches == [["a"]] and failures == []


def test_closing_a_paused_outbox_ends_its_sender_with_the_rest_unsent(outbox):
    box, service, _ = outbox
    box.put(req("a"))
    assert service.entered.acquire(timeout=WAIT)
    box.put(req("b"))
    box.pause()
    service.release.set()
    box.close()  # returns: the sender does not wait for a resume that never comes
    assert not box._thread.is_alive()
    assert service.batches == [["a"]] and box.unsent() == {"b"}
