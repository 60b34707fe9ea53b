"""Progress and a failed job's error in the status server's answers: /api/jobs,
/api/jobs/<id> and the dashboard's running jobs."""

from __future__ import annotations

from collections.abc import Callable

from fakeclock import FakeClock
from manager.http.conftest import TRACEBACK, request, run, submit

from mpsched._manager.failures import KEEP
from mpsched._manager.http.server import StatusServer
from mpsched._manager.service import ManagerService
from mpsched._protocol.codec import assignment_from_wire


def test_a_running_job_shows_its_latest_progress_and_an_ended_one_keeps_it(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    server = serve()
    submit(service, "long")
    [wire] = service.take("w1", None, 0)
    lease = assignment_from_wire(wire).lease
    service.progress("w1", [(lease.lease_id, "long", "0.5")])
    service.progress("w1", [(lease.lease_id + 1, "long", "0.9")])  # not its lease: dropped
    [running] = request(server, "/api/jobs?state=running").json()
    assert running["progress"] == 0.5
    service.progress("w1", [(lease.lease_id, "long", '{"rows":3}')])
    assert request(server, "/api/dashboard").json()["running"][0]["progress"] == {"rows": 3}
    assert request(server, "/api/jobs/long").json()["progress"] == {"rows": 3}


def test_a_failed_job_shows_its_error_and_traceback_after_newer_failures(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    server = serve()
    for n in range(KEEP + 1):  # the first is no longer among the dashboard's failures
        submit(service, f"bad-{n}")
        assert run(service, "w1", ok=False) == f"bad-{n}"
    first = request(server, "/api/jobs/bad-0").json()
    assert (first["state"], first["error"], first["traceback"]) == (
        "failed",
        "ValueError: boom",
        TRACEBACK,
    )
    listed = request(server, "/api/jobs?state=failed&limit=2").json()
    assert [(j["job_id"], j["error"]) for j in listed] == [
        ("bad-0", "ValueError: boom"),
        ("bad-1", "ValueError: boom"),
    ]
