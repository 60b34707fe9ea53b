"""The status server's answers, from a service whose state the test sets up by playing
its workers: /metrics read by prometheus_client's parser, /api/status, /api/jobs,
/api/dashboard."""

from __future__ import annotations

import json
import os
import pickle
import platform
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from fakeclock import FakeClock
from manager.http.conftest import TRACEBACK, WORKERS, request, run, submit
from prometheus_client.parser import text_string_to_metric_families

from mpsched._core.heap import PendingJobs
from mpsched._core.job import JobRequest, Outcome, Priority
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.queue import JobQueue
from mpsched._core.recurring import ScheduleKind, ScheduleSpec
from mpsched._manager.http.server import StatusServer
from mpsched._manager.service import ManagerService
from mpsched._manager.store_journal import Journal
from mpsched._protocol.codec import assignment_from_wire, report_to_wire
from mpsched._protocol.records import Report, WorkerHello, stats_json
from mpsched._store.sqlite import SQLiteStore
from mpsched._transport.http_access import HttpConfig
from mpsched._transport.sockets import describe_versions


def schedule(service: ManagerService, clock: FakeClock) -> None:
    """Schedule "tick" every 10 s from 5 s on, overlap skip: one run started, then two
    slots skipped while it ran; then paused (its next run leaves the heap)."""
    service.add_schedule(
        tuple(
            ScheduleSpec(
                "tick",
                ScheduleKind.EVERY,
                10.0,
                Mode.RATE,
                "",
                "",
                5.0,
                None,
                0.0,
                Overlap.SKIP,
                Catchup.LATEST,
                OnError.CONTINUE,
                2,
                None,
                0,
                "jobs:tick",
                b"payload",
            )
        )
    )
    clock.advance(5)
    [wire] = service.take("w1", None, 0)
    lease = assignment_from_wire(wire).lease
    clock.advance(25)
    service.finish(
        "w1", [report_to_wire(Report(lease.lease_id, Outcome(lease.job_id, True, b"", "", None)))]
    )
    service.schedule_control("tick", "pause")


def set_up(service: ManagerService, clock: FakeClock) -> None:
    """Two jobs done, one failed, one retried after its worker died, one schedule; then
    pending: 2 HIGH, 1 MEDIUM, 3 LOW, due in an hour."""
    for job_id in ("ok-1", "ok-2"):
        submit(service, job_id)
        run(service, "w1")
    submit(service, "bad")
    assert run(service, "w1", ok=False) == "bad"
    submit(service, "retry-me", retries=1)
    assert service.take("w2", None, 0) != []
    service.lose_worker("w2", exitcode=-9, received=lambda lease: True)  # retried
    assert run(service, "w1") == "retry-me"
    schedule(service, clock)
    for job_id, priority in (
        ("h1", Priority.HIGH),
        ("h2", Priority.HIGH),
        ("m1", Priority.MEDIUM),
        ("l1", Priority.LOW),
        ("l2", Priority.LOW),
        ("l3", Priority.LOW),
    ):
        submit(service, job_id, priority, delay=3600)


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(found: dict[str, Any], family: str, name: str | None = None, **labels: str) -> float:
    values = [
        s.value
        for s in found[family].samples
        if s.name == (name or family) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(values) == 1, (family, labels, values)
    return float(values[0])


def test_metrics_show_the_state_the_test_set_up(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    set_up(service, clock)
    answer = request(serve(), "/metrics")
    assert answer.status == 200
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found = families(answer.text)
    assert [
        sample(found, "mpsched_jobs_pending", priority=p) for p in ("HIGH", "MEDIUM", "LOW")
    ] == [2, 1, 3]
    finished = {s.labels["outcome"]: s.value for s in found["mpsched_jobs_finished"].samples}
    # cancelled: the run the pause withdrew
    assert finished == {"done": 4, "failed": 1, "cancelled": 1, "crashed": 0, "timeout": 0}
    assert sample(found, "mpsched_jobs_retried", "mpsched_jobs_retried_total", cause="crash") == 1
    assert sample(found, "mpsched_jobs_running") == 0
    counters = {
        field: sample(
            found, f"mpsched_schedule_{field}", f"mpsched_schedule_{field}_total", schedule="tick"
        )
        for field in ("runs", "skipped", "missed", "failed")
    }
    assert counters == {"runs": 1, "skipped": 2, "missed": 0, "failed": 0}
    assert sample(found, "mpsched_schedule_paused", schedule="tick") == 1
    # w2 died; w1 is left, idle, on the host it said
    assert sample(found, "mpsched_workers", state="idle", host="elsewhere") == 1
    assert sample(found, "mpsched_workers", state="busy", host="elsewhere") == 0
    # ok-1, ok-2, bad, retry-me and the schedule's run
    assert (
        sample(
            found, "mpsched_worker_jobs", "mpsched_worker_jobs_total", host="elsewhere", slot="0"
        )
        == 5
    )
    assert not [name for name in found if name.startswith("mpsched_store_")]  # no store
    me = psutil.Process()  # the service runs in this process: it is the manager here
    assert sample(found, "process_start_time_seconds") == me.create_time()
    assert (
        0
        < sample(found, "process_cpu_seconds", "process_cpu_seconds_total")
        <= sum(me.cpu_times()[:2])
    )
    assert sample(found, "process_open_fds") > 0
    [build] = found["mpsched_build_info"].samples
    assert build.value == 1 and build.labels["python"] == platform.python_version()


def test_api_status_is_what_status_json_prints(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    set_up(service, clock)
    shown = request(serve(), "/api/status").json()
    expected = stats_json(service.stats())
    for changing in ("uptime", "throughput"):
        shown.pop(changing), expected.pop(changing)
    # What status --json prints: json.dump of the same record (tuples become lists).
    assert {"name": "default", "pending": 6, "workers": 1} in shown["queues"]
    expected = json.loads(json.dumps(expected))
    assert shown == expected


def test_api_jobs_lists_by_state_and_shows_one_job_with_its_traceback(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    set_up(service, clock)
    server = serve()
    pending = request(server, "/api/jobs?state=pending&limit=4").json()
    assert [j["job_id"] for j in pending] == ["h1", "h2", "m1", "l1"]  # hand-out order
    assert pending[0]["priority"] == "high" and 3599 < pending[0]["due_in"] <= 3600
    assert [j["job_id"] for j in request(server, "/api/jobs?state=failed").json()] == ["bad"]
    assert request(server, "/api/jobs?state=running").json() == []
    bad = request(server, "/api/jobs/bad").json()
    assert (bad["state"], bad["error"], bad["traceback"]) == (
        "failed",
        "ValueError: boom",
        TRACEBACK,
    )
    run_id = request(server, "/api/dashboard").json()["schedules"][0]["last_run"]
    assert "@" in run_id
    by_id = request(server, "/api/jobs/" + urllib.parse.quote(run_id, safe=""))
    assert by_id.status == 200 and by_id.json()["state"] == "done"
    assert request(server, "/api/jobs/nope").status == 404


def test_the_dashboard_shows_counts_workers_the_head_running_jobs_failures_and_schedules(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    set_up(service, clock)
    submit(service, "now")
    assert service.take("w1", None, 0) != []  # running on w1
    clock.advance(2.5)
    shown = request(serve(), "/api/dashboard").json()
    assert shown["counts"]["pending"] == {"HIGH": 2, "MEDIUM": 1, "LOW": 3}
    assert (shown["counts"]["done"], shown["counts"]["failed"]) == (4, 1)
    [worker] = shown["workers"]
    assert (worker["worker_id"], worker["pid"], worker["current_job"]) == ("w1", os.getpid(), "now")
    assert [j["job_id"] for j in shown["pending"]] == ["h1", "h2", "m1", "l1", "l2", "l3"]
    [running] = shown["running"]
    assert (running["job_id"], running["worker"], running["running_for"]) == ("now", "w1", 2.5)
    [failure] = shown["failures"]
    assert (failure["job_id"], failure["error"]) == ("bad", "ValueError: boom")
    [tick] = shown["schedules"]
    assert (tick["schedule_id"], tick["runs"], tick["skipped"], tick["paused"]) == (
        "tick",
        1,
        2,
        True,
    )
    assert shown["actions"] is False
    assert len(shown["chart"]["counts"]) == len(shown["chart"]["bounds"])
    assert WORKERS[1] not in {w["worker_id"] for w in shown["workers"]}


def test_a_worker_that_replaces_another_takes_its_series(
    service: ManagerService, serve: Callable[..., StatusServer]
) -> None:
    server = serve()
    for generation in range(3):  # w2 replaced by w2-1, then by w2-2
        found = families(request(server, "/metrics").text)
        slots = {
            (s.labels["host"], s.labels["slot"]) for s in found["mpsched_worker_rss_bytes"].samples
        }
        assert slots == {("elsewhere", "0"), ("elsewhere", "1")}, generation
        gone = WORKERS[1] if generation == 0 else f"{WORKERS[1]}-{generation}"
        service.lose_worker(gone, exitcode=0)
        python, cp = describe_versions()
        service.hello(
            WorkerHello(
                f"{WORKERS[1]}-{generation + 1}", os.getpid(), "elsewhere", python, cp, True, ""
            )
        )
    [replaced] = [w for w in service.stats().workers if w.worker_id == "w2-3"]
    assert replaced.slot == 1


def test_a_worker_lost_with_its_job_shows_as_a_crash(
    service: ManagerService, serve: Callable[..., StatusServer]
) -> None:
    submit(service, "doomed")
    assert service.take("w2", None, 0) != []
    service.lose_worker("w2", exitcode=-9, received=lambda lease: True)
    server = serve()
    found = families(request(server, "/metrics").text)
    assert (
        sample(found, "mpsched_jobs_finished", "mpsched_jobs_finished_total", outcome="crashed")
        == 1
    )
    [failure] = request(server, "/api/dashboard").json()["failures"]
    assert failure["job_id"] == "doomed" and failure["error"].startswith("WorkerCrashedError")


def test_the_page_and_the_listings_never_copy_the_whole_heap(
    service: ManagerService,
    clock: FakeClock,
    serve: Callable[..., StatusServer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_up(service, clock)
    assert isinstance(service.queue, JobQueue)
    service.queue.submit_many(
        [JobRequest(f"bulk-{i}", "client", b"", 3, 7200.0, None) for i in range(20_000)]
    )

    def whole_heap(*args: object) -> None:
        raise AssertionError("the whole heap was copied")

    monkeypatch.setattr(service.queue, "jobs", whole_heap)
    monkeypatch.setattr(PendingJobs, "__iter__", whole_heap)
    server = serve()
    shown = request(server, "/api/dashboard").json()
    assert shown["counts"]["pending"]["LOW"] == 20_003 and len(shown["pending"]) == 20
    for query in (
        "",
        "?state=pending&limit=1000",
        "?state=running",
        "?state=failed",
        "?state=done",
        "?state=cancelled",
    ):
        assert request(server, "/api/jobs" + query).status == 200, query
    assert request(server, "/metrics").status == 200
    assert request(server, "/api/status").status == 200


@pytest.fixture
def stored(tmp_path: Path) -> Iterator[tuple[ManagerService, SQLiteStore, StatusServer]]:
    """A service journalling to a SQLite store, with its status server; all stopped at the
    end."""
    store = SQLiteStore(tmp_path / "jobs.db", durability="process")
    queue = JobQueue()
    service = ManagerService(queue, journal=Journal(store, queue))
    server = StatusServer(HttpConfig(host="127.0.0.1", port=0), service)
    server.start()
    yield service, store, server
    server.stop()
    service.stop()
    store.close()


def test_with_a_store_its_size_and_commit_times_are_metrics(
    stored: tuple[ManagerService, SQLiteStore, StatusServer],
) -> None:
    service, store, server = stored
    service.journal.recover(service.queue.clock)
    service.journal.submit([JobRequest("kept", "client", b"", 2, 3600.0, None)], None)
    found = families(request(server, "/metrics").text)
    assert sample(found, "mpsched_store_size_bytes") > 0
    commits = sample(found, "mpsched_store_commit_seconds", "mpsched_store_commit_seconds_count")
    assert commits >= 1 and commits == store.commits


def test_jobs_waiting_for_parents_are_listed_with_what_they_wait_for_and_released_by_its_end(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    from mpsched._core.job import After
    from mpsched._core.result_of import detach_inputs
    from mpsched._protocol.codec import request_to_wire

    submit(service, "parent", delay=5)
    child = JobRequest("child", "client", b"child payload", 2, 0.0, None, name="jobs:child")
    service.submit_after([request_to_wire(child)], [After(("parent",), ("parent",))])
    server = serve()
    shown = request(server, "/api/dashboard").json()
    assert [(j["job_id"], j["waiting_for"]) for j in shown["waiting"]] == [
        ("child", "after 1 jobs")
    ]
    pending = request(server, "/api/jobs?state=pending").json()
    assert [j["job_id"] for j in pending] == ["parent", "child"]
    assert service.job("child").waiting_for == "after 1 jobs"  # type: ignore[union-attr]
    clock.advance(5)
    assert run(service, "w1") == "parent"  # its end releases the child at once: no poll
    [wire] = service.take("w1", None, 0)
    assignment = assignment_from_wire(wire)
    inputs, payload = detach_inputs(assignment.payload)
    assert assignment.lease.job_id == "child" and payload == b"child payload"
    assert inputs["parent"].ok and inputs["parent"].payload == pickle.dumps(7)
    assert request(server, "/api/dashboard").json()["waiting"] == []
