"""A manager without a store writes nothing per job (NoJournal), and still knows its jobs."""

from __future__ import annotations

import os

import pytest
from fakeclock import FakeClock

from mpsched._errors import InvalidJobError, JobNotFoundError
from mpsched._job import JobRequest, Outcome
from mpsched._protocol import (
    ClientHello,
    Report,
    WorkerHello,
    assignment_from_wire,
    report_to_wire,
    request_to_wire,
)
from mpsched._queue import JobQueue
from mpsched._service import ManagerService
from mpsched._store import JobState
from mpsched._transport import describe_versions

JOB_CALLS = ("submit", "lease", "finish", "requeue", "cancel", "flush", "get", "jobs",
             "find_key")


class NoJobCalls:
    """Stands for the store of a NoJournal: any per-job call fails the test."""

    location = "memory"

    def __getattr__(self, name: str) -> object:
        if name in JOB_CALLS:
            raise AssertionError(f"a manager without a store called store.{name}()")
        raise AttributeError(name)

    def size(self) -> None:
        return None


def request(job_id: str, *, key: str | None = None, delay: float = 0.0,
            name: str = "m:f") -> JobRequest:
    return JobRequest(job_id, "c", b"payload", 2, delay, None, key=key, name=name)


@pytest.fixture
def service() -> ManagerService:
    clock = FakeClock()
    service = ManagerService(JobQueue(clock=clock), clock=clock)  # no store
    service.journal.store = NoJobCalls()  # type: ignore[assignment]
    python, cp = describe_versions()
    service.hello(WorkerHello("w", os.getpid(), "elsewhere", python, cp, True, ""))
    service.open_client(ClientHello("c", python, cp))
    return service


def take(service: ManagerService, report: Report | None = None) -> int:
    wire = service.take("w", None if report is None else report_to_wire(report), 0)
    assert wire is not None
    return assignment_from_wire(wire).lease.lease_id


def done(lease_id: int, job_id: str) -> Report:
    return Report(lease_id, Outcome(job_id, True, b"result", "", None))


def test_jobs_run_without_any_store_call(service: ManagerService) -> None:
    service.submit([request_to_wire(request(f"j{i}")) for i in range(3)], None)
    service.submit([request_to_wire(request("keyed", key="k"))], None)
    service.submit([request_to_wire(request("later", delay=60))], None)
    lease = take(service)
    for job_id in ("j1", "j2", "keyed"):
        lease = take(service, done(lease, "j0" if job_id == "j1" else job_id))
    service.finish("w", report_to_wire(done(lease, "keyed")))
    assert service.cancel("later", "other-client")
    assert service.stats().queue.completed == 4


def test_lookups_see_pending_and_running_jobs_and_forget_ended_ones(
        service: ManagerService) -> None:
    service.submit([request_to_wire(request("run", name="m:run")),
                    request_to_wire(request("wait", delay=60, key="k", name="m:wait"))], None)
    lease = take(service)
    journal = service.journal
    records = journal.jobs(None, None)
    assert [(r.job_id, r.state, r.name, r.worker_id) for r in records] == [
        ("run", JobState.RUNNING, "m:run", "w"), ("wait", JobState.PENDING, "m:wait", None)]
    assert [r.job_id for r in journal.jobs("pending", None)] == ["wait"]
    assert journal.jobs(None, 1)[0].job_id == "run"
    wait = journal.get("wait")
    assert wait is not None and wait.key == "k" and wait.client_id == "c"
    assert journal.owner("run") == "c"
    assert journal.watch("watcher", "run") is None  # handed over when it ends
    service.finish("w", report_to_wire(done(lease, "run")))
    assert journal.get("run") is None and journal.owner("run") is None
    with pytest.raises(JobNotFoundError):
        journal.watch("watcher", "run")


def test_a_key_is_held_while_its_job_is_pending_or_running(service: ManagerService) -> None:
    def submit(job_id: str) -> list[str] | None:
        return service.submit([request_to_wire(request(job_id, key="nightly"))], None)

    assert submit("first") is None
    assert submit("second") == ["first"]  # pending: the holder stands for it
    lease = take(service)
    assert submit("third") == ["first"]  # running
    service.finish("w", report_to_wire(done(lease, "first")))
    assert submit("fourth") is None  # ended: the key is free
    assert service.cancel("fourth", "c")
    assert submit("fifth") is None  # cancelled: free again
    assert service.submit([request_to_wire(request("a", key="x")),
                           request_to_wire(request("b", key="x"))], None) == ["a", "a"]


def test_a_refused_batch_leaves_its_keys_free(service: ManagerService) -> None:
    service.submit([request_to_wire(request("pending"))], None)
    with pytest.raises(InvalidJobError):
        service.submit([request_to_wire(request("new", key="k")),
                        request_to_wire(request("pending"))], None)
    assert service.submit([request_to_wire(request("again", key="k"))], None) is None


def test_the_id_of_a_running_job_is_refused(service: ManagerService) -> None:
    service.submit([request_to_wire(request("job"))], None)
    take(service)
    with pytest.raises(InvalidJobError, match="already running"):
        service.submit([request_to_wire(request("job"))], None)
