"""order="priority" with several managers on one Redis store, end to end: ``serve``
processes and Schedulers on a redis-server of the test's own, clients in the test
process. Each run of a job logs itself (shared_jobs), so a test reads what ran, in what
order and when."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import shared_jobs
from processes import wait_for
from served import Manager, serve

from mpsched import ConfigError, Priority, Scheduler

pytestmark = pytest.mark.slow


def start_manager(procs: Any, url: str, *args: str, workers: int = 1) -> Manager:
    return serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        str(workers),
        "--store",
        url,
        "--order",
        "priority",
        *args,
    )


def test_due_jobs_run_highest_priority_first_on_another_managers_single_worker(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    idle = start_manager(procs, redis_url, workers=0)  # submits only
    runner = start_manager(procs, redis_url, workers=1)  # the one worker of the store
    client, other = connect_client(idle), connect_client(runner)
    log = str(tmp_path / "runs.log")
    opened = [tmp_path / "gate-1", tmp_path / "gate-2"]
    first = client.submit(shared_jobs.gate, log, "gate-1", str(opened[0]))
    wait_for(lambda: shared_jobs.runs(log), 30, "the first gate to hold the worker")
    # Due in time order LOW, MEDIUM, HIGH, all in the past; the second gate before all.
    now = time.time()
    second = client.schedule(
        shared_jobs.gate, log, "gate-2", str(opened[1]), at=now - 4, priority=Priority.HIGH
    )
    levels = [Priority.LOW, Priority.MEDIUM, Priority.HIGH]
    backlog = {
        f"{level.name}-{n}": client.schedule(
            shared_jobs.run, log, f"{level.name}-{n}", at=now - 3 + k + n / 10, priority=level
        )
        for k, level in enumerate(levels)
        for n in range(3)
    }
    opened[0].touch()
    wait_for(lambda: len(shared_jobs.runs(log)) == 2, 30, "the second gate to hold it")
    # The claim of the second gate moved every due job among the ready ones: still pending.
    pending = {job.job_id for job in other.jobs(state="pending")}
    assert pending == {future.job_id for future in backlog.values()}
    listed = procs.run("jobs", "--state", "pending", "--json", *idle.cli())
    assert listed.returncode == 0, listed.stderr
    assert {job["job_id"] for job in json.loads(listed.stdout)} == pending
    assert other.cancel(backlog["MEDIUM-1"].job_id)
    due_later = time.time() + 2.0
    later = client.schedule(shared_jobs.run, log, "later", at=due_later, priority=Priority.HIGH)
    opened[1].touch()
    for future in [first, second, later, *backlog.values()]:
        if future is not backlog["MEDIUM-1"]:
            future.result(timeout=60)
    assert backlog["MEDIUM-1"].cancelled()
    runs = shared_jobs.runs(log)
    # "later" (HIGH) may go before the last of the backlog on a slow machine, once due.
    assert [r.key for r in runs if r.key != "later"] == [
        "gate-1",
        "gate-2",
        "HIGH-0",
        "HIGH-1",
        "HIGH-2",
        "MEDIUM-0",
        "MEDIUM-2",
        "LOW-0",
        "LOW-1",
        "LOW-2",
    ]
    [run_later] = [r for r in runs if r.key == "later"]
    assert run_later.started >= due_later, "a job started before its due time"


def test_a_manager_with_the_other_order_is_refused_while_one_is_live(
    procs: Any, make_scheduler: Callable[..., Scheduler], redis_url: str
) -> None:
    first = make_scheduler(workers=1, store=redis_url, order="priority")
    with pytest.raises(
        ConfigError,
        match=r"^order must be 'priority' \(the order of the "
        r"live managers of the store unix://.*prefix=.*\), "
        r"not 'time'$",
    ) as refused:
        make_scheduler(workers=1, store=redis_url)
    assert refused.value.option == "order"
    done = procs.run("serve", "--address", "127.0.0.1:0", "--store", redis_url, "--order", "time")
    assert done.returncode == 2 and "order must be 'priority'" in done.stderr, done.stderr
    assert first.submit(pow, 2, 3).result(timeout=30) == 8  # the first one runs on
    first.shutdown()
    second = make_scheduler(workers=1, store=redis_url)  # none is live: "time" is taken
    assert second.submit(pow, 2, 4).result(timeout=30) == 16
