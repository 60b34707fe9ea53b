"""Prefetched jobs end to end: a worker whose jobs are short gets several at once
(mpsched._core.prefetch), and nothing a job-at-a-time worker promises is lost by it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from jobs import by_kind, noop

from mpsched import Scheduler, WorkerCrashedError

pytestmark = pytest.mark.slow

WAIT = 20.0  # seconds a result may take here, however loaded the machine


@pytest.fixture
def scheduler(request: pytest.FixtureRequest) -> Iterator[Scheduler]:
    # max_pending: a map() goes to the manager in one call, so its jobs enter the heap
    # together and an idle worker whose last job was short takes several of them at once.
    s = Scheduler(workers=request.param, max_pending=10_000)
    try:
        list(s.map(noop, range(200)))  # every worker's last job was short
        yield s
    finally:
        s.shutdown(cancel_futures=True)


def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT} s: {what}"
        time.sleep(0.01)


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize("scheduler", [1], indirect=True, ids=["1-worker"])
def test_a_result_does_not_wait_for_the_long_job_after_it(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    before = scheduler.stats().queue.prefetched
    results = scheduler.map(by_kind, ["short", "wait"], ["", str(release)], timeout=WAIT)
    try:
        assert next(results) == "short"  # while "wait" runs, in the same batch
        assert scheduler.stats().queue.prefetched > before
    finally:
        release.touch()
    assert next(results) == "wait"


@pytest.mark.parametrize("scheduler", [2], indirect=True, ids=["2-workers"])
def test_jobs_prefetched_behind_a_long_job_run_on_the_other_worker(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    first, second, log = tmp_path / "first", tmp_path / "second", tmp_path / "log"
    blocker = scheduler.submit(by_kind, "wait", str(first))  # one worker waits for "first"
    eventually(lambda: scheduler.stats().queue.in_flight == 1, "the blocker started")
    # The other takes "wait" (for "second") with short jobs prefetched behind it; the rest
    # queue behind those.
    kinds = ["wait"] + ["short"] * 40
    results = scheduler.map(by_kind, kinds, [str(second)] + [str(log)] * 40)
    try:
        eventually(lambda: scheduler.stats().queue.prefetched > 0, "jobs were prefetched")
        first.touch()  # the first worker runs the heap dry, then takes back the rest
        assert blocker.result(WAIT) == "wait"
        eventually(lambda: lines(log) == 40, "every short job ran while 'wait' did")
        assert scheduler.stats().queue.revoked > 0
    finally:
        second.touch()
    assert list(results) == kinds


@pytest.mark.parametrize("scheduler", [1], indirect=True, ids=["1-worker"])
def test_jobs_that_ran_before_their_worker_died_keep_their_results(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    before = scheduler.stats().queue
    results = scheduler.map(by_kind, ["a", "b", "die"], [str(log)] * 3)
    assert [next(results), next(results)] == ["a", "b"]  # not WorkerCrashedError
    with pytest.raises(WorkerCrashedError):
        next(results)
    assert lines(log) == 2
    after = scheduler.stats().queue
    assert (after.completed - before.completed, after.failed - before.failed) == (2, 1)
    assert after.retried == before.retried and after.prefetched > before.prefetched
    assert scheduler.submit(by_kind, "again").result(WAIT) == "again"  # a new worker
