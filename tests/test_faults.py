"""Failure handling end to end: crashes, timeouts, recycling, orphans, chaos."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections import Counter

import jobs
import pytest
from processes import assert_gone, wait_for, wait_started

from mpsched import (
    JobError,
    JobTimeoutError,
    JobUnpicklingError,
    ManagerConnectionLostError,
    ResultPicklingError,
    ResultUnpicklingError,
    SchedulerShutdownError,
    WorkerCrashedError,
)
from mpsched._client.link import ManagerLink
from mpsched._protocol.records import (
    ClientHello,
)

pytestmark = pytest.mark.slow


def test_killed_worker_fails_only_its_job_and_is_replaced(make_scheduler, fifo):
    s = make_scheduler(workers=2)
    victim = s.submit(jobs.announce_then_sleep, fifo, 60)
    [pid] = wait_started(fifo)
    others = [s.schedule(jobs.pid, delay=0.2) for _ in range(6)]
    os.kill(pid, signal.SIGKILL)
    exc = victim.exception(timeout=30)
    assert isinstance(exc, WorkerCrashedError) and isinstance(exc, ChildProcessError)
    assert "SIGKILL" in str(exc) and victim.job_id in str(exc)
    assert all(isinstance(f.result(timeout=30), int) for f in others)
    wait_for(lambda: len(s.stats().workers) == 2)
    assert pid not in {w.pid for w in s.stats().workers}
    assert s.stats().failed == 1


def test_crash_with_retries_runs_the_job_again(make_scheduler, tmp_path):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.die_once, str(tmp_path / "marker"), retries=1)
    assert future.result(timeout=30) == "survived"
    stats = s.stats()
    assert stats.queue.retried == 1 and stats.failed == 0 and stats.completed == 1


def test_crash_without_retries_left_fails(make_scheduler, tmp_path):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.exit_process, 3, retries=0)
    exc = future.exception(timeout=30)
    assert isinstance(exc, WorkerCrashedError) and "exited with code 3" in str(exc)
    assert exc.exitcode == 3


def test_segfault_fails_only_that_job(make_scheduler):
    s = make_scheduler(workers=1)
    exc = s.submit(jobs.segfault).exception(timeout=30)
    assert isinstance(exc, WorkerCrashedError) and "SIGSEGV" in str(exc)
    assert s.submit(jobs.noop, 5).result(timeout=30) == 5


def test_sys_exit_in_a_job_is_an_error_and_the_worker_survives(make_scheduler):
    s = make_scheduler(workers=1)
    before = s.submit(jobs.pid).result(timeout=30)
    exc = s.submit(jobs.call_sys_exit, 3).exception(timeout=30)
    assert isinstance(exc, JobError) and "sys.exit(3)" in str(exc)
    assert s.submit(jobs.pid).result(timeout=30) == before


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        pytest.param(
            lambda s: s.submit(jobs.noop, jobs.LoadsBadly()),
            JobUnpicklingError,
            "could not unpickle",
            id="job-unpickling",
        ),
        pytest.param(
            lambda s: s.submit(jobs.unpicklable_result),
            ResultPicklingError,
            "could not be pickled",
            id="result-pickling",
        ),
        pytest.param(
            lambda s: s.submit(jobs.return_loads_badly),
            ResultUnpicklingError,
            "could not be unpickled",
            id="result-unpickling",
        ),
    ],
)
def test_pickling_failures_resolve_only_their_future(make_scheduler, call, error, text):
    s = make_scheduler(workers=1)
    exc = call(s).exception(timeout=30)
    assert isinstance(exc, error) and text in str(exc)
    assert s.submit(jobs.noop, "next").result(timeout=30) == "next"


def test_timeout_kills_the_worker_tree_and_fails_with_job_timeout(make_scheduler, fifo):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.announce_then_sleep, fifo, 60, True, timeout=1.0)
    worker_pid, child_pid = wait_started(fifo)
    t0 = time.monotonic()
    exc = future.exception(timeout=30)
    assert isinstance(exc, JobTimeoutError) and isinstance(exc, TimeoutError)
    assert time.monotonic() - t0 < 10
    assert_gone([worker_pid, child_pid])
    assert s.submit(jobs.noop, 1).result(timeout=30) == 1  # replaced
    assert s.stats().queue.timed_out == 1


def test_max_tasks_per_worker_recycles_without_losing_jobs(make_scheduler):
    s = make_scheduler(workers=1, max_tasks_per_worker=2)
    pids = [s.submit(jobs.pid).result(timeout=30) for _ in range(6)]
    assert [pids.count(p) for p in dict.fromkeys(pids)] == [2, 2, 2]
    assert s.stats().completed == 6 and s.stats().failed == 0


def test_max_memory_per_worker_recycles_after_the_job(make_scheduler):
    s = make_scheduler(workers=1, max_memory_per_worker=200 << 20)
    first = s.submit(jobs.hoard, 300).result(timeout=30)
    second = s.submit(jobs.pid).result(timeout=30)
    assert first != second
    assert s.stats().failed == 0


def test_worker_killed_while_waiting_in_take_loses_no_job(make_scheduler):
    # A dead worker's blocked take() lives on in a manager thread; it must never take a
    # job into the closed socket.
    s = make_scheduler(workers=1)
    [worker] = s.stats().workers
    os.kill(worker.pid, signal.SIGKILL)
    futures = [s.submit(jobs.noop, i) for i in range(20)]
    assert [f.result(timeout=30) for f in futures] == list(range(20))
    assert s.stats().failed == 0 and s.stats().queue.retried == 0


OWNER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    import jobs
    from mpsched import Scheduler
    s = Scheduler(workers=2)
    s.submit(jobs.announce_then_sleep, {fifo!r}, 60)
    pids = [s._manager_process.pid] + [w.pid for w in s.stats().workers]
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(120)
""")


@pytest.fixture
def owner_process(fifo):
    """A process holding a Scheduler; yields it with the manager and worker pids."""
    code = OWNER.format(tests=os.path.dirname(__file__), fifo=fifo)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    wait_started(fifo)
    yield proc, pids
    for pid in [proc.pid, *pids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()


def test_killing_the_owner_stops_manager_and_workers(owner_process):
    proc, pids = owner_process
    assert len(pids) == 3
    proc.kill()
    assert_gone(pids)


def test_killing_the_manager_stops_its_workers_even_mid_job(owner_process):
    _, (manager, *workers) = owner_process
    os.kill(manager, signal.SIGKILL)
    assert_gone(workers)


def test_futures_fail_when_the_manager_dies(make_scheduler):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.noop, delay=3600)
    os.kill(s._manager_process.pid, signal.SIGKILL)
    assert isinstance(future.exception(timeout=30), SchedulerShutdownError)
    with pytest.raises(SchedulerShutdownError):
        s.submit(jobs.noop)


def test_a_scheduler_whose_manager_died_says_so_to_its_futures_and_submits(make_scheduler):
    s = make_scheduler(workers=1)
    future = s.schedule(jobs.noop, delay=3600)
    pid = s._manager_process.pid
    os.kill(pid, signal.SIGKILL)
    error = future.exception(timeout=30)
    assert isinstance(error, ManagerConnectionLostError)  # not "after shutdown"
    assert f"this Scheduler's manager (pid {pid}) is gone, and nothing restarts it" in str(error)
    with pytest.raises(ManagerConnectionLostError, match="start a new one"):
        s.submit(jobs.noop)
    with pytest.raises(ManagerConnectionLostError, match="start a new one"):
        s.stats()


def test_a_lost_call_of_a_client_that_does_not_reconnect_refuses_the_next_ones_at_once():
    # An outbox send that loses its connection fails its futures before the result thread
    # has seen the loss: a submit in between must be refused, not queued for a dead manager.
    service = types.SimpleNamespace(manager_address=("127.0.0.1", 1))
    link = ManagerLink(
        service,  # type: ignore[arg-type]
        ClientHello("c1", "3.11", "3.0"),
        None,
        "start a new one",
    )
    assert link.refusal() is None
    error = link.lost(BrokenPipeError(), service)  # type: ignore[arg-type]
    assert "start a new one" in str(error)
    refusal = link.refusal()
    assert isinstance(refusal, ManagerConnectionLostError)
    assert "start a new one" in str(refusal)


def test_chaos_random_worker_kills_lose_nothing(make_scheduler, tmp_path):
    s = make_scheduler(workers=4)
    log_path = str(tmp_path / "runs.log")
    keys = [f"k{i}" for i in range(3000)]
    futures = [
        s.schedule(jobs.record, log_path, k, delay=i / 1000, retries=20) for i, k in enumerate(keys)
    ]
    rng = random.Random(7)
    killed = 0
    while not all(f.done() for f in futures) and killed < 25:
        workers = s.stats().workers
        if workers:
            try:
                os.kill(rng.choice(workers).pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        threading.Event().wait(0.1)
    results = [f.result(timeout=120) for f in futures]
    assert killed >= 10
    assert Counter(key for key, _ in results) == Counter(keys)  # each resolved once
    with open(log_path) as log:
        ran = Counter(line.strip() for line in log)
    assert set(ran) == set(keys)  # every job ran; reruns only after a crash
    stats = s.stats()
    assert stats.completed == len(keys) and stats.failed == 0
    wait_for(lambda: len(s.stats().workers) == 4)
