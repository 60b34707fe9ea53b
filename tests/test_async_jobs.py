"""``async def`` jobs, and any callable that returns an awaitable: the worker awaits them
on an event loop it keeps for its life, and the future gets what the coroutine returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import context_jobs
import pytest
from processes import wait_for, wait_started
from served import START_TIMEOUT, Manager, Processes, pool_workers, serve

import mpsched
from mpsched import JobTimeoutError, Scheduler


@pytest.fixture
def scheduler(make_scheduler: Callable[..., Scheduler]) -> Scheduler:
    return make_scheduler(workers=1)


@pytest.mark.parametrize("store", ["none", "sqlite", "redis"])
def test_an_async_job_returns_what_its_coroutine_returns(
    make_scheduler: Callable[..., Scheduler],
    store: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    where = {"none": None, "sqlite": str(tmp_path / "jobs.db")}.get(store)
    if store == "redis":
        where = request.getfixturevalue("redis_url")
    scheduler = make_scheduler(workers=1, store=where)
    assert scheduler.submit(context_jobs.add, 2, 3).result(timeout=30) == 5
    assert scheduler.submit(context_jobs.returns_awaitable, "x").result(timeout=30) == "x"


def test_an_async_job_awaits_asyncio_sleep_on_the_loop_its_worker_keeps(
    scheduler: Scheduler,
) -> None:
    value, took = scheduler.submit(context_jobs.sleep_then, 0.2, "slept").result(timeout=30)
    assert value == "slept" and took >= 0.2
    first = scheduler.submit(context_jobs.loop_identity).result(timeout=30)
    assert scheduler.submit(context_jobs.running_loop).result(timeout=30) is False
    assert scheduler.submit(context_jobs.loop_identity).result(timeout=30) == first


def test_an_async_job_that_raises_fails_its_future_with_its_exception(scheduler: Scheduler) -> None:
    error = scheduler.submit(context_jobs.fail_async, "no such key").exception(timeout=30)
    assert isinstance(error, KeyError) and error.args == ("no such key",)
    assert "fail_async" in str(error.__cause__)  # the worker's traceback
    assert scheduler.submit(context_jobs.add, 1, 1).result(timeout=30) == 2


def test_an_async_job_past_its_timeout_is_killed(scheduler: Scheduler, fifo: str) -> None:
    slow = scheduler.schedule(context_jobs.announce_then_sleep_async, fifo, 300, timeout=1.0)
    (pid,) = wait_started(fifo)
    assert isinstance(slow.exception(timeout=60), JobTimeoutError)
    assert scheduler.submit(os.getpid).result(timeout=60) != pid  # a new worker
    assert scheduler.submit(context_jobs.add, 1, 2).result(timeout=30) == 3


@pytest.mark.slow
def test_a_remote_worker_awaits_async_jobs_reports_progress_and_kills_one_past_its_timeout(
    procs: Processes, connect_client: Callable[[Manager], mpsched.Client], fifo: str
) -> None:
    manager = serve(procs, "--address", "127.0.0.1:0", "--workers", "0")
    pool = procs.start("worker", *manager.cli(), "--processes", "1")
    assert "1 process joined" in pool.line()
    wait_for(lambda: len(pool_workers(manager, pool)) == 1, START_TIMEOUT, "a worker joined")
    client = connect_client(manager)
    assert client.submit(context_jobs.sleep_then, 0.05, 7).result(timeout=30)[0] == 7
    # Its jobs read their context and report progress as a local worker's do.
    assert client.submit(context_jobs.context).result(timeout=30)["attempt"] == 1
    first, second = Path(fifo + ".first"), Path(fifo + ".second")
    steps = client.submit(context_jobs.progress_steps, str(first), str(second))
    wait_for(lambda: client.job_info(steps.job_id).progress == 0.25, 30, "its progress")
    first.touch()
    second.touch()
    assert steps.result(timeout=30) == "done"
    slow = client.schedule(context_jobs.announce_then_sleep_async, fifo, 300, timeout=1.0)
    wait_started(fifo)
    assert isinstance(slow.exception(timeout=60), JobTimeoutError)
    assert client.submit(context_jobs.add, 20, 22).result(timeout=60) == 42
