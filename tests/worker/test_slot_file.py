"""Claim slots in a file beside a SQLite store: what a worker writes there outlives it and
its manager, and a manager started again resolves the jobs that were running by it."""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpsched._core.job import JobState, Lease, Outcome
from mpsched._core.queue import JobQueue
from mpsched._errors import WorkerCrashedError
from mpsched._manager.journal import decode
from mpsched._manager.store_journal import Journal
from mpsched._protocol.codec import report_to_wire
from mpsched._protocol.records import Report
from mpsched._store.base import StoredJob
from mpsched._store.sqlite import SQLiteStore
from mpsched._worker.claims import ClaimSlot
from mpsched._worker.slot_file import SlotFile

CTX = multiprocessing.get_context("spawn")
T0 = 1.8e9


def outcome(job_id: str, result: object) -> Outcome:
    return Outcome(job_id=job_id, ok=True, payload=pickle.dumps(result), traceback="", started=1.0)


def kept(job_id: str, result: object, lease_id: int = 1) -> bytes:
    """A report as a worker keeps it in its slot."""
    report = Report(lease_id=lease_id, outcome=outcome(job_id, result))
    return pickle.dumps(report_to_wire(report), pickle.HIGHEST_PROTOCOL)


def work_in_a_process(slot: ClaimSlot, entered: str, ended: list[str]) -> None:
    """What a worker process writes into its slot: the jobs it ran, the one it is in."""
    for job_id in ended:
        slot.entering(job_id)
        assert slot.keep(kept(job_id, f"result of {job_id}"))
    slot.entering(entered)


@pytest.fixture
def store_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "jobs.db"


def test_what_a_worker_process_wrote_is_read_back_by_a_manager_started_again(
    store_path: Path,
) -> None:
    slots = SlotFile(f"{store_path}-workers")
    first, second = slots.slot(CTX, "w1"), slots.slot(CTX, "w2")
    proc = CTX.Process(target=work_in_a_process, args=(first, "job-3", ["job-1", "job-2"]))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    second.entering("job-9")

    traces = SlotFile(f"{store_path}-workers").traces()  # as a manager started again reads it
    assert set(traces) == {"w1", "w2"}
    w1 = traces["w1"]
    assert {r.outcome.job_id: pickle.loads(r.outcome.payload) for r in w1.ended} == {
        "job-1": "result of job-1",
        "job-2": "result of job-2",
    }
    assert w1.entered_job("job-3") and not w1.entered_job("job-2")
    assert traces["w2"].ended == () and traces["w2"].entered_job("job-9")


def test_a_slot_given_to_the_next_worker_says_nothing_of_the_one_before(store_path: Path) -> None:
    slots = SlotFile(f"{store_path}-workers")
    old = slots.slot(CTX, "w1")
    old.entering("job-1")
    assert old.keep(kept("job-0", 0))
    slots.release(old)
    new = slots.slot(CTX, "w2")
    assert new.region == old.region  # the same bytes of the file
    assert set(slots.traces()) == {"w2"}
    assert slots.traces()["w2"].ended == () and not slots.traces()["w2"].entered_job("job-1")


def test_cleared_and_removed(store_path: Path) -> None:
    slots = SlotFile(f"{store_path}-workers")
    slots.slot(CTX, "w1").entering("job-1")
    slots.clear()
    assert slots.traces() == {} and os.path.getsize(slots.path) == 0
    assert slots.slot(CTX, "w2").region == (slots.path, 0)  # the file grows again
    slots.remove()
    assert not os.path.exists(slots.path)


def test_a_file_that_cannot_grow_gives_anonymous_slots_and_says_so_once(
    store_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    slots = SlotFile(f"{store_path}-workers")
    monkeypatch.setattr(os, "pwrite", full)
    with caplog.at_level(logging.WARNING, logger="mpsched.supervisor"):
        made = [slots.slot(CTX, f"w{n}") for n in range(3)]
    assert [slot.region for slot in made] == [None] * 3
    assert not any(slot.durable for slot in made)
    assert sum("could not grow" in r.getMessage() for r in caplog.records) == 1
    made[0].entering("job-1")  # an anonymous slot takes it, and says nothing of it
    assert slots.traces() == {}


def stored(n: int, retries: int = 0) -> StoredJob:
    return StoredJob(
        f"job-{n}",
        "client-1",
        None,
        "tests.jobs:work",
        b"payload",
        2,
        T0 + n,
        n,
        None,
        retries,
        0,
        T0,
    )


def test_recovery_ends_what_ran_requeues_what_never_started_and_awaits_remote_workers(
    store_path: Path,
) -> None:
    # job-1 ran to its end (its report kept), job-2 was entered, job-3 was handed out with
    # them and never started, job-4 (retries=1) never started either, job-5 ran on a
    # worker with no slot here (a remote one, which may run it still): it stays in flight.
    store = SQLiteStore(store_path, clock=lambda: T0)
    store.submit([stored(1), stored(2), stored(3), stored(4, retries=1), stored(5)])
    for n in (1, 2, 3, 4):
        store.lease(f"job-{n}", "w1", 1)
    store.lease("job-5", "r1", 1)
    slots = SlotFile(f"{store_path}-workers")
    slot = slots.slot(CTX, "w1")
    slot.entering("job-1")
    slot.keep(kept("job-1", "one"))
    slot.entering("job-2")
    store.close()  # its log is folded at the next open, as after a crash

    store = SQLiteStore(store_path, clock=lambda: T0)
    queue = JobQueue()
    try:
        summary, awaited = Journal(store, queue).recover(
            queue.clock, SlotFile(f"{store_path}-workers").traces()
        )
        store.flush()
        assert summary.endswith(
            "of 5 running when the manager stopped, 1 had ended, 2 had "
            "not started, 1 wait for their remote worker to say how "
            "they ended, 0 will run again and 1 failed "
            "(WorkerCrashedError)"
        )
        assert {w: [j.job_id for j in jobs] for w, jobs in awaited.items()} == {"r1": ["job-5"]}
        held = queue.find("job-5")
        assert held is not None and held[1] == "r1" and held[0].attempt == 1
        one = store.get("job-1")
        assert one is not None and one.state is JobState.DONE and one.outcome is not None
        assert pickle.loads(decode(one.outcome).payload) == "one"
        for job_id in ("job-2",):
            record = store.get(job_id)
            assert record is not None and record.state is JobState.FAILED
            assert record.outcome is not None
            error = pickle.loads(decode(record.outcome).payload)
            assert isinstance(error, WorkerCrashedError)
        pending = {j.job_id: j.attempt for j, _ in queue.jobs(JobState.PENDING)}
        assert pending == {"job-3": 0, "job-4": 0}  # not an attempt: no retry used
    finally:
        queue.close()
        store.close()


def test_lease_reaches_the_slot_through_received_and_claim() -> None:
    slot = ClaimSlot(CTX)
    slot.received(Lease(lease_id=4, job_id="a", worker_id="w1", attempt=1))
    assert slot.started() == 4
    slot.revoke(6)
    assert slot.claim(Lease(lease_id=5, job_id="b", worker_id="w1", attempt=1))
    assert not slot.claim(Lease(lease_id=6, job_id="c", worker_id="w1", attempt=1))
    assert slot.started() == 5
