"""The supervisor: timeout kills that never hit the wrong job, restarts that never give up."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jobs
import psutil
import pytest
from fakeclock import FakeClock
from processes import wait_for

import mpsched._manager.supervisor as supervisor_module
from mpsched import Scheduler
from mpsched._core.job import JobRequest, Outcome
from mpsched._core.queue import JobQueue
from mpsched._manager.service import ManagerService
from mpsched._manager.supervisor import Supervisor, _Local
from mpsched._protocol.records import (
    ManagerConfig,
    StartMethod,
    WorkerHello,
)
from mpsched._transport.sockets import describe_versions


class _FakeProc:
    pid = 999_999


@pytest.fixture
def supervised() -> Iterator[tuple[Supervisor, JobQueue, FakeClock]]:
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    service = ManagerService(queue)
    supervisor = Supervisor(
        service, ManagerConfig(authkey=b"k", workers=0, mp_method=StartMethod.SPAWN), address=None
    )
    python, cp = describe_versions()
    service.hello(WorkerHello("w1", _FakeProc.pid, "host", python, cp))
    supervisor._workers["w1"] = _Local(_FakeProc(), None)  # type: ignore[arg-type]
    yield supervisor, queue, clock
    supervisor._lifeline_w.close()
    supervisor._lifeline_r.close()
    os.close(service.wake_reader)


def _late_job_then_next(queue: JobQueue, clock: FakeClock) -> int:
    queue.submit(JobRequest("late", "c", b"", 2, 0.0, None, timeout=1.0))
    queue.submit(JobRequest("next", "c", b"", 2, 0.0, None, timeout=60.0))
    taken = queue.take("w1", 0)
    assert taken is not None and taken.lease.job_id == "late"
    clock.advance(2.0)  # past the late job's timeout
    return taken.lease.lease_id


def test_a_job_past_its_timeout_gets_its_worker_killed_once(
    supervised: tuple[Supervisor, JobQueue, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, queue, clock = supervised
    killed: list[int] = []
    monkeypatch.setattr(supervisor_module, "kill_tree", killed.append)
    _late_job_then_next(queue, clock)
    supervisor._kill_expired()
    supervisor._kill_expired()
    assert killed == [_FakeProc.pid]


def test_a_timeout_kill_never_hits_the_job_taken_after_the_late_one(
    supervised: tuple[Supervisor, JobQueue, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, queue, clock = supervised
    killed: list[int] = []
    monkeypatch.setattr(supervisor_module, "kill_tree", killed.append)
    lease_id = _late_job_then_next(queue, clock)
    expired = queue.leases.expired

    def worker_reports_in_between(now: float | None = None) -> Any:
        found = expired(now)
        # Between the supervisor's look and its kill, the worker reports the late job
        # and takes the next one.
        queue.leases.complete(lease_id, Outcome("late", True, b"", "", None))
        assert queue.take("w1", 0) is not None
        return found

    monkeypatch.setattr(queue.leases, "expired", worker_reports_in_between)
    supervisor._kill_expired()
    assert killed == []


def test_a_timeout_kill_runs_outside_the_queue_s_lock(
    supervised: tuple[Supervisor, JobQueue, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psutil walking a process tree is slow: other workers' takes must not wait on it."""
    supervisor, queue, clock = supervised
    queue.submit(JobRequest("other", "c", b"", 2, 0.0, None))
    took: list[Any] = []

    def slow_kill(pid: int) -> None:
        other = threading.Thread(target=lambda: took.append(queue.take("w2", 0)))
        other.start()
        other.join(10)
        assert not other.is_alive(), "a take waited for the kill"

    monkeypatch.setattr(supervisor_module, "kill_tree", slow_kill)
    queue.submit(JobRequest("late", "c", b"", 1, 0.0, None, timeout=1.0))
    assert queue.take("w1", 0) is not None
    clock.advance(2.0)
    supervisor._kill_expired()
    assert [a.lease.job_id for a in took] == ["other"]


def test_a_worker_being_killed_for_a_timeout_is_handed_no_other_job(
    supervised: tuple[Supervisor, JobQueue, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor, queue, clock = supervised
    taken: list[Any] = []
    lease_id = _late_job_then_next(queue, clock)

    def kill_while_the_worker_reports(pid: int) -> None:
        # The kill is under way, outside the lock: the worker reports the late job and asks
        # for the next, which must not be handed to a process about to die.
        queue.leases.complete(lease_id, Outcome("late", True, b"", "", None))
        taken.append(queue.take("w1", 0))

    monkeypatch.setattr(supervisor_module, "kill_tree", kill_while_the_worker_reports)
    supervisor._kill_expired()
    assert taken == [None]
    assert [(job.job_id, worker) for job, worker in queue.jobs()] == [("next", None)]


@pytest.fixture
def restore_nofile() -> Iterator[Callable[[int, int], None]]:
    changed: list[tuple[psutil.Process, tuple[int, int]]] = []

    def limit(pid: int, soft: int) -> None:
        proc = psutil.Process(pid)
        old = proc.rlimit(psutil.RLIMIT_NOFILE)
        changed.append((proc, old))
        proc.rlimit(psutil.RLIMIT_NOFILE, (soft, old[1]))

    yield limit
    for proc, old in changed:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.rlimit(psutil.RLIMIT_NOFILE, old)


@pytest.mark.slow
def test_a_worker_that_cannot_be_restarted_is_retried_until_it_can(
    make_scheduler: Callable[..., Scheduler], restore_nofile: Callable[[int, int], None]
) -> None:
    s = make_scheduler(workers=1)
    manager = psutil.Process(s._manager_process.pid)
    [worker] = s.stats().workers
    # Every client thread has its connection to the manager before fds run out.
    assert s.submit(jobs.noop, 1).result(timeout=60) == 1
    # No file descriptor left in the manager: starting a worker fails (EMFILE).
    restore_nofile(manager.pid, manager.num_fds())
    os.kill(worker.pid, signal.SIGKILL)
    wait_for(lambda: s.stats().worker_start_failures >= 2, 30, "failed restarts")
    assert s.stats().workers_missing == 1
    restore_nofile(manager.pid, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    wait_for(
        lambda: s.stats().workers_missing == 0 and len(s.stats().workers) == 1,
        60,
        "the worker replaced",
    )
    assert s.submit(jobs.noop, 7).result(timeout=60) == 7
