"""What a dashboard reads off a JobQueue: the head of the heap, the jobs in flight with
when they were handed out, the lateness histogram and the crashed count."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakeclock import FakeClock

import mpsched._core.lookups as lookups_module
from mpsched._core.job import JobRequest, Order, Outcome, Priority
from mpsched._core.leases import percentiles
from mpsched._core.queue import JobQueue

HIGH, MEDIUM, LOW = (p.level for p in (Priority.HIGH, Priority.MEDIUM, Priority.LOW))
ORDERS = pytest.mark.parametrize("order", [Order.TIME, Order.PRIORITY], ids=["time", "priority"])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def queues(clock: FakeClock) -> Iterator[list[JobQueue]]:
    made: list[JobQueue] = []
    yield made
    for queue in made:
        queue.close()


def make(queues: list[JobQueue], clock: FakeClock, order: Order = Order.TIME) -> JobQueue:
    queue = JobQueue(clock=clock, order=order)
    queues.append(queue)
    return queue


def request(job_id: str, priority: int = MEDIUM, delay: float = 0.0) -> JobRequest:
    return JobRequest(job_id, "client", b"payload", priority, delay, None)


def taken_order(queue: JobQueue, clock: FakeClock) -> list[str]:
    """Every job, in the order takers get them once all are due."""
    clock.advance(1000)
    order = []
    while (assignment := queue.take("w", 0)) is not None:
        order.append(assignment.lease.job_id)
    return order


@ORDERS
def test_the_head_lists_pending_jobs_in_the_order_takers_get_them(
    queues: list[JobQueue], clock: FakeClock, order: Order
) -> None:
    queue = make(queues, clock, order)
    levels, delays = {}, {}
    for i in range(40):
        levels[f"j{i}"], delays[f"j{i}"] = (HIGH, MEDIUM, LOW)[i % 3], (i * 7) % 13
        queue.submit(request(f"j{i}", levels[f"j{i}"], delays[f"j{i}"]))
    queue.cancel("j0")
    queue.cancel("j14")
    clock.advance(6)
    first = queue.take("w", 0)  # with order="priority", due jobs move to the ready heap
    assert first is not None
    head = [job.job_id for job in queue.head(30)]
    seq = {job_id: int(job_id[1:]) for job_id in levels}
    left = [j for j in levels if j not in ("j0", "j14", first.lease.job_id)]
    if order is Order.TIME:
        expected = sorted(left, key=lambda j: (delays[j], levels[j], seq[j]))
    else:  # due ones by priority, then the others by due time
        due = sorted((j for j in left if delays[j] <= 6), key=lambda j: (levels[j], delays[j]))
        later = sorted((j for j in left if delays[j] > 6), key=lambda j: (delays[j], levels[j]))
        expected = due + later
    assert head == expected[:30]
    if order is Order.TIME:  # the head did not move anything: takers get the same order
        assert taken_order(queue, clock) == expected


def test_the_head_is_short_when_few_jobs_wait(queues: list[JobQueue], clock: FakeClock) -> None:
    queue = make(queues, clock)
    assert queue.head(5) == []
    queue.submit(request("only"))
    assert [job.job_id for job in queue.head(5)] == ["only"]
    assert queue.head(0) == []


def test_the_head_of_a_large_heap_costs_only_the_jobs_it_lists(
    queues: list[JobQueue], clock: FakeClock
) -> None:
    queue = make(queues, clock)
    queue.submit_many([request(f"j{i}", delay=(i * 7919) % 100_003) for i in range(100_000)])
    looked_at: list[int] = []

    class Counting(float):
        """A due time that notes each comparison the walk makes."""

        def __lt__(self, other: object) -> bool:
            looked_at.append(1)
            return float(self) < float(other)  # type: ignore[arg-type]

    only = queue._pending.only
    assert only is not None
    heap = only._delayed  # the delayed heap, only to count comparisons
    heap[:] = [(Counting(due), level, seq, job) for due, level, seq, job in heap]
    head = queue.head(20)
    assert [job.due for job in head] == sorted(job.due for job in head)
    assert len(looked_at) < 2_000  # O(n log n) for n = 20, not O(100,000)


def test_running_jobs_carry_when_they_were_handed_out(
    queues: list[JobQueue], clock: FakeClock
) -> None:
    queue = make(queues, clock)
    queue.submit(request("a"))
    clock.advance(2)
    assignment = queue.take("w1", 0)
    assert assignment is not None
    [running] = queue.leases.running()
    assert (running.job.job_id, running.lease.worker_id, running.taken) == ("a", "w1", clock.now())
    queue.complete(assignment.lease.lease_id, Outcome("a", True, b"", "", clock.now()))
    assert queue.leases.running() == []


def test_lateness_counts_in_the_histogram_of_every_job_since_the_start(
    queues: list[JobQueue], clock: FakeClock
) -> None:
    queue = make(queues, clock)
    queue.submit_many([request("a"), request("b"), request("c")])
    for started_late in (0.0002, 0.003, 12.0):
        assignment = queue.take("w", 0)
        assert assignment is not None and assignment.due is not None
        queue.complete(
            assignment.lease.lease_id,
            Outcome(assignment.lease.job_id, True, b"", "", assignment.due + started_late),
        )
    histogram = queue.leases.lateness_histogram()
    assert histogram.observations == 3
    assert histogram.total == pytest.approx(12.0032)
    cumulative = dict(zip(histogram.bounds, histogram.cumulative(), strict=False))
    assert (cumulative[0.00025], cumulative[0.005], cumulative[10.0], cumulative[30.0]) == (
        1,
        2,
        2,
        3,
    )


def test_jobs_lost_with_their_worker_count_as_crashed_unless_they_timed_out(
    queues: list[JobQueue], clock: FakeClock
) -> None:
    queue = make(queues, clock)
    queue.submit_many([request("crash"), request("late")])
    assignments = [queue.take("w", 0) for _ in range(2)]
    assert all(assignments)
    lost = {entry.job.job_id: entry.job for entry in queue.release_worker("w")}
    queue.fail(lost["crash"])
    queue.fail(lost["late"], timed_out=True)
    stats = queue.stats()
    assert (stats.failed, stats.crashed, stats.timed_out) == (2, 1, 1)


def test_lateness_percentiles_are_computed_outside_the_lock_or_not_at_all(
    queues: list[JobQueue], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = make(queues, clock)
    queue.submit(request("a"))
    assignment = queue.take("w", 0)
    assert assignment is not None and assignment.due is not None
    queue.complete(assignment.lease.lease_id, Outcome("a", True, b"", "", assignment.due + 0.5))
    sorted_under_lock: list[bool] = []
    real = percentiles

    def watched(samples: list[float]) -> dict[str, float]:
        sorted_under_lock.append(queue._lock.locked())
        return real(samples)

    monkeypatch.setattr(lookups_module, "percentiles", watched)
    assert queue.stats().lateness["max"] == 0.5
    assert sorted_under_lock == [False]
    without = queue.stats(lateness=False)
    assert without.lateness == {} and without.lateness_samples == 1
    assert sorted_under_lock == [False]  # not sorted at all
