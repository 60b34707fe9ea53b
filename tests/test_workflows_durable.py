"""Workflows with a SQLite store: a manager SIGKILLed in the middle of a graph, then
started again on the same file, runs every job once, in order, with the results passed."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flow_jobs
import pytest
from processes import wait_for

from mpsched import JobFuture, ResultOf, Scheduler

pytestmark = pytest.mark.slow
WAIT = 120.0
LAYERS, WIDTH = 7, 7  # and one job after the last layer: 50 jobs


def test_a_graph_of_fifty_survives_a_manager_killed_in_its_middle(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store, log = tmp_path / "jobs.db", str(tmp_path / "ran.log")
    s = make_scheduler(workers=2, store=store)
    parents: dict[str, list[str]] = {}
    names: dict[str, str] = {}  # job id -> name
    previous: list[JobFuture[Any]] = []
    for k in range(LAYERS):
        layer: list[JobFuture[Any]] = [
            s.schedule(
                flow_jobs.layer, log, f"L{k}.{i}", 0.1, [ResultOf(p) for p in previous], retries=2
            )
            for i in range(WIDTH)
        ]
        for i, future in enumerate(layer):
            names[future.job_id] = f"L{k}.{i}"
            parents[f"L{k}.{i}"] = [names[p.job_id] for p in previous]
        previous = layer
    last = s.schedule(flow_jobs.total, log, "last", [ResultOf(p) for p in previous], retries=2)
    parents["last"] = [names[p.job_id] for p in previous]
    ended = lambda: Path(log).read_text().count("end ") if Path(log).exists() else 0  # noqa: E731
    wait_for(lambda: ended() >= 15, WAIT, "15 jobs ended")
    pid = s._manager_process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    s._manager_process.join(WAIT)
    assert ended() < 50
    s2 = make_scheduler(workers=2, store=store)
    assert s2.job(last.job_id).result(timeout=WAIT) == WIDTH**LAYERS
    lines = flow_jobs.order(log)
    ends = Counter(line.split()[1] for line in lines if line.startswith("end "))
    assert set(ends) == set(parents) and set(ends.values()) == {1}, "ran twice, or not at all"
    for name, its_parents in parents.items():
        last_start = max(i for i, line in enumerate(lines) if line == f"start {name}")
        assert all(lines.index(f"end {p}") < last_start for p in its_parents), name
    assert s2.jobs(state="pending") == [] and not s2.jobs(state="failed")


def test_a_parent_from_before_a_restart_passes_its_result(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    s = make_scheduler(workers=1, store=store)
    done = s.submit(flow_jobs.describe, "before")
    assert done.result(timeout=WAIT) == "'before'"
    later = s.schedule(flow_jobs.describe, "pending", delay=8)
    s.stats()  # sent
    pid = s._manager_process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    s._manager_process.join(WAIT)
    s2 = make_scheduler(workers=1, store=store)
    child = s2.schedule(flow_jobs.describe, ResultOf(done.job_id))
    assert child.result(timeout=WAIT) == repr("'before'")
    other = s2.schedule(flow_jobs.describe, ResultOf(later.job_id))
    assert s2.job_info(other.job_id).waiting_for == "after 1 jobs"
    assert other.result(timeout=WAIT) == repr("'pending'")


def test_a_waiting_job_keeps_its_queue_and_limit_across_a_restart(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    s = make_scheduler(workers=1, store=store, queues=["q1"], limits={"api": 1})
    parent = s.schedule(flow_jobs.describe, "parent", delay=3600)
    child = s.schedule(flow_jobs.describe, ResultOf(parent), queue="q1", limit="api")
    info = s.job_info(child.job_id)
    assert (info.queue, info.limit, info.waiting_for) == ("q1", "api", "after 1 jobs")
    pid = s._manager_process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    s._manager_process.join(WAIT)
    s2 = make_scheduler(workers=1, store=store, queues=["q1"], limits={"api": 1})
    info = s2.job_info(child.job_id)
    assert (info.queue, info.limit, info.waiting_for) == ("q1", "api", "after 1 jobs")
