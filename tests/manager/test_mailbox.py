"""Per-client result mailboxes in the manager."""

from __future__ import annotations

import threading
import time

from mpsched._core.job import Outcome
from mpsched._manager.mailbox import Mailboxes


def outcome(job_id: str) -> Outcome:
    return Outcome(job_id, True, b"", "", None)


def test_collect_returns_everything_posted_in_order():
    boxes = Mailboxes()
    boxes.open("c")
    for i in range(3):
        boxes.post("c", outcome(f"j{i}"))
    assert [o.job_id for o in boxes.collect("c", 0) or []] == ["j0", "j1", "j2"]
    assert boxes.collect("c", 0) == []


def test_outcomes_posted_after_a_stop_are_still_collected():
    boxes = Mailboxes()
    boxes.open("c")
    boxes.close()  # the manager is stopping
    boxes.post("c", outcome("late"))  # a job that finished while it drained
    assert [o.job_id for o in boxes.collect("c", 0) or []] == ["late"]
    assert boxes.collect("c", 0) is None  # then the client learns the box is closed


def test_wait_collected_returns_once_clients_took_what_was_left():
    boxes = Mailboxes()
    boxes.open("c")
    boxes.post("c", outcome("j"))
    boxes.close()
    assert boxes.wait_collected(0) is False
    taker = threading.Thread(target=boxes.collect, args=("c", 5))
    taker.start()
    assert boxes.wait_collected(10) is True
    taker.join(10)


def test_a_client_closing_its_empty_box_leaves_nothing_behind():
    boxes = Mailboxes()
    boxes.open("c")
    boxes.close("c")
    assert boxes.collect("c", 0) is None
    boxes.post("c", outcome("stray"))  # dropped: nobody will collect it
    assert boxes.wait_collected(0) is True


def test_a_full_batch_is_returned_without_lingering():
    from mpsched._manager.mailbox import BATCH

    boxes = Mailboxes()
    boxes.open("c")
    for i in range(BATCH):
        boxes.post("c", outcome(f"j{i}"))
    assert len(boxes.collect("c", 0) or []) == BATCH


def test_a_waiting_collector_wakes_for_the_first_outcome():
    boxes = Mailboxes()
    boxes.open("c")
    got: list[list[Outcome] | None] = []
    taker = threading.Thread(target=lambda: got.append(boxes.collect("c", 30)))
    taker.start()
    boxes.post("c", outcome("j"))
    taker.join(10)
    assert not taker.is_alive() and [o.job_id for o in got[0] or []] == ["j"]


def test_one_reply_is_capped_by_count_and_the_rest_follows(monkeypatch):
    monkeypatch.setattr("mpsched._manager.mailbox.REPLY_OUTCOMES", 3)
    boxes = Mailboxes()
    boxes.open("c")
    for i in range(7):
        boxes.post("c", outcome(f"j{i}"))
    replies = [boxes.collect("c", 0) for _ in range(4)]
    assert [[o.job_id for o in r or []] for r in replies] == [
        ["j0", "j1", "j2"],
        ["j3", "j4", "j5"],
        ["j6"],
        [],
    ]


def test_one_reply_is_capped_by_bytes_but_always_carries_one_outcome(monkeypatch):
    monkeypatch.setattr("mpsched._manager.mailbox.REPLY_BYTES", 100)
    boxes = Mailboxes()
    boxes.open("c")
    for i, size in enumerate([150, 60, 30, 20]):
        boxes.post("c", Outcome(f"j{i}", True, b"x" * size, "", None))
    replies = [[o.job_id for o in boxes.collect("c", 0) or []] for _ in range(3)]
    assert replies == [["j0"], ["j1", "j2"], ["j3"]]


def test_a_dropped_client_keeps_nothing():
    boxes = Mailboxes()
    boxes.open("gone")
    boxes.post("gone", outcome("j1"))
    assert boxes.drop("gone") == 1
    boxes.post("gone", outcome("j2"))  # a job of the dead client finishes later
    assert len(boxes) == 0
    assert boxes.collect("gone", 0) is None
    assert boxes.wait_collected(0)


def collect_in_thread(
    boxes: Mailboxes, waiting: int
) -> tuple[threading.Thread, list[list[Outcome] | None]]:
    got: list[list[Outcome] | None] = []
    taker = threading.Thread(target=lambda: got.append(boxes.collect("c", 30, waiting)))
    taker.start()
    return taker, got


def streaming(boxes: Mailboxes) -> None:
    """Outcomes for client "c" back to back, collected: its outcomes stream in."""
    for i in range(8):
        boxes.post("c", outcome(f"s{i}"))
    assert len(boxes.collect("c", 0) or []) == 8


def test_a_client_that_waits_for_more_gets_its_outcomes_in_one_reply(monkeypatch):
    # Under load a reply costs the manager and the client a wake-up each: one carries as
    # many of the outcomes the client waits for as come within LINGER.
    monkeypatch.setattr("mpsched._manager.mailbox.LINGER", 30.0)
    boxes = Mailboxes()
    boxes.open("c")
    streaming(boxes)
    taker, got = collect_in_thread(boxes, waiting=3)
    for i in range(3):
        boxes.post("c", outcome(f"j{i}"))
    taker.join(20)  # well before LINGER: the third outcome ends the wait
    assert not taker.is_alive() and [o.job_id for o in got[0] or []] == ["j0", "j1", "j2"]


def test_a_client_that_waits_for_one_outcome_gets_it_at_once(monkeypatch):
    # One job at a time (submit, result, submit...): no lingering for outcomes that will
    # not come.
    monkeypatch.setattr("mpsched._manager.mailbox.LINGER", 30.0)
    boxes = Mailboxes()
    boxes.open("c")
    taker, got = collect_in_thread(boxes, waiting=1)
    boxes.post("c", outcome("j"))
    taker.join(20)
    assert not taker.is_alive() and [o.job_id for o in got[0] or []] == ["j"]


class CountingCondition(threading.Condition):
    """A condition that counts its notify() calls: each wakes the collector once."""

    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


def test_a_collector_on_an_empty_box_is_woken_once_for_what_its_client_waits_for(
    monkeypatch,
):
    # Not once for the first outcome and again for the rest: a wake-up of the manager's
    # result thread per reply, not two.
    monkeypatch.setattr("mpsched._manager.mailbox.LINGER", 30.0)
    boxes = Mailboxes()
    boxes.open("c")
    streaming(boxes)
    box = boxes._boxes["c"]
    box.ready = CountingCondition(boxes._lock)
    taker, got = collect_in_thread(boxes, waiting=3)
    try:
        deadline = time.monotonic() + 10
        while box.wanted != 3:  # the collector waits, for all three
            assert time.monotonic() < deadline, "the collector did not wait for three"
            time.sleep(0.001)
        for i in range(3):
            boxes.post("c", outcome(f"j{i}"))
        taker.join(20)
        woken = box.ready.notified
    finally:
        boxes.close("c")  # ends the collector's wait whatever happened
        taker.join(20)
    assert [o.job_id for o in got[0] or []] == ["j0", "j1", "j2"]
    assert woken == 1


def test_outcomes_further_apart_than_linger_go_at_once(monkeypatch):
    # Jobs longer than LINGER end one by one: lingering for company that does not come
    # would hold each outcome back by LINGER and wake the collector for nothing.
    monkeypatch.setattr("mpsched._manager.mailbox.LINGER", 30.0)
    boxes = Mailboxes()
    boxes.open("c")
    box = boxes._boxes["c"]
    box.ready = CountingCondition(boxes._lock)
    takers = []
    try:
        for _ in range(2):
            taker, got = collect_in_thread(boxes, waiting=5)
            takers.append(taker)
            boxes.post("c", outcome("j"))
            taker.join(20)  # well before LINGER
            assert not taker.is_alive() and [o.job_id for o in got[0] or []] == ["j"]
            box.last_post -= 60.0  # the next job ends a minute after this one
        woken = box.ready.notified
    finally:
        boxes.close("c")  # ends a collector's wait whatever happened
        for taker in takers:
            taker.join(20)
    assert woken == 2  # once for each outcome


def test_two_outcomes_together_after_a_pause_are_not_held_back(monkeypatch):
    # Two workers that end long jobs at the same moment: no stream, nothing more is due.
    monkeypatch.setattr("mpsched._manager.mailbox.LINGER", 30.0)
    boxes = Mailboxes()
    boxes.open("c")
    box = boxes._boxes["c"]
    for i in range(2):
        box.last_post -= 60.0  # a minute after the last pair
        boxes.post("c", outcome(f"a{i}"))
        boxes.post("c", outcome(f"b{i}"))
        taker, got = collect_in_thread(boxes, waiting=5)
        try:
            taker.join(20)  # well before LINGER
            assert not taker.is_alive() and [o.job_id for o in got[0] or []] == [f"a{i}", f"b{i}"]
        finally:
            boxes.close("c") if taker.is_alive() else None
            taker.join(20)


def test_a_stream_that_ends_leaves_the_next_outcome_unheld(monkeypatch):
    # The last of a stream: the collector waits LINGER for more, none come; it then waits
    # for the next outcome alone, not for company again.
    monkeypatch.setattr("mpsched._manager.mailbox.LINGER", 0.05)
    boxes = Mailboxes()
    boxes.open("c")
    box = boxes._boxes["c"]
    streaming(boxes)
    assert boxes.collect("c", 0.06, 5) == []  # lingered 0.05 s: the stream has ended
    taker, got = collect_in_thread(boxes, waiting=5)
    try:
        deadline = time.monotonic() + 10
        while not box.ready._waiters:  # type: ignore[attr-defined]  # the collector waits
            assert time.monotonic() < deadline, "the collector did not wait"
            time.sleep(0.001)
        assert box.wanted == 1  # for one outcome, not for five
        box.last_post -= 60.0  # the next outcome comes a minute later
        boxes.post("c", outcome("j"))
        taker.join(20)
        assert not taker.is_alive() and [o.job_id for o in got[0] or []] == ["j"]
    finally:
        boxes.close("c")
        taker.join(20)
