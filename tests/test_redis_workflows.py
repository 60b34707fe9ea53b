"""Workflows on a Redis store shared by two managers: a parent's end releases its children
in the script that ends it, whichever manager's worker ran it, and a manager SIGKILLed in
the middle of a graph loses nothing."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flow_jobs
import pytest
import retry_jobs
from processes import wait_for
from served import Manager, serve

from mpsched import (
    DependencyFailedError,
    InvalidJobError,
    JobNotFoundError,
    ResultOf,
    RetryPolicy,
)

pytestmark = pytest.mark.slow
WAIT = 60.0


def start_manager(procs: Any, url: str, *args: str, workers: int = 1) -> Manager:
    return serve(
        procs, "--address", "127.0.0.1:0", "--workers", str(workers), "--store", url, *args
    )


def worker_pids(manager: Manager) -> set[int]:
    return {w.pid for w in manager.stats().workers}


def test_parents_on_one_manager_release_children_on_another_with_their_results(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    one, two = connect_client(first), connect_client(second)
    log = str(tmp_path / "runs.log")
    # A diamond, and a fan-out of 20 with its fan-in, parents sent through one manager
    # and children through the other.
    a = one.schedule(flow_jobs.run_after, log, "a", 0.2)
    b = two.schedule(flow_jobs.run_after, log, "b", 0.1, ResultOf(a.job_id))
    c = two.schedule(flow_jobs.run_after, log, "c", 0.0, ResultOf(a.job_id))
    d = one.schedule(flow_jobs.run_after, log, "d", 0.0, ResultOf(b.job_id), ResultOf(c.job_id))
    parts = [
        two.schedule(flow_jobs.run_after, log, f"p{i}", 0.05, ResultOf(d.job_id)) for i in range(20)
    ]
    fan_in = one.schedule(flow_jobs.run_after, log, "sum", 0.0, [ResultOf(p.job_id) for p in parts])
    assert d.result(timeout=WAIT) == ["a", "b", "a", "c", "d"]
    result = fan_in.result(timeout=WAIT)
    assert result[-1] == "sum" and result[:-1] == [
        ["a", "b", "a", "c", "d", f"p{i}"] for i in range(20)
    ]
    lines = flow_jobs.order_keys(log)
    started = flow_jobs.pids(log)
    assert all(len(v) == 1 for v in started.values()) and len(started) == 25
    for parent, child in [
        ("a", "b"),
        ("a", "c"),
        ("b", "d"),
        ("c", "d"),
        *(("d", f"p{i}") for i in range(20)),
        *((f"p{i}", "sum") for i in range(20)),
    ]:
        assert lines.index(f"end {parent}") < lines.index(f"start {child}"), (parent, child)
    first_pids, second_pids = worker_pids(first), worker_pids(second)
    ran_on = {key: "first" if pids[0] in first_pids else "second" for key, pids in started.items()}
    assert all(pids[0] in first_pids | second_pids for pids in started.values())
    assert set(ran_on.values()) == {"first", "second"}
    assert any(ran_on[f"p{i}"] != ran_on["d"] for i in range(20))


def test_a_failed_parent_fails_the_downstream_on_every_manager_and_allow_failure_runs(
    procs: Any, connect_client: Callable[..., Any], redis_url: str
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    one, two = connect_client(first), connect_client(second)
    gate = one.schedule(flow_jobs.describe, 1, delay=0.5)
    bad = one.schedule(flow_jobs.fail, "broken", after=[gate])
    b = two.schedule(flow_jobs.describe, 2, after=[bad.job_id])
    c = one.schedule(flow_jobs.describe, ResultOf(b.job_id))
    tolerant = two.schedule(flow_jobs.describe, ResultOf(bad.job_id), allow_failure=True)
    for child, parent in ((b, bad), (c, b)):
        error = child.exception(timeout=WAIT)
        assert isinstance(error, DependencyFailedError), error
        assert error.parent_id == parent.job_id
    assert tolerant.result(timeout=WAIT) == "ValueError: broken"
    with pytest.raises(JobNotFoundError):
        two.schedule(flow_jobs.describe, 1, after=["no-such-job"])
    later = one.schedule(flow_jobs.describe, 1, delay=60)
    waiting = two.schedule(flow_jobs.describe, 2, after=[later.job_id])
    assert two.job_info(waiting.job_id).waiting_for == "after 1 jobs"
    assert waiting.cancel()
    assert one.job_info(later.job_id).state == "pending"
    cancelled_child = two.schedule(flow_jobs.describe, 3, after=[later.job_id])
    assert later.cancel()
    error = cancelled_child.exception(timeout=WAIT)
    assert isinstance(error, DependencyFailedError) and error.outcome == "cancelled"
    assert one.jobs(state="pending") == []


def test_a_manager_sigkilled_in_the_middle_of_a_graph_loses_nothing(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    lease = 2.0
    doomed = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    survivor = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    client = connect_client(survivor)
    log = str(tmp_path / "runs.log")
    previous: list[Any] = []
    names: list[str] = []
    for k in range(5):
        layer = [
            client.schedule(
                flow_jobs.run_after,
                log,
                f"L{k}.{i}",
                0.2,
                *[ResultOf(p) for p in previous],
                retries=2,
            )
            for i in range(4)
        ]
        names += [f"L{k}.{i}" for i in range(4)]
        previous = layer
    last = previous[-1]
    wait_for(
        lambda: os.path.exists(log) and flow_jobs.order_keys(log).count("end L1.0") == 1,
        WAIT,
        "the second layer ran",
    )
    doomed_pids = worker_pids(doomed)
    os.killpg(doomed.proc.pid, signal.SIGKILL)
    result = last.result(timeout=WAIT)
    assert result[-1] == "L4.3" and len(result) == 4**4 + 4**3 + 4**2 + 4 + 1
    ends = Counter(line.split()[1] for line in flow_jobs.order_keys(log) if line.startswith("end "))
    assert set(ends) == set(names) and set(ends.values()) == {1}
    assert client.jobs(state="pending") == []
    ran_on_doomed = [key for key, pids in flow_jobs.pids(log).items() if set(pids) & doomed_pids]
    assert ran_on_doomed, "the killed manager's worker ran none of the graph"


def test_a_parent_retried_on_its_exception_releases_its_child_at_its_final_outcome(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    one, two = connect_client(first), connect_client(second)
    log = str(tmp_path / "runs")
    parent = one.schedule(
        retry_jobs.fail_times, log, 2, "third time", retry=RetryPolicy(3, backoff=0.05)
    )
    child = two.schedule(flow_jobs.describe, ResultOf(parent.job_id))
    assert child.result(timeout=WAIT) == repr("third time")
    assert len(retry_jobs.runs(log)) == 3


def test_a_redis_store_refuses_a_queue_or_limit_for_a_job_with_parents(
    procs: Any, connect_client: Callable[..., Any], redis_url: str
) -> None:
    client = connect_client(start_manager(procs, redis_url))
    parent = client.schedule(flow_jobs.describe, 1, delay=60)
    with pytest.raises(InvalidJobError, match="queue= or limit="):
        client.schedule(flow_jobs.describe, 2, after=[parent], queue="reports")
    assert [j.job_id for j in client.jobs()] == [parent.job_id]
