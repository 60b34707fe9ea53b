"""The workers table's figures: CPU seconds of local and remote workers, throughput."""

from __future__ import annotations

import os
import time

import psutil

from mpsched._manager.worker_table import WorkerTable
from mpsched._protocol.records import WorkerHello, WorkerLoad

TOKEN = "t" * 32


def hello(worker_id: str, *, remote: bool) -> WorkerHello:
    return WorkerHello(worker_id, os.getpid(), "here", "3.x", "3", remote=remote,
                       local_token="" if remote else TOKEN)


def later_than(instant: float) -> float:
    """The first monotonic reading after ``instant``."""
    while (now := time.monotonic()) <= instant:
        pass
    return now


def test_a_local_workers_cpu_seconds_are_read_from_its_process() -> None:
    table = WorkerTable(local_token=TOKEN)
    table.join(hello("w1", remote=False))
    [status], _ = table.statuses(since=0.0)
    times = psutil.Process().cpu_times()
    assert 0 < status.cpu_seconds <= times.user + times.system
    assert status.rss > 0


def test_a_remote_workers_cpu_seconds_come_with_its_heartbeat() -> None:
    table = WorkerTable(local_token=TOKEN)
    table.join(hello("w2", remote=True))
    table.update("w2", load=WorkerLoad(12.5, 2**20, 42.25))
    [status], _ = table.statuses(since=0.0)
    assert (status.cpu_percent, status.rss, status.cpu_seconds) == (12.5, 2**20, 42.25)


def test_throughput_counts_the_jobs_finished_since_the_given_instant() -> None:
    table = WorkerTable(local_token=TOKEN)
    table.join(hello("w3", remote=True))
    for _ in range(3):
        table.check_in("w3", reported=True)
    middle = later_than(time.monotonic())  # after the third, before the fourth
    later_than(middle)
    for _ in range(2):
        table.check_in("w3", reported=True)
    assert table.statuses(since=0.0)[1] == 5
    assert table.statuses(since=middle)[1] == 2
    assert table.statuses(since=time.monotonic() + 1)[1] == 0
