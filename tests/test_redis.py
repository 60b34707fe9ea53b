"""Several managers on one Redis store, end to end: real ``serve`` processes (and
Schedulers), a real redis-server of the test's own, clients in the test process.

Each run of a job logs itself (shared_jobs: one O_APPEND line with its start and pid), so
a test reads what ran, where, when, and how often, whatever was killed on the way.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jobs
import pytest
import shared_jobs
from processes import wait_for
from served import Manager, serve

from mpsched import (
    InvalidJobError,
    PayloadTooLargeError,
    Priority,
    QueueFullError,
    Scheduler,
    StoreError,
    StoreUnavailableError,
    WorkerCrashedError,
)

pytestmark = pytest.mark.slow

SECRET = "n0t-this-one"


def start_manager(procs: Any, url: str, *args: str, workers: int = 1) -> Manager:
    return serve(
        procs, "--address", "127.0.0.1:0", "--workers", str(workers), "--store", url, *args
    )


def worker_pids(manager: Manager) -> set[int]:
    return {w.pid for w in manager.stats().workers}


def test_two_managers_share_a_thousand_jobs_each_run_once_and_never_early(
    procs: Any,
    connect_client: Callable[..., Any],
    shared_redis: Any,
    redis_url: str,
    tmp_path: Path,
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    client = connect_client(first)  # this process: a client of neither's host process
    log = str(tmp_path / "runs.log")
    submitted = time.time()
    futures = [
        client.schedule(shared_jobs.run, log, f"j{n}", delay=(n % 50) / 100) for n in range(1000)
    ]
    assert [f.result(timeout=60) for f in futures] == [f"j{n}" for n in range(1000)]
    runs = shared_jobs.runs(log)
    assert sorted(r.key for r in runs) == sorted(f"j{n}" for n in range(1000))  # once each
    due = {f"j{n}": submitted + (n % 50) / 100 for n in range(1000)}
    assert all(r.started >= due[r.key] for r in runs), "a job started before its due time"
    used = {r.pid for r in runs}
    assert used & worker_pids(first) and used & worker_pids(second)


def test_cancels_through_another_manager_while_jobs_run_in_batches_never_run_one_twice(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    # Short jobs go to each worker in batches; a cancel through the other manager finds
    # each job pending, prefetched (its holder gives it back unless it started) or
    # running: whichever, a job cancelled never runs, and every other one runs once.
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url)
    owner, other = connect_client(first), connect_client(second)
    log = str(tmp_path / "runs.log")
    # All due at one instant, so that both workers take batches (none waits for work).
    at = time.time() + 1.0
    futures = [owner.schedule(shared_jobs.run, log, f"j{n}", 0.0003, at=at) for n in range(1000)]
    tried: set[int] = set()
    cancelled: set[str] = set()
    wait_for(lambda: shared_jobs.runs(log), 30, "the first run")
    deadline = time.monotonic() + 60
    while not futures[-1].done() and time.monotonic() < deadline:
        done = len(shared_jobs.runs(log)) + len(cancelled)
        for n in range(done + 2, min(done + 12, len(futures)), 3):  # just ahead of runs
            if n not in tried:
                tried.add(n)
                if other.cancel(futures[n].job_id):
                    cancelled.add(futures[n].job_id)
    wait_for(lambda: all(f.done() for f in futures), 60)
    ran = collections.Counter(r.key for r in shared_jobs.runs(log))
    assert set(ran.values()) == {1}
    for n, future in enumerate(futures):
        if future.job_id in cancelled:
            assert future.cancelled() and f"j{n}" not in ran
        else:
            assert future.result() == f"j{n}" and ran[f"j{n}"] == 1
    assert sum(m.stats().queue.prefetched for m in (first, second)) > 0


def test_large_arguments_and_results_of_a_remote_client_go_through_redis(
    procs: Any, connect_client: Callable[..., Any], redis_url: str
) -> None:
    # Over a connection, a payload of 64 KiB or more arrives as a bytearray.
    manager = start_manager(procs, redis_url, workers=1)
    client = connect_client(manager)
    data = os.urandom(200_000)
    assert client.submit(jobs.length, data).result(timeout=30) == len(data)
    assert client.submit(bytes, 300_000).result(timeout=30) == bytes(300_000)


def test_max_pending_bytes_bounds_what_every_managers_pending_jobs_hold(
    procs: Any, connect_client: Callable[..., Any], redis_url: str
) -> None:
    # Submits go through a manager without workers; claims on another one make room.
    size, bound = 100_000, 250_000  # two jobs' payloads fit (a little over their data)
    submitter = start_manager(procs, redis_url, "--max-pending-bytes", str(bound), workers=0)
    hasty = connect_client(submitter, submit_timeout=0.5)
    patient = connect_client(submitter, submit_timeout=30)
    data = os.urandom(size)
    queued = [hasty.submit(jobs.length, data) for _ in range(2)]
    with pytest.raises(QueueFullError) as full:
        hasty.submit(jobs.length, data)
    assert (full.value.unit, full.value.max_pending) == ("payload bytes", bound)
    with pytest.raises(InvalidJobError, match="can never fit max_pending_bytes"):
        hasty.submit(jobs.length, os.urandom(bound))  # as without Redis: it never fits
    waited: list[Any] = []
    thread = threading.Thread(target=lambda: waited.append(patient.submit(jobs.length, data)))
    thread.start()
    try:
        assert not waited  # the queue is full: it waits for room
        start_manager(procs, redis_url, workers=1)  # the store's only worker
        thread.join(30)
        assert len(waited) == 1  # the runner's claims made room
        assert [f.result(timeout=30) for f in queued + waited] == [size] * 3
    finally:
        thread.join(30)


def test_a_scheduler_on_redis_maps_in_batches_that_fit_max_pending_bytes(
    make_scheduler: Callable[..., Scheduler], redis_url: str
) -> None:
    size = 100_000
    scheduler = make_scheduler(workers=1, store=redis_url, max_pending_bytes=2 * size + 1000)
    data = os.urandom(size)
    # Five payloads, two of which fit at once: sent in batches, each waiting for room.
    assert list(scheduler.map(jobs.length, [data] * 5)) == [size] * 5
    with pytest.raises(InvalidJobError, match="can never fit max_pending_bytes"):
        scheduler.submit(jobs.length, os.urandom(3 * size))


def test_jobs_run_in_exact_order_across_managers(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    idle = start_manager(procs, redis_url, workers=0)  # submits only
    client = connect_client(idle)
    log = str(tmp_path / "runs.log")
    at = time.time() + 1.5
    levels = [Priority.LOW, Priority.MEDIUM, Priority.HIGH]
    futures = [
        client.schedule(
            shared_jobs.run, log, f"{levels[n % 3].name}-{n}", at=at, priority=levels[n % 3]
        )
        for n in range(30)
    ]
    futures.append(
        client.schedule(shared_jobs.run, log, "first", at=at - 0.5, priority=Priority.LOW)
    )
    start_manager(procs, redis_url, workers=1)  # the one worker of the store
    for future in futures:
        future.result(timeout=60)
    order = [r.key for r in shared_jobs.runs(log)]
    expected = ["first"] + [
        f"{levels[n % 3].name}-{n}" for level in (2, 1, 0) for n in range(30) if n % 3 == level
    ]
    assert order == expected


@pytest.mark.parametrize("retries", [0, 1])
def test_a_killed_managers_job_is_taken_back_by_a_peer_in_time(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path, retries: int
) -> None:
    lease = 2.0
    doomed = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    client = connect_client(doomed)
    log = str(tmp_path / "runs.log")
    job = client.schedule(shared_jobs.run, log, "held", 30.0, retries=retries)
    wait_for(lambda: len(shared_jobs.runs(log)) == 1, 30, "the job started")
    survivor = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    watcher = connect_client(survivor)
    watched = watcher.job(job.job_id)
    os.killpg(doomed.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    if retries:
        wait_for(lambda: len(shared_jobs.runs(log)) == 2, lease + 10, "the job ran again")
        assert time.monotonic() - killed < lease + 1.0
        runs = shared_jobs.runs(log)
        assert runs[1].pid in worker_pids(survivor)
    else:
        with pytest.raises(WorkerCrashedError):
            watched.result(timeout=lease + 10)
        assert time.monotonic() - killed < lease + 1.0
        assert len(shared_jobs.runs(log)) == 1  # never run twice


def test_a_manager_stopped_past_its_lease_loses_its_job_and_its_late_end_replaces_that(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    lease = 1.5
    # The peer has no worker: it only takes back the job of the stalled manager.
    peer = start_manager(procs, redis_url, "--lease-timeout", str(lease), workers=0)
    stalled = start_manager(procs, redis_url, "--lease-timeout", str(lease))
    log = str(tmp_path / "runs.log")
    client = connect_client(stalled)
    job = client.schedule(shared_jobs.run, log, "held", lease + 3.0)  # retries=0
    wait_for(lambda: len(shared_jobs.runs(log)) == 1, 30, "the job started")
    watched = connect_client(peer).job(job.job_id)
    os.kill(stalled.proc.pid, signal.SIGSTOP)  # the manager; its worker runs on
    try:
        with pytest.raises(WorkerCrashedError):
            watched.result(timeout=lease + 10)
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    # The job ran to its end on the stalled manager's worker: that end is recorded in
    # place of the failure the peer recorded, and said.
    wait_for(
        lambda: "its end replaces that failure" in stalled.proc.stderr(),
        30,
        "the late end was recorded and logged",
    )
    wait_for(
        lambda: "presumed dead" in stalled.proc.stderr(),
        30,
        "the manager learnt that its peers presumed it dead",
    )
    again = client.schedule(shared_jobs.run, log, "after", 0.0)
    assert again.result(timeout=30) == "after"  # it carries on
    [info] = [i for i in connect_client(peer).jobs() if i.job_id == job.job_id]
    assert info.state == "done"
    assert len(shared_jobs.runs(log)) == 2  # "held" ran once


def test_one_key_submitted_at_once_through_two_managers_runs_once(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    managers = [start_manager(procs, redis_url), start_manager(procs, redis_url)]
    clients = [connect_client(m) for m in managers]
    log = str(tmp_path / "runs.log")
    barrier = threading.Barrier(len(clients))
    futures: list[Any] = [None, None]

    def submit(n: int) -> None:
        barrier.wait()
        futures[n] = clients[n].schedule(shared_jobs.run, log, f"from-{n}", 0.2, key="once")

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert futures[0].job_id == futures[1].job_id
    results = {futures[n].result(timeout=30) for n in range(2)}
    assert len(results) == 1 and len(shared_jobs.runs(log)) == 1


def test_acknowledged_jobs_survive_a_sigkill_of_redis_under_appendfsync_always(
    own_redis: Callable[..., Any], make_scheduler: Callable[..., Scheduler], tmp_path: Path
) -> None:
    server = own_redis(appendonly="yes", appendfsync="always")
    scheduler = make_scheduler(workers=1, store=server.url(), max_pending=1000)
    log = str(tmp_path / "runs.log")
    # max_pending: each submit returns once Redis acknowledged it
    futures = [scheduler.schedule(shared_jobs.run, log, f"j{n}", delay=2.0) for n in range(50)]
    server.kill()
    server.start()
    assert sorted(f.result(timeout=60) for f in futures) == sorted(f"j{n}" for n in range(50))
    assert collections.Counter(r.key for r in shared_jobs.runs(log)).most_common(1)[0][1] == 1


def test_a_scheduler_on_a_redis_that_may_evict_fails_at_once_without_the_password(
    own_redis: Callable[..., Any],
) -> None:
    server = own_redis(maxmemory_policy="allkeys-lru", requirepass=SECRET)
    started = time.monotonic()
    with pytest.raises(StoreError, match="maxmemory-policy") as caught:
        Scheduler(workers=1, store=server.url())
    assert SECRET not in str(caught.value)
    assert time.monotonic() - started < 15.0


def test_serve_with_a_bad_store_url_says_so_in_one_line(procs: Any) -> None:
    done = procs.run(
        "serve", "--address", "127.0.0.1:0", "--store", f"redis://:{SECRET}@127.0.0.1:1/0"
    )
    assert done.returncode == 7, done.stderr
    assert "nothing is listening" in done.stderr and SECRET not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_one_schedule_added_on_two_managers_runs_each_slot_once(
    make_scheduler: Callable[..., Scheduler], redis_url: str, tmp_path: Path
) -> None:
    log = str(tmp_path / "runs.log")
    first = make_scheduler(workers=1, store=redis_url)
    second = make_scheduler(workers=1, store=redis_url)
    handles = [s.every(0.25, shared_jobs.run, log, "tick", id="tick") for s in (first, second)]
    assert [s.id for s in second.schedules()] == ["tick"]  # one schedule
    wait_for(lambda: len(shared_jobs.runs(log)) >= 8, 30, "eight runs")
    handles[1].cancel()  # from the other manager: it ends on both
    time.sleep(0.6)
    runs = shared_jobs.runs(log)
    done = [j for j in first.jobs() if j.job_id.startswith("tick@") and j.state == "done"]
    assert len(done) == len(runs), "a slot ran twice"  # one run id per slot, each once
    assert all(j.attempts == 1 for j in done)
    assert {r.pid for r in runs} <= {w.pid for s in (first, second) for w in s.stats().workers}
    time.sleep(0.6)
    assert len(shared_jobs.runs(log)) == len(runs)  # cancelled on both


def test_the_cli_works_against_any_manager_and_status_shows_them_all(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    first, second = start_manager(procs, redis_url), start_manager(procs, redis_url, workers=2)
    client = connect_client(first)
    log = str(tmp_path / "runs.log")
    done = client.schedule(shared_jobs.run, log, "done", 0.0)
    later = client.schedule(shared_jobs.run, log, "later", 0.0, delay=600)
    assert done.result(timeout=30) == "done"
    status = procs.run("status", *second.cli())
    assert status.returncode == 0, status.stderr
    assert "managers  2 on the store" in status.stdout
    for manager in (first, second):
        assert str(manager.proc.pid) in status.stdout
        assert manager.address in status.stdout
    assert status.stdout.count("    worker ") == 3 and "s ago" in status.stdout
    listed = procs.run("jobs", *second.cli())
    assert done.job_id in listed.stdout and later.job_id in listed.stdout
    shown = procs.run("result", done.job_id, *second.cli())
    assert shown.returncode == 0 and "done" in shown.stdout, shown.stderr
    cancelled = procs.run("cancel", later.job_id, *second.cli())
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for(later.cancelled, 10, "the future of its owner's client ended cancelled")
    client.every(3600, shared_jobs.run, log, "hourly", id="hourly")
    wait_for(
        lambda: "hourly" in procs.run("schedules", *second.cli()).stdout,
        10,
        "the other manager lists the schedule added through the first",
    )


def test_a_payload_larger_than_redis_takes_fails_at_the_call_site(
    own_redis: Callable[..., Any], make_scheduler: Callable[..., Scheduler]
) -> None:
    server = own_redis(proto_max_bulk_len="1mb")
    scheduler = make_scheduler(workers=1, store=server.url())
    with pytest.raises(PayloadTooLargeError, match="more than the job store takes"):
        scheduler.submit(len, b"x" * 2**20)
    with pytest.raises(PayloadTooLargeError):
        list(scheduler.map(len, [b"x", b"y" * 2**20]))
    assert scheduler.submit(len, b"x" * 1000).result(timeout=30) == 1000


def test_while_redis_is_down_calls_fail_with_a_typed_error_and_work_again_after(
    own_redis: Callable[..., Any], make_scheduler: Callable[..., Scheduler]
) -> None:
    server = own_redis(appendonly="yes", appendfsync="always")
    scheduler = make_scheduler(workers=1, store=server.url())
    assert scheduler.submit(len, "ab").result(timeout=30) == 2
    server.kill()
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="job store unix://"):
        scheduler.submit(len, "abc").result(timeout=30)
    with pytest.raises(StoreUnavailableError):
        scheduler.jobs()
    assert time.monotonic() - started < 15.0  # at once: nothing waits for Redis
    server.start()
    deadline = time.monotonic() + 30
    while True:  # the manager's connections come back on their next use
        try:
            assert scheduler.submit(len, "abcd").result(timeout=30) == 4
            break
        except StoreUnavailableError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_status_shows_the_workers_of_each_manager_with_how_old_that_news_is(
    procs: Any, connect_client: Callable[..., Any], redis_url: str, tmp_path: Path
) -> None:
    busy = start_manager(procs, redis_url, "--lease-timeout", "30")  # beats every 10 s
    other = start_manager(procs, redis_url, workers=0)
    log = str(tmp_path / "runs.log")
    job = connect_client(busy).schedule(shared_jobs.run, log, "held", 20.0)
    wait_for(lambda: shared_jobs.runs(log), 30, "the job started")
    mine = procs.run("status", *busy.cli())  # its own workers, as they are now
    assert mine.returncode == 0, mine.stderr
    [line] = [ln for ln in mine.stdout.splitlines() if ln.startswith("    worker ")]
    assert f"running {job.job_id}" in line and line.endswith("(now)")
    theirs = procs.run("status", *other.cli())  # another manager's, from its heartbeat
    [line] = [ln for ln in theirs.stdout.splitlines() if ln.startswith("    worker ")]
    assert "(as of " in line and line.endswith(" s ago)")
