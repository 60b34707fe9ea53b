"""Retries with a SQLite store: the policy, the attempt count and the back-off's due time
survive SIGKILLs of a real ``serve --store`` between attempts and during one."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import retry_jobs
from processes import wait_for
from served import START_TIMEOUT, Manager, Processes, serve

import mpsched
from mpsched import RetryPolicy

pytestmark = pytest.mark.slow
CLOCK_SLACK = 0.01  # a due time crosses a restart on the wall clock; starts are monotonic


def serve_store(procs: Processes, store: Path) -> Manager:
    manager = serve(procs, "--store", str(store), "--workers", "1")
    assert manager.proc.line().startswith("  status: ")
    assert manager.proc.line().startswith("  store:  ")
    return manager


def kill(manager: Manager, *, with_workers: bool = False) -> None:
    if with_workers:  # its worker dies in the middle of the attempt it runs
        os.killpg(manager.proc.pid, signal.SIGKILL)
    else:
        os.kill(manager.proc.pid, signal.SIGKILL)
    manager.proc.wait()


def test_an_always_failing_job_runs_exactly_its_budget_across_sigkills(
    procs: Processes, tmp_path: Path, connect_client: Callable[[Manager], mpsched.Client]
) -> None:
    store, log = tmp_path / "jobs.db", str(tmp_path / "starts.log")
    policy = RetryPolicy(3, backoff=2.0, factor=1.0, jitter=0.0)
    first = serve_store(procs, store)
    client = connect_client(first)
    job_id = client.schedule(retry_jobs.slow_fail, log, 0.5, retry=policy).job_id

    def waits_for_retry(client: mpsched.Client, attempts: int) -> bool:
        info = client.job_info(job_id)
        return info.state == "pending" and info.attempts == attempts

    wait_for(lambda: waits_for_retry(client, 1), START_TIMEOUT, "the first attempt's end")
    assert client.job_info(job_id).error == "ValueError: slow 1"
    kill(first)  # between attempts: the retry waits out its back-off

    second = serve_store(procs, store)
    again = connect_client(second)
    info = again.job_info(job_id)  # on a loaded machine the retry may have started
    assert (info.state, info.attempts) in {("pending", 1), ("running", 2)}
    assert info.error == "ValueError: slow 1"
    wait_for(lambda: len(retry_jobs.starts(log)) == 2, START_TIMEOUT, "the second attempt")
    kill(second, with_workers=True)  # during the second attempt: its crash counts

    third = serve_store(procs, store)
    last = connect_client(third)
    error = last.job(job_id).exception(timeout=START_TIMEOUT)
    assert isinstance(error, ValueError) and str(error) == "slow 4"
    starts = retry_jobs.starts(log)
    assert len(starts) == 4 == policy.max_retries + 1
    assert starts[1] >= starts[0] + 0.5 + 2.0 - CLOCK_SLACK  # never early, across a restart
    assert [note.split(": ", 1)[1] for note in retry_jobs.notes(error)] == [
        "ValueError: slow 1",
        retry_jobs.notes(error)[1].split(": ", 1)[1],
        "ValueError: slow 3",
    ]
    assert "WorkerCrashedError" in retry_jobs.notes(error)[1]
    info = last.job_info(job_id)
    assert (info.state, info.attempts, info.error) == ("failed", 4, "ValueError: slow 4")
