"""Managers on a Redis store that is killed and restarted, or paused past the operation
timeout: they heal by themselves, and every job ends up run once, or back in the queue.

Each test has a redis-server of its own (tests/redis_server.py) that it kills, restarts
or pauses; every run of a job logs itself (shared_jobs).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import shared_jobs

from mpsched import Scheduler, StoreUnavailableError

pytestmark = pytest.mark.slow


def test_a_restarted_redis_is_served_again_within_seconds_however_many_calls_failed(
    own_redis: Callable[..., Any], make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    server = own_redis(appendonly="yes", appendfsync="always")
    # max_pending: each submit returns once Redis acknowledged it, or fails at once.
    scheduler = make_scheduler(workers=1, store=server.url(), max_pending=10_000)
    log = str(tmp_path / "runs.log")
    assert scheduler.submit(shared_jobs.run, log, "before").result(timeout=30) == "before"
    due = scheduler.schedule(shared_jobs.run, log, "due-meanwhile", delay=1.0)
    server.kill()
    killed = time.monotonic()
    for _ in range(150):  # more failed calls than redis-py's pool makes connections
        with pytest.raises(StoreUnavailableError):
            scheduler.submit(len, "x").result(timeout=30)
    time.sleep(max(0.0, killed + 2.0 - time.monotonic()))  # the job came due meanwhile
    server.start()
    back = time.time()
    assert due.result(timeout=30) == "due-meanwhile"
    [run] = [r for r in shared_jobs.runs(log) if r.key == "due-meanwhile"]
    # No submit wakes it: the takers look again by themselves, within a second.
    assert run.started - back < 2.5
    assert scheduler.submit(len, "abc").result(timeout=30) == 3


def test_a_client_says_a_store_outage_once_and_its_end_with_counts(
    own_redis: Callable[..., Any],
    make_scheduler: Callable[..., Scheduler],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = own_redis(appendonly="yes", appendfsync="always")
    scheduler = make_scheduler(workers=1, store=server.url())  # submits go by its outbox
    assert scheduler.submit(len, "ab").result(timeout=30) == 2
    with caplog.at_level(logging.INFO, logger="mpsched.client"):
        server.kill()
        for _ in range(50):  # a batch each: each fails on its own
            failed = scheduler.submit(len, "x").exception(timeout=30)
            assert isinstance(failed, StoreUnavailableError)
        server.start()
        deadline = time.monotonic() + 30
        while True:  # the manager's connections come back on their next use
            if scheduler.submit(len, "abc").exception(timeout=30) is None:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
    lines = [r for r in caplog.records if r.name == "mpsched.client"]
    down = [r for r in lines if "does not answer" in r.message]
    back = [r for r in lines if "answers again after" in r.message]
    assert len(down) == 1 and down[0].levelno == logging.ERROR, [r.message for r in lines]
    assert len(back) == 1 and "job(s) failed meanwhile" in back[0].message
    assert int(back[0].message.split("; ")[1].split()[0]) >= 50
    assert len(lines) == 2, [r.message for r in lines]
