"""Prefetched jobs (mpsched._core.prefetch): handed out ahead, revocable until started.

The queue runs against FakeClaims, ClaimSlot's rules in plain Python: a worker starts a
prefetched job only if its claim wins; the queue takes back what was not claimed.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from fakeclock import FakeClock

from mpsched._core.clock import SystemClock
from mpsched._core.job import Assignment, Job, JobRequest, Order, Outcome, Priority
from mpsched._core.queue import JobQueue
from mpsched._errors import SchedulerShutdownError

HIGH, MEDIUM = Priority.HIGH.level, Priority.MEDIUM.level
NEVER = 1 << 62
JOIN = 30.0


class FakeClaims:
    """Each worker's started lease and first revoked lease, as ClaimSlot keeps them."""

    def __init__(self, *workers: str) -> None:
        self.lock = threading.Lock()
        self.started = dict.fromkeys(workers, 0)
        self.revoked_from = dict.fromkeys(workers, NEVER)
        self.revokes: list[tuple[str, int]] = []
        self.gate: threading.Event | None = None  # set: revoke() waits for it
        self.entered = threading.Event()  # a revoke() call began

    def reopen(self, worker_id: str) -> bool:
        if worker_id not in self.started:
            return False
        self.revoked_from[worker_id] = NEVER
        return True

    def revoke(self, worker_id: str, lowest: int) -> int | None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(JOIN)
        with self.lock:
            self.revokes.append((worker_id, lowest))
            cut = max(self.started[worker_id] + 1, lowest)
            self.revoked_from[worker_id] = cut
            return cut

    def received(self, worker_id: str, lease_id: int) -> None:
        self.started[worker_id] = lease_id

    def claim(self, worker_id: str, lease_id: int) -> bool:
        with self.lock:
            if lease_id >= self.revoked_from[worker_id]:
                return False
            self.started[worker_id] = lease_id
            return True


def request(
    job_id: str, priority: int = MEDIUM, *, delay: float = 0.0, timeout: float | None = None
) -> JobRequest:
    return JobRequest(job_id, "client", job_id.encode(), priority, delay, None, timeout)


def ids(batch: list[Assignment]) -> list[str]:
    return [a.lease.job_id for a in batch]


def lease(batch: list[Assignment], job_id: str) -> int:
    return next(a.lease.lease_id for a in batch if a.lease.job_id == job_id)


def drain(queue: JobQueue, worker_id: str = "c") -> list[str]:
    taken = []
    while batch := queue.take_batch(worker_id, 0):
        taken += ids(batch)
    return taken


@pytest.fixture
def claims() -> FakeClaims:
    return FakeClaims("a", "b", "c")


@pytest.fixture
def queues(claims: FakeClaims) -> Iterator[list[JobQueue]]:
    made: list[JobQueue] = []
    yield made
    for queue in made:
        queue.close()


def fake_queue(
    queues: list[JobQueue], claims: FakeClaims | None, order: Order = Order.TIME
) -> JobQueue:
    queue = JobQueue(clock=FakeClock(), order=order, claims=claims)
    queues.append(queue)
    return queue


ORDERS = pytest.mark.parametrize("order", [Order.TIME, Order.PRIORITY], ids=["time", "priority"])


# ----------------------------------------------------------------------------- handing out


@ORDERS
def test_a_batch_is_the_head_and_due_jobs_after_it_in_heap_order(
    queues: list[JobQueue], claims: FakeClaims, order: Order
) -> None:
    queue = fake_queue(queues, claims, order)
    queue.submit_many([request("m0"), request("m1")])
    clock = queue.clock
    assert isinstance(clock, FakeClock)
    clock.advance(1.0)
    queue.submit_many([request("h0", HIGH), request("m2"), request("m3")])
    batch = queue.take_batch("a", 0, more=3)
    expected = {Order.TIME: ["m0", "m1", "h0", "m2"], Order.PRIORITY: ["h0", "m0", "m1", "m2"]}
    assert ids(batch) == expected[order]
    assert all(a.lease.worker_id == "a" and a.lease.attempt == 1 for a in batch)
    assert len(queue) == 1 and queue.find("m3") is not None


def test_nothing_is_prefetched_without_claims_or_for_a_worker_with_no_slot(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    for queue, worker in ((fake_queue(queues, None), "a"), (fake_queue(queues, claims), "far")):
        queue.submit_many([request("j0"), request("j1")])
        assert ids(queue.take_batch(worker, 0, more=3)) == ["j0"]


def test_prefetch_stops_at_a_job_not_due_with_a_timeout_or_refused(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many(
        [
            request("j0"),
            request("j1"),
            request("timed", timeout=5.0),
            request("j3"),
            request("later", delay=1.0),
        ]
    )
    assert ids(queue.take_batch("a", 0, more=7)) == ["j0", "j1"]
    assert ids(queue.take_batch("b", 0, more=7)) == ["timed", "j3"]  # first: as any take
    queue.submit_many([request("run"), request("plain")])
    refused = queue.take_batch("c", 0, more=7, prefetchable=lambda job: job.job_id != "plain")
    assert ids(refused) == ["run"]


def test_two_idle_takers_get_one_job_each_and_nothing_is_revoked(claims: FakeClaims) -> None:
    clock = FakeClock()
    queue = JobQueue(clock=clock, claims=claims)
    answers: dict[str, list[str]] = {}

    def take(worker_id: str) -> None:
        answers[worker_id] = ids(queue.take_batch(worker_id, 60.0, more=3))

    takers = [threading.Thread(target=take, args=(w,), daemon=True) for w in ("a", "b")]
    try:
        for thread in takers:
            thread.start()
        clock.wait_parked(2)
        queue.submit_many([request("j0"), request("j1")])
        for thread in takers:
            thread.join(JOIN)
    finally:
        queue.close()
    assert sorted(answers.values()) == [["j0"], ["j1"]]
    assert claims.revokes == []


# ------------------------------------------------------------------------------ revoking


def test_an_idle_taker_takes_back_what_another_worker_has_not_started(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(4)])
    batch = queue.take_batch("a", 0, more=3)
    claims.received("a", lease(batch, "j0"))  # a runs j0, long
    stolen = queue.take_batch("b", 0)
    assert ids(stolen) == ["j1"]
    assert stolen[0].lease.attempt == 1  # a never received it: no attempt counted
    assert claims.revokes == [("a", lease(batch, "j1"))]
    assert not claims.claim("a", lease(batch, "j1"))  # a moves on: its batch is over
    assert drain(queue) == ["j2", "j3"]


def test_taking_back_leaves_the_jobs_already_started(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(4)])
    batch = queue.take_batch("a", 0, more=3)
    assert claims.claim("a", lease(batch, "j1"))  # a started j1 (it ran j0)
    assert ids(queue.take_batch("b", 0, more=1)) == ["j2", "j3"]
    assert not claims.claim("a", lease(batch, "j2"))
    found = queue.find("j1")  # still in flight with a
    assert found is not None and found[1] == "a"


def test_a_worker_reporting_its_batch_leaves_nothing_to_take_back(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(3)])
    batch = queue.take_batch("a", 0, more=2)
    for assignment in batch[1:]:
        assert claims.claim("a", assignment.lease.lease_id)
    for assignment in batch:
        queue.complete(assignment.lease.lease_id, done(assignment), "a")
    assert queue.take_batch("b", 0) == []
    assert claims.revokes == []  # nothing left to revoke: no call into a's slot


@pytest.mark.parametrize("order", [Order.PRIORITY], ids=["priority"])
def test_a_due_job_that_goes_first_takes_back_the_prefetched_jobs_after_it(
    queues: list[JobQueue], claims: FakeClaims, order: Order
) -> None:
    queue = fake_queue(queues, claims, order)
    queue.submit_many([request(f"m{n}") for n in range(3)])
    batch = queue.take_batch("a", 0, more=2)
    claims.received("a", lease(batch, "m0"))
    queue.submit(request("urgent", HIGH))
    assert claims.revokes == [("a", lease(batch, "m1"))]
    assert not claims.claim("a", lease(batch, "m1"))
    assert drain(queue) == ["urgent", "m1", "m2"]


def test_a_job_that_goes_after_them_takes_nothing_back(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(3)])
    queue.take_batch("a", 0, more=2)
    clock = queue.clock
    assert isinstance(clock, FakeClock)
    clock.advance(0.001)
    queue.submit(request("next", HIGH))  # due later than they were: after them by time
    assert claims.revokes == []


def test_a_requeued_job_goes_before_the_prefetched_ones(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(4)])
    first = queue.take_batch("b", 0)  # j0, to a worker that will die
    batch = queue.take_batch("a", 0, more=2)
    claims.received("a", lease(batch, "j1"))
    [lost] = queue.release_worker("b")
    assert queue.requeue(lost.job, retry=True)
    assert claims.revokes == [("a", lease(batch, "j2"))]
    assert ids(first) == ["j0"] and drain(queue) == ["j0", "j2", "j3"]


def test_cancelling_a_prefetched_job_takes_it_back_and_cancels_it(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(3)])
    batch = queue.take_batch("a", 0, more=2)
    claims.received("a", lease(batch, "j0"))
    assert queue.cancel("j1")
    assert not claims.claim("a", lease(batch, "j1"))
    assert not queue.cancel("j0")  # started: it runs
    assert drain(queue) == ["j2"]
    assert queue.stats().cancelled == 1


def test_a_leaving_worker_gives_back_what_it_did_not_start(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request(f"j{n}") for n in range(4)])
    batch = queue.take_batch("a", 0, more=3)
    assert claims.claim("a", lease(batch, "j1"))
    assert queue.revoke("a") == 2
    assert drain(queue) == ["j2", "j3"]
    assert queue.revoke("a") == 0


def test_revoked_jobs_are_told_to_the_journal_as_pending_again(claims: FakeClaims) -> None:
    queue = JobQueue(clock=FakeClock(), claims=claims)
    returned: list[tuple[str, int]] = []
    queue.set_on_returned(lambda job: returned.append((job.job_id, job.attempt)))
    try:
        queue.submit_many([request(f"j{n}") for n in range(3)])
        queue.take_batch("a", 0, more=2)
        queue.revoke("a")
        assert returned == [("j1", 0), ("j2", 0)]  # no attempt counted
        assert drain(queue) == ["j1", "j2"]
    finally:
        queue.close()


def test_a_worker_whose_batch_is_being_taken_back_gets_nothing_until_that_ends(
    claims: FakeClaims,
) -> None:
    clock = FakeClock()
    queue = JobQueue(clock=clock, claims=claims)
    queue.submit_many([request(f"j{n}") for n in range(3)])
    batch = queue.take_batch("a", 0, more=2)
    claims.received("a", lease(batch, "j0"))
    claims.gate = threading.Event()  # b's revocation of a's batch stalls in a's slot
    answers: dict[str, list[str]] = {}

    def take(worker_id: str) -> None:
        answers[worker_id] = ids(queue.take_batch(worker_id, 60.0))

    threads = [threading.Thread(target=take, args=(w,), daemon=True) for w in ("b", "a")]
    try:
        threads[0].start()
        assert claims.entered.wait(JOIN)  # b found nothing due and is taking a's back
        clock.advance(0.001)
        queue.submit(request("other"))  # due: a must not get it while a's jobs are out
        threads[1].start()
        clock.wait_parked(1)  # a waits for the revocation of its batch to end
        assert "a" not in answers
        claims.gate.set()
        for thread in threads:
            thread.join(JOIN)
    finally:
        claims.gate.set()
        queue.close()
    assert answers == {"b": ["j1"], "a": ["j2"]}  # j1, j2 went back before "other"


def done(assignment: Assignment) -> Outcome:
    return Outcome(assignment.lease.job_id, True, b"", "", None)


# ---------------------------------------------------------------------------- under load


def test_every_job_runs_once_or_is_cancelled_while_workers_steal_from_each_other() -> None:
    """Workers take batches, claim, run and report, some jobs long; a submitter adds jobs
    in small bursts (some urgent, overtaking prefetched ones); a canceller cancels at random
    near the newest. Each job must end exactly once: run by one worker, or cancelled, never
    both, never twice, never neither."""
    workers = ("w0", "w1", "w2")
    claims = FakeClaims(*workers)
    queue = JobQueue(clock=SystemClock(), order=Order.PRIORITY, claims=claims)
    runs: Counter[str] = Counter()
    cancelled: set[str] = set()
    record = threading.Lock()
    total, burst = 4000, 20
    submitted = [0]  # jobs submitted so far
    errors: list[BaseException] = []

    def work(worker_id: str) -> None:
        rng = random.Random(worker_id)
        try:
            while True:
                batch = queue.take_batch(worker_id, 0.2, more=rng.randint(0, 7))
                for i, assignment in enumerate(batch):
                    lease_id = assignment.lease.lease_id
                    if i == 0:
                        claims.received(worker_id, lease_id)
                    elif not claims.claim(worker_id, lease_id):
                        break
                    with record:
                        runs[assignment.lease.job_id] += 1
                    if rng.random() < 0.02:
                        time.sleep(0.002)  # a long job: the others' batches run dry
                    queue.complete(lease_id, done(assignment), worker_id)
        except SchedulerShutdownError:
            pass
        except BaseException as exc:
            errors.append(exc)

    def submit() -> None:
        for start in range(0, total, burst):
            priority = HIGH if start % (5 * burst) == 0 else MEDIUM
            queue.submit_many([request(f"j{n}", priority) for n in range(start, start + burst)])
            submitted[0] = start + burst
            time.sleep(0.0005)  # bursts: workers find the heap empty and take back

    def cancel() -> None:
        rng = random.Random(3)
        while submitted[0] < total:
            job_id = f"j{max(0, submitted[0] - rng.randrange(1, 2 * burst))}"
            if queue.cancel(job_id):
                with record:
                    cancelled.add(job_id)
            time.sleep(0.0002)

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in workers]
    side = [threading.Thread(target=f, daemon=True) for f in (submit, cancel)]
    try:
        for thread in threads + side:
            thread.start()
        for thread in side:
            thread.join(JOIN)
        while len(queue) or not queue.wait_drained(0):
            assert queue.wait_drained(JOIN)
    finally:
        queue.close()
        for thread in threads:
            thread.join(JOIN)
    assert not errors
    twice = {job_id for job_id, n in runs.items() if n > 1}
    assert not twice, f"ran more than once: {sorted(twice)[:10]}"
    assert not (set(runs) & cancelled), "a cancelled job ran"
    assert set(runs) | cancelled == {f"j{n}" for n in range(total)}, "a job was lost"
    assert claims.revokes, "nothing was ever taken back: the test exercised too little"


def test_jobs_prefetched_are_in_flight_with_their_worker(
    queues: list[JobQueue], claims: FakeClaims
) -> None:
    queue = fake_queue(queues, claims)
    queue.submit_many([request("j0"), request("j1")])
    queue.take_batch("a", 0, more=1)
    listed: list[tuple[Job, str | None]] = queue.jobs()
    assert [(job.job_id, worker) for job, worker in listed] == [("j0", "a"), ("j1", "a")]
