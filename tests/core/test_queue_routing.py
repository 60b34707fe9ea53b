"""Named queues and limits in the pure queue: routing in strict order, parking behind a
full limit, slots that free on every kind of end, rate windows that open on a timed wait."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from core.test_queue import FOREVER, Harness, outcome
from fakeclock import FakeClock

from mpsched._core.job import JobRequest, Order, Priority, check_name, check_queues
from mpsched._core.limits import LimitSpec, parse_limit, parse_limits
from mpsched._core.queue import JobQueue
from mpsched._errors import InvalidJobError

MEDIUM = Priority.MEDIUM.level
ORDERS = pytest.mark.parametrize("order", [Order.TIME, Order.PRIORITY], ids=["time", "priority"])


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


def job(
    job_id: str,
    *,
    queue: str = "default",
    limit: str | None = None,
    delay: float = 0.0,
    retries: int = 0,
) -> JobRequest:
    return JobRequest(
        job_id,
        "client-1",
        job_id.encode(),
        MEDIUM,
        delay,
        None,
        retries=retries,
        queue=queue,
        limit=limit,
    )


def take(queue: JobQueue, worker: str = "w", queues: tuple[str, ...] | None = None) -> str | None:
    batch = queue.take_batch(worker, 0, queues=queues)
    return batch[0].lease.job_id if batch else None


# ------------------------------------------------------------------------------ names


@pytest.mark.parametrize("name", ["", "a" * 65, "has space", "é", 3, None])
def test_a_bad_queue_name_is_refused(name: object) -> None:
    with pytest.raises(InvalidJobError, match="queue name"):
        check_name("queue", name)


def test_queue_lists_keep_their_order_and_refuse_repeats() -> None:
    assert check_queues("gpu, default") == ("gpu", "default")
    assert check_queues(None) is None
    with pytest.raises(InvalidJobError, match="repeats"):
        check_queues(["gpu", "gpu"])


@pytest.mark.parametrize(
    ("form", "spec"),
    [
        (2, LimitSpec(concurrency=2)),
        ("2", LimitSpec(concurrency=2)),
        ("10/s", LimitSpec(rate=(10, 1.0))),
        ("5/m", LimitSpec(rate=(5, 60.0))),
        ("1/h", LimitSpec(rate=(1, 3600.0))),
        ("2,10/s", LimitSpec(concurrency=2, rate=(10, 1.0))),
    ],
)
def test_limit_forms(form: object, spec: LimitSpec) -> None:
    assert parse_limit("x", form) == spec
    assert parse_limit("x", str(spec)) == spec  # the form it is shown in reads back


@pytest.mark.parametrize("form", ["0", "-1", "2/d", "2,3", "x", "1.5", "0/s", True])
def test_bad_limit_forms_are_refused(form: object) -> None:
    with pytest.raises(InvalidJobError, match="limit x"):
        parse_limit("x", form)


def test_limits_are_given_as_a_dict_or_as_name_equals_form() -> None:
    assert parse_limits(["a=2", "b=3/s"]) == parse_limits({"a": 2, "b": "3/s"})
    with pytest.raises(InvalidJobError, match="NAME=FORM"):
        parse_limits(["a"])


# ------------------------------------------------------------------------------ queues


@ORDERS
def test_a_taker_gets_jobs_of_its_queues_only_in_strict_order(
    harness: Harness, order: Order
) -> None:
    queue = harness.queue(order=order)
    queue.submit_many([job("d1"), job("g1", queue="gpu"), job("d2"), job("g2", queue="gpu")])
    assert take(queue, queues=("gpu",)) == "g1"
    # gpu first while it has a due job, then default, whatever came first
    assert take(queue, queues=("gpu", "default")) == "g2"
    assert take(queue, queues=("gpu", "default")) == "d1"
    assert take(queue, queues=("gpu",)) is None
    assert take(queue, queues=("other",)) is None
    assert take(queue) == "d2"


def test_a_taker_of_every_queue_gets_the_first_due_job_of_all(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit_many([job("a", queue="x"), job("b", queue="y"), job("c")])
    assert [take(queue), take(queue), take(queue)] == ["a", "b", "c"]


def test_a_queue_nobody_serves_blocks_no_other(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit_many([job("nobody", queue="gpu"), job("d")])
    assert take(queue, queues=("default",)) == "d"
    assert queue.pending_by_queue() == {"default": 0, "gpu": 1}
    assert take(queue, queues=("gpu",)) == "nobody"  # a subscriber joins: it runs


def test_takers_of_different_queues_each_wait_for_their_own_head(harness: Harness) -> None:
    """A taker timing the gpu head (due later) never holds up the default head."""
    queue = harness.queue()
    queue.submit_many([job("g", queue="gpu", delay=10), job("d", delay=5)])
    gpu = harness.taker_of(queue, "gpu-worker", ("gpu",), limit=1)
    default = harness.taker_of(queue, "cpu-worker", ("default",), limit=1)
    harness.settle(2)
    harness.advance(5, parked=1)
    default.join(10)
    assert default.taken == [("d", 1005.0)]
    harness.advance(5, parked=0)
    gpu.join(10)
    assert gpu.taken == [("g", 1010.0)]


def test_a_waiting_taker_of_a_queue_wakes_for_a_submit_to_it(harness: Harness) -> None:
    queue = harness.queue()
    taker = harness.taker_of(queue, "gpu-worker", ("gpu",), limit=1)
    harness.settle(1)
    queue.submit(job("d"))  # not its queue: it may wake, and waits again
    harness.settle(1)
    queue.submit(job("g", queue="gpu"))
    taker.join(10)
    assert taker.taken == [("g", 1000.0)]


# ------------------------------------------------------------------------------ limits


def test_a_job_of_a_full_limit_waits_without_blocking_the_next_job(harness: Harness) -> None:
    queue = harness.queue(limits={"exports": LimitSpec(concurrency=1)})
    queue.submit_many([job("e1", limit="exports"), job("e2", limit="exports"), job("p")])
    first = queue.take_batch("w1", 0)
    assert first[0].lease.job_id == "e1"
    assert take(queue, "w2") == "p"  # e2 is passed over
    assert take(queue, "w3") is None
    assert queue.waiting_for("e2") == "limit exports"
    found = queue.find("e2")
    assert found is not None and found[0].attempt == 0  # no attempt used
    queue.complete(first[0].lease.lease_id, outcome("e1"))
    assert queue.waiting_for("e2") is None
    assert take(queue, "w3") == "e2"


def test_a_parked_job_keeps_its_place_among_its_limit(harness: Harness) -> None:
    queue = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    queue.submit_many([job(f"j{i}", limit="x") for i in range(4)])
    order = []
    for _ in range(4):
        batch = queue.take_batch("w", 0)
        order.append(batch[0].lease.job_id)
        queue.complete(batch[0].lease.lease_id, outcome(order[-1]))
    assert order == ["j0", "j1", "j2", "j3"]


def test_a_waiting_taker_gets_a_parked_job_the_moment_a_slot_frees(harness: Harness) -> None:
    queue = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    queue.submit_many([job("a", limit="x"), job("b", limit="x")])
    running = queue.take_batch("w1", 0)
    taker = harness.taker(queue, "w2", limit=1)
    harness.settle(1)
    queue.complete(running[0].lease.lease_id, outcome("a"))
    taker.join(10)
    assert taker.taken == [("b", 1000.0)]


def test_a_lost_lease_frees_its_slot_and_a_retry_takes_one_again(harness: Harness) -> None:
    queue = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    queue.submit_many([job("a", limit="x", retries=1), job("b", limit="x")])
    assert take(queue, "w1") == "a"
    [lost] = queue.release_worker("w1")  # its worker died
    assert take(queue, "w2") == "b"  # the slot came back
    assert queue.requeue(lost.job, retry=True)
    assert take(queue, "w3") is None  # the retry waits for a slot of its own
    assert queue.waiting_for("a") == "limit x"


def test_a_job_handed_out_and_given_back_frees_its_slot(harness: Harness) -> None:
    queue = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    queue.submit_many([job("a", limit="x"), job("b", limit="x")])
    [assignment] = queue.take_batch("w1", 0)
    queue.return_lease(assignment.lease.lease_id)
    assert take(queue, "w2") == "a"


def test_an_unknown_limit_is_refused_naming_the_known_ones(harness: Harness) -> None:
    queue = harness.queue(limits={"exports": LimitSpec(concurrency=2), "api": LimitSpec()})
    with pytest.raises(InvalidJobError, match=r"unknown limit 'nope'.*api, exports"):
        queue.submit_many([job("ok"), job("bad", limit="nope")])
    assert len(queue) == 0  # nothing half-applied


def test_raising_a_limit_at_run_time_lets_parked_jobs_go(harness: Harness) -> None:
    queue = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    queue.submit_many([job("a", limit="x"), job("b", limit="x")])
    assert take(queue, "w1") == "a"
    assert take(queue, "w2") is None
    queue.set_limit("x", LimitSpec(concurrency=2))
    assert take(queue, "w2") == "b"


def test_a_rate_window_opens_on_the_leaders_timed_wait(harness: Harness) -> None:
    queue = harness.queue(limits={"api": LimitSpec(rate=(2, 1.0))})
    queue.submit_many([job(f"r{i}", limit="api") for i in range(3)] + [job("p")])
    assert [take(queue, "w1"), take(queue, "w2"), take(queue, "w3")] == ["r0", "r1", "p"]
    taker = harness.taker(queue, "w4", limit=1)
    harness.settle(1)
    assert harness.clock.next_deadline() == pytest.approx(1001.0, abs=0.05)
    harness.advance(1.0, parked=0)
    taker.join(10)
    assert [job_id for job_id, _ in taker.taken] == ["r2"]


def test_at_most_n_start_in_any_window(harness: Harness) -> None:
    clock: FakeClock = harness.clock
    queue = harness.queue(limits={"api": LimitSpec(rate=(3, 1.0))})
    queue.submit_many([job(f"r{i}", limit="api") for i in range(9)])
    starts: list[float] = []
    for _ in range(9):
        while take(queue) is None:
            clock.advance(0.25)
        starts.append(clock.now())
    for t in starts:
        assert sum(1 for s in starts if t <= s < t + 1.0) <= 3
    assert starts[-1] - starts[0] <= 2.01


def test_prefetch_passes_over_a_full_limit_and_stays_in_the_takers_queues(harness: Harness) -> None:
    class Open:
        def reopen(self, worker_id: str) -> bool:
            return True

        def revoke(self, worker_id: str, lowest: int) -> int | None:
            return lowest

    queue = harness.queue(claims=Open(), limits={"x": LimitSpec(concurrency=1)})
    queue.submit_many(
        [job("a", limit="x"), job("b", limit="x"), job("c"), job("g", queue="gpu"), job("d")]
    )
    batch = queue.take_batch("w", FOREVER, more=7, queues=("default",))
    assert [a.lease.job_id for a in batch] == ["a", "c", "d"]


def test_a_job_running_before_a_restart_holds_its_slot(harness: Harness) -> None:
    queue = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    queue.submit(job("still-running", limit="x"))
    assert len(queue.take_batch("old", 0)) == 1
    running = queue.find("still-running")
    assert running is not None
    fresh = harness.queue(limits={"x": LimitSpec(concurrency=1)})
    fresh.hold_in_flight("remote", [running[0]])
    fresh.submit(job("next", limit="x"))
    assert take(fresh) is None
    assert fresh.waiting_for("next") == "limit x"
