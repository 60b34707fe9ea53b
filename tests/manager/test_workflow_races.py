"""A job submitted after a parent that is ending at that moment: out of the queue, its end
not yet journalled. It must wait for that end, not call the parent unknown."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mpsched._core.job import After, JobRequest, Outcome
from mpsched._core.queue import JobQueue
from mpsched._errors import JobNotFoundError
from mpsched._manager import workflows
from mpsched._manager.no_journal import NoJournal
from mpsched._manager.service import ManagerService
from mpsched._protocol.codec import assignment_from_wire, report_to_wire, request_to_wire
from mpsched._protocol.records import Report, WorkerHello
from mpsched._transport.sockets import describe_versions


def test_a_child_submitted_while_its_parent_ends_waits_for_that_end_and_runs() -> None:
    queue = JobQueue()
    service = ManagerService(queue, journal=NoJournal(queue, result_ttl=60))
    service.mailboxes.open("c")
    service.hello(WorkerHello("w", 4242, "another-host", *describe_versions(), True, ""))
    queue.submit(JobRequest("parent", "c", b"", 2, 0.0, None))
    [wire] = service.take("w", None, 0)
    lease = assignment_from_wire(wire).lease
    child = request_to_wire(JobRequest("child", "c", b"", 2, 0.0, None))
    errors: list[BaseException] = []

    def submit_child() -> None:
        try:
            service.submit_after([child], [After(("parent",), (), False)])
        except BaseException as error:
            errors.append(error)

    flows = service.workflows
    assert flows is not None
    racer = threading.Thread(target=submit_child)
    journal: Any = service.journal
    record_ends = journal.finished_all

    def finished_all(*args: Any, **kwargs: Any) -> Any:
        # The parent is out of the queue and not yet journalled: the child comes now.
        racer.start()
        deadline = time.monotonic() + 10
        while racer.is_alive() and not (flows._adding and _let_go(flows._lock)):
            assert time.monotonic() < deadline, "the child's submit neither failed nor waited"
            time.sleep(0.001)
        return record_ends(*args, **kwargs)

    journal.finished_all = finished_all
    try:
        ok = Outcome("parent", True, b"", "", time.monotonic())
        service.finish("w", [report_to_wire(Report(lease.lease_id, ok))])
    finally:
        if racer.ident is not None:  # started
            racer.join(10)
    assert errors == [] and not racer.is_alive()
    found = queue.find("child")
    assert found is not None and found[1] is None  # released: pending in the heap


def _let_go(lock: threading.Lock) -> bool:
    """True while the workflows' lock is free (the submit waits, letting it go)."""
    if lock.acquire(blocking=False):
        lock.release()
        return True
    return False


def test_a_parent_still_unknown_after_the_wait_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workflows, "UNKNOWN_WAIT", 0.05)
    queue = JobQueue()
    service = ManagerService(queue)
    child = request_to_wire(JobRequest("child", "c", b"", 2, 0.0, None))
    with pytest.raises(JobNotFoundError, match="no-such-parent"):
        service.submit_after([child], [After(("no-such-parent",), (), False)])
    assert queue.find("child") is None  # nothing was queued
