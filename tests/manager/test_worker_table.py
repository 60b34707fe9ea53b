"""The workers table's figures: CPU seconds and CPU % of local and remote workers, slots,
throughput."""

from __future__ import annotations

import os
import time

import psutil

from mpsched._manager.worker_table import CPU_SPAN, CpuMeter, WorkerTable
from mpsched._protocol.records import WorkerHello, WorkerLoad

TOKEN = "t" * 32


def hello(worker_id: str, *, remote: bool, host: str = "here") -> WorkerHello:
    return WorkerHello(
        worker_id, os.getpid(), host, "3.x", "3", remote=remote, local_token="" if remote else TOKEN
    )


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


def test_cpu_percent_is_averaged_over_a_second_or_more_whoever_asks() -> None:
    meter = CpuMeter(since=10.0, base=4.0)
    assert meter.read(10.5, 4.4) == 0.0  # under a second since the base: no figure yet
    assert meter.read(11.0, 4.5) == 50.0  # 0.5 s of CPU over 1 s; the base moves here
    assert meter.read(11.2, 4.7) == 50.0  # a reader close behind sees the same figure
    assert meter.read(10.9, 4.45) == 50.0  # one overtaken by another sees it too
    assert meter.read(13.0, 6.5) == 100.0  # 2 s of CPU over 2 s
    assert meter.read(14.0 + CPU_SPAN, 6.5) == 0.0  # idle since


def test_a_local_workers_cpu_percent_is_the_same_for_readers_within_a_second() -> None:
    clock = [100.0]
    table = WorkerTable(local_token=TOKEN, clock=lambda: clock[0])
    table.join(hello("w1", remote=False))
    clock[0] += 2.0
    [first], _ = table.statuses(since=0.0)
    busy = time.process_time()
    while time.process_time() - busy < 0.05:  # some CPU, so the next figure would differ
        pass
    clock[0] += 0.5
    [second], _ = table.statuses(since=0.0)
    assert second.cpu_percent == first.cpu_percent >= 0.0
    assert second.cpu_seconds > first.cpu_seconds


def test_a_worker_takes_the_lowest_slot_free_on_its_host() -> None:
    table = WorkerTable(local_token=TOKEN)
    for worker_id, host in (("a", "here"), ("b", "here"), ("c", "there"), ("d", "here")):
        table.join(hello(worker_id, remote=True, host=host))
    table.remove("b")
    table.join(hello("e", remote=True))  # b's replacement
    table.join(hello("f", remote=True))
    slots = {s.worker_id: (s.host, s.slot) for s in table.statuses(since=0.0)[0]}
    assert slots == {
        "a": ("here", 0),
        "c": ("there", 0),
        "d": ("here", 2),
        "e": ("here", 1),
        "f": ("here", 3),
    }
