"""ManagerService in-process: what it does with workers' reports."""

from __future__ import annotations

import time

from mpsched._job import JobRequest, Outcome
from mpsched._manager import (
    ManagerService,
    Report,
    WorkerHello,
    assignment_from_wire,
    report_to_wire,
)
from mpsched._queue import JobQueue
from mpsched._transport import describe_versions


def hello(worker_id: str, host: str, pid: int) -> WorkerHello:
    python, cp = describe_versions()
    return WorkerHello(worker_id, pid, host, python, cp, remote=True)


def run_one(service: ManagerService, worker_id: str) -> None:
    service.queue.submit(JobRequest(f"job-{worker_id}", "c", b"", 2, 0.0, None))
    wire = service.take(worker_id, None, 0)
    assert wire is not None
    assignment = assignment_from_wire(wire)
    # A start stamp far from the manager's clock, as another machine's would be.
    outcome = Outcome(assignment.lease.job_id, True, b"", "", time.monotonic() - 1e6)
    service.finish(worker_id, report_to_wire(Report(assignment.lease.lease_id, outcome)))


def test_a_worker_on_another_machine_does_not_skew_lateness():
    import os

    service = ManagerService(JobQueue())
    service.hello(hello("far", "some-other-host", 4242))
    service.hello(hello("near", service.host, os.getpid()))
    run_one(service, "far")
    stats = service.stats().queue
    assert stats.completed == 1 and stats.lateness_samples == 0 and stats.started_early == 0
    run_one(service, "near")
    stats = service.stats().queue
    assert stats.completed == 2 and stats.lateness_samples == 1 and stats.started_early == 1
