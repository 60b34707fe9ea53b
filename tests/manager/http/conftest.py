"""A ManagerService in this process (no worker processes: tests play the workers) with its
status server on a loopback port, stopped when the test ends."""

from __future__ import annotations

import http.client
import json
import os
import pickle
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakeclock import FakeClock

from mpsched._core.job import JobRequest, Outcome, Priority
from mpsched._core.queue import JobQueue
from mpsched._manager.http.server import StatusServer
from mpsched._manager.no_journal import NoJournal
from mpsched._manager.service import ManagerService
from mpsched._protocol.codec import assignment_from_wire, report_to_wire
from mpsched._protocol.records import Report, WorkerHello
from mpsched._transport.http_access import HttpConfig
from mpsched._transport.sockets import describe_versions
from mpsched._transport.tls import TlsConfig

TOKEN = b"s3cret-token-for-tests"
WORKERS = ("w1", "w2")
TRACEBACK = (
    'Traceback (most recent call last):\n  File "jobs.py", line 26, in fail\nValueError: boom\n'
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def service(clock: FakeClock) -> Iterator[ManagerService]:
    """A manager's service with two remote workers that joined (on host "elsewhere")."""
    queue = JobQueue(clock=clock)
    service = ManagerService(
        queue, clock=clock, journal=NoJournal(queue, wall=clock.wall, result_ttl=600.0)
    )
    python, cp = describe_versions()
    for worker_id in WORKERS:
        service.hello(WorkerHello(worker_id, os.getpid(), "elsewhere", python, cp, True, ""))
    yield service
    service.stop()


@pytest.fixture
def serve(service: ManagerService) -> Iterator[Callable[..., StatusServer]]:
    """Start status servers of ``service``; each is stopped when the test ends."""
    started: list[StatusServer] = []

    def start(
        token: bytes | None = None, host: str = "127.0.0.1", tls: TlsConfig | None = None
    ) -> StatusServer:
        server = StatusServer(HttpConfig(host=host, port=0, token=token, tls=tls), service)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def port_of(server: StatusServer) -> int:
    return int(server.url.rsplit(":", 1)[1].strip("/"))


def request(
    server: StatusServer,
    path: str,
    *,
    method: str = "GET",
    token: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One request on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port_of(server), timeout=10)
    try:
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token.decode()}"
        conn.request(method, path, headers=sent)
        answer = conn.getresponse()
        return Answer(answer.status, dict(answer.getheaders()), answer.read())
    finally:
        conn.close()


def raw_exchange(server: StatusServer, data: bytes) -> bytes:
    """Send ``data`` as it is, read until the server closes (or 10 s pass)."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:  # closed with what we sent unread: the same end
            pass
    return received


def submit(
    service: ManagerService,
    job_id: str,
    priority: Priority = Priority.MEDIUM,
    delay: float = 0.0,
    retries: int = 0,
) -> None:
    assert isinstance(service.queue, JobQueue)
    service.queue.submit(
        JobRequest(
            job_id,
            "client",
            b"payload",
            priority.level,
            delay,
            None,
            retries=retries,
            name=f"jobs:{job_id}",
        )
    )


def run(service: ManagerService, worker: str, ok: bool = True) -> str:
    """``worker`` takes the next due job and reports it; returns its id."""
    [wire] = service.take(worker, None, 0)
    assignment = assignment_from_wire(wire)
    outcome = Outcome(
        assignment.lease.job_id,
        ok,
        pickle.dumps(7 if ok else ValueError()),
        "" if ok else TRACEBACK,
        None,
    )
    service.finish(worker, [report_to_wire(Report(assignment.lease.lease_id, outcome))])
    return assignment.lease.job_id


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> TlsConfig:
    """A certificate that is its own CA, made with the openssl CLI; key mode 0600."""
    where = tmp_path_factory.mktemp("http-cert")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
            "-subj",
            "/CN=mpsched http test",
        ],
        cwd=where,
        check=True,
        capture_output=True,
        timeout=60,
    )
    os.chmod(where / "key.pem", 0o600)
    return TlsConfig(cert=Path(where / "cert.pem"), key=Path(where / "key.pem"))
