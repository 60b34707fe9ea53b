"""Queues and limits across managers of one Redis store, end to end: a limit admits at
most its number of running jobs whichever manager claims them, and a manager killed
while it holds a slot gives it back with its leases."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobs
import pytest
from served import Manager, serve
from test_queues_limits import most_at_once, pool_pids, spans, start_pool

pytestmark = pytest.mark.slow
RESULT = 60.0


def start_manager(procs: Any, url: str, *args: str, workers: int = 2) -> Manager:
    return serve(
        procs, "--address", "127.0.0.1:0", "--workers", str(workers), "--store", url, *args
    )


def test_two_exports_at_most_across_two_managers_while_other_jobs_flow(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first = start_manager(procs, redis_url, "--limit", "exports=2")
    second = start_manager(procs, redis_url, "--limit", "exports=2")
    one, two = connect_client(first), connect_client(second)
    log, others_log = tmp_path / "exports.log", tmp_path / "others.log"
    exports = [
        (one if n % 2 else two).schedule(jobs.span, str(log), 0.3, limit="exports")
        for n in range(20)
    ]
    others = [one.submit(jobs.span, str(others_log), 0.05) for _ in range(20)]
    for f in others:
        f.result(RESULT)
    assert sum(f.done() for f in exports) < 20  # they did not wait for the exports
    for f in exports:
        f.result(RESULT)
    assert most_at_once(spans(log)) == 2
    info = two.job_info(exports[-1].job_id)
    assert (info.limit, info.state) == ("exports", "done")


def test_a_killed_managers_slot_comes_back_after_its_lease(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path, fifo: str
) -> None:
    lease = 2.0
    doomed = start_manager(
        procs, redis_url, "--limit", "x=1", "--lease-timeout", str(lease), workers=1
    )
    client = connect_client(doomed)
    client.schedule(jobs.announce_then_sleep, fifo, 60.0, limit="x")
    with open(fifo) as announced:
        announced.readline()  # it runs, holding the one slot
    survivor = start_manager(procs, redis_url, "--lease-timeout", str(lease), workers=1)
    other = connect_client(survivor)
    waiting = other.schedule(jobs.stamp, "next", limit="x")
    time.sleep(0.5)
    assert other.job_info(waiting.job_id).waiting_for == "limit x"
    os.killpg(doomed.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert waiting.result(RESULT)[0] == "next"
    assert time.monotonic() - killed < lease + 5.0


def test_queues_route_jobs_across_managers(
    procs: Any, connect_client: Callable[..., Any], redis_url: str
) -> None:
    first = start_manager(procs, redis_url, "--queues", "default", workers=1)
    second = start_manager(procs, redis_url, "--queues", "default", workers=1)
    client = connect_client(first)
    waiting = client.schedule(jobs.stamp, "g", queue="gpu")
    assert client.submit(jobs.stamp, "d").result(RESULT)[0] == "d"
    assert client.job_info(waiting.job_id).state == "pending"
    gpu = start_pool(procs, second, "gpu")
    ran_on = waiting.result(RESULT)[1]
    assert ran_on in pool_pids(gpu)


def test_fifty_jobs_under_ten_a_second_across_two_managers(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first = start_manager(procs, redis_url, "--limit", "api=10/s")
    second = start_manager(procs, redis_url)
    one, two = connect_client(first), connect_client(second)
    log = tmp_path / "api.log"
    began = time.monotonic()
    futures = [
        (one if n % 2 else two).schedule(jobs.span, str(log), 0.0, limit="api") for n in range(50)
    ]
    for f in futures:
        f.result(RESULT)
    took = time.monotonic() - began
    starts = sorted(start for start, _ in spans(log))
    # The limit counts claims; a worker starts its job a moment after. That moment varies
    # by a few hundred ms on a loaded machine, so a window of 0.75 s holds at most 10 starts.
    assert max(sum(1 for s in starts if t <= s < t + 0.75) for t in starts) <= 10
    assert 3.9 < took < 15.0


def test_a_limit_set_through_one_manager_holds_on_the_other(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first = start_manager(procs, redis_url, workers=1)
    second = start_manager(procs, redis_url, workers=1)
    one, two = connect_client(first), connect_client(second)
    one.set_limit("x", concurrency=1, rate="100/m")
    assert two.limits() == {"x": "1,100/m"}
    log = tmp_path / "x.log"
    futures = [two.schedule(jobs.span, str(log), 0.2, limit="x") for _ in range(4)]
    for f in futures:
        f.result(RESULT)
    assert most_at_once(spans(log)) == 1
    one.set_limit("x")  # no bound left: its jobs run as any other
    assert two.limits() == {"x": ""}
