"""The pending heaps hold each job's id, not the Job: one object per pending job for the
garbage collector to walk, and a job moved in time (``reschedule``) found by its id,
seq and due time, never at its old place."""

from __future__ import annotations

import gc

import pytest
from fakeclock import FakeClock

from mpsched._core.job import JobRequest, Order
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
