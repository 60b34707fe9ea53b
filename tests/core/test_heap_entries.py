"""The pending heaps hold each job's id, not the Job: one object per pending job for the
garbage collector to walk, and a job moved in time (``reschedule``) found by its id,
seq and due time, never at its old place."""

from __future__ import annotations

import dataclasses
import gc

import pytest
from fakeclock import FakeClock

from mpsched._core import heap as heap_module
from mpsched._core.heap import PendingJobs
from mpsched._core.job import Job, JobRequest, Order
from mpsched._core.queue import JobQueue

ORDERS = pytest.mark.parametrize("order", [Order.TIME, Order.PRIORITY], ids=["time", "priority"])


def request(job_id: str, delay: float) -> JobRequest:
    return JobRequest(job_id, "client", b"payload", 2, delay, None)


def tracked() -> int:
    gc.collect()
    gc.collect()  # a tuple is untracked once a collection finds its items untracked
    return len(gc.get_objects())


def take_now(queue: JobQueue) -> str | None:
    assignment = queue.take("w", 0)
    return None if assignment is None else assignment.lease.job_id


@ORDERS
def test_a_pending_job_is_one_object_for_the_collector(order: Order) -> None:
    queue = JobQueue(clock=FakeClock(), order=order)
    before = tracked()
    queue.submit_many([request(f"j{i}", 60.0) for i in range(1_000)], None)
    assert len(queue) == 1_000
    assert tracked() - before < 1_100  # its Job; with the Job in its entry, 2,000


@ORDERS
def test_a_job_moved_runs_at_its_new_time_only(order: Order) -> None:
    clock = FakeClock()
    queue = JobQueue(clock=clock, order=order)
    queue.submit_many([request("moved", 10.0), request("other", 20.0)], None)
    assert queue.reschedule("moved", clock.now() + 30.0)
    assert [job.job_id for job in queue.head(5)] == ["other", "moved"]
    clock.advance(10.0)
    assert take_now(queue) is None  # its old time: nothing is due
    clock.advance(10.0)
    assert take_now(queue) == "other"
    clock.advance(10.0)
    assert take_now(queue) == "moved"
    assert take_now(queue) is None and len(queue) == 0


@ORDERS
def test_a_job_moved_to_its_own_time_is_listed_and_run_once(order: Order) -> None:
    clock = FakeClock()
    queue = JobQueue(clock=clock, order=order)
    queue.submit_many([request("same", 10.0)], None)
    due = queue.head(1)[0].due
    assert queue.reschedule("same", due)  # two entries alike until one is taken
    assert [job.job_id for job in queue.head(5)] == ["same"]
    clock.advance(10.0)
    assert take_now(queue) == "same"
    assert take_now(queue) is None and len(queue) == 0 and queue.head(5) == []


def test_a_rebuilt_heap_keeps_one_entry_of_a_job_moved_to_its_own_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(heap_module, "COMPACT_AFTER", 2)
    pending = PendingJobs(Order.TIME, None)
    first = Job("first", "client", b"p", 2, 1.0, 0)  # keeps the others off the top
    pending.push(first)
    same = Job("same", "client", b"p", 2, 10.0, 1)
    others = [Job(f"o{i}", "client", b"p", 2, 5.0, i + 2) for i in range(4)]
    for job in (same, *others):
        pending.push(job)
    assert pending.remove("same") is same
    pending.push(dataclasses.replace(same, cancelled=False))  # as Intake.reschedule does
    for job in others:  # stale entries now outnumber live jobs: the heaps are rebuilt
        pending.remove(job.job_id)
    assert pending.pop_due(now=1.0) is first
    taken = pending.pop_due(now=10.0)
    assert taken is not None and taken.job_id == "same"
    assert pending.pop_due(now=10.0) is None and len(pending) == 0
    assert pending._stale == 0  # no entry of it outlived the rebuild's count
