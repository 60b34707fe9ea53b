"""Journal.watch with a store: a watcher gets a job's outcome exactly once, and no finish
waits for a watcher's flush (a commit)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fakeclock import FakeClock

from mpsched._core.job import Job, JobRequest, Outcome
from mpsched._core.queue import JobQueue
from mpsched._manager.store_journal import Journal
from mpsched._store.memory import MemoryStore

WAIT = 10.0


class HeldFlush(MemoryStore):
    """A store whose next flush waits, once ``hold`` is set, until the test releases it."""

    def __init__(self) -> None:
        super().__init__(result_ttl=60.0)  # keeps finished jobs and their outcomes
        self.hold = threading.Event()
        self.flushing = threading.Event()
        self.release = threading.Event()

    def flush(self) -> None:
        if self.hold.is_set():
            self.flushing.set()
            assert self.release.wait(WAIT)
        super().flush()


@pytest.fixture
def journal() -> Iterator[tuple[Journal, HeldFlush, JobQueue]]:
    store = HeldFlush()
    queue = JobQueue(clock=FakeClock())
    journal = Journal(store, queue)
    journal.submit([JobRequest(job_id, "c1", b"", 2, 0.0, None) for job_id in "AB"], None)
    yield journal, store, queue
    store.release.set()


def _ended(queue: JobQueue, job_id: str) -> tuple[Job, Outcome]:
    assignment = queue.take("w1", 0)
    assert assignment is not None and assignment.lease.job_id == job_id
    outcome = Outcome(job_id, True, b"result", "", None)
    job = queue.complete(assignment.lease.lease_id, outcome)
    assert job is not None
    return job, outcome


def _watch_in_thread(journal: Journal, job_id: str) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []
    watcher = threading.Thread(target=lambda: got.append(journal.watch("c2", job_id)))
    watcher.start()
    return watcher, got


def test_a_finish_does_not_wait_for_a_watcher_s_flush(
    journal: tuple[Journal, HeldFlush, JobQueue],
) -> None:
    journal_, store, queue = journal
    store.hold.set()
    watcher, _ = _watch_in_thread(journal_, "B")
    assert store.flushing.wait(WAIT)
    job, outcome = _ended(queue, "A")
    finisher = threading.Thread(target=journal_.finished, args=(job, outcome, "w1"))
    finisher.start()
    finisher.join(WAIT)
    finished = not finisher.is_alive()
    store.release.set()
    watcher.join(WAIT)
    finisher.join(WAIT)
    assert finished, "a finish waited for a watcher's flush"


def test_a_job_ending_while_its_watcher_reads_is_handed_over_once(
    journal: tuple[Journal, HeldFlush, JobQueue],
) -> None:
    journal_, store, queue = journal
    store.hold.set()
    watcher, got = _watch_in_thread(journal_, "A")
    assert store.flushing.wait(WAIT)
    job, outcome = _ended(queue, "A")
    store.hold.clear()
    assert journal_.finished(job, outcome, "w1") == {"c2"}  # handed to the watcher
    store.release.set()
    watcher.join(WAIT)
    assert got == [None]  # ... so the watch does not return it a second time


def test_a_job_that_ended_before_the_watch_is_found_by_it(
    journal: tuple[Journal, HeldFlush, JobQueue],
) -> None:
    journal_, _, queue = journal
    job, outcome = _ended(queue, "A")
    assert journal_.finished(job, outcome, "w1") == set()
    found = journal_.watch("c2", "A")
    assert found is not None and found.ok and found.job_id == "A"
    second, outcome_b = _ended(queue, "B")
    assert journal_.finished(second, outcome_b, "w1") == set()  # nobody left watching
