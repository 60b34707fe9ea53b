"""What a manager keeps for long is left out of the garbage collector's full walks: the jobs
it remembers after they end (EndedJobs), and what it built before it served
(settle_collector)."""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Iterator
from typing import Any

import pytest
from fakeclock import FakeClock

from mpsched._core.job import Job, JobState, Outcome
from mpsched._core.retrying import RetryTerms
from mpsched._manager import main as manager_main
from mpsched._manager.retained import EndedJobs
from mpsched._protocol.records import ManagerConfig, StartMethod


def tracked() -> int:
    """Objects the collector walks in a full collection, after two: a collection stops
    tracking a tuple once it finds its items untracked, and a tuple made of tuples may be
    looked at before its items are."""
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


def ended_job(i: int, *, every_field: bool = False) -> Job:
    job = Job(f"job-{i}", "client", b"args", 2, i + 0.25, i, name="m:f")
    if every_field:  # each unlike the others: a field kept in another's place shows
        job.timeout, job.retries, job.attempt, job.key, job.at = 9.0, 4, 3, f"k{i}", 1e9
        job.cancelled = True
        job.retry = RetryTerms(3, 1.0, 2.0, 60.0, 0.1)
        job.error, job.notes, job.progress = "ValueError: x", ["one", "two"], "0.5"
        job.queue, job.limit = "gpu", "db"
    return job


def test_ended_jobs_kept_are_not_walked_by_the_collector() -> None:
    """1,000 kept jobs of each kind (done with a result, failed with its arguments and every
    field set) add no object to a full collection's walk; as Job, Ended and Outcome
    objects they added three each."""
    ended = EndedJobs(60.0, FakeClock().now)
    before = tracked()
    for i in range(1_000):
        done = Outcome(f"job-{i}", True, b"r", "", 2.0)
        ended.add_locked(ended_job(i), JobState.DONE, "w", 1.0, done)
        failed = ended_job(1_000 + i, every_field=True)
        outcome = Outcome(failed.job_id, False, b"e", "Traceback", None, "")
        ended.add_locked(failed, JobState.FAILED, "w", 1.0, outcome)
    assert len(ended) == 2_000
    assert tracked() - before < 100  # the EndedJobs and its dict, and this frame's; not 6,000


def test_an_ended_job_comes_back_as_it_was_kept() -> None:
    clock = FakeClock()
    ended = EndedJobs(60.0, clock.now)
    job = ended_job(7, every_field=True)
    defaults = [f.name for f in dataclasses.fields(Job) if getattr(job, f.name) == f.default]
    assert defaults == [], "set every field (a new one must be kept by retained._keep too)"
    outcome = Outcome(job.job_id, False, bytearray(b"error"), "Traceback", 5.0, "")
    ended.add_locked(job, JobState.FAILED, "w1", 123.5, outcome)
    again = ended.get_locked(job.job_id)
    assert again is not None
    assert vars_of(again.job) == vars_of(job)
    assert isinstance(again.job.retry, RetryTerms) and again.job.notes == ["one", "two"]
    assert (again.state, again.worker_id, again.finished_wall) == (JobState.FAILED, "w1", 123.5)
    assert again.outcome == outcome and isinstance(again.outcome, Outcome)
    assert again.kept_until == clock.now() + 60.0
    listed = ended.all_locked(JobState.FAILED, 1)
    assert [vars_of(e.job) for e in listed] == [vars_of(job)]
    assert ended.all_locked(JobState.DONE) == []
    forgotten = ended.forget_locked(job.job_id)
    assert forgotten is not None and vars_of(forgotten.job) == vars_of(job)
    assert ended.get_locked(job.job_id) is None and len(ended) == 0


def vars_of(job: Job) -> dict[str, Any]:
    return {name: getattr(job, name) for name in Job.__slots__}


@pytest.fixture
def thawed() -> Iterator[None]:
    """Whatever a test freezes goes back to the collector's care at its end."""
    yield
    gc.unfreeze()


def test_settle_collector_leaves_what_lives_now_out_of_later_walks(thawed: None) -> None:
    built = [{"object": i} for i in range(10_000)]  # a service's worth of long-lived objects
    manager_main.settle_collector()
    assert gc.get_freeze_count() > len(built)
    assert tracked() < 1_000


def test_run_manager_settles_the_collector_before_it_serves(
    thawed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen: list[int] = []

    def serve(*_args: Any) -> int:
        frozen.append(gc.get_freeze_count())
        return 0

    monkeypatch.setattr(manager_main, "serve", serve)
    assert (
        manager_main.run_manager(
            ManagerConfig(authkey=b"k", workers=0, mp_method=StartMethod.SPAWN)
        )
        == 0
    )
    assert frozen and frozen[0] > 10_000
