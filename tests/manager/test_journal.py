"""A manager without a store writes nothing per job (NoJournal), and still knows its jobs."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest
from fakeclock import FakeClock

from mpsched._core.job import JobRecord, JobRequest, JobState, Outcome, OutcomeKind
from mpsched._core.queue import JobQueue
from mpsched._errors import InvalidJobError, JobNotFoundError
from mpsched._manager import retained as _retained
from mpsched._manager.no_journal import NoJournal
from mpsched._manager.service import ManagerService
from mpsched._protocol.codec import (
    assignment_from_wire,
    report_to_wire,
    request_to_wire,
)
from mpsched._protocol.records import (
    ClientHello,
    Report,
    WorkerHello,
)
from mpsched._transport.sockets import describe_versions

JOB_CALLS = ("submit", "lease", "finish", "requeue", "cancel", "flush", "get", "jobs", "find_key")


class NoJobCalls:
    """Stands for the store of a NoJournal: any per-job call fails the test."""

    location = "memory"

    def __getattr__(self, name: str) -> object:
        if name in JOB_CALLS:
            raise AssertionError(f"a manager without a store called store.{name}()")
        raise AttributeError(name)

    def size(self) -> None:
        return None


def request(
    job_id: str, *, key: str | None = None, delay: float = 0.0, name: str = "m:f"
) -> JobRequest:
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
    [wire] = service.take("w", None if report is None else [report_to_wire(report)], 0)
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
    service.finish("w", [report_to_wire(done(lease, "keyed"))])
    assert service.cancel("later", "other-client")
    assert service.stats().queue.completed == 4


def test_lookups_see_pending_and_running_jobs_and_forget_ended_ones(
    service: ManagerService,
) -> None:
    service.submit(
        [
            request_to_wire(request("run", name="m:run")),
            request_to_wire(request("wait", delay=60, key="k", name="m:wait")),
        ],
        None,
    )
    lease = take(service)
    journal = service.journal
    records = journal.jobs(None, None)
    assert [(r.job_id, r.state, r.name, r.worker_id) for r in records] == [
        ("run", JobState.RUNNING, "m:run", "w"),
        ("wait", JobState.PENDING, "m:wait", None),
    ]
    assert [r.job_id for r in journal.jobs("pending", None)] == ["wait"]
    assert journal.jobs(None, 1)[0].job_id == "run"
    wait = journal.get("wait")
    assert wait is not None and wait.key == "k" and wait.client_id == "c"
    assert journal.owner("run") == "c"
    assert journal.watch("watcher", "run") is None  # handed over when it ends
    service.finish("w", [report_to_wire(done(lease, "run"))])
    assert journal.get("run") is None and journal.owner("run") is None
    with pytest.raises(JobNotFoundError):
        journal.watch("watcher", "run")


def test_a_limited_listing_makes_records_for_the_jobs_it_lists_only(
    service: ManagerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A million pending jobs listed 100 at a time must not cost a record for each of
    # them (seconds of the manager's time): the first ``limit`` are chosen first.
    service.submit(
        [request_to_wire(request(f"j{i}", delay=60 + (i * 7) % 50)) for i in range(2000)], None
    )
    journal = service.journal
    assert isinstance(journal, NoJournal)
    made = 0
    record = journal._record

    def counted(*args: Any, **kwargs: Any) -> JobRecord:
        nonlocal made
        made += 1
        return record(*args, **kwargs)

    monkeypatch.setattr(journal, "_record", counted)
    for state in (None, "pending"):
        made = 0
        listed = journal.jobs(state, 10)
        assert [r.job_id for r in listed] == [f"j{i}" for i in range(10)]  # by submission
        assert made == 10
    made = 0
    assert journal.jobs("running", 10) == [] and made == 0


def test_a_key_is_held_while_its_job_is_pending_or_running(service: ManagerService) -> None:
    def submit(job_id: str) -> list[str] | None:
        return service.submit([request_to_wire(request(job_id, key="nightly"))], None)

    assert submit("first") is None
    assert submit("second") == ["first"]  # pending: the holder stands for it
    lease = take(service)
    assert submit("third") == ["first"]  # running
    service.finish("w", [report_to_wire(done(lease, "first"))])
    assert submit("fourth") is None  # ended: the key is free
    assert service.cancel("fourth", "c")
    assert submit("fifth") is None  # cancelled: free again
    assert service.submit(
        [request_to_wire(request("a", key="x")), request_to_wire(request("b", key="x"))], None
    ) == ["a", "a"]


def test_a_refused_batch_leaves_its_keys_free(service: ManagerService) -> None:
    service.submit([request_to_wire(request("pending"))], None)
    with pytest.raises(InvalidJobError):
        service.submit(
            [request_to_wire(request("new", key="k")), request_to_wire(request("pending"))], None
        )
    assert service.submit([request_to_wire(request("again", key="k"))], None) is None


def test_the_id_of_a_running_job_is_refused(service: ManagerService) -> None:
    service.submit([request_to_wire(request("job"))], None)
    take(service)
    with pytest.raises(InvalidJobError, match="already running"):
        service.submit([request_to_wire(request("job"))], None)


# ------------------------------------------------------------------ ended jobs kept


@pytest.fixture
def keeping(monkeypatch: pytest.MonkeyPatch) -> tuple[ManagerService, FakeClock]:
    """A manager without a store that keeps ended jobs for 60 s (at most 3 of them)."""
    monkeypatch.setattr(_retained, "MAX_JOBS", 3)
    clock = FakeClock()
    queue = JobQueue(clock=clock)
    service = ManagerService(
        queue, clock=clock, journal=NoJournal(queue, wall=clock.wall, result_ttl=60)
    )
    python, cp = describe_versions()
    service.hello(WorkerHello("w", os.getpid(), "elsewhere", python, cp, True, ""))
    service.open_client(ClientHello("c", python, cp))
    return service, clock


def run_to_end(
    service: ManagerService,
    job_id: str,
    *,
    ok: bool = True,
    payload: bytes = b"result",
    key: str | None = None,
) -> None:
    service.submit([request_to_wire(request(job_id, key=key))], None)
    lease = take(service)
    service.finish(
        "w",
        [
            report_to_wire(
                Report(lease, Outcome(job_id, ok, payload, "" if ok else "Traceback", None))
            )
        ],
    )


def test_an_ended_job_is_known_by_its_id_for_result_ttl(
    keeping: tuple[ManagerService, FakeClock],
) -> None:
    service, clock = keeping
    run_to_end(service, "done")
    run_to_end(service, "failed", ok=False, payload=b"error")
    service.submit([request_to_wire(request("cancelled", delay=60))], None)
    assert service.cancel("cancelled", "c")
    journal = service.journal
    assert [(r.job_id, r.state, r.worker_id) for r in journal.jobs(None, None)] == [
        ("done", JobState.DONE, "w"),
        ("failed", JobState.FAILED, "w"),
        ("cancelled", JobState.CANCELLED, None),
    ]
    assert [r.job_id for r in journal.jobs("done", None)] == ["done"]
    assert [r.job_id for r in journal.jobs(None, 2)] == ["done", "failed"]
    assert [r.job_id for r in journal.jobs("cancelled", 1)] == ["cancelled"]
    assert service.job("done") is not None and journal.owner("failed") == "c"
    done, failed, gone = (journal.watch("other", j) for j in ("done", "failed", "cancelled"))
    assert done is not None and (done.ok, done.payload) == (True, b"result")
    assert failed is not None and (failed.ok, failed.traceback) == (False, "Traceback")
    assert gone is not None and gone.error_kind == OutcomeKind.CANCELLED
    clock.advance(61)
    assert journal.jobs(None, None) == [] and journal.get("done") is None
    with pytest.raises(JobNotFoundError):
        journal.watch("other", "done")


def test_the_oldest_ended_jobs_go_first_past_the_bound(
    keeping: tuple[ManagerService, FakeClock],
) -> None:
    service, _ = keeping
    for i in range(5):
        run_to_end(service, f"j{i}")
    assert [r.job_id for r in service.journal.jobs(None, None)] == ["j2", "j3", "j4"]


def test_an_outcome_too_large_to_keep_says_so(
    keeping: tuple[ManagerService, FakeClock], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = keeping
    monkeypatch.setattr(_retained, "MAX_OUTCOME", 10)
    run_to_end(service, "big", payload=b"x" * 11)
    record = service.journal.get("big")
    assert record is not None and record.state is JobState.DONE
    outcome = service.journal.watch("other", "big")
    assert outcome is not None and not outcome.ok and outcome.error_kind == "outcome-not-kept"
    assert "was not kept" in str(pickle.loads(outcome.payload))


def test_a_kept_job_holds_its_key_until_it_is_forgotten(
    keeping: tuple[ManagerService, FakeClock],
) -> None:
    service, clock = keeping

    def submit(job_id: str) -> list[str] | None:
        return service.submit([request_to_wire(request(job_id, key="nightly", delay=60))], None)

    run_to_end(service, "first", key="nightly")
    assert submit("second") == ["first"]  # ended, and kept: it stands for the key
    clock.advance(61)
    assert submit("third") is None  # forgotten: the key is free
    assert service.cancel("third", "c")
    assert submit("fourth") is None  # cancelled: free at once
