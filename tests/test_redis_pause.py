"""Managers on one Redis store, one of them paused (SIGSTOP) past its lease while its
peers carry on: no future of its clients hangs, no job that ran to its end is listed
failed, and no job a peer took back starts on its workers after it wakes.

Real ``serve`` processes and a redis-server of the test run's own; every run of a job
logs itself (shared_jobs).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import shared_jobs
from processes import wait_for
from served import Manager, serve

pytestmark = pytest.mark.slow

LEASE = 1.5


def start_manager(procs: Any, url: str, *, workers: int = 1) -> Manager:
    return serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        str(workers),
        "--store",
        url,
        "--lease-timeout",
        str(LEASE),
    )


@pytest.fixture
def stopped() -> Iterator[Callable[[Manager], None]]:
    """SIGSTOP a manager's process; every one is sent SIGCONT when the test ends."""
    paused: list[int] = []

    def stop(manager: Manager) -> None:
        paused.append(manager.proc.pid)
        os.kill(manager.proc.pid, signal.SIGSTOP)

    yield stop
    for pid in paused:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def presumed_dead(peer: Manager, manager: Manager) -> bool:
    return f":{manager.proc.pid}:" in peer.proc.stderr() and "presumed dead" in peer.proc.stderr()


def test_a_future_whose_job_ended_while_its_manager_was_presumed_dead_resolves(
    procs: Any,
    connect_client: Callable[..., Any],
    redis_url: str,
    tmp_path: Path,
    stopped: Callable[[Manager], None],
) -> None:
    owner = start_manager(procs, redis_url, workers=0)  # its client's jobs run elsewhere
    peer = start_manager(procs, redis_url)
    client, watcher = connect_client(owner), connect_client(peer)
    log = str(tmp_path / "runs.log")
    future = client.schedule(shared_jobs.run, log, "held", 4 * LEASE)
    wait_for(lambda: shared_jobs.runs(log), 30, "the job started on the peer")
    stopped(owner)
    try:
        wait_for(lambda: presumed_dead(peer, owner), 30, "the owner presumed dead")
        assert watcher.job(future.job_id).result(timeout=30) == "held"  # it ended
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
    assert future.result(timeout=10) == "held"
    assert client.job(future.job_id).result(timeout=10) == "held"


def test_a_job_that_ran_to_its_end_under_a_paused_manager_is_listed_with_its_end(
    procs: Any,
    connect_client: Callable[..., Any],
    redis_url: str,
    tmp_path: Path,
    stopped: Callable[[Manager], None],
) -> None:
    paused = start_manager(procs, redis_url)  # its worker runs the job
    peer = start_manager(procs, redis_url, workers=0)
    client = connect_client(peer)
    log = str(tmp_path / "runs.log")
    future = client.schedule(shared_jobs.run, log, "ends", 1.0)  # retries=0
    wait_for(lambda: shared_jobs.runs(log), 30, "the job started on the paused manager")
    stopped(paused)  # its worker runs on, ends the job, and reports to a paused manager
    try:
        wait_for(lambda: presumed_dead(peer, paused), 30, "the paused manager presumed dead")
        wait_for(lambda: future.done(), 30, "the peer failed the job")
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)

    def listed() -> str:
        return next(j.state for j in client.jobs() if j.job_id == future.job_id)

    wait_for(lambda: listed() == "done", 30, "the job listed with the end it ran to")
    assert client.job(future.job_id).result(timeout=10) == "ends"
    assert len(shared_jobs.runs(log)) == 1
