from __future__ import annotations

from mpsched._core.job import Job, Outcome
from mpsched._manager.failures import KEEP, MAX_TRACEBACK, RecentFailures

TRACEBACK = 'Traceback (most recent call last):\n  File "jobs.py", line 3\nValueError: boom\n'


def job(job_id: str) -> Job:
    return Job(
        job_id=job_id,
        client_id="c",
        payload=b"",
        priority=2,
        due=0.0,
        seq=0,
        name="jobs:fail",
        attempt=1,
    )


def test_a_failure_is_named_by_its_tracebacks_last_line_or_the_managers_message() -> None:
    failures = RecentFailures()
    failures.note(job("a"), Outcome("a", False, b"", TRACEBACK, 1.0), "w1")
    failures.note(
        job("b"),
        Outcome("b", False, b"", "", None, "WorkerCrashedError"),
        "w2",
        "WorkerCrashedError: worker w2 died (exit code -9)",
    )
    newest, oldest = failures.latest()
    assert (newest.job_id, newest.error, newest.traceback) == (
        "b",
        "WorkerCrashedError: worker w2 died (exit code -9)",
        "",
    )
    assert (oldest.job_id, oldest.name, oldest.worker_id, oldest.attempt, oldest.error) == (
        "a",
        "jobs:fail",
        "w1",
        1,
        "ValueError: boom",
    )


def test_only_the_latest_failures_and_the_end_of_long_tracebacks_are_kept() -> None:
    failures = RecentFailures()
    long = "x" * (2 * MAX_TRACEBACK) + "\nValueError: deep"
    for i in range(KEEP + 5):
        failures.note(job(f"j{i}"), Outcome(f"j{i}", False, b"", long, 1.0), None)
    kept = failures.latest()
    assert [f.job_id for f in kept] == [f"j{i}" for i in reversed(range(5, KEEP + 5))]
    assert kept[0].traceback.endswith("ValueError: deep")
    assert len(kept[0].traceback) <= MAX_TRACEBACK + 10
    assert kept[0].error == "ValueError: deep"
