"""HandOut.lease_ahead: a run window's fill, the next jobs due within a horizon leased in
one hold of the lock, in heap order, stopping where order would break."""

from __future__ import annotations

import pytest
from fakeclock import FakeClock

from mpsched._core.job import JobRequest, Outcome
from mpsched._core.limits import LimitSpec
from mpsched._core.queue import JobQueue
from mpsched._errors import SchedulerShutdownError

HIGH, MEDIUM = 1, 2


def job(
    job_id: str,
    delay: float | None = 0.0,
    *,
    priority: int = MEDIUM,
    at: float | None = None,
    limit: str | None = None,
    queue: str = "default",
) -> JobRequest:
    return JobRequest(job_id, "c", job_id.encode(), priority, delay, at, limit=limit, queue=queue)


def leased(queue: JobQueue, horizon: float, most: int = 10, **kwargs: object) -> list[str]:
    return [a.lease.job_id for a in queue.hand_out.lease_ahead("window", horizon, most, **kwargs)]  # type: ignore[arg-type]


def test_the_next_jobs_within_the_horizon_come_in_heap_order_under_leases() -> None:
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    for request in (job("c", 0.002), job("a", 0.001), job("b", 0.001, priority=HIGH)):
        queue.submit(request)
    queue.submit(job("later", 0.5))
    assert leased(queue, 0.005) == ["b", "a", "c"]  # due first, then priority
    for job_id in ("a", "b", "c"):
        lease = queue.leases.lease_of(job_id)
        assert lease is not None and lease.worker_id == "window"
    assert queue.take("w", 0) is None  # the later one is not due: a take waits for it
    clock.advance(0.5)
    taken = queue.take("w", 0)
    assert taken is not None and taken.lease.job_id == "later"


def test_jobs_of_several_queues_come_in_their_order_across_the_queues() -> None:
    queue = JobQueue(clock=FakeClock())
    for n, name in enumerate(["a", "b", "a", "b", "default"]):
        queue.submit(job(f"{name}{n}", n * 0.001, queue=name))
    assert leased(queue, 0.01) == ["a0", "b1", "a2", "b3", "default4"]


def test_at_most_as_many_as_asked_and_the_rest_stay_in_order() -> None:
    queue = JobQueue(clock=FakeClock())
    for n in range(5):
        queue.submit(job(f"j{n}"))
    assert leased(queue, 0.0, most=2) == ["j0", "j1"]
    assert leased(queue, 0.0, most=10) == ["j2", "j3", "j4"]
    assert leased(queue, 0.0) == []


def test_it_stops_at_a_job_refused_or_under_a_limit_so_that_none_after_it_goes_first() -> None:
    queue = JobQueue(clock=FakeClock())
    queue.set_limit("db", LimitSpec(concurrency=5))
    for n, request in enumerate([job("a"), job("limited", limit="db"), job("c"), job("d")]):
        queue.submit(request._replace(delay=n * 0.001))
    assert leased(queue, 0.01) == ["a"]
    taken = queue.take("w", 0, early=0.01)
    assert taken is not None and taken.lease.job_id == "limited"  # a take admits it
    assert leased(queue, 0.01, eligible=lambda j: j.job_id != "d") == ["c"]


def test_it_stops_at_an_at_job_the_wall_clock_would_start_early() -> None:
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    queue.submit(job("plain", 0.001))
    queue.submit(job("at", None, at=clock.wall() + 0.002))
    queue.submit(job("after", 0.003))
    clock.wall_offset -= 3600  # the wall clock is set an hour back
    assert leased(queue, 0.01) == ["plain"]  # the at= job must wait for the wall clock


def test_a_closed_queue_leases_nothing() -> None:
    queue = JobQueue(clock=FakeClock())
    queue.submit(job("a"))
    queue.close()
    with pytest.raises(SchedulerShutdownError):
        queue.hand_out.lease_ahead("window", 1.0, 10)


def test_a_leased_job_completes_as_a_taken_one_does() -> None:
    queue = JobQueue(clock=FakeClock())
    queue.submit(job("a"))
    [assignment] = queue.hand_out.lease_ahead("window", 0.0, 1)
    done = queue.complete(assignment.lease.lease_id, Outcome("a", True, b"", "", None), "window")
    assert done is not None and done.job_id == "a"
    assert queue.stats().completed == 1
