"""Reports (mpsched._worker.reports): what a worker holds back while its batch goes on."""

from __future__ import annotations

import queue
import threading
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
