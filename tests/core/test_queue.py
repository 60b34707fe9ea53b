from __future__ import annotations

import math
import queue as stdlib_queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fakeclock import FakeClock

from mpsched._core.clock import SystemClock, Waitable
from mpsched._core.job import Assignment, JobRequest, Order, Outcome, Priority
from mpsched._core.leases import GONE_MEMORY
from mpsched._core.queue import JobQueue
from mpsched._errors import (
    ConfigError,
    InvalidJobError,
    MpschedError,
    QueueFullError,
    SchedulerShutdownError,
)

HIGH = Priority.HIGH.level
MEDIUM = Priority.MEDIUM.level
LOW = Priority.LOW.level

FOREVER = 1e6  # a take timeout, in fake seconds, that no test advances to
JOIN = 10.0  # real seconds a test waits for a thread it started to finish

ORDERS = pytest.mark.parametrize("order", [Order.TIME, Order.PRIORITY], ids=["time", "priority"])


def request(
    job_id: str,
    priority: int = MEDIUM,
    *,
    delay: float | None = None,
    at: float | None = None,
    client: str = "client-1",
) -> JobRequest:
    """A request due after ``delay`` (default: now) or at wall time ``at``."""
    if delay is None and at is None:
        delay = 0.0
    return JobRequest(job_id, client, job_id.encode(), priority, delay, at)


def outcome(job_id: str, *, ok: bool = True, started: float | None = None) -> Outcome:
    return Outcome(job_id, ok, b"result", "" if ok else "Traceback ...", started)


def take_now(queue: JobQueue, worker_id: str = "main") -> str | None:
    """Take without waiting (the fake clock does not move); the job id or None."""
    assignment = queue.take(worker_id, 0)
    return None if assignment is None else assignment.lease.job_id


def drain(queue: JobQueue) -> list[str]:
    """Take every job already due, without waiting, in the order the queue hands them."""
    taken = []
    while (job_id := take_now(queue)) is not None:
        taken.append(job_id)
    return taken


# ------------------------------------------------------------------------------ threads


class Taker(threading.Thread):
    """A worker's take loop: takes until it has ``limit`` answers, or the queue closes."""

    def __init__(
        self,
        queue: JobQueue,
        now: Callable[[], float],
        worker_id: str,
        *,
        limit: int | None,
        timeout: float,
        early: float = 0.0,
        queues: tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(name=f"taker-{worker_id}", daemon=True)
        self.queues = queues
        self.queue = queue
        self.now = now
        self.worker_id = worker_id
        self.limit = limit
        self.timeout = timeout
        self.early = early
        # (what take returned, the clock when it returned); read after the thread parks
        # again or ends.
        self.answers: list[tuple[Assignment | None, float]] = []
        self.error: BaseException | None = None
        self.shut_down = False

    def run(self) -> None:
        try:
            while self.limit is None or len(self.answers) < self.limit:
                batch = self.queue.take_batch(
                    self.worker_id, self.timeout, self.early, queues=self.queues
                )
                self.answers.append((batch[0] if batch else None, self.now()))
        except SchedulerShutdownError:
            self.shut_down = True
        except BaseException as exc:
            self.error = exc

    @property
    def taken(self) -> list[tuple[str, float]]:
        """(job id, clock at hand-out) of every job this taker got."""
        return [(a.lease.job_id, when) for a, when in self.answers if a is not None]


class Submitter(threading.Thread):
    """One submit in its own thread, for submits that block on a full queue."""

    def __init__(
        self, queue: JobQueue, job: JobRequest | list[JobRequest], timeout: float | None
    ) -> None:
        name = job.job_id if isinstance(job, JobRequest) else "+".join(j.job_id for j in job)
        super().__init__(name=f"submitter-{name}", daemon=True)
        self.queue = queue
        self.job = job
        self.timeout = timeout
        self.error: BaseException | None = None
        self.submitted = False

    def run(self) -> None:
        try:
            if isinstance(self.job, JobRequest):
                self.queue.submit(self.job, self.timeout)
            else:
                self.queue.submit_many(self.job, self.timeout)
        except BaseException as exc:
            self.error = exc
        else:
            self.submitted = True


@dataclass
class Harness:
    """Queues on one fake clock, and the threads a test starts against them.

    Teardown closes every queue (which releases every waiting taker and submitter) and
    joins every thread, so a failing test leaves nothing running.
    """

    clock: FakeClock = field(default_factory=FakeClock)
    queues: list[JobQueue] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def queue(self, **options: Any) -> JobQueue:
        options.setdefault("clock", self.clock)
        queue = JobQueue(**options)
        self.queues.append(queue)
        return queue

    def taker(
        self,
        queue: JobQueue,
        worker_id: str,
        *,
        limit: int | None = None,
        timeout: float = FOREVER,
        now: Callable[[], float] | None = None,
        early: float = 0.0,
    ) -> Taker:
        taker = Taker(
            queue, now or self.clock.now, worker_id, limit=limit, timeout=timeout, early=early
        )
        self.threads.append(taker)
        taker.start()
        return taker

    def taker_of(
        self, queue: JobQueue, worker_id: str, queues: tuple[str, ...], *, limit: int | None = None
    ) -> Taker:
        """A taker that serves ``queues`` only, in that order."""
        taker = Taker(queue, self.clock.now, worker_id, limit=limit, timeout=FOREVER, queues=queues)
        self.threads.append(taker)
        taker.start()
        return taker

    def submitter(
        self, queue: JobQueue, job: JobRequest | list[JobRequest], timeout: float | None = None
    ) -> Submitter:
        submitter = Submitter(queue, job, timeout)
        self.threads.append(submitter)
        submitter.start()
        return submitter

    def settle(self, parked: int) -> None:
        """Wait until exactly ``parked`` threads wait on the fake clock: nothing else runs."""
        self.clock.wait_parked(parked)

    def advance(self, seconds: float, *, parked: int) -> None:
        """Move the fake clock on, then wait until ``parked`` threads wait again."""
        self.clock.advance(seconds)
        self.clock.wait_parked(parked)

    def close(self) -> None:
        for queue in self.queues:
            queue.close()
        for thread in self.threads:
            thread.join(JOIN)
        stuck = [t.name for t in self.threads if t.is_alive()]
        assert not stuck, f"threads still running after close: {stuck}"


def finish(thread: threading.Thread) -> None:
    thread.join(JOIN)
    assert not thread.is_alive(), f"{thread.name} did not finish"


@pytest.fixture
def harness() -> Iterator[Harness]:
    harness = Harness()
    try:
        yield harness
    finally:
        harness.close()
    errors = [(t.name, t.error) for t in harness.threads if isinstance(t, Taker) and t.error]
    assert not errors, f"takers failed: {errors}"


# ----------------------------------------------------------------------------- ordering


@ORDERS
def test_idle_taker_gets_jobs_in_heap_order(harness: Harness, order: Order) -> None:
    queue = harness.queue(order=order)
    t0 = harness.clock.now()
    taker = harness.taker(queue, "w1")
    harness.settle(1)
    for job in [
        request("late-high", HIGH, delay=3),
        request("mid-low", LOW, delay=2),
        request("mid-high-1", HIGH, delay=2),
        request("mid-medium", MEDIUM, delay=2),
        request("mid-high-2", HIGH, delay=2),
        request("early-low", LOW, delay=1),
    ]:
        queue.submit(job)
    harness.settle(1)
    for _ in range(3):
        harness.advance(1, parked=1)
    assert taker.taken == [
        ("early-low", t0 + 1),
        ("mid-high-1", t0 + 2),
        ("mid-high-2", t0 + 2),
        ("mid-medium", t0 + 2),
        ("mid-low", t0 + 2),
        ("late-high", t0 + 3),
    ]


@pytest.mark.parametrize(
    ("order", "expected"),
    [(Order.TIME, ["low", "high"]), (Order.PRIORITY, ["high", "low"])],
    ids=["time", "priority"],
)
def test_overdue_backlog_is_taken_in_the_orders_key(
    harness: Harness, order: Order, expected: list[str]
) -> None:
    queue = harness.queue(order=order)
    queue.submit(request("low", LOW, delay=1))
    queue.submit(request("high", HIGH, delay=2))
    harness.clock.advance(5)
    assert drain(queue) == expected


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        (Order.TIME, ["low-0", "medium-1a", "medium-1b", "high-2", "high-3"]),
        (Order.PRIORITY, ["high-2", "high-3", "medium-1a", "medium-1b", "low-0"]),
    ],
    ids=["time", "priority"],
)
def test_overdue_backlog_never_includes_jobs_not_yet_due(
    harness: Harness, order: Order, expected: list[str]
) -> None:
    queue = harness.queue(order=order)
    for job in [
        request("medium-1a", MEDIUM, delay=1),
        request("high-future", HIGH, delay=10),
        request("high-3", HIGH, delay=3),
        request("high-2", HIGH, delay=2),
        request("low-0", LOW, delay=0),
        request("medium-1b", MEDIUM, delay=1),
    ]:
        queue.submit(job)
    harness.clock.advance(5)
    assert drain(queue) == expected
    assert len(queue) == 1
    harness.clock.advance(5)
    assert drain(queue) == ["high-future"]


@ORDERS
def test_equal_at_values_tie_break_by_priority_then_submission(
    harness: Harness, order: Order
) -> None:
    queue = harness.queue(order=order)
    at = harness.clock.wall() + 3
    for job in [
        request("low", LOW, at=at),
        request("high-1", HIGH, at=at),
        request("medium-at", MEDIUM, at=at),
        request("medium-delay", MEDIUM, delay=3),
        request("high-2", HIGH, at=at),
    ]:
        queue.submit(job)
    harness.clock.advance(2.5)
    assert drain(queue) == []
    harness.clock.advance(0.5)
    dues = []
    taken = []
    while (assignment := queue.take("w1", 0)) is not None:
        taken.append(assignment.lease.job_id)
        dues.append(assignment.due)
    assert taken == ["high-1", "high-2", "medium-at", "medium-delay", "low"]
    assert set(dues) == {harness.clock.now()}


class SwitchingClock(FakeClock):
    """A fake clock on which every wall-clock read comes 2 ms after the monotonic read
    before it, as when another thread takes the GIL (5 ms turns) or the CPU in between."""

    def wall(self) -> float:
        self._now += 0.002
        return super().wall()


def test_equal_at_values_in_one_batch_tie_break_by_priority_across_thread_switches(
    harness: Harness,
) -> None:
    clock = SwitchingClock()
    queue = harness.queue(clock=clock)
    at = clock.wall() + 3
    queue.submit_many(
        [request("high", HIGH, at=at), request("medium", MEDIUM, at=at), request("low", LOW, at=at)]
    )
    clock.advance(4)
    assert drain(queue) == ["high", "medium", "low"]


def test_equal_at_values_keep_equal_keys_across_sub_millisecond_drift(
    harness: Harness,
) -> None:
    queue = harness.queue()
    at = harness.clock.wall() + 3
    queue.submit(request("low", LOW, at=at))
    harness.clock.wall_offset -= 0.0004  # the wall clock drifts back, by less than 1 ms
    queue.submit(request("high", HIGH, at=at))
    harness.clock.advance(3)
    assert take_now(queue) is None  # the wall clock reads 0.4 ms before their time
    harness.clock.advance(0.0004 + 1e-6)  # (wall times this large have ~0.2 us of rounding)
    assert drain(queue) == ["high", "low"]


def test_an_at_job_never_starts_before_its_time_by_the_wall_clock(harness: Harness) -> None:
    # The wall clock falls 2 ms behind the monotonic one (NTP slews it) after the jobs came
    # in: at their monotonic due time it reads 2 ms before the time they were asked for.
    queue = harness.queue()
    at = harness.clock.wall() + 5
    queue.submit(request("low", LOW, at=at))
    queue.submit(request("high", HIGH, at=at))
    queue.submit(request("by-delay", delay=5))  # asked for on the monotonic clock
    harness.clock.wall_offset -= 0.002
    harness.clock.advance(5)
    assert drain(queue) == ["by-delay"]
    harness.clock.advance(0.0019)
    assert take_now(queue) is None
    harness.clock.advance(0.0001 + 1e-6)  # (wall times this large have ~0.2 us of rounding)
    assert harness.clock.wall() >= at
    assert drain(queue) == ["high", "low"]  # held together: the tie still breaks by priority


def test_an_at_job_waits_out_a_wall_clock_set_back(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("report", at=harness.clock.wall() + 10))
    harness.clock.wall_offset -= 3600  # someone set the wall clock an hour back
    harness.clock.advance(10)
    assert take_now(queue) is None and queue.stats().next_due_in == pytest.approx(3600)
    harness.clock.advance(3600)
    assert drain(queue) == ["report"]


def test_at_follows_a_wall_clock_jump(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("before", at=harness.clock.wall() + 10))
    harness.clock.wall_offset += 60  # the wall clock was set a minute ahead
    queue.submit(request("after", at=harness.clock.wall() + 3))
    harness.clock.advance(2.5)
    assert take_now(queue) is None
    harness.clock.advance(0.5)
    assert drain(queue) == ["after"]
    harness.clock.advance(7)
    assert drain(queue) == ["before"]  # converted when it arrived, never re-read


@pytest.mark.parametrize(
    "when",
    [
        {"at_ago": 100.0},
        {"at_ago": 1e9},  # long before the monotonic clock's origin
        {"delay": -5.0},
    ],
    ids=["at-100s-ago", "at-1e9s-ago", "negative-delay"],
)
def test_a_time_already_past_is_due_now(harness: Harness, when: dict[str, float]) -> None:
    queue = harness.queue()
    if "at_ago" in when:
        job = request("past", at=harness.clock.wall() - when["at_ago"])
    else:
        job = request("past", delay=when["delay"])
    queue.submit(job)
    assignment = queue.take("w1", 0)
    assert assignment is not None
    assert assignment.lease.job_id == "past"
    assert assignment.due == harness.clock.now()


# ------------------------------------------------------------------ leader / follower


def test_sooner_submit_wakes_the_leader_and_overtakes(harness: Harness) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    queue.submit(request("in-10", delay=10))
    taker = harness.taker(queue, "w1", limit=1)
    harness.settle(1)
    queue.submit(request("in-1", delay=1))
    harness.settle(1)
    harness.clock.advance(1)
    finish(taker)
    assert taker.taken == [("in-1", t0 + 1)]
    assert len(queue) == 1


@pytest.mark.parametrize("taker_first", [True, False], ids=["taker-first", "job-first"])
def test_lone_future_job_becomes_due_without_another_signal(
    harness: Harness, taker_first: bool
) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    if taker_first:
        taker = harness.taker(queue, "w1", limit=1)
        harness.settle(1)
        queue.submit(request("job", delay=5))
    else:
        queue.submit(request("job", delay=5))
        taker = harness.taker(queue, "w1", limit=1)
    harness.settle(1)
    harness.advance(4.5, parked=1)
    assert taker.answers == []
    harness.clock.advance(0.5)
    finish(taker)
    assert taker.taken == [("job", t0 + 5)]


@ORDERS
def test_two_idle_takers_each_get_one_of_two_jobs_due_together(
    harness: Harness, order: Order
) -> None:
    # The signal() trap: one wake-up for two due jobs would leave J2 waiting for
    # whoever took J1 to finish it. Neither taker here ever completes its job.
    queue = harness.queue(order=order)
    t0 = harness.clock.now()
    a = harness.taker(queue, "A", limit=1)
    b = harness.taker(queue, "B", limit=1)
    harness.settle(2)
    queue.submit(request("J1", delay=3))
    queue.submit(request("J2", delay=3))
    harness.settle(2)
    harness.clock.advance(3)
    finish(a)
    finish(b)
    assert sorted(a.taken + b.taken) == [("J1", t0 + 3), ("J2", t0 + 3)]
    assert len(a.taken) == len(b.taken) == 1
    assert sorted(lease.worker_id for lease in queue.leases.held()) == ["A", "B"]


K_JOBS = 20
# Due times (seconds from now) of the K_JOBS jobs, by schedule.
SCHEDULES = {
    "staggered": [i + 1 for i in range(K_JOBS)],  # only the first submit makes a new head
    "staggered-reversed": [K_JOBS - i for i in range(K_JOBS)],  # every submit does
    "due-together": [1] * K_JOBS,  # one timer fires, then a backlog of due jobs
    "due-now": [0] * K_JOBS,  # handed out as they are submitted
}


def count_wakeups(harness: Harness, takers: int, schedule: str, order: Order) -> int:
    """Hand out K_JOBS jobs to ``takers`` looping takers; condition wake-ups it took."""
    queue = harness.queue(order=order)
    pool = [harness.taker(queue, f"w{i}") for i in range(takers)]
    harness.settle(takers)
    delays = SCHEDULES[schedule]
    for i, delay in enumerate(delays):
        queue.submit(request(f"job-{i}", (HIGH, MEDIUM, LOW)[i % 3], delay=delay))
        harness.settle(takers)
    for _ in range(max(delays)):
        harness.advance(1, parked=takers)
    wakeups = queue.stats().wakeups  # before close(), which wakes everyone once more
    taken = sorted(job_id for taker in pool for job_id, _ in taker.taken)
    assert taken == sorted(f"job-{i}" for i in range(K_JOBS))
    assert len(queue) == 0
    queue.close()
    for taker in pool:
        finish(taker)
    return wakeups


@ORDERS
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("takers", [2, 32], ids=["2-takers", "32-takers"])
def test_wakeups_per_handed_out_job_are_bounded(
    harness: Harness, takers: int, schedule: str, order: Order
) -> None:
    wakeups = count_wakeups(harness, takers, schedule, order)
    assert wakeups <= 4 * K_JOBS, f"{wakeups} wake-ups for {K_JOBS} jobs"


@ORDERS
@pytest.mark.parametrize(
    ("schedule", "extra"),
    [
        ("staggered", 2),
        ("due-now", 2),
        # Each due job a taker takes while more are due wakes one idle taker to take the
        # next; with 2 takers that idle taker is often already awake, with 32 it never is.
        ("due-together", K_JOBS),
        # Each new head wakes one waiter to lead; the leader it replaces keeps its timer,
        # which fires once later unless (with few takers) it was woken meanwhile. Which
        # of two timers firing together leads next is a race: a little slack for it.
        ("staggered-reversed", K_JOBS + 4),
    ],
    ids=["staggered", "due-now", "due-together", "staggered-reversed"],
)
def test_wakeups_do_not_grow_with_the_number_of_takers(
    harness: Harness, schedule: str, extra: int, order: Order
) -> None:
    few = count_wakeups(harness, 2, schedule, order)
    many = count_wakeups(harness, 32, schedule, order)
    more = count_wakeups(harness, 64, schedule, order)
    # A herd would cost up to one wake-up per taker per event: 32 or 64 per job, not 1.
    assert many <= few + extra, f"2 takers: {few} wake-ups, 32 takers: {many}"
    assert more <= few + extra, f"2 takers: {few} wake-ups, 64 takers: {more}"


def test_waiting_takers_show_in_stats(harness: Harness) -> None:
    queue = harness.queue()
    for i in range(3):
        harness.taker(queue, f"w{i}")
    harness.settle(3)
    stats = queue.stats()
    assert stats.waiting == 3
    assert stats.wakeups == 0
    assert stats.next_due_in is None


@pytest.fixture
def late_timers() -> Iterator[Harness]:
    """A harness whose timed waits end 0.3% late, as on a VM whose timers do (a 2 s wait
    ended 6 ms late there)."""
    harness = Harness(clock=FakeClock(oversleep=0.003))
    try:
        yield harness
    finally:
        harness.close()


@pytest.mark.parametrize("delay", [0.5, 2.0, 3600.0])
def test_a_timer_that_ends_late_does_not_make_the_head_late(
    late_timers: Harness, delay: float
) -> None:
    harness, clock = late_timers, late_timers.clock
    queue = harness.queue()
    taker = harness.taker(queue, "w1")
    harness.settle(1)
    due = clock.now() + delay
    queue.submit(request("head", delay=delay))
    harness.settle(1)
    waits = 0
    while not taker.taken:
        deadline = clock.next_deadline()  # time moves as a real timer would: to its end
        assert deadline is not None, "nobody times the head"
        harness.advance(deadline - clock.now(), parked=1)
        waits += 1
    [(_, handed_out)] = taker.taken
    # A leader that waited the whole delay at once would hand it out 0.3% of it late.
    assert due <= handed_out <= due + 1e-5
    assert waits <= 6  # a few waits each ending early, not a poll


@pytest.mark.parametrize(("delay", "most_waits"), [(0.05, 1), (0.2, 1), (3600.0, 6)])
def test_a_taker_handed_jobs_early_waits_once_when_the_timer_fits_in_that(
    late_timers: Harness, delay: float, most_waits: int
) -> None:
    # A wake-up costs ~30 µs of CPU on a VM: a local worker, handed its job 2 ms early,
    # is not woken twice for a head its timer reaches within half of that.
    harness, clock = late_timers, late_timers.clock
    queue = harness.queue()
    taker = harness.taker(queue, "w1", early=0.002)
    harness.settle(1)
    due = clock.now() + delay
    queue.submit(request("head", delay=delay))
    harness.settle(1)
    waits = 0
    while not taker.taken:
        deadline = clock.next_deadline()
        assert deadline is not None, "nobody times the head"
        harness.advance(deadline - clock.now(), parked=1)
        waits += 1
    [(_, handed_out)] = taker.taken
    assert due - 0.002 <= handed_out <= due  # early, never past its due time
    assert waits <= most_waits


# ---------------------------------------------------------------------------- cancel


def test_cancelled_job_is_never_handed_out(harness: Harness) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    taker = harness.taker(queue, "w1")
    harness.settle(1)
    for i in range(1, 4):
        queue.submit(request(f"job-{i}", delay=i))
    harness.settle(1)
    assert queue.cancel("job-2") is True
    harness.settle(1)
    assert len(queue) == 2
    for _ in range(4):
        harness.advance(1, parked=1)
    assert taker.taken == [("job-1", t0 + 1), ("job-3", t0 + 3)]
    assert queue.stats().cancelled == 1


def test_cancel_returns_false_for_unknown_taken_or_cancelled_ids(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("taken"))
    queue.submit(request("cancelled", delay=5))
    assert queue.cancel("unknown") is False
    assert take_now(queue) == "taken"
    assert queue.cancel("taken") is False
    assert queue.cancel("cancelled") is True
    assert queue.cancel("cancelled") is False
    assert len(queue) == 0
    assert queue.stats().cancelled == 1


def test_cancelling_the_awaited_head_moves_the_leader_to_the_next_job(
    harness: Harness,
) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    taker = harness.taker(queue, "w1", limit=1)
    harness.settle(1)
    queue.submit(request("head", delay=5))
    queue.submit(request("next", delay=10))
    harness.settle(1)
    assert queue.cancel("head") is True
    harness.settle(1)
    wakeups = queue.stats().wakeups
    # Nobody still sleeps until the cancelled head's time: passing it wakes no one.
    harness.advance(5, parked=1)
    assert queue.stats().wakeups == wakeups
    assert taker.answers == []
    harness.advance(4.5, parked=1)
    assert taker.answers == []
    harness.clock.advance(0.5)
    finish(taker)
    assert taker.taken == [("next", t0 + 10)]


def test_cancelling_the_only_job_leaves_the_taker_ready_for_the_next(
    harness: Harness,
) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    taker = harness.taker(queue, "w1", limit=1)
    harness.settle(1)
    queue.submit(request("only", delay=5))
    harness.settle(1)
    assert queue.cancel("only") is True
    harness.advance(5, parked=1)
    assert taker.answers == []
    queue.submit(request("later", delay=2))
    harness.settle(1)
    harness.clock.advance(2)
    finish(taker)
    assert taker.taken == [("later", t0 + 7)]


def test_cancel_client_removes_only_that_clients_jobs(harness: Harness) -> None:
    queue = harness.queue()
    for i in range(6):
        client = "alice" if i % 2 else "bob"
        queue.submit(request(f"{client}-{i}", delay=i, client=client))
    assert sorted(queue.cancel_client("alice")) == ["alice-1", "alice-3", "alice-5"]
    assert queue.cancel_client("alice") == []
    assert queue.cancel_client("nobody") == []
    assert len(queue) == 3
    harness.clock.advance(10)
    assert drain(queue) == ["bob-0", "bob-2", "bob-4"]
    assert queue.stats().cancelled == 3


def test_cancelling_a_due_job_in_priority_order_skips_it(harness: Harness) -> None:
    queue = harness.queue(order=Order.PRIORITY)
    for job_id, priority in [("a", HIGH), ("b", MEDIUM), ("c", LOW)]:
        queue.submit(request(job_id, priority))
    assert take_now(queue) == "a"  # every due job has now moved to the due-job heap
    assert queue.cancel("b") is True
    assert drain(queue) == ["c"]


@ORDERS
def test_order_survives_mass_cancellation(harness: Harness, order: Order) -> None:
    # 3000 jobs, 2000 cancelled behind a live head: far more than 1024 cancelled entries
    # stay in the heap and outnumber the live ones, so the heaps get compacted.
    queue = harness.queue(order=order)
    jobs = [
        request(f"job-{i}", (HIGH, MEDIUM, LOW)[(i * 7) % 3], delay=1 + (i * 37) % 101)
        for i in range(3000)
    ]
    for job in jobs:
        queue.submit(job)
    assert take_now(queue) is None
    kept = [job for i, job in enumerate(jobs) if i % 3 == 0]
    for i, job in enumerate(jobs):
        if i % 3:
            assert queue.cancel(job.job_id) is True
    assert len(queue) == len(kept)
    assert queue.stats().cancelled == 2000
    harness.clock.advance(200)  # everything due: both orders then agree on this backlog
    seq = {job.job_id: i for i, job in enumerate(jobs)}

    def key(job: JobRequest) -> tuple[float, ...]:
        assert job.delay is not None
        if order is Order.TIME:
            return (job.delay, job.priority, seq[job.job_id])
        return (job.priority, job.delay, seq[job.job_id])

    assert drain(queue) == [job.job_id for job in sorted(kept, key=key)]
    assert len(queue) == 0


def test_submit_after_mass_cancellation_still_wakes_the_leader(harness: Harness) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    taker = harness.taker(queue, "w1", limit=1)
    harness.settle(1)
    for i in range(1100):
        queue.submit(request(f"job-{i}", delay=100 + i))
    harness.settle(1)
    for i in reversed(range(1100)):  # the head last, so cancelled entries pile up
        assert queue.cancel(f"job-{i}") is True
    harness.settle(1)
    assert len(queue) == 0
    queue.submit(request("survivor", delay=3))
    harness.settle(1)
    harness.clock.advance(3)
    finish(taker)
    assert taker.taken == [("survivor", t0 + 3)]


# ------------------------------------------------------------------------ bounded queue


def test_full_queue_blocks_submit_until_a_take_makes_room(harness: Harness) -> None:
    queue = harness.queue(max_pending=2)
    queue.submit(request("one"))
    queue.submit(request("two"))
    third = harness.submitter(queue, request("three"))
    harness.settle(1)
    assert not third.submitted
    assert len(queue) == 2
    assert take_now(queue) == "one"
    finish(third)
    assert third.error is None
    assert third.submitted
    assert drain(queue) == ["two", "three"]


def test_full_queue_blocks_submit_until_a_cancel_makes_room(harness: Harness) -> None:
    queue = harness.queue(max_pending=2)
    queue.submit(request("one", delay=5))
    queue.submit(request("two", delay=5))
    third = harness.submitter(queue, request("three"), timeout=10)
    harness.settle(1)
    assert queue.cancel("two") is True
    finish(third)
    assert third.error is None
    assert drain(queue) == ["three"]


def test_full_queue_submit_times_out_with_queue_full(harness: Harness) -> None:
    queue = harness.queue(max_pending=2)
    queue.submit(request("one", delay=1))
    queue.submit(request("two", delay=1))
    third = harness.submitter(queue, request("three"), timeout=5)
    harness.settle(1)
    harness.advance(4.5, parked=1)
    assert third.is_alive()
    harness.clock.advance(0.5)
    finish(third)
    assert isinstance(third.error, QueueFullError)
    assert isinstance(third.error, stdlib_queue.Full)
    assert isinstance(third.error, MpschedError)
    assert len(queue) == 2
    assert queue.stats().submitted == 2
    assert drain(queue) == ["one", "two"]
    assert queue.cancel("three") is False


def test_full_queue_submit_with_zero_timeout_fails_at_once(harness: Harness) -> None:
    queue = harness.queue(max_pending=1)
    queue.submit(request("one"))
    with pytest.raises(QueueFullError):
        queue.submit(request("two"), timeout=0)
    assert len(queue) == 1


def test_close_releases_a_blocked_submitter_with_shutdown(harness: Harness) -> None:
    queue = harness.queue(max_pending=1)
    queue.submit(request("one"))
    blocked = harness.submitter(queue, request("two"))
    harness.settle(1)
    queue.close()
    finish(blocked)
    assert isinstance(blocked.error, SchedulerShutdownError)


def test_max_pending_below_one_is_rejected() -> None:
    with pytest.raises(ConfigError):
        JobQueue(clock=FakeClock(), max_pending=0)


def test_blocked_submitters_cannot_both_enqueue_one_job_id(harness: Harness) -> None:
    queue = harness.queue(max_pending=2)
    queue.submit(request("a", client="old"))
    queue.submit(request("b", client="old"))
    first = harness.submitter(queue, request("dup", client="new"))
    second = harness.submitter(queue, request("dup", client="new"))
    harness.settle(2)
    queue.cancel_client("old")  # makes room for both
    finish(first)
    finish(second)
    # With the bug, both entries reach the heap while the pending table keeps one: the
    # first take hands out one and the second raises KeyError from inside take().
    assert drain(queue) == ["dup"]
    errors = [s.error for s in (first, second)]
    assert sum(isinstance(e, InvalidJobError) for e in errors) == 1, errors


# ---------------------------------------------------------------------------- leases


def test_take_hands_out_a_lease_naming_the_worker_and_first_attempt(
    harness: Harness,
) -> None:
    queue = harness.queue()
    queue.submit(request("job", HIGH, delay=2))
    harness.clock.advance(2)
    assignment = queue.take("worker-7", 0)
    assert assignment is not None
    lease = assignment.lease
    assert (lease.job_id, lease.worker_id, lease.attempt) == ("job", "worker-7", 1)
    assert assignment.payload == b"job"
    assert assignment.due == harness.clock.now()
    assert queue.leases.held() == [lease]
    assert len(queue) == 0
    stats = queue.stats()
    assert (stats.in_flight, stats.submitted) == (1, 1)


def test_each_take_gets_a_distinct_lease(harness: Harness) -> None:
    queue = harness.queue()
    for i in range(3):
        queue.submit(request(f"job-{i}"))
    leases = []
    for worker in ("w1", "w2", "w1"):
        assignment = queue.take(worker, 0)
        assert assignment is not None
        leases.append(assignment.lease)
    assert len({lease.lease_id for lease in leases}) == 3
    assert sorted(queue.leases.held()) == sorted(leases)


def test_complete_returns_the_job_once(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job"))
    assignment = queue.take("w1", 0)
    assert assignment is not None
    job = queue.leases.complete(assignment.lease.lease_id, outcome("job"))
    assert job is not None
    assert (job.job_id, job.client_id, job.attempt) == ("job", "client-1", 1)
    assert queue.leases.complete(assignment.lease.lease_id, outcome("job")) is None
    assert queue.leases.complete(12345, outcome("job")) is None
    assert queue.leases.held() == []
    assert queue.stats().completed == 1


def test_release_worker_returns_only_that_workers_leases(harness: Harness) -> None:
    queue = harness.queue()
    for i in range(4):
        queue.submit(request(f"job-{i}"))
    leases = {}
    for i, worker in enumerate(["dead", "alive", "dead", "alive"]):
        assignment = queue.take(worker, 0)
        assert assignment is not None
        leases[f"job-{i}"] = assignment.lease
    lost = queue.release_worker("dead")
    assert sorted((job.job_id, lease) for job, lease, _ in lost) == [
        ("job-0", leases["job-0"]),
        ("job-2", leases["job-2"]),
    ]
    assert sorted(queue.leases.held()) == sorted([leases["job-1"], leases["job-3"]])
    assert queue.release_worker("dead") == []
    # A late report from the released worker resolves nothing.
    assert queue.leases.complete(leases["job-0"].lease_id, outcome("job-0")) is None
    assert queue.leases.complete(leases["job-1"].lease_id, outcome("job-1")) is not None
    assert queue.stats().completed == 1


@pytest.mark.parametrize(
    ("retry", "next_attempt"), [(True, 2), (False, 1)], ids=["retried", "never-started"]
)
def test_requeued_job_keeps_its_place_in_line(
    harness: Harness, retry: bool, next_attempt: int
) -> None:
    queue = harness.queue()
    queue.submit(request("first", LOW))
    queue.submit(request("second", LOW))
    assert take_now(queue) == "first"
    [(job, _, _)] = queue.release_worker("main")
    assert queue.requeue(job, retry=retry) is True
    assignment = queue.take("w2", 0)
    assert assignment is not None
    assert (assignment.lease.job_id, assignment.lease.attempt) == ("first", next_attempt)
    assert queue.stats().submitted == 2


def test_released_lease_past_its_timeout_says_so(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("slow")._replace(timeout=5.0))
    queue.submit(request("quick")._replace(timeout=50.0))
    assert take_now(queue) == "slow"
    assert take_now(queue) == "quick"
    assert queue.leases.expired() == ([], harness.clock.now() + 5.0)
    harness.clock.advance(6.0)
    late, next_deadline = queue.leases.expired()
    assert [lease.job_id for lease in late] == ["slow"] and next_deadline is not None
    lost = {entry.job.job_id: entry.past_deadline for entry in queue.release_worker("main")}
    assert lost == {"slow": True, "quick": False}


def test_wait_drained_returns_once_in_flight_jobs_end(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job"))
    assignment = queue.take("w", 0)
    assert assignment is not None
    assert queue.leases.wait_drained(0) is False
    queue.leases.complete(assignment.lease.lease_id, outcome("job"))
    assert queue.leases.wait_drained(0) is True


def test_requeue_after_close_leaves_the_job_out(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job"))
    assert take_now(queue) == "job"
    [(job, _, _)] = queue.release_worker("main")
    queue.close()
    assert queue.requeue(job, retry=True) is False
    assert len(queue) == 0


def test_stats_count_outcomes_and_lateness(harness: Harness) -> None:
    queue = harness.queue()
    for i in range(3):
        queue.submit(request(f"job-{i}", delay=1))
    harness.clock.advance(1)
    assignments = [queue.take("w1", 0) for _ in range(3)]
    assert all(a is not None for a in assignments)
    late_ok, late_failed, never_started = (a for a in assignments if a is not None)
    assert late_ok.due is not None and late_failed.due is not None
    queue.leases.complete(late_ok.lease.lease_id, outcome("job-0", started=late_ok.due + 0.25))
    queue.leases.complete(
        late_failed.lease.lease_id, outcome("job-1", ok=False, started=late_failed.due + 2)
    )
    queue.leases.complete(never_started.lease.lease_id, outcome("job-2", ok=False))
    stats = queue.stats()
    assert (stats.completed, stats.failed, stats.in_flight) == (1, 2, 0)
    assert stats.lateness_samples == 2
    assert stats.lateness["max"] == 2.0
    assert stats.lateness["p50"] == 0.25


def test_lateness_of_a_job_started_early_counts_as_zero(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job"))
    assignment = queue.take("w1", 0)
    assert assignment is not None and assignment.due is not None
    queue.leases.complete(assignment.lease.lease_id, outcome("job", started=assignment.due - 1))
    assert queue.stats().lateness["max"] == 0.0


def test_stats_show_pending_by_priority_and_next_due(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("h", HIGH, delay=4))
    queue.submit(request("l1", LOW, delay=6))
    queue.submit(request("l2", LOW, delay=8))
    stats = queue.stats()
    assert stats.pending == {"high": 1, "medium": 0, "low": 2}
    assert stats.next_due_in == 4
    assert stats.submitted == 3


# -------------------------------------------------------------------- timeouts, close


@pytest.mark.parametrize("future_job", [False, True], ids=["empty", "job-due-later"])
def test_take_times_out_with_none_when_nothing_becomes_due(
    harness: Harness, future_job: bool
) -> None:
    queue = harness.queue()
    if future_job:
        queue.submit(request("later", delay=10))
    taker = harness.taker(queue, "w1", limit=1, timeout=5)
    harness.settle(1)
    harness.advance(4.5, parked=1)
    assert taker.answers == []
    harness.clock.advance(0.5)
    finish(taker)
    assert taker.answers == [(None, harness.clock.now())]
    assert len(queue) == int(future_job)


def test_timed_out_leader_hands_the_lead_to_a_follower(harness: Harness) -> None:
    queue = harness.queue()
    t0 = harness.clock.now()
    queue.submit(request("job", delay=10))
    impatient = harness.taker(queue, "impatient", limit=1, timeout=2)
    harness.settle(1)
    patient = harness.taker(queue, "patient", limit=1)
    harness.settle(2)
    harness.clock.advance(2)
    finish(impatient)
    harness.settle(1)
    assert impatient.answers == [(None, t0 + 2)]
    harness.clock.advance(8)
    finish(patient)
    assert patient.taken == [("job", t0 + 10)]


def test_close_wakes_every_waiting_taker_with_shutdown(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("later", delay=10))
    takers = [harness.taker(queue, f"w{i}") for i in range(3)]
    harness.settle(3)
    queue.close()
    for taker in takers:
        finish(taker)
    assert [t.shut_down for t in takers] == [True, True, True]
    assert all(t.answers == [] for t in takers)


def test_take_and_submit_after_close_raise_shutdown(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("due"))
    queue.close()
    with pytest.raises(SchedulerShutdownError):
        queue.take("w1", 0)
    with pytest.raises(SchedulerShutdownError):
        queue.submit(request("late"))
    assert len(queue) == 1


def test_work_in_flight_can_still_complete_after_close(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job"))
    assignment = queue.take("w1", 0)
    assert assignment is not None
    queue.close()
    assert queue.leases.complete(assignment.lease.lease_id, outcome("job")) is not None


# ------------------------------------------------------------------------ validation


NAN = math.nan
INF = math.inf


@pytest.mark.parametrize(
    ("priority", "delay", "at"),
    [
        (MEDIUM, NAN, None),
        (MEDIUM, INF, None),
        (MEDIUM, -INF, None),
        (MEDIUM, None, NAN),
        (MEDIUM, None, INF),
        (MEDIUM, None, -INF),
        (0, 1.0, None),
        (4, 1.0, None),
        (-1, 1.0, None),
        (MEDIUM, 1.0, 1.7e9),
        (MEDIUM, None, None),
        (MEDIUM, "1", None),
    ],
    ids=[
        "delay-nan",
        "delay-inf",
        "delay-minus-inf",
        "at-nan",
        "at-inf",
        "at-minus-inf",
        "priority-0",
        "priority-4",
        "priority-minus-1",
        "both-delay-and-at",
        "neither-delay-nor-at",
        "delay-not-a-number",
    ],
)
def test_invalid_request_is_rejected_and_leaves_no_trace(
    harness: Harness, priority: int, delay: Any, at: Any
) -> None:
    queue = harness.queue()
    with pytest.raises(InvalidJobError) as caught:
        queue.submit(JobRequest("bad", "client-1", b"", priority, delay, at))
    assert isinstance(caught.value, ValueError)
    assert len(queue) == 0
    assert queue.stats().submitted == 0
    harness.clock.advance(1e6)
    assert take_now(queue) is None


@pytest.mark.parametrize("field_name", ["delay", "at"], ids=["delay-huge-int", "at-huge-int"])
def test_time_too_large_for_a_float_is_an_invalid_job(harness: Harness, field_name: str) -> None:
    queue = harness.queue()
    huge = -(10**400)
    job = request("huge", delay=huge) if field_name == "delay" else request("huge", at=huge)
    with pytest.raises(InvalidJobError):
        queue.submit(job)
    assert len(queue) == 0


def test_duplicate_pending_job_id_is_rejected(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job", LOW, delay=1))
    with pytest.raises(InvalidJobError, match="job"):
        queue.submit(request("job", HIGH))
    assert len(queue) == 1
    assert queue.stats().submitted == 1
    assert take_now(queue) is None  # the rejected HIGH one, due now, never entered
    harness.clock.advance(1)
    assignment = queue.take("w1", 0)
    assert assignment is not None
    assert assignment.lease.job_id == "job"
    assert take_now(queue) is None


def test_job_id_can_be_reused_once_it_left_the_queue(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job"))
    assert take_now(queue) == "job"
    queue.submit(request("job"))
    queue.submit(request("cancelled", delay=5))
    queue.cancel("cancelled")
    queue.submit(request("cancelled"))
    assert drain(queue) == ["job", "cancelled"]


# ------------------------------------------------------------------------ real clock


class RecordingClock(SystemClock):
    """The real clock, with conditions that report each wait before it starts."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []
        # Set (under the queue lock, just before a real wait releases it) by every wait;
        # the test waits on it instead of polling for a parked thread.
        self.waiting = threading.Event()

    def condition(self, lock: threading.Lock) -> Waitable:
        return RecordingCondition(self, threading.Condition(lock))


class RecordingCondition:
    def __init__(self, clock: RecordingClock, condition: threading.Condition) -> None:
        self._clock = clock
        self._condition = condition

    def wait(self, timeout: float | None = None) -> bool:
        self._clock.timeouts.append(timeout)
        self._clock.waiting.set()
        return self._condition.wait(timeout)

    def notify(self, n: int = 1) -> None:
        self._condition.notify(n)

    def notify_all(self) -> None:
        self._condition.notify_all()


def test_take_with_a_huge_timeout_on_the_real_clock_gets_a_submitted_job(
    harness: Harness,
) -> None:
    queue = harness.queue(clock=None)
    clock = SystemClock()
    taker = harness.taker(queue, "w1", limit=1, timeout=1e12, now=clock.now)
    queue.submit(request("job"))
    finish(taker)
    assert taker.error is None
    assert [job_id for job_id, _ in taker.taken] == ["job"]


def test_real_waits_are_clamped_to_timeout_max(harness: Harness) -> None:
    clock = RecordingClock()
    queue = harness.queue(clock=clock)
    taker = harness.taker(queue, "w1", limit=1, timeout=1e12, now=clock.now)
    assert clock.waiting.wait(JOIN)
    queue.submit(request("job"))
    finish(taker)
    assert taker.error is None
    assert [job_id for job_id, _ in taker.taken] == ["job"]
    assert clock.timeouts
    assert all(t is not None and t <= threading.TIMEOUT_MAX for t in clock.timeouts)


def test_real_submit_waits_for_room_are_clamped_to_timeout_max(harness: Harness) -> None:
    clock = RecordingClock()
    queue = harness.queue(clock=clock, max_pending=1)
    queue.submit(request("one"))
    blocked = harness.submitter(queue, request("two"), timeout=1e12)
    assert clock.waiting.wait(JOIN)
    assert take_now(queue) == "one"
    finish(blocked)
    assert blocked.error is None
    assert clock.timeouts
    assert all(t is not None and t <= threading.TIMEOUT_MAX for t in clock.timeouts)
    assert take_now(queue) == "two"


def test_submit_many_queues_a_batch_in_order(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit_many([request(f"b{i}") for i in range(5)])
    assert drain(queue) == [f"b{i}" for i in range(5)]
    assert queue.stats().submitted == 5


def test_submit_many_is_all_or_nothing(harness: Harness) -> None:
    queue = harness.queue(max_pending=4)
    queue.submit(request("old"))
    with pytest.raises(InvalidJobError, match="repeats"):
        queue.submit_many([request("x"), request("x")])
    with pytest.raises(InvalidJobError, match="already pending"):
        queue.submit_many([request("new"), request("old")])
    with pytest.raises(InvalidJobError, match="never fit"):
        queue.submit_many([request(f"big{i}") for i in range(5)])
    with pytest.raises(InvalidJobError):
        queue.submit_many([request("fine"), request("bad", delay=math.nan)])
    with pytest.raises(QueueFullError):
        queue.submit_many([request(f"four{i}") for i in range(4)], timeout=0)
    assert len(queue) == 1 and drain(queue) == ["old"]


def test_submit_many_waits_for_room_for_the_whole_batch(harness: Harness) -> None:
    queue = harness.queue(max_pending=3)
    for job_id in "abc":
        queue.submit(request(job_id))
    blocked = harness.submitter(queue, [request("d"), request("e")])
    harness.settle(1)
    assert take_now(queue) == "a"  # room for one is not room for the batch of two...
    harness.settle(1)
    assert not blocked.submitted
    assert take_now(queue) == "b"  # ...room for two is
    blocked.join(JOIN)
    assert blocked.submitted
    assert drain(queue) == ["c", "d", "e"]


def test_early_take_hands_out_a_job_just_before_it_is_due(harness: Harness) -> None:
    queue = harness.queue()
    taken: list[Assignment | None] = []
    thread = threading.Thread(
        target=lambda: taken.append(queue.take("w", FOREVER, early=0.25)), daemon=True
    )
    harness.threads.append(thread)
    queue.submit(request("job", delay=10.0))
    thread.start()
    harness.advance(9.5, parked=1)  # half a second before due: not yet
    assert taken == []
    harness.clock.advance(0.25)  # a quarter before due: within the early window
    thread.join(JOIN)
    [assignment] = taken
    assert assignment is not None and assignment.lease.job_id == "job"
    assert assignment.due == harness.clock.now() + 0.25


def test_take_without_early_waits_for_the_due_time(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job", delay=10.0))
    harness.clock.advance(9.75)
    assert queue.take("w", 0) is None
    assert queue.take("w", 0, early=0.25) is not None


def test_stats_count_jobs_started_before_their_due_time(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("job", delay=1.0))
    assignment = queue.take("w", 0, early=2.0)
    assert assignment is not None and assignment.due is not None
    queue.leases.complete(assignment.lease.lease_id, outcome("job", started=assignment.due - 0.5))
    stats = queue.stats()
    assert stats.started_early == 1 and stats.lateness["max"] == 0.0


# ------------------------------------------------------------- hardening: wake-ups, memory


def test_room_wakes_a_smaller_batch_when_a_larger_one_still_does_not_fit(harness: Harness) -> None:
    queue = harness.queue(max_pending=3)
    for name in ("a", "b", "c"):
        queue.submit(request(name, delay=5))
    pair = harness.submitter(queue, [request("p1"), request("p2")])
    harness.settle(1)
    single = harness.submitter(queue, request("s"))
    harness.settle(2)
    assert queue.cancel("a")  # room for one: the pair (first in line) still does not fit
    finish(single)
    assert single.submitted and single.error is None
    harness.settle(1)  # the pair waits on for more room
    assert not pair.submitted
    assert queue.cancel("b")
    assert queue.cancel("c")
    finish(pair)
    assert pair.submitted


def test_priority_order_never_hands_a_job_early_to_a_taker_that_may_not_get_it_early(
    harness: Harness,
) -> None:
    queue = harness.queue(order=Order.PRIORITY)
    queue.submit(request("urgent", HIGH))
    queue.submit(request("soon", LOW, delay=0.0015))
    local = queue.take("local", 0, early=0.002)  # may start jobs up to 2 ms early
    assert local is not None and local.lease.job_id == "urgent"
    assert queue.take("remote", 0) is None  # "soon" is not due for a worker on another clock
    harness.clock.advance(0.0015)
    remote = queue.take("remote", 0)
    assert remote is not None and remote.lease.job_id == "soon"


@ORDERS
def test_an_early_taker_still_gets_a_job_due_within_its_head_start(
    harness: Harness, order: Order
) -> None:
    queue = harness.queue(order=order)
    queue.submit(request("soon", delay=0.001))
    assert queue.take("remote", 0) is None
    early = queue.take("local", 0, early=0.002)
    assert early is not None and early.lease.job_id == "soon"


class _NoWalk(dict):
    def values(self) -> Any:
        raise AssertionError("stats() walked the pending jobs")


def test_stats_counts_pending_per_priority_without_walking_the_heap(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit_many(
        [request("h", HIGH), request("m1"), request("m2", delay=9), request("l", LOW, delay=9)]
    )
    assert queue.cancel("m2")
    assert take_now(queue) == "h"
    heap = queue._pending.only  # the one queue's heap, and its live jobs
    assert heap is not None
    heap._live = _NoWalk(heap._live)
    assert queue.stats().pending == {"high": 0, "medium": 1, "low": 1}
    assert queue.cancel("m1") and queue.cancel("l")
    assert queue.stats().pending == {"high": 0, "medium": 0, "low": 0}


def test_requeued_jobs_count_as_pending_again(harness: Harness) -> None:
    queue = harness.queue()
    queue.submit(request("h", HIGH))
    assert take_now(queue, "w") == "h"
    assert queue.stats().pending["high"] == 0
    [(job, _, _)] = queue.release_worker("w")
    assert queue.requeue(job, retry=True)
    assert queue.stats().pending["high"] == 1


def test_released_worker_ids_are_forgotten_after_a_while(harness: Harness) -> None:
    queue = harness.queue()
    for n in range(100):
        queue.release_worker(f"dead-{n}")
    queue.submit(request("x"))
    assert take_now(queue, "dead-99") is None  # a take still on its way gets nothing
    harness.clock.advance(GONE_MEMORY + 1)
    queue.release_worker("dead-100")
    assert set(queue.leases._gone) == {"dead-100"}
