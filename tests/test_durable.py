"""Durable jobs through a Scheduler: a SQLite store, recovery after a manager crash, job
ids that outlive a connection, idempotent submits. Real processes, real files."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobs
import pytest
from processes import wait_for, wait_started

import mpsched
from mpsched import (
    ConfigError,
    JobNotFoundError,
    Scheduler,
    StoreError,
    StoreLockedError,
    WorkerCrashedError,
)

pytestmark = pytest.mark.slow
WAIT = 60.0


def kill_manager(s: Scheduler) -> None:
    """SIGKILL the manager (its workers follow it), as an OOM kill or a crash would."""
    pid = s._manager_process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    s._manager_process.join(WAIT)


def test_pending_and_running_jobs_survive_a_manager_killed_with_sigkill(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, fifo: str
) -> None:
    store, log = tmp_path / "jobs.db", str(tmp_path / "ran.log")
    s = make_scheduler(workers=1, store=store)
    due = time.time() + 4
    pending = [s.schedule(jobs.record, log, f"p{n}", at=due + n * 0.001) for n in range(300)]
    again = s.schedule(jobs.record_then_sleep, log, "again", fifo, 60, retries=1)
    wait_started(fifo)  # it runs when the manager dies: with a retry left, it runs again
    ids = {f.job_id for f in pending}
    kill_manager(s)
    s2 = make_scheduler(workers=2, store=store)
    assert {j.job_id for j in s2.jobs(state="pending")} >= ids
    assert s2.job(pending[-1].job_id).result(timeout=WAIT)[0] == f"p{len(pending) - 1}"
    wait_for(lambda: not s2.jobs(state="pending"), WAIT, "every recovered job ran")
    lines = Counter(Path(log).read_text().split())
    assert all(lines[f"p{n}"] == 1 for n in range(300)), "a job ran twice, or not at all"
    assert lines["again"] == 2  # once before the kill, once after
    assert again.job_id in {j.job_id for j in s2.jobs(state="running")}


def test_a_running_job_without_retries_fails_as_crashed_after_a_restart(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, fifo: str
) -> None:
    store, log = tmp_path / "jobs.db", str(tmp_path / "ran.log")
    s = make_scheduler(workers=1, store=store)
    once = s.schedule(jobs.record_then_sleep, log, "once", fifo, 60)
    wait_started(fifo)
    kill_manager(s)
    s2 = make_scheduler(workers=1, store=store)
    error = s2.job(once.job_id).exception(timeout=WAIT)
    assert isinstance(error, WorkerCrashedError) and once.job_id in str(error)
    assert Path(log).read_text().split() == ["once"]  # not run again


def test_jobs_that_finished_just_before_a_sigkill_stay_finished_with_their_results(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    # A finish is journalled before the worker's next job is handed out (the lease log): a
    # manager killed a moment after a job ended must not list it as crashed (retries=0) or
    # run it again (retries=1). Killed just after each round's last result came back, while
    # its end has not reached SQLite (~10 ms later).
    store, log = tmp_path / "jobs.db", str(tmp_path / "ran.log")
    finished: dict[str, object] = {}
    for round_ in range(3):
        s = make_scheduler(workers=2, store=store)
        futures: dict[mpsched.JobFuture[Any], str]
        futures = {
            s.schedule(jobs.record, log, f"r{round_}-{n}", retries=n % 2): f"r{round_}-{n}"
            for n in range(20)
        }
        # and outcomes too long for the lease log, which are committed before they are told
        futures[s.submit(jobs.big_result, 40_000, round_)] = "big"
        for future, key in futures.items():
            result = future.result(timeout=WAIT)
            finished[future.job_id] = result
            assert key == "big" or result[0] == key
        kill_manager(s)
    s2 = make_scheduler(workers=1, store=store)
    for job_id, result in finished.items():
        assert s2.job(job_id).result(timeout=WAIT) == result, job_id
    lines = Counter(Path(log).read_text().split())
    assert len(lines) == 60 and set(lines.values()) == {1}, "a finished job ran again"


def test_recovered_jobs_keep_their_due_time_and_never_start_early(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    s = make_scheduler(workers=1, store=store)
    due = time.time() + 3
    job = s.schedule(jobs.stamp, "late", at=due)
    s.stats()  # the job has reached the manager (submits are sent write-behind)
    kill_manager(s)
    s2 = make_scheduler(workers=1, store=store)
    tag, _, _ = s2.job(job.job_id).result(timeout=WAIT)
    assert tag == "late"
    [info] = [j for j in s2.jobs() if j.job_id == job.job_id]
    assert abs(info.due.timestamp() - due) < 1e-3 and info.state == "done"
    assert s2.stats().queue.started_early == 0


def test_a_second_manager_on_one_store_is_refused(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    make_scheduler(workers=1, store=store)
    with pytest.raises(StoreLockedError, match=r"jobs\.db"):
        Scheduler(workers=1, store=store)


def test_a_file_that_is_not_a_store_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"my notes, not a database\n" * 100)
    before = path.read_bytes()
    with pytest.raises(StoreError, match=r"notes\.db"):
        Scheduler(workers=1, store=path)
    assert path.read_bytes() == before


def test_bad_store_options_fail_at_the_call_site(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Scheduler(workers=1, store=tmp_path / "a.db", durability="weekly")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Scheduler(workers=1, store=tmp_path / "a.db", result_ttl=-1)
    with pytest.raises(StoreError, match="missing"):
        Scheduler(workers=1, store=tmp_path / "missing" / "a.db")


def test_a_job_id_reaches_its_outcome_from_another_client_and_after_a_restart(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    store = tmp_path / "jobs.db"
    s = make_scheduler(workers=1, store=store)
    done = s.submit(jobs.noop, "first")
    assert done.result(timeout=WAIT) == "first"
    later = s.schedule(jobs.noop, "later", delay=1.0)
    s.stats()  # it has reached the manager (submits are sent write-behind)
    other = mpsched.connect(s.address, authkey=s.authkey)
    try:
        assert other.job(done.job_id).result(timeout=WAIT) == "first"  # finished: retained
        assert other.job(later.job_id).result(timeout=WAIT) == "later"  # watched
    finally:
        other.detach()
    s.shutdown()
    s2 = make_scheduler(workers=1, store=store)
    assert s2.job(done.job_id).result(timeout=WAIT) == "first"
    with pytest.raises(JobNotFoundError):
        s2.job("no-such-job")


def test_without_a_store_a_finished_job_is_kept_in_memory_for_result_ttl(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(workers=1)
    done = s.submit(jobs.noop, 1)
    assert done.result(timeout=WAIT) == 1
    with pytest.raises(JobNotFoundError):
        s.job(done.job_id + "x")
    pending = s.schedule(jobs.noop, 2, delay=60)
    assert [(j.job_id, j.state) for j in s.jobs()] == [
        (done.job_id, "done"),
        (pending.job_id, "pending"),
    ]
    assert s.job(done.job_id).result(timeout=WAIT) == 1
    assert s.stats().store == "memory"


def test_without_a_store_and_no_result_ttl_a_finished_job_is_forgotten(
    make_scheduler: Callable[..., Scheduler],
) -> None:
    s = make_scheduler(workers=1, result_ttl=0)
    done = s.submit(jobs.noop, 1)
    assert done.result(timeout=WAIT) == 1
    with pytest.raises(JobNotFoundError):
        s.job(done.job_id)
    pending = s.schedule(jobs.noop, 2, delay=60)
    assert [(j.job_id, j.state) for j in s.jobs()] == [(pending.job_id, "pending")]


@pytest.mark.parametrize("with_store", [False, True], ids=["memory", "sqlite"])
def test_a_key_queues_one_job_across_clients(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path, with_store: bool
) -> None:
    s = make_scheduler(workers=1, store=tmp_path / "jobs.db" if with_store else None)
    first = s.schedule(jobs.noop, "first", key="nightly-2026-12-03", delay=1.0)
    other = mpsched.connect(s.address, authkey=s.authkey)
    try:
        second = other.schedule(jobs.noop, "second", key="nightly-2026-12-03", delay=1.0)
        assert second.job_id == first.job_id
        assert s.schedule(jobs.noop, "third", key="nightly-2026-12-03") is first
        assert second.result(timeout=WAIT) == first.result(timeout=WAIT) == "first"
    finally:
        other.detach()
    assert s.stats().queue.submitted == 1
    if with_store:  # retained: the key still stands for the finished job
        assert (
            s.schedule(jobs.noop, "fourth", key="nightly-2026-12-03").result(timeout=WAIT)
            == "first"
        )


def test_cancel_by_job_id_from_another_client_cancels_the_owners_future(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    s = make_scheduler(workers=1, store=tmp_path / "jobs.db")
    mine = s.schedule(jobs.noop, 1, delay=60)
    s.stats()  # it has reached the manager (submits are sent write-behind)
    other = mpsched.connect(s.address, authkey=s.authkey)
    try:
        assert other.cancel(mine.job_id) is True
        assert other.cancel(mine.job_id) is False
    finally:
        other.detach()
    wait_for(mine.cancelled, WAIT, "the owner's future cancelled")
    assert [j.state for j in s.jobs() if j.job_id == mine.job_id] == ["cancelled"]


def test_a_full_disk_fails_only_the_submit_that_hit_it(
    make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    import psutil

    store = tmp_path / "jobs.db"
    s = make_scheduler(workers=1, store=store)
    kept = [s.schedule(jobs.noop, n, delay=600) for n in range(20)]
    s.stats()  # committed
    manager = psutil.Process(s._manager_process.pid)
    old = manager.rlimit(psutil.RLIMIT_FSIZE)
    biggest = max(p.stat().st_size for p in tmp_path.iterdir() if p.name.startswith("jobs"))
    manager.rlimit(psutil.RLIMIT_FSIZE, (biggest + 65536, old[1]))  # no room to grow
    try:
        too_big = s.schedule(jobs.noop, bytes(4 << 20))
        assert isinstance(too_big.exception(timeout=WAIT), StoreError)
    finally:
        manager.rlimit(psutil.RLIMIT_FSIZE, old)
    assert s.submit(jobs.noop, "after").result(timeout=WAIT) == "after"  # carries on
    assert {j.job_id for j in s.jobs(state="pending")} == {f.job_id for f in kept}
    kill_manager(s)
    s2 = make_scheduler(workers=1, store=store)  # and nothing committed was lost
    assert {j.job_id for j in s2.jobs(state="pending")} == {f.job_id for f in kept}
