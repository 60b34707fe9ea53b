"""Reports (mpsched._worker.reports): what a worker holds back while its batch goes on."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import pytest

from mpsched._core.job import Outcome
from mpsched._protocol.records import Report
from mpsched._worker.reports import Reports

WAIT = 10.0


def report(n: int) -> Report:
    return Report(
        lease_id=n,
        outcome=Outcome(job_id=f"job-{n}", ok=True, payload=b"", traceback="", started=None),
    )


class Sent:
    """The reporter's ``send``: records each batch; blocks while ``gate`` is clear."""

    def __init__(self) -> None:
        self.batches: queue.Queue[list[int]] = queue.Queue()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, reports: list[Report]) -> None:
        self.entered.set()
        assert self.gate.wait(WAIT)
        self.batches.put([r.lease_id for r in reports])


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def reports(sent: Sent) -> Iterator[Reports]:
    made = Reports(sent, after=0.01)
    try:
        yield made
    finally:
        sent.gate.set()
        made.close()


def test_held_reports_are_sent_when_the_batch_goes_on(reports: Reports, sent: Sent) -> None:
    reports.hold(report(1))
    reports.hold(report(2))
    assert sent.batches.get(timeout=WAIT) == [1, 2]
    assert reports.take_all() == []  # each report goes one way only


def test_reports_taken_with_the_next_take_are_not_sent_again(reports: Reports, sent: Sent) -> None:
    sent.gate.clear()
    reports.hold(report(1))
    reports.add(report(2))
    taken = reports.take_all()  # the batch ended before the reporter's look (or not)
    sent.gate.set()
    assert reports.settle(WAIT)
    early = [] if sent.batches.empty() else sent.batches.get_nowait()
    assert sorted(early + [r.lease_id for r in taken]) == [1, 2]


def test_a_report_added_at_the_end_of_a_batch_waits_for_the_take(
    reports: Reports, sent: Sent
) -> None:
    reports.add(report(1))
    reports.hold(report(2))  # a held one makes the reporter look
    assert sent.batches.get(timeout=WAIT) == [1, 2]  # what was pending went with it


def test_close_waits_for_a_send_under_way(reports: Reports, sent: Sent) -> None:
    sent.gate.clear()
    reports.hold(report(1))
    assert sent.entered.wait(WAIT)
    closer = threading.Thread(target=reports.close, daemon=True)
    closer.start()
    closer.join(0.05)
    assert closer.is_alive()  # the report is on its way: whoever leaves must wait for it
    sent.gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert sent.batches.get_nowait() == [1]


def test_the_reporter_is_started_only_when_a_report_is_held(sent: Sent) -> None:
    made = Reports(sent, after=0.01)
    before = {t.name for t in threading.enumerate()}
    made.add(report(1))
    assert made.take_all() == [report(1)]
    made.close()
    assert "mpsched-reporter" not in {t.name for t in threading.enumerate()} - before


def test_batches_that_follow_each_other_wake_the_reporter_once(sent: Sent) -> None:
    # Each batch ends (its reports taken) before the reporter gets to look: it must go on
    # looking on its own while batches follow, not be woken again for each one.
    made = Reports(sent, after=0.5)
    wakes = 0
    notify = made._changed.notify

    def counted(n: int = 1) -> None:
        nonlocal wakes
        wakes += 1
        notify(n)

    made._changed.notify = counted  # type: ignore[method-assign]
    try:
        for n in range(200):
            made.hold(report(2 * n))
            made.add(report(2 * n + 1))
            assert len(made.take_all()) == 2  # the batch's take
            threading.Event().wait(0.0005)  # the take's round trip: the reporter may run
    finally:
        made.close()
    assert wakes <= 3  # once, and again only after a whole look with nothing held
    assert sent.batches.empty()  # nothing was held long enough to be sent early


def test_an_idle_reporter_is_woken_by_the_next_held_report(sent: Sent) -> None:
    made = Reports(sent, after=0.01)
    try:
        made.hold(report(1))
        assert sent.batches.get(timeout=WAIT) == [1]
        # A look with nothing held since the last one: it sleeps, untimed, until a hold.
        deadline = time.monotonic() + WAIT
        while not made._idle:  # read without the lock: a bool, polled
            assert time.monotonic() < deadline
            threading.Event().wait(0.002)
        made.hold(report(2))
        assert sent.batches.get(timeout=WAIT) == [2]
    finally:
        made.close()
