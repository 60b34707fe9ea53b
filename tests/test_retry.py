"""Retries of jobs that raise, on a Scheduler without a store: the budget, the back-off,
the filter, RetryLater, the notes of the final exception, and what a listing shows."""

from __future__ import annotations

import pytest
import retry_jobs
from processes import wait_for

from mpsched import InvalidJobError, JobError, RetryLater, RetryPolicy
from mpsched._core.retrying import backoff

FAST = RetryPolicy(3, backoff=0.01, jitter=0.0)


@pytest.fixture
def scheduler(make_scheduler):
    return make_scheduler(workers=2)


def test_a_job_that_always_raises_runs_exactly_its_budget_plus_one(scheduler, tmp_path):
    log = str(tmp_path / "starts")
    error = scheduler.schedule(retry_jobs.always_fail, log, retry=FAST).exception(timeout=60)
    assert isinstance(error, ValueError) and str(error) == "boom 4"
    assert len(retry_jobs.starts(log)) == 4
    notes = retry_jobs.notes(error)
    assert len(notes) == 3
    for attempt, note in enumerate(notes, 1):
        assert note.startswith(f"attempt {attempt} failed at 20")
        assert note.endswith(f"ValueError: boom {attempt}")
    stats = scheduler.stats().queue
    assert (stats.retried_exception, stats.failed, stats.completed) == (3, 1, 0)


def test_retry_as_an_int_is_a_policy_and_a_success_ends_the_retries(scheduler, tmp_path):
    log = str(tmp_path / "starts")
    policy = RetryPolicy(5, backoff=0.01, jitter=0.0)
    future = scheduler.schedule(retry_jobs.fail_times, log, 2, "done", retry=policy)
    assert future.result(timeout=60) == "done"
    assert len(retry_jobs.starts(log)) == 3
    info = scheduler.job_info(future.job_id)
    assert (info.state, info.attempts) == ("done", 3)
    assert scheduler.schedule(abs, -2, retry=2).result(timeout=60) == 2


def test_no_retry_starts_before_its_back_off(scheduler, tmp_path):
    log = str(tmp_path / "starts")
    policy = RetryPolicy(3, backoff=0.15, factor=2.0, jitter=0.3)
    future = scheduler.schedule(retry_jobs.always_fail, log, retry=policy)
    assert isinstance(future.exception(timeout=60), ValueError)
    starts = retry_jobs.starts(log)
    assert len(starts) == 4
    for n in range(1, 4):  # each attempt raised right after its logged start
        due = backoff(policy.terms(), future.job_id, n)
        assert 0.15 * 2 ** (n - 1) * 0.7 <= due <= 0.15 * 2 ** (n - 1) * 1.3
        assert starts[n] - starts[n - 1] >= due


@pytest.mark.parametrize(
    ("policy", "raised", "runs"),
    [
        (RetryPolicy(2, backoff=0.01, never=(retry_jobs.Fatal,)), "Fatal", 1),
        (RetryPolicy(2, backoff=0.01, never=(retry_jobs.Fatal,)), "Flaky", 3),
        (RetryPolicy(2, backoff=0.01, on=(retry_jobs.Flaky,)), "KeyError", 1),
        (RetryPolicy(2, backoff=0.01, on=(retry_jobs.Flaky,)), "Flaky", 3),
        (RetryPolicy(2, backoff=0.01), "KeyboardInterrupt", 1),
        (RetryPolicy(2, backoff=0.01), "SystemExit", 1),
        (RetryPolicy(2, backoff=0.01, on=(Exception, KeyboardInterrupt)), "KeyboardInterrupt", 3),
        (RetryPolicy(2, backoff=0.01, on=(SystemExit,)), "SystemExit", 3),
    ],
    ids=[
        "never-listed",
        "never-other",
        "on-other",
        "on-listed",
        "interrupt",
        "exit",
        "interrupt-listed",
        "exit-listed",
    ],
)
def test_on_and_never_decide_what_is_retried(scheduler, tmp_path, policy, raised, runs):
    log = str(tmp_path / "starts")
    error = scheduler.schedule(retry_jobs.raise_named, log, raised, retry=policy).exception(
        timeout=60
    )
    assert error is not None
    if raised in ("KeyboardInterrupt", "SystemExit"):
        assert isinstance(error, JobError)  # never escapes into the client as itself
    assert len(retry_jobs.starts(log)) == runs
    assert len(getattr(error, "__notes__", [])) == runs - 1


def test_retry_later_without_a_policy_runs_three_more_times(scheduler, tmp_path):
    log = str(tmp_path / "starts")
    error = scheduler.schedule(retry_jobs.later, log, 0.01, "busy").exception(timeout=60)
    assert isinstance(error, RetryLater) and error.reason == "busy"
    assert len(retry_jobs.starts(log)) == 4
    notes = retry_jobs.notes(error)
    assert len(notes) == 3 and "mpsched.RetryLater: busy" in notes[0]
    assert scheduler.stats().queue.retried_later == 3


def test_retry_later_keeps_its_delay_and_counts_against_a_policy(scheduler, tmp_path):
    log = str(tmp_path / "starts")
    future = scheduler.schedule(
        retry_jobs.later, log, 0.3, times=1, retry=RetryPolicy(1, backoff=100.0)
    )
    assert future.result(timeout=60) == 2
    starts = retry_jobs.starts(log)
    assert starts[1] - starts[0] >= 0.3
    log2 = str(tmp_path / "starts2")
    error = scheduler.schedule(retry_jobs.later, log2, 0.01, retry=1).exception(timeout=60)
    assert isinstance(error, RetryLater) and len(retry_jobs.starts(log2)) == 2


def test_a_job_waiting_for_its_retry_is_pending_with_its_attempts_and_last_error(
    scheduler, tmp_path
):
    log = str(tmp_path / "starts")
    future = scheduler.schedule(retry_jobs.later, log, 600, "rate limited by the API")
    wait_for(lambda: scheduler.job_info(future.job_id).attempts == 1, what="the first run")
    wait_for(lambda: scheduler.job_info(future.job_id).state == "pending", what="pending")
    info = scheduler.job_info(future.job_id)
    assert info.error == "mpsched.RetryLater: rate limited by the API"
    assert [i.error for i in scheduler.jobs(state="pending")] == [info.error]
    assert scheduler.job_info(scheduler.submit(abs, 1).job_id).error is None
    assert future.cancel()


@pytest.mark.parametrize("store", [False, True], ids=["memory", "sqlite"])
def test_a_worker_death_counts_against_the_policy_and_is_retried_at_once(
    make_scheduler, tmp_path, store
):
    scheduler = make_scheduler(workers=2, **({"store": tmp_path / "jobs.db"} if store else {}))
    log = str(tmp_path / "starts")
    policy = RetryPolicy(2, backoff=0.01, jitter=0.0)
    future = scheduler.schedule(retry_jobs.crash_first, log, retry=policy)
    error = future.exception(timeout=60)
    assert isinstance(error, retry_jobs.Flaky) and str(error) == "run 3"
    assert len(retry_jobs.starts(log)) == 3
    assert "WorkerCrashedError" in retry_jobs.notes(error)[0]
    assert "Flaky: run 2" in retry_jobs.notes(error)[1]
    stats = scheduler.stats().queue
    assert (stats.retried, stats.retried_exception) == (1, 1)
    info = scheduler.job_info(future.job_id)
    assert info.attempts == 3 and info.error is not None and info.error.endswith("run 3")


def test_each_run_of_a_schedule_gets_the_policy(scheduler, tmp_path):
    log = str(tmp_path / "starts")
    schedule = scheduler.every(
        3600, retry_jobs.always_fail, log, start=0, retry=RetryPolicy(2, backoff=0.01)
    )
    wait_for(lambda: schedule.info().counters.failed == 1, what="the first run's end")
    assert len(retry_jobs.starts(log)) == 3
    schedule.cancel()


def test_retry_with_retries_or_a_bad_value_is_refused_at_the_call_site(scheduler):
    with pytest.raises(InvalidJobError, match="not both"):
        scheduler.schedule(abs, 1, retry=2, retries=1)
    with pytest.raises(InvalidJobError):
        scheduler.schedule(abs, 1, retry="3")
    with pytest.raises(InvalidJobError):
        scheduler.every(60, abs, 1, retry=1, retries=1)
    assert scheduler.stats().queue.submitted == 0
