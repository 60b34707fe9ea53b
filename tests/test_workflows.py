"""Workflows end to end: jobs after others (``after=``, ``ResultOf``), with real workers,
without a store and with a SQLite store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import flow_jobs
import jobs
import pytest
import retry_jobs
from processes import wait_for

import mpsched
from mpsched import (
    DependencyFailedError,
    InvalidJobError,
    JobNotFoundError,
    ResultOf,
    RetryPolicy,
    Scheduler,
)

MakeScheduler = Callable[..., Scheduler]


@pytest.fixture(params=["none", "sqlite"])
def sched(
    request: pytest.FixtureRequest, make_scheduler: MakeScheduler, tmp_path: Path
) -> Scheduler:
    if request.param == "sqlite":
        return make_scheduler(workers=2, store=str(tmp_path / "jobs.db"))
    return make_scheduler(workers=2)


def before(lines: list[str], first: str, then: str) -> bool:
    return lines.index(first) < lines.index(then)


def test_a_chain_of_three_runs_in_order_with_the_results_passed(sched: Scheduler, tmp_path: Path):
    log = str(tmp_path / "log")
    a = sched.schedule(flow_jobs.slow_step, log, "a", 0.3)
    b = sched.schedule(flow_jobs.step, log, "b", ResultOf(a))
    c = sched.schedule(flow_jobs.step, log, "c", ResultOf(b))
    assert c.result(timeout=30) == ("a", "b", "c")
    assert b.result() == ("a", "b") and a.result() == ("a",)
    lines = flow_jobs.order(log)
    assert lines == ["start a", "end a", "start b", "end b", "start c", "end c"]


def test_a_fan_out_of_twenty_and_their_fan_in_run_each_once(sched: Scheduler, tmp_path: Path):
    log = str(tmp_path / "log")
    root = sched.schedule(flow_jobs.square, log, "root", 100, 0, delay=0.2)
    parts = [sched.schedule(flow_jobs.square, log, f"p{i}", ResultOf(root), i) for i in range(20)]
    combined = sched.schedule(flow_jobs.total, log, "sum", [ResultOf(p) for p in parts])
    assert combined.result(timeout=60) == sum(100 + i * i for i in range(20))
    lines = flow_jobs.order(log)
    started = flow_jobs.starts(log)
    assert sorted(started) == sorted(["root", "sum", *(f"p{i}" for i in range(20))])
    assert all(before(lines, "end root", f"start p{i}") for i in range(20))
    assert all(before(lines, f"end p{i}", "start sum") for i in range(20))


def test_a_diamond_runs_each_job_once_after_its_parents(sched: Scheduler, tmp_path: Path):
    log = str(tmp_path / "log")
    a = sched.schedule(flow_jobs.step, log, "a")
    b = sched.submit(flow_jobs.slow_step, log, "b", 0.2, ResultOf(a))
    c = sched.schedule(flow_jobs.step, log, "c", ResultOf(a))
    d = sched.schedule(flow_jobs.step, log, "d", ResultOf(b), ResultOf(c))
    assert d.result(timeout=30) == ("a", "b", "a", "c", "d")
    lines = flow_jobs.order(log)
    assert flow_jobs.starts(log).count("a") == 1 and len(lines) == 8
    assert before(lines, "end a", "start b") and before(lines, "end a", "start c")
    assert before(lines, "end b", "start d") and before(lines, "end c", "start d")


def test_after_without_a_result_waits_and_keeps_its_own_arguments(sched: Scheduler, tmp_path: Path):
    log = str(tmp_path / "log")
    a = sched.schedule(flow_jobs.slow_step, log, "a", 0.3)
    b = sched.schedule(flow_jobs.step, log, "b", [1, 2], after=[a.job_id])
    assert b.result(timeout=30) == ("[1, 2]", "b")
    first = sched.schedule(flow_jobs.step, log, "first", after=[])  # no parent: runs now
    assert first.result(timeout=30) == ("first",)
    assert flow_jobs.order(log)[:3] == ["start a", "end a", "start b"]


def test_a_failed_parent_fails_its_whole_downstream_at_once(sched: Scheduler, tmp_path: Path):
    log = str(tmp_path / "log")
    gate = sched.schedule(flow_jobs.slow_step, log, "gate", 0.5)
    a = sched.schedule(flow_jobs.fail, "broken", after=[gate])
    b = sched.schedule(flow_jobs.step, log, "b", after=[a])
    c = sched.schedule(flow_jobs.step, log, "c", ResultOf(b))
    d = sched.schedule(flow_jobs.step, log, "d", ResultOf(c), ResultOf(gate))
    for child, parent in ((b, a), (c, b), (d, c)):
        error = child.exception(timeout=30)
        assert isinstance(error, DependencyFailedError) and isinstance(error, mpsched.JobError)
        assert error.parent_id == parent.job_id
    assert "ValueError: broken" in str(b.exception())
    assert sched.jobs(state="pending") == []
    assert "start b" not in flow_jobs.order(log)
    assert {i.job_id: i.state for i in sched.jobs()}[d.job_id] == "failed"


def test_allow_failure_runs_the_dependent_with_the_exception(sched: Scheduler):
    a = sched.submit(flow_jobs.fail, "broken")
    b = sched.schedule(flow_jobs.describe, ResultOf(a), allow_failure=True)
    c = sched.schedule(flow_jobs.describe, "ran", after=[a], allow_failure=True)
    assert b.result(timeout=30) == "ValueError: broken"
    assert c.result(timeout=30) == "'ran'"


def test_a_parent_that_ended_already_counts_as_ended(sched: Scheduler):
    a = sched.submit(flow_jobs.describe, 5)
    assert a.result(timeout=30) == "5"
    b = sched.schedule(flow_jobs.describe, ResultOf(a))
    assert b.result(timeout=30) == "'5'"
    failed = sched.submit(flow_jobs.fail, "x")
    failed.exception(timeout=30)
    c = sched.schedule(flow_jobs.describe, 1, after=[failed])
    assert isinstance(c.exception(timeout=30), DependencyFailedError)


def test_cancelling_a_dependent_leaves_its_parent_and_cancelling_a_parent_fails_them(
    sched: Scheduler,
):
    parent = sched.schedule(flow_jobs.describe, 1, delay=60)
    child = sched.schedule(flow_jobs.describe, 2, after=[parent])
    other = sched.schedule(flow_jobs.describe, ResultOf(parent))
    assert sched.job_info(child.job_id).waiting_for == "after 1 jobs"
    assert child.cancel() and child.cancelled()
    assert sched.job_info(parent.job_id).state == "pending"
    assert sched.job_info(other.job_id).state == "pending"
    assert parent.cancel()
    error = other.exception(timeout=30)
    assert isinstance(error, DependencyFailedError)
    assert error.parent_id == parent.job_id and error.outcome == "cancelled"
    assert sched.jobs(state="pending") == []


def test_an_unknown_parent_is_refused_at_the_call_site_leaving_no_trace(sched: Scheduler):
    with pytest.raises(JobNotFoundError):
        sched.schedule(flow_jobs.describe, 1, after=["no-such-job"])
    with pytest.raises(JobNotFoundError):
        sched.schedule(flow_jobs.describe, ResultOf("no-such-job"))
    assert sched.jobs() == []


def test_bad_parents_and_schedules_with_parents_are_refused(sched: Scheduler):
    a = sched.schedule(flow_jobs.describe, 1, delay=60)
    with pytest.raises(InvalidJobError):
        sched.schedule(flow_jobs.describe, 1, after=cast(Any, [3]))
    with pytest.raises(InvalidJobError):
        sched.schedule(flow_jobs.describe, 1, after=[a], key="k")
    with pytest.raises(InvalidJobError):
        ResultOf(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="schedule cannot have parents"):
        sched.every(10, flow_jobs.describe, 1, after=[a])
    with pytest.raises(InvalidJobError, match="schedule cannot have parents"):
        sched.cron("* * * * *", flow_jobs.describe, ResultOf(a))
    assert [i.job_id for i in sched.jobs()] == [a.job_id]


def test_waiting_jobs_are_listed_with_what_they_wait_for(sched: Scheduler):
    a = sched.schedule(flow_jobs.describe, 1, delay=60)
    b = sched.schedule(flow_jobs.describe, 1, delay=60)
    c = sched.schedule(flow_jobs.describe, ResultOf(a), ResultOf(b))
    listed = {i.job_id: i for i in sched.jobs(state="pending")}
    assert listed[c.job_id].waiting_for == "after 2 jobs"
    assert sched.stats().queue.pending["medium"] == 3  # a waiting job is pending too
    assert listed[a.job_id].waiting_for is None
    a.cancel()
    assert isinstance(c.exception(timeout=30), DependencyFailedError)


def test_a_recurring_run_can_be_a_parent(sched: Scheduler):
    schedule = sched.every(60, flow_jobs.describe, "tick", start=0.3, id="tick")
    wait_for(lambda: schedule.runs(1), what="a run armed")
    [run] = schedule.runs(1)
    child = sched.schedule(flow_jobs.describe, ResultOf(run))
    assert child.result(timeout=30) == repr("'tick'")
    schedule.cancel()


def test_another_clients_job_can_be_a_parent(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=2)
    other = mpsched.connect(s.address, authkey=s.authkey)
    a = other.schedule(flow_jobs.describe, "theirs", delay=0.2)
    b = s.schedule(flow_jobs.describe, ResultOf(a.job_id))
    try:
        assert b.result(timeout=30) == repr("'theirs'")
    finally:
        other.shutdown()


def test_a_large_result_reaches_its_child_through_shared_memory_and_is_cleaned_up(
    make_scheduler: MakeScheduler, prefix: str
):
    s = make_scheduler(workers=2)
    big = s.submit(flow_jobs.big, 4 << 20)
    sizes = s.schedule(flow_jobs.length, ResultOf(big), [ResultOf(big)])
    assert sizes.result(timeout=30) == (4 << 20, 4 << 20)
    assert len(big.result()) == 4 << 20
    s.shutdown()


def test_a_retried_parent_counts_as_ended_only_at_its_final_outcome(
    sched: Scheduler, tmp_path: Path
):
    parent = sched.schedule(jobs.die_once, str(tmp_path / "died"), retries=1)
    child = sched.schedule(flow_jobs.describe, ResultOf(parent))
    assert child.result(timeout=60) == "'survived'"
    crashed = sched.schedule(jobs.die_once, str(tmp_path / "again"))  # no retry left
    after_crash = sched.schedule(flow_jobs.describe, 1, after=[crashed])
    error = after_crash.exception(timeout=60)
    assert isinstance(error, DependencyFailedError) and "WorkerCrashedError" in str(error)


def test_a_parent_retried_on_its_exception_releases_its_child_at_its_final_outcome(
    sched: Scheduler, tmp_path: Path
):
    log = str(tmp_path / "runs")
    parent = sched.schedule(
        retry_jobs.fail_times, log, 2, "third time", retry=RetryPolicy(3, backoff=0.05)
    )
    child = sched.schedule(flow_jobs.describe, ResultOf(parent))
    assert child.result(timeout=60) == repr("third time")
    assert len(retry_jobs.runs(log)) == 3
    hopeless = sched.schedule(retry_jobs.always_fail, log, retry=RetryPolicy(1, backoff=0.05))
    after = sched.schedule(flow_jobs.describe, 1, after=[hopeless], retry=2)
    assert isinstance(after.exception(timeout=60), DependencyFailedError)


def test_shutdown_with_cancel_futures_cancels_the_jobs_that_wait(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=1)
    parent = s.schedule(flow_jobs.describe, 1, delay=60)
    child = s.schedule(flow_jobs.describe, ResultOf(parent))
    s.shutdown(wait=True, cancel_futures=True)
    assert parent.cancelled() and child.cancelled()


def test_a_job_with_parents_keeps_its_queue_and_limit(make_scheduler: MakeScheduler):
    s = make_scheduler(workers=2, queues=["default", "reports"], limits={"exports": 1})
    parent = s.submit(flow_jobs.describe, "data")
    child = s.schedule(flow_jobs.describe, ResultOf(parent), queue="reports", limit="exports")
    assert child.result(timeout=30) == repr("'data'")
    info = s.job_info(child.job_id)
    assert (info.queue, info.limit) == ("reports", "exports")
