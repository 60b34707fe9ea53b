"""A job's context (``mpsched.current_job()``) and the progress it reports: read inside the
job, and seen from other clients (of another manager, on Redis) while the job runs."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import context_jobs
import pytest
from processes import wait_for
from served import Manager, Processes, serve

import mpsched
from mpsched import Scheduler


def test_current_job_is_none_outside_a_job() -> None:
    assert mpsched.current_job() is None


def test_a_job_reads_its_id_attempt_retry_budget_and_due_time(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    scheduler = make_scheduler(workers=1)
    due = time.time() + 0.3
    future = scheduler.schedule(context_jobs.context, at=due, retries=2)
    seen = future.result(timeout=30)
    assert seen["job_id"] == future.job_id
    assert seen["attempt"] == 1 and seen["max_retries"] == 2
    assert seen["schedule_id"] is None
    assert seen["due"].tzinfo is timezone.utc
    assert abs(seen["due"].timestamp() - due) < 0.001
    later = scheduler.schedule(context_jobs.context, delay=0.2).result(timeout=30)
    assert later["max_retries"] == 0
    assert later["due"] <= datetime.now(timezone.utc)


def test_the_attempt_counts_the_runs_of_a_job_run_again(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    scheduler = make_scheduler(workers=1)
    marker = str(tmp_path / "died")
    future = scheduler.schedule(context_jobs.attempt_after_dying_once, marker, retries=1)
    assert future.result(timeout=60) == 2


def test_a_recurring_run_knows_its_schedule_and_its_slot(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    scheduler = make_scheduler(workers=1)
    log = tmp_path / "runs.log"
    schedule = scheduler.every(0.2, context_jobs.log_context, str(log), id="ticks")
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 2, 30, "two runs")
    schedule.cancel()
    for line in log.read_text().splitlines()[:2]:
        job_id, attempt, schedule_id, due = line.split()
        assert schedule_id == "ticks" and attempt == "1"
        slot = datetime.fromisoformat(job_id.partition("@")[2].replace("Z", "+00:00"))
        assert float(due) == slot.timestamp()  # exactly its slot


def test_bad_progress_raises_value_error_in_the_job(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    scheduler = make_scheduler(workers=1)
    errors = scheduler.submit(context_jobs.bad_progress).result(timeout=30)
    assert errors == ["ConfigError"] * 8


def _start(
    procs: Processes, store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Manager, Manager]:
    """The manager whose worker runs the job, and the one a watching client asks (the
    same one but with Redis, where it is another manager of the store)."""
    if store == "redis":
        url = request.getfixturevalue("redis_url")
        runner = serve(procs, "--address", "127.0.0.1:0", "--workers", "2", "--store", url)
        return runner, serve(procs, "--address", "127.0.0.1:0", "--workers", "0", "--store", url)
    extra = ["--store", str(tmp_path / "jobs.db")] if store == "sqlite" else []
    runner = serve(procs, "--address", "127.0.0.1:0", "--workers", "2", *extra)
    return runner, runner


@pytest.mark.slow
@pytest.mark.parametrize("store", ["none", "sqlite", "redis"])
def test_progress_is_seen_by_another_client_while_the_job_runs(
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    runner, watched = _start(procs, store, tmp_path, request)
    submitter, watcher = connect_client(runner), connect_client(watched)
    first, second = tmp_path / "first", tmp_path / "second"
    future = submitter.submit(context_jobs.progress_steps, str(first), str(second))
    plain = submitter.submit(context_jobs.add, 1, 2)
    assert plain.result(timeout=30) == 3

    def progress() -> Any:
        return watcher.job_info(future.job_id).progress

    wait_for(lambda: progress() == 0.25, 30, "the first progress")
    assert watcher.job_info(future.job_id).state == "running"
    first.touch()
    wait_for(lambda: progress() == {"step": 2, "of": 3}, 30, "the second progress")
    [listed] = [j for j in watcher.jobs(state="running") if j.job_id == future.job_id]
    assert listed.progress == {"step": 2, "of": 3}
    second.touch()
    assert future.result(timeout=30) == "done"
    # The last progress recorded stays with the ended job, while it is kept.
    assert watcher.job_info(future.job_id).progress == {"step": 2, "of": 3}
    assert watcher.job_info(plain.job_id).progress is None
