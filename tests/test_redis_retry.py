"""Retries on a Redis store shared by two managers: each attempt is counted once, by the
claim that leases it, and a failed attempt goes back with its back-off in the script
that ends its lease; a manager SIGKILLed mid-attempt costs exactly that attempt."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import retry_jobs
from processes import wait_for
from served import Manager, serve

from mpsched import RetryLater, RetryPolicy

pytestmark = pytest.mark.slow


def start_manager(procs: Any, url: str, *args: str) -> Manager:
    return serve(procs, "--address", "127.0.0.1:0", "--workers", "1", "--store", url, *args)


def worker_pids(manager: Manager) -> set[int]:
    return {w.pid for w in manager.stats().workers}


def test_an_always_failing_job_runs_exactly_its_budget_across_two_managers(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    client, other = connect_client(first), connect_client(second)
    log = str(tmp_path / "starts.log")
    policy = RetryPolicy(4, backoff=0.05, factor=2.0, jitter=0.1)
    future = client.schedule(retry_jobs.always_fail, log, retry=policy)
    error = future.exception(timeout=60)
    assert isinstance(error, ValueError) and str(error) == "boom 5"
    assert [n.rsplit(": ", 2)[-1] for n in retry_jobs.notes(error)] == [
        f"boom {n}" for n in range(1, 5)
    ]
    starts = retry_jobs.starts(log)
    assert len(starts) == 5
    for n in range(1, 5):
        assert starts[n] - starts[n - 1] >= 0.05 * 2 ** (n - 1) * 0.9  # never early
    info = other.job_info(future.job_id)
    assert (info.state, info.attempts, info.error) == ("failed", 5, "ValueError: boom 5")
    assert other.stats().queue.retried_exception == 4


def test_retry_later_waits_pending_with_its_reason_seen_from_another_manager(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    client, other = connect_client(first), connect_client(second)
    log = str(tmp_path / "starts.log")
    future = client.schedule(retry_jobs.later, log, 600, "rate limited by the API")

    def waiting_after_its_attempt() -> bool:
        info = other.job_info(future.job_id)  # one read: state and attempts of one moment
        return info.state == "pending" and info.attempts == 1

    wait_for(waiting_after_its_attempt, 30, "the retry's wait")
    assert other.job_info(future.job_id).error == "mpsched.RetryLater: rate limited by the API"
    assert other.stats().queue.retried_later == 1
    assert future.cancel()
    quick = client.schedule(retry_jobs.later, str(tmp_path / "quick.log"), 0.01, "busy")
    assert isinstance(quick.exception(timeout=60), RetryLater)
    assert len(retry_jobs.starts(str(tmp_path / "quick.log"))) == 4


def test_a_manager_sigkilled_mid_attempt_costs_that_attempt_only(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    lease = 2.0
    first = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    second = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    log = str(tmp_path / "starts.log")
    policy = RetryPolicy(3, backoff=0.05, factor=1.0, jitter=0.0)
    job_id = connect_client(first).schedule(retry_jobs.slow_fail, log, 1.5, retry=policy).job_id
    wait_for(lambda: len(retry_jobs.runs(log)) == 1, 30, "the first attempt started")
    [(_, pid)] = retry_jobs.runs(log)
    doomed, survivor = (first, second) if pid in worker_pids(first) else (second, first)
    watched = connect_client(survivor).job(job_id)
    os.killpg(doomed.proc.pid, signal.SIGKILL)  # with its worker, mid-attempt
    doomed.proc.wait()
    error = watched.exception(timeout=lease + 60)
    assert isinstance(error, ValueError) and str(error) == "slow 4"
    runs = retry_jobs.runs(log)
    assert len(runs) == 4 == policy.max_retries + 1
    assert {pid for _, pid in runs[1:]} <= worker_pids(survivor)
