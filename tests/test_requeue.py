"""The failed-job list and requeue by id: a job that failed for good is listed with its
error (and its traceback by id) while it is kept, and ``requeue`` runs a failed or
cancelled job again under its id, from any client, the command line, after a restart of
a manager with a SQLite store, and from another manager of a Redis store."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from collections.abc import Callable
from pathlib import Path

import context_jobs
import pytest
from served import Manager, Processes, serve

import mpsched
from mpsched import InvalidJobError, JobNotFoundError, Priority
from mpsched._cli.main import main
from mpsched._protocol.records import Exit

pytestmark = pytest.mark.slow


def serve_with(procs: Processes, store: Path | str | None, workers: int) -> Manager:
    extra = [] if store is None else ["--store", str(store)]
    return serve(procs, "--address", "127.0.0.1:0", "--workers", str(workers), *extra)


def kill(manager: Manager) -> None:
    os.kill(manager.proc.pid, signal.SIGKILL)
    manager.proc.wait()


def failed_for_good(client: mpsched.Client, marker: Path) -> str:
    """Submit a job that fails (until ``marker`` exists); returns its id once it failed."""
    future = client.schedule(
        context_jobs.fail_until, str(marker), priority=Priority.HIGH, retries=2
    )
    assert isinstance(future.exception(timeout=60), ValueError)
    return future.job_id


@pytest.mark.parametrize("store", ["none", "sqlite"])
def test_another_client_lists_a_failed_job_and_requeues_it_with_its_options(
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    store: str,
) -> None:
    manager = serve_with(procs, tmp_path / "jobs.db" if store == "sqlite" else None, 1)
    submitter, other = connect_client(manager), connect_client(manager)
    marker = tmp_path / "fixed"
    job_id = failed_for_good(submitter, marker)

    [listed] = other.jobs(state="failed")
    assert (listed.job_id, listed.error) == (job_id, "ValueError: fixed is missing")
    assert listed.attempts == 1 and listed.priority is Priority.HIGH
    assert other.job_info(job_id).error == "ValueError: fixed is missing"
    error = other.job(job_id).exception(timeout=30)  # its traceback, by id
    assert isinstance(error, ValueError)
    assert "fail_until" in str(error.__cause__)

    marker.touch()
    again = other.requeue(job_id)
    assert again.job_id == job_id
    seen = again.result(timeout=60)
    # The same job, its options kept (retries=2), a fresh count of attempts.
    assert (seen["job_id"], seen["attempt"], seen["max_retries"]) == (job_id, 1, 2)
    info = other.job_info(job_id)
    assert (info.state, info.attempts, info.priority, info.error) == (
        "done",
        1,
        Priority.HIGH,
        None,
    )
    assert other.jobs(state="failed") == []
    with pytest.raises(InvalidJobError, match="it is done"):
        other.requeue(job_id)


@pytest.mark.parametrize("store", ["none", "sqlite"])
def test_a_cancelled_job_is_requeued_due_now_and_live_or_unknown_ones_are_refused(
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    store: str,
) -> None:
    manager = serve_with(procs, tmp_path / "jobs.db" if store == "sqlite" else None, 1)
    client, other = connect_client(manager), connect_client(manager)
    later = client.schedule(context_jobs.add, 2, 2, delay=3600)
    with pytest.raises(InvalidJobError, match="it is pending"):
        other.requeue(later.job_id)
    assert other.cancel(later.job_id)
    concurrent.futures.wait([later], timeout=30)
    assert later.cancelled()
    assert other.requeue(later.job_id).result(timeout=60) == 4  # due now, not in an hour
    with pytest.raises(JobNotFoundError):
        other.requeue("no-such-job")
    with pytest.raises(InvalidJobError):
        other.requeue("")


def test_the_command_line_lists_failed_jobs_with_their_error_and_requeues_one(
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    manager = serve_with(procs, None, 1)
    client = connect_client(manager)
    marker = tmp_path / "fixed"
    job_id = failed_for_good(client, marker)
    cli = ["--connect", manager.address, "--authkey-file", str(manager.key_file)]
    capsys.readouterr()

    assert main(["jobs", "--state", "failed", *cli]) == Exit.OK
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-3:] == ["progress", "last", "error"]
    assert row.startswith(job_id) and row.endswith(" ValueError: fixed is missing"), row

    marker.touch()
    assert main(["requeue", job_id, *cli]) == Exit.OK
    assert capsys.readouterr().out == f"{job_id}\n"
    assert client.job(job_id).result(timeout=60)["attempt"] == 1
    assert main(["requeue", job_id, *cli]) == Exit.FAILURE
    assert "was not requeued: it is done" in capsys.readouterr().err
    assert main(["requeue", "no-such-job", *cli]) == Exit.FAILURE
    assert "no such job" in capsys.readouterr().err


def test_a_failed_job_is_listed_and_requeued_across_restarts_of_a_sqlite_store(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], tmp_path: Path
) -> None:
    store, marker = tmp_path / "jobs.db", tmp_path / "fixed"
    first = serve_with(procs, store, 1)
    job_id = failed_for_good(connect_client(first), marker)
    kill(first)

    idle = serve_with(procs, store, 0)  # no worker: the requeued job stays pending
    client = connect_client(idle)
    [listed] = client.jobs(state="failed")
    assert (listed.job_id, listed.error) == (job_id, "ValueError: fixed is missing")
    marker.touch()
    client.requeue(job_id)
    assert client.job_info(job_id).state == "pending"
    kill(idle)  # after the requeue, before the job ran

    last = serve_with(procs, store, 1)
    seen = connect_client(last).job(job_id).result(timeout=60)
    assert (seen["job_id"], seen["attempt"], seen["max_retries"]) == (job_id, 1, 2)


def test_a_client_of_another_redis_manager_lists_and_requeues_a_failed_job(
    procs: Processes,
    connect_client: Callable[[Manager], mpsched.Client],
    tmp_path: Path,
    redis_url: str,
) -> None:
    runner, idle = serve_with(procs, redis_url, 1), serve_with(procs, redis_url, 0)
    marker = tmp_path / "fixed"
    job_id = failed_for_good(connect_client(runner), marker)
    other = connect_client(idle)
    [listed] = other.jobs(state="failed")
    assert (listed.job_id, listed.error) == (job_id, "ValueError: fixed is missing")
    marker.touch()
    seen = other.requeue(job_id).result(timeout=60)  # run by the other manager's worker
    assert (seen["job_id"], seen["attempt"], seen["max_retries"]) == (job_id, 1, 2)
    assert other.job_info(job_id).state == "done"
    with pytest.raises(InvalidJobError, match="it is done"):
        other.requeue(job_id)


def test_a_job_requeued_through_a_redis_manager_killed_after_runs_on_another(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], redis_url: str
) -> None:
    requeuer = serve_with(procs, redis_url, 0)
    client = connect_client(requeuer)
    later = client.schedule(context_jobs.add, 20, 22, delay=3600, retries=1)
    assert client.cancel(later.job_id)
    client.requeue(later.job_id)  # pending now, due now: no manager has a worker yet
    kill(requeuer)
    runner = serve_with(procs, redis_url, 1)
    assert connect_client(runner).job(later.job_id).result(timeout=60) == 42


@pytest.mark.parametrize("store", ["none", "sqlite", "redis"])
def test_a_requeued_job_keeps_its_retry_policy_with_a_fresh_budget(
    make_scheduler: Callable[..., mpsched.Scheduler],
    tmp_path: Path,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    where = {"none": None, "sqlite": str(tmp_path / "jobs.db")}.get(store)
    if store == "redis":
        where = request.getfixturevalue("redis_url")
    scheduler = make_scheduler(workers=1, store=where)
    log = tmp_path / "runs.log"
    policy = mpsched.RetryPolicy(2, backoff=0.01, jitter=0.0)
    first = scheduler.schedule(context_jobs.log_context_then_fail, str(log), retry=policy)
    assert str(first.exception(timeout=60)) == "attempt 3"
    assert scheduler.job_info(first.job_id).error == "ValueError: attempt 3"
    again = scheduler.requeue(first.job_id)
    error = again.exception(timeout=60)
    assert str(error) == "attempt 3"  # its whole budget again
    assert len(getattr(error, "__notes__", [])) == 2  # this round's earlier attempts only
    runs = log.read_text().splitlines()
    assert runs == ["1 2", "2 2", "3 2"] * 2  # attempt, then max_retries: the policy's


@pytest.mark.parametrize("store", ["none", "sqlite", "redis"])
def test_a_requeued_job_keeps_its_queue(
    make_scheduler: Callable[..., mpsched.Scheduler],
    tmp_path: Path,
    store: str,
    request: pytest.FixtureRequest,
) -> None:
    where = {"none": None, "sqlite": str(tmp_path / "jobs.db")}.get(store)
    if store == "redis":
        where = request.getfixturevalue("redis_url")
    scheduler = make_scheduler(workers=1, store=where, queues=["default"])
    later = scheduler.schedule(context_jobs.add, 1, 1, delay=3600, queue="reports")
    assert scheduler.cancel(later.job_id)
    scheduler.requeue(later.job_id)
    info = scheduler.job_info(later.job_id)
    # Due now, but only a worker of "reports" may run it, and none serves it here.
    assert (info.state, info.queue) == ("pending", "reports")
