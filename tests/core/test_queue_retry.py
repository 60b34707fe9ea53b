"""JobQueue.retry: a failed attempt's end and its return to the heap with its back-off, in
one step, on a fake clock."""

from __future__ import annotations

from fakeclock import FakeClock

from mpsched import RetryPolicy
from mpsched._core.job import JobRequest, Outcome, OutcomeKind, Priority
from mpsched._core.queue import JobQueue
from mpsched._core.retrying import backoff, retry_delay

TERMS = RetryPolicy(3, backoff=2.0, factor=3.0, jitter=0.25).terms()


def failed(job_id: str, kind: str = OutcomeKind.RETRYABLE) -> Outcome:
    return Outcome(job_id, False, b"exc", "Traceback...\nValueError: no", 0.0, kind)


def submit(queue: JobQueue, job_id: str = "j") -> None:
    queue.submit(
        JobRequest(
            job_id,
            "c",
            b"p",
            Priority.MEDIUM.level,
            0.0,
            None,
            retries=TERMS.max_retries,
            retry=TERMS,
        )
    )


def delay_of(outcome: Outcome):
    return lambda job: retry_delay(job.job_id, job.attempt, job.retry, outcome.error_kind)


def test_a_retry_is_never_handed_out_before_its_back_off_and_is_on_time():
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    submit(queue)
    for attempt in range(1, TERMS.max_retries + 1):
        assignment = queue.take("w", 0)
        assert assignment is not None and assignment.lease.attempt == attempt
        outcome = failed("j")
        job, delay = queue.retry(assignment.lease.lease_id, outcome, "w", delay_of(outcome))
        assert job is not None and delay == backoff(TERMS, "j", attempt)
        base = 2.0 * 3.0 ** (attempt - 1)
        assert base * 0.75 <= delay <= base * 1.25
        clock.advance(delay - 1e-6)
        assert queue.take("w", 0) is None  # never early
        assert queue.stats().pending["medium"] == 1
        clock.advance(2e-6)
    last = queue.take("w", 0)
    assert last is not None and last.lease.attempt == TERMS.max_retries + 1
    outcome = failed("j")
    job, delay = queue.retry(last.lease.lease_id, outcome, "w", delay_of(outcome))
    assert job is not None and delay is None  # the budget is spent: it ended
    stats = queue.stats()
    assert (stats.failed, stats.retried_exception, stats.in_flight) == (1, 3, 0)
    assert sum(stats.pending.values()) == 0


def test_a_late_report_of_an_ended_lease_changes_nothing():
    queue = JobQueue(clock=FakeClock())
    submit(queue)
    assignment = queue.take("w", 0)
    assert assignment is not None
    queue.release_worker("w")
    outcome = failed("j")
    assert queue.retry(assignment.lease.lease_id, outcome, "w", delay_of(outcome)) == (None, None)


def test_retry_later_is_counted_apart_and_keeps_its_own_delay():
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    submit(queue)
    assignment = queue.take("w", 0)
    assert assignment is not None
    outcome = failed("j", "retry-later:7.5")
    _, delay = queue.retry(assignment.lease.lease_id, outcome, "w", delay_of(outcome))
    assert delay == 7.5
    stats = queue.stats()
    assert (stats.retried_later, stats.retried_exception, stats.failed) == (1, 0, 0)
    clock.advance(7.4)
    assert queue.take("w", 0) is None
    clock.advance(0.2)
    assert queue.take("w", 0) is not None
