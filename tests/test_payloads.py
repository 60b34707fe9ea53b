"""Large arguments and results end to end: through shared memory, and nothing leaked.

Each test counts the segments under its manager's prefix in /dev/shm: while jobs hold
them, and after submits, cancels, crashes of workers, clients and the manager, timeouts
and retries, when only the manager's probe may remain (nothing once it stopped).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import jobs
import psutil
import pytest
from processes import wait_for, wait_started
from served import serve

from mpsched import Scheduler
from mpsched._core.job import JobState
from mpsched._errors import (
    JobTimeoutError,
    QueueFullError,
    SchedulerShutdownError,
    WorkerCrashedError,
)
from mpsched._payload import segment_pool as _segment_pool
from mpsched._payload import shm
from mpsched._store.redis.store import RedisStore
from mpsched._transport.address import format_address

pytestmark = pytest.mark.slow

BIG = 1 << 20  # 1 MiB


def segments(s: Scheduler, kind: str = "") -> list[str]:
    return shm.names(s._core.shm_prefix + kind)


def settled(s: Scheduler) -> None:
    """Wait until only the probe is left: results are released when their client collects
    again, which its result thread does right after resolving them."""
    wait_for(lambda: segments(s) == [s._core.shm_prefix + "probe"], what="segments released")


@pytest.fixture(params=["no-store", "redis"])
def store_options(request):
    """No store, or a Redis store (which holds every payload whole: the manager keeps
    the segments of its own clients' jobs for its own workers)."""
    if request.param == "no-store":
        return {}
    return {"store": request.getfixturevalue("redis_url")}


def test_arguments_and_results_travel_through_shared_memory(make_scheduler, fifo, store_options):
    s = make_scheduler(workers=1, **store_options)
    assert s._core.shm_prefix  # a Scheduler's client shares its manager's /dev/shm
    data = os.urandom(BIG)
    running = s.submit(jobs.announce_then_sleep_with, fifo, 0.5, data)
    wait_started(fifo)
    assert len(segments(s, "j")) == 1  # the argument, written once, while it runs
    assert running.result(timeout=30) == BIG
    assert s.submit(jobs.length, bytearray(data)).result(timeout=30) == BIG
    assert s.submit(jobs.big_result, BIG).result(timeout=30) == bytes([7]) * BIG
    assert list(s.map(jobs.length, [data, b"small", memoryview(data)])) == [BIG, 5, BIG]
    mapped = s.submit(jobs.inspect_mapped, jobs.Mapped(bytearray(BIG))).result(timeout=30)
    assert mapped == ("mmap", True, 255)  # mapped in the worker, not copied
    settled(s)
    s.shutdown()
    assert segments(s) == []


def test_cancelled_and_retried_jobs_leak_nothing(make_scheduler, tmp_path, store_options):
    s = make_scheduler(workers=1, **store_options)
    data = os.urandom(BIG)
    later = [s.schedule(jobs.length, data, delay=60) for _ in range(3)]
    s.stats()  # every submit has landed
    assert len(segments(s, "j")) == 3
    assert later[0].cancel()
    assert s._core.cancel_jobs([later[1].job_id]) == 1
    retried = s.schedule(jobs.die_once_with, str(tmp_path / "m1"), data, retries=1)
    crashed = s.schedule(jobs.die_once_with, str(tmp_path / "m2"), data)
    assert retried.result(timeout=30) == BIG
    assert isinstance(crashed.exception(timeout=30), WorkerCrashedError)
    s.shutdown(cancel_futures=True)
    assert later[2].cancelled()
    assert segments(s) == []


def test_a_job_past_its_timeout_leaks_nothing(make_scheduler, fifo, store_options):
    s = make_scheduler(workers=1, **store_options)
    late = s.schedule(jobs.announce_then_sleep_with, fifo, 60, os.urandom(BIG), timeout=0.5)
    wait_started(fifo)
    assert isinstance(late.exception(timeout=30), JobTimeoutError)
    settled(s)


def test_a_dead_client_s_jobs_and_results_leak_nothing(make_scheduler, tmp_path):
    s = make_scheduler(workers=1)
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import jobs, mpsched
        c = mpsched.connect({s.address!r}, authkey={s.authkey!r})
        assert c._core.shm_prefix
        c.schedule(jobs.length, os.urandom({BIG}), delay=0.5)
        c.schedule(jobs.big_result, {BIG}, delay=0.5)
        c.stats()  # both landed
        os._exit(0)  # no goodbye: the manager finds out from its connections
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    wait_for(lambda: s.stats().completed == 2, what="the dead client's jobs ran")
    settled(s)


def test_a_job_held_by_one_manager_runs_on_another_with_its_payload_inline(
    make_scheduler, redis_url, fifo, tmp_path
):
    # Submitted through a manager whose one worker is busy, which keeps the segments;
    # the other manager claims the jobs with their payloads from Redis (copies, not
    # mappings), and their results reach the owner's client through Redis.
    owner = make_scheduler(workers=1, store=redis_url)
    release = tmp_path / "release"
    busy = owner.submit(jobs.announce_then_wait, fifo, str(release), 60)
    wait_started(fifo)
    data = os.urandom(BIG)
    mapped = owner.submit(jobs.inspect_mapped, jobs.Mapped(bytearray(data)))
    summed = owner.submit(jobs.digest, data)
    result = owner.submit(jobs.big_result, BIG)
    later = owner.schedule(jobs.length, data, delay=60)
    owner.stats()  # every submit has landed
    assert len(segments(owner, "j")) == 3  # held while the jobs are pending
    runner = make_scheduler(workers=1, store=redis_url)
    assert runner.cancel(later.job_id)  # the end reaches the owner, which unlinks it
    assert mapped.result(timeout=30) == ("bytearray", True, 255)  # inline: a copy
    assert summed.result(timeout=30) == hashlib.sha256(data).hexdigest()
    assert result.result(timeout=30) == bytes([7]) * BIG  # inline, through Redis
    wait_for(later.cancelled, what="the owner's future ended cancelled")
    release.touch()
    assert busy.result(timeout=30) == "woke"
    own = owner.submit(jobs.big_result, BIG, 3)  # its result comes back in a segment
    assert own.result(timeout=30) == bytes([3]) * BIG
    settled(owner)  # the ends came to the owner, which unlinked the segments
    settled(runner)
    # What Redis keeps of a result a worker wrote into shared memory is whole, for
    # every manager, after the segment is gone.
    assert runner.job(own.job_id).result(timeout=30) == bytes([3]) * BIG


def test_prefetched_and_cancelled_jobs_on_a_redis_store_leak_nothing(make_scheduler, redis_url):
    # Short jobs go to each worker in batches (prefetched); cancels just ahead of the runs
    # find them pending, prefetched (given back, then cancelled) or started: each ends
    # once, rightly, and every segment is unlinked when its job ends.
    s = make_scheduler(workers=2, store=redis_url)
    data = os.urandom(shm.THRESHOLD * 2)
    # Some due in an hour, cancelled for sure (pending); the others raced below.
    later = [s.schedule(jobs.hold_with, 0.0003, data, delay=3600) for _ in range(3)]
    assert all(f.cancel() for f in later)
    futures = [s.submit(jobs.hold_with, 0.0003, data) for _ in range(1000)]
    tried: set[int] = set()
    cancelled: set[int] = set()
    while not futures[-1].done():
        done = sum(f.done() for f in futures)
        for n in range(done + 2, min(done + 30, len(futures)), 3):
            if n not in tried:
                tried.add(n)
                if futures[n].cancel():
                    cancelled.add(n)
    results = {n: f.result(timeout=60) for n, f in enumerate(futures) if n not in cancelled}
    assert set(results.values()) == {len(data)}
    # How many of the raced cancels find a job not yet started depends on the machine's
    # pace (none, on a loaded one): each that did must have ended cancelled.
    assert all(f.cancelled() for f in later) and all(futures[n].cancelled() for n in cancelled)
    assert s.stats().queue.prefetched > 0
    settled(s)


def test_a_late_end_refused_by_redis_leaks_nothing_and_its_retry_runs(
    make_scheduler, redis_url, procs, fifo, tmp_path
):
    # The manager stalls past its lease while its worker runs a job held in shared
    # memory: a peer takes the job back (a retry). The stalled manager's late end, with
    # a large result in a segment, is refused: the result's segment is unlinked. Its
    # worker then runs the retry, whose payload this manager no longer holds: it reads
    # it from Redis.
    lease = 1.5
    s = make_scheduler(workers=1, store=redis_url, lease_timeout=lease)
    serve(
        procs,
        "--address",
        "127.0.0.1:0",
        "--workers",
        "0",
        "--store",
        redis_url,
        "--lease-timeout",
        str(lease),
    )  # takes back the stalled manager's job
    release = tmp_path / "release"
    data = os.urandom(BIG)
    job = s.schedule(jobs.announce_wait_then_big_result, fifo, str(release), data, retries=1)
    wait_started(fifo)
    store = RedisStore(redis_url)
    try:
        os.kill(s._manager_process.pid, signal.SIGSTOP)  # its worker runs on
        try:
            wait_for(
                lambda: getattr(store.get(job.job_id), "state", None) is JobState.PENDING,
                lease + 10,
                "the peer took the job back",
            )
            release.touch()  # the worker ends it and reports to the stalled manager
        finally:
            os.kill(s._manager_process.pid, signal.SIGCONT)
    finally:
        store.close()
    wait_started(fifo)  # the retry
    assert job.result(timeout=30) == bytes([7]) * BIG
    settled(s)


def test_a_finished_job_s_segment_carries_the_next_job(make_scheduler, monkeypatch):
    monkeypatch.setattr(_segment_pool, "IDLE", 30.0)  # however slow the machine
    s = make_scheduler(workers=1)
    seen: set[str] = set()
    for _ in range(5):
        data = os.urandom(BIG)
        assert s.submit(jobs.digest, data).result(timeout=30) == hashlib.sha256(data).hexdigest()
        seen.update(segments(s, "jp"))
    assert len(seen) == 1  # written five times, created once
    assert s._core.pool is not None and s._core.pool.free_names() == list(seen)
    s.shutdown()
    assert segments(s) == []


def test_cancelled_and_unqueued_jobs_hand_their_segments_back(make_scheduler, monkeypatch):
    monkeypatch.setattr(_segment_pool, "IDLE", 30.0)
    s = make_scheduler(workers=1)
    pool = s._core.pool
    assert pool is not None
    first = s.schedule(jobs.digest, os.urandom(BIG), delay=60)
    s.stats()
    assert first.cancel() and pool.free_names() == segments(s, "jp")
    keyed = s.schedule(jobs.digest, os.urandom(BIG), delay=60, key="k")
    held = s.schedule(jobs.digest, os.urandom(BIG), delay=60, key="k")  # not queued
    assert held.job_id == keyed.job_id and len(pool.free_names()) == 1
    assert s._core.cancel_jobs([keyed.job_id]) == 1
    assert sorted(pool.free_names()) == sorted(segments(s, "jp")) and len(segments(s)) == 3
    # Each segment carries new arguments now, and each job sees its own.
    data = [os.urandom(BIG) for _ in range(4)]
    runs = [s.submit(jobs.digest, d) for d in data]
    assert [r.result(timeout=30) for r in runs] == [hashlib.sha256(d).hexdigest() for d in data]
    s.shutdown()
    assert segments(s) == []


def test_a_dead_client_s_free_segments_are_removed(make_scheduler):
    s = make_scheduler(workers=1)
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import jobs, mpsched
        from mpsched._payload import segment_pool as _segment_pool
        _segment_pool.IDLE = 3600.0  # kept free until the client dies
        c = mpsched.connect({s.address!r}, authkey={s.authkey!r})
        assert c.submit(jobs.length, os.urandom({BIG})).result(timeout=30) == {BIG}
        assert c._core.pool.free_names()
        os._exit(0)  # no goodbye: the manager finds out from its connections
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    settled(s)


# Put on a worker's PYTHONPATH: it finds none of our segments, as on another host.
NO_SHARED_MEMORY = """
import _posixshmem

def shm_open(path, *args, **kwargs):
    raise FileNotFoundError(2, "No such file or directory", path)

_posixshmem.shm_open = shm_open
"""


def test_a_remote_worker_gets_the_arguments_inline(make_scheduler, procs, tmp_path, fifo):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_SHARED_MEMORY)
    key = tmp_path / "authkey"
    s = make_scheduler(workers=1)
    key.write_bytes(s.authkey)
    key.chmod(0o600)
    s.submit(jobs.announce_then_sleep, fifo, 600)  # keeps the local worker busy
    wait_started(fifo)
    pythonpath = os.pathsep.join([str(site), procs.env["PYTHONPATH"]])
    pool = procs.start(
        "worker",
        "--connect",
        format_address(s.address),
        "--authkey-file",
        str(key),
        "--processes",
        "1",
        env={"PYTHONPATH": pythonpath},
    )
    assert "1 process joined" in pool.line()
    data = os.urandom(BIG)
    assert s.submit(jobs.digest, data).result(timeout=30) == hashlib.sha256(data).hexdigest()
    assert s.submit(jobs.length, bytearray(data)).result(timeout=30) == BIG
    mapped = s.submit(jobs.inspect_mapped, jobs.Mapped(bytearray(BIG))).result(timeout=30)
    assert mapped[1:] == (True, 255)  # a writable copy of its own, as the job wrote to it
    assert s.submit(jobs.big_result, BIG).result(timeout=30) == bytes([7]) * BIG


def test_a_crashed_manager_s_segments_are_removed(make_scheduler):
    s = make_scheduler(workers=1)
    prefix = s._core.shm_prefix
    pending = s.schedule(jobs.length, os.urandom(BIG), delay=60)
    s.stats()
    assert len(shm.names(prefix)) == 2  # the argument and the probe
    os.kill(s._manager_process.pid, signal.SIGKILL)
    assert isinstance(pending.exception(timeout=30), SchedulerShutdownError)
    s.shutdown()
    s._finalizer()  # as when the Scheduler is dropped or the program exits
    assert shm.names(prefix) == []  # its owner removed what the killed manager left


def test_a_new_manager_removes_what_a_killed_one_left(make_scheduler):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    prefix = shm.manager_prefix(gone.pid)
    gone.wait()
    shm.write(prefix + "jleft", [memoryview(b"left")])
    try:
        make_scheduler(workers=1)
        assert shm.names(prefix) == []
    finally:
        shm.sweep(prefix)


@pytest.mark.parametrize(
    "options", [{"shared_memory": False}, {"store": "jobs.db"}], ids=["off", "store"]
)
def test_without_shared_memory_payloads_travel_inline(make_scheduler, tmp_path, options):
    if "store" in options:
        options = {"store": tmp_path / options["store"]}
    s = make_scheduler(workers=1, **options)
    assert s._core.shm_prefix == ""
    manager = psutil.Process(s._manager_process.pid).pid
    before = shm.names(f"mps{manager}_")
    assert s.submit(jobs.length, os.urandom(BIG)).result(timeout=30) == BIG
    assert s.submit(jobs.big_result, BIG).result(timeout=30) == bytes([7]) * BIG
    assert before == shm.names(f"mps{manager}_") == []


def test_max_pending_bytes_makes_submits_wait_then_fail(make_scheduler):
    s = make_scheduler(workers=1, max_pending_bytes=3 * BIG, submit_timeout=0.5)
    data = os.urandom(BIG)
    queued = [s.schedule(jobs.length, data, delay=60) for _ in range(2)]
    with pytest.raises(QueueFullError) as full:
        s.schedule(jobs.length, data, delay=60)
    assert full.value.unit == "payload bytes"
    assert len(segments(s, "j")) == 2  # the refused job's segment was removed
    queued[0].cancel()
    assert s.schedule(jobs.length, data).result(timeout=30) == BIG
    queued[1].cancel()
    # 5 MiB in one map() call: sent in batches that each fit, waiting for room between.
    assert list(s.map(jobs.length, [data] * 5)) == [BIG] * 5
