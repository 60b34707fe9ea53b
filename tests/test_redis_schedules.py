"""One schedule on several managers of a Redis store: each slot runs once, whichever
client adds it, however the adds race, and whichever manager dies or all restart.

Every run logs itself (shared_jobs); a slot's run id (``id@UTC``) is listed by any
manager, so the slots that ran are read from the listing and the runs from the log.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import shared_jobs
from processes import wait_for
from served import Manager, serve

from mpsched import Scheduler

pytestmark = pytest.mark.slow

INTERVAL = 0.25


def at_once(adds: Sequence[Callable[[], object]]) -> None:
    """Run ``adds`` in threads released together."""
    barrier = threading.Barrier(len(adds))

    def add(n: int) -> None:
        barrier.wait(30)
        adds[n]()

    threads = [threading.Thread(target=add, args=(n,)) for n in range(len(adds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)


def slot(run_id: str) -> float:
    return datetime.fromisoformat(run_id.rpartition("@")[2].replace("Z", "+00:00")).timestamp()


def assert_each_slot_once(
    listing: list[Any], log: str, schedule_id: str, interval: float = INTERVAL
) -> list[float]:
    """Every run of ``schedule_id`` listed is a slot of one timeline, and each ran once;
    returns the slots."""
    ran = [
        j
        for j in listing
        if j.job_id.startswith(f"{schedule_id}@") and j.state in ("done", "failed")
    ]
    slots = sorted(slot(j.job_id) for j in ran)
    gaps = [later - earlier for earlier, later in itertools.pairwise(slots)]
    assert all(gap > 0.8 * interval for gap in gaps), f"two timelines: {gaps}"
    runs = [r for r in shared_jobs.runs(log) if r.key == schedule_id]
    assert len(runs) == len(ran), "a slot ran twice"
    return slots


def settled(jobs: Callable[[], list[Any]], *schedule_ids: str) -> list[Any]:
    """The listing once no run of ``schedule_ids`` is pending or running (they were
    cancelled: the last one that started ends)."""

    def runs_ended() -> bool:
        return not [
            j
            for j in jobs()
            if j.state in ("pending", "running") and j.job_id.partition("@")[0] in schedule_ids
        ]

    wait_for(runs_ended, 30, "the last runs ended")
    return jobs()


def test_one_schedule_added_at_once_on_two_managers_runs_each_slot_once(
    make_scheduler: Callable[..., Scheduler], redis_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    schedulers = [make_scheduler(workers=1, store=redis_url) for _ in range(2)]
    ids = [f"tick{n}" for n in range(3)]
    handles: list[Any] = []

    def add(s: Scheduler, schedule_id: str) -> None:
        handles.append(
            s.every(INTERVAL, shared_jobs.run, log, schedule_id, id=schedule_id, start=INTERVAL)
        )

    for schedule_id in ids:  # three races: any one with two timelines fails
        at_once([functools.partial(add, s, schedule_id) for s in schedulers])
    wait_for(lambda: len(shared_jobs.runs(log)) >= 24, 30, "eight runs of each")
    for handle in handles:
        handle.cancel()
    listing = settled(schedulers[1].jobs, *ids)
    for schedule_id in ids:
        assert len(assert_each_slot_once(listing, log, schedule_id)) >= 4


def test_one_schedule_added_at_once_on_three_managers_runs_each_slot_once(
    make_scheduler: Callable[..., Scheduler], redis_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    schedulers = [make_scheduler(workers=1, store=redis_url) for _ in range(3)]
    handles: list[Any] = []

    def add(s: Scheduler) -> None:
        handles.append(s.every(INTERVAL, shared_jobs.run, log, "tick", id="tick", start=INTERVAL))

    at_once([functools.partial(add, s) for s in schedulers])
    wait_for(lambda: len(shared_jobs.runs(log)) >= 10, 30, "ten runs")
    handles[0].cancel()
    assert len(assert_each_slot_once(settled(schedulers[2].jobs, "tick"), log, "tick")) >= 8


def start_manager(procs: Any, url: str) -> Manager:
    return serve(
        procs, "--address", "127.0.0.1:0", "--workers", "1", "--store", url, "--lease-timeout", "2"
    )


def test_each_slot_runs_once_when_a_manager_is_killed_mid_run(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    managers = [start_manager(procs, redis_url) for _ in range(3)]
    clients = [connect_client(m) for m in managers]
    at_once(
        [
            functools.partial(
                c.every,
                INTERVAL,
                shared_jobs.run,
                log,
                "tick",
                INTERVAL / 2,
                id="tick",
                start=INTERVAL,
            )
            for c in clients
        ]
    )
    wait_for(lambda: len(shared_jobs.runs(log)) >= 6, 30, "six runs")
    os.killpg(managers[0].proc.pid, signal.SIGKILL)  # whatever it was running
    ran = len(shared_jobs.runs(log))
    wait_for(lambda: len(shared_jobs.runs(log)) >= ran + 12, 30, "twelve runs more")
    [handle] = [s for s in clients[1].schedules() if s.id == "tick"]
    handle.cancel()
    listing = settled(clients[1].jobs, "tick")
    # A run the killed manager held is failed by a peer: it ran once, or never started.
    ran_once = [
        j for j in listing if j.job_id.startswith("tick@") and j.state in ("done", "failed")
    ]
    runs = [r for r in shared_jobs.runs(log) if r.key == "tick"]
    assert len(runs) <= len(ran_once) and len(ran_once) - len(runs) <= 1
    slots = sorted(slot(j.job_id) for j in ran_once)
    assert all(b - a > 0.8 * INTERVAL for a, b in itertools.pairwise(slots)), "two timelines"


def test_catchup_all_after_every_manager_was_down_runs_each_missed_slot_once(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    first = start_manager(procs, redis_url)
    connect_client(first).every(
        INTERVAL, shared_jobs.run, log, "tick", id="tick", start=INTERVAL, catchup="all"
    )
    wait_for(lambda: len(shared_jobs.runs(log)) >= 2, 30, "two runs")
    os.killpg(first.proc.pid, signal.SIGKILL)
    down = time.monotonic()
    time.sleep(max(0.0, down + 8 * INTERVAL - time.monotonic()))  # eight slots missed
    back = time.time()
    restarted = [start_manager(procs, redis_url) for _ in range(2)]  # both catch up
    ran = len(shared_jobs.runs(log))
    wait_for(lambda: len(shared_jobs.runs(log)) >= ran + 12, 30, "the missed slots and more")
    client = connect_client(restarted[0])
    [handle] = [s for s in client.schedules() if s.id == "tick"]
    handle.cancel()
    listing = settled(client.jobs, "tick")
    ran_once = [
        j for j in listing if j.job_id.startswith("tick@") and j.state in ("done", "failed")
    ]
    runs = [r for r in shared_jobs.runs(log) if r.key == "tick"]
    assert len(runs) <= len(ran_once) and len(ran_once) - len(runs) <= 1  # the killed one
    slots = sorted(slot(j.job_id) for j in ran_once)
    gaps = [b - a for a, b in itertools.pairwise(slots)]
    assert all(gap > 0.8 * INTERVAL for gap in gaps), f"two timelines: {gaps}"
    # The slots missed while every manager was down ran (those that came due while a
    # late one was pending were passed over: overlap="skip").
    assert len([s for s in slots if s < back]) >= 2 + 6, slots
