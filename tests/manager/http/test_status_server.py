"""The status server's rules: tokens, read-only without one, bad requests answered with a
status and one line, and clients that cannot stall the manager."""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakeclock import FakeClock
from manager.http.conftest import TOKEN, port_of, raw_exchange, request, submit
from processes import wait_for

import mpsched._manager.http.connections as connections_module
import mpsched._manager.http.server as server_module
from mpsched._core.job import Priority
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.queue import JobQueue
from mpsched._core.recurring import ScheduleKind, ScheduleSpec
from mpsched._errors import AddressError, AuthenticationError, ConfigError
from mpsched._manager.http.connections import MAX_PER_ADDRESS
from mpsched._manager.http.server import StatusServer
from mpsched._manager.http.views import Views
from mpsched._manager.service import ManagerService
from mpsched._transport.http_access import http_config
from mpsched._transport.tls import TlsConfig


def one_line(body: bytes) -> str:
    """The body of an error: one line of text, never a traceback."""
    text = body.decode()
    assert text.endswith("\n") and text.count("\n") == 1, text
    assert "Traceback" not in text
    return text.strip()


def status_of(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


# ------------------------------------------------------------------------------ tokens


def token_file(tmp_path: Path, content: bytes = TOKEN, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_bytes(content + b"\n")
    path.chmod(mode)
    return path


def test_a_non_loopback_address_needs_a_token_and_tls(
    tmp_path: Path, self_signed: TlsConfig
) -> None:
    with pytest.raises(ConfigError, match="token file"):
        http_config("0.0.0.0:8080")
    with pytest.raises(ConfigError, match="TLS"):
        http_config("0.0.0.0:8080", token_file(tmp_path))
    with pytest.raises(ConfigError, match="token file"):
        http_config("10.1.2.3:8080", tls=self_signed)
    config = http_config("0.0.0.0:8080", token_file(tmp_path), self_signed)
    assert config.token == TOKEN and config.url().startswith("https://")
    assert http_config("127.0.0.1:0").token is None  # loopback: read-only without one


@pytest.mark.parametrize(
    ("content", "mode", "problem"),
    [
        (TOKEN, 0o644, "readable by others"),
        (b"  ", 0o600, "is empty"),
        ("tök en".encode(), 0o600, "cannot carry"),
    ],
    ids=["readable", "empty", "not-a-header"],
)
def test_a_token_file_must_be_private_and_hold_a_token(
    tmp_path: Path, content: bytes, mode: int, problem: str
) -> None:
    with pytest.raises(AuthenticationError, match=problem):
        http_config("127.0.0.1:0", token_file(tmp_path, content, mode))


def test_an_address_must_be_host_and_port_or_a_port_on_loopback() -> None:
    for bad in ("unix:/tmp/x", "nonsense", "host:99999", ":8080", "99999", True, 1.5):
        with pytest.raises(AddressError, match=r"(use|give) a port"):
            http_config(bad)  # type: ignore[arg-type]
    for port in ("8080", 8080):
        config = http_config(port)
        assert (config.host, config.port, config.url()) == (
            "127.0.0.1",
            8080,
            "http://127.0.0.1:8080/",
        )


def test_the_url_of_a_server_on_every_interface_names_this_host(
    tmp_path: Path, self_signed: TlsConfig
) -> None:
    config = http_config("0.0.0.0:8443", token_file(tmp_path), self_signed)
    assert config.url(8443) == f"https://{socket.gethostname()}:8443/"


def test_with_a_token_every_request_carries_it_but_the_page(
    serve: Callable[..., StatusServer],
) -> None:
    server = serve(token=TOKEN)
    for token, says in (
        (None, "this server needs its token: send Authorization: Bearer"),
        (b"wrong-token", "wrong token: this server takes the one in its --http-token-file"),
    ):
        answer = request(server, "/api/dashboard", token=token)
        assert answer.status == 401 and answer.headers["WWW-Authenticate"].startswith("Bearer")
        assert one_line(answer.body).startswith(says)
        assert request(server, "/metrics", token=token).status == 401
    assert request(server, "/", token=None).status == 200  # its code only: no data
    answer = request(server, "/api/dashboard", token=TOKEN)
    assert answer.status == 200 and answer.json()["actions"] is True


def test_without_a_token_the_server_is_read_only(
    service: ManagerService, serve: Callable[..., StatusServer]
) -> None:
    submit(service, "later", delay=60)
    server = serve()
    answer = request(server, "/api/jobs/later/cancel", method="POST")
    assert answer.status == 403 and "read-only" in one_line(answer.body)
    assert len(service.queue) == 1


def test_a_token_holder_cancels_a_pending_job_and_pauses_and_resumes_a_schedule(
    service: ManagerService, clock: FakeClock, serve: Callable[..., StatusServer]
) -> None:
    submit(service, "later", Priority.LOW, delay=60)
    assert isinstance(service.queue, JobQueue)
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
    server = serve(token=TOKEN)
    answer = request(server, "/api/jobs/later/cancel", method="POST", token=TOKEN)
    assert answer.status == 200 and answer.json() == {"job_id": "later", "cancelled": True}
    assert service.queue.find("later") is None
    again = request(server, "/api/jobs/later/cancel", method="POST", token=TOKEN)
    assert again.status == 409 and "not pending" in one_line(again.body)
    paused = request(server, "/api/schedules/tick/pause", method="POST", token=TOKEN)
    assert paused.status == 200 and service.schedule_control("tick", "info").paused
    resumed = request(server, "/api/schedules/tick/resume", method="POST", token=TOKEN)
    assert resumed.json() == {"schedule_id": "tick", "paused": False}
    assert not service.schedule_control("tick", "info").paused
    assert request(server, "/api/schedules/nope/pause", method="POST", token=TOKEN).status == 404
    assert request(server, "/api/jobs/later/cancel", token=TOKEN).status == 405  # a GET


def test_https_with_a_token_on_every_interface(
    serve: Callable[..., StatusServer], self_signed: TlsConfig
) -> None:
    server = serve(token=TOKEN, host="0.0.0.0", tls=self_signed)
    assert server.url.startswith(f"https://{socket.gethostname()}:")
    context = ssl.create_default_context(cafile=str(self_signed.cert))
    context.check_hostname = False
    conn = http.client.HTTPSConnection("127.0.0.1", port_of(server), timeout=10, context=context)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN.decode()}"})
        answer = conn.getresponse()
        assert answer.status == 200 and b"mpsched_jobs_pending" in answer.read()
    finally:
        conn.close()
    # plain HTTP to the TLS port: the handshake fails, the connection ends, nothing hangs
    assert b"mpsched" not in raw_exchange(server, b"GET /metrics HTTP/1.1\r\n\r\n")


# ------------------------------------------------------------------------ bad requests


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/nothing-here", 404),
        ("/api/jobs?state=bogus", 400),
        ("/api/jobs?limit=0", 400),
        ("/api/jobs?limit=many", 400),
        ("/api/jobs?limit=99999999999999999999", 400),
        ("/api/jobs?limit=1&limit=2", 400),
        ("/api/jobs?colour=red", 400),
        ("/api/jobs?%zz", 400),
        ("/api/jobs/", 404),
        ("/api/jobs/x/y/z/w", 404),
    ],
)
def test_a_bad_path_or_query_gets_a_4xx_and_one_line(
    serve: Callable[..., StatusServer], path: str, status: int
) -> None:
    answer = request(serve(), path)
    assert answer.status == status, answer.text
    assert answer.headers["Content-Type"].startswith("text/plain")
    one_line(answer.body)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"PUT /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"x" * 20_000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", 431),
        (
            b"POST /api/jobs/x/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999\r\n\r\n",
            413,
        ),
        (
            b"POST /api/jobs/x/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            411,
        ),
        (b"GET /metrics HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n\r\n", 421),
        (b"GET /metrics HTTP/9.9\r\n\r\n", 505),
    ],
    ids=[
        "garbage",
        "put",
        "huge-header",
        "huge-line",
        "huge-body",
        "chunked",
        "rebound-host",
        "version",
    ],
)
def test_a_malformed_request_gets_a_4xx_and_one_line(
    serve: Callable[..., StatusServer], raw: bytes, status: int
) -> None:
    answer = raw_exchange(
        serve(),
        raw
        if b"Connection" in raw or b"HTTP/1.1" not in raw
        else raw.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1),
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(head) == status, answer[:300]
    one_line(body)


def test_head_is_get_without_the_body(serve: Callable[..., StatusServer]) -> None:
    server = serve()
    length = len(request(server, "/").body)
    with connect(server) as sock:  # one kept-alive connection: a body would garble the next
        sock.sendall(
            b"HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            b"GET /nothing HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    assert status_of(head) == 200 and f"Content-Length: {length}\r\n".encode() in head
    assert rest.startswith(b"HTTP/1.1 404 "), rest[:100]
    answer = request(server, "/metrics", method="HEAD")
    assert answer.status == 200 and answer.body == b""
    assert answer.headers["Server"] == "mpsched"  # no Python version, no trailing space
    posted = request(server, "/metrics", method="POST")
    assert (posted.status, posted.headers["Allow"]) == (405, "GET, HEAD")


def test_an_error_of_the_server_is_logged_and_answered_500_in_one_line(
    serve: Callable[..., StatusServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = serve()

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(Views, "dashboard", broken)
    with caplog.at_level(logging.ERROR, logger="mpsched.http"):
        answer = request(server, "/api/dashboard")
    assert answer.status == 500 and "manager's log" in one_line(answer.body)
    assert "RuntimeError: a bug" in caplog.text
    assert request(server, "/metrics").status == 200  # and it goes on serving


# ------------------------------------------------------------------- slow and many clients


@pytest.fixture
def quick_deadline(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    monkeypatch.setattr(connections_module, "REQUEST_TIME", 0.5)
    yield 0.5


def connect(server: StatusServer, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(
        ("127.0.0.1", port_of(server)), timeout=10, source_address=(source, 0)
    )
    return sock


def _still_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""  # an answer it did not ask for: open, yet wrong
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


def test_idle_connections_past_the_cap_of_one_address_make_room_oldest_first(
    serve: Callable[..., StatusServer], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mpsched.http")
    server = serve()
    connections = server._listener.connections
    others = [connect(server, source="127.0.0.2") for _ in range(3)]
    idle = [connect(server) for _ in range(MAX_PER_ADDRESS)]
    try:
        wait_for(
            lambda: len(connections.socks()) == MAX_PER_ADDRESS + 3, what="every connection counted"
        )
        # A request past 127.0.0.1's cap is answered: the oldest idle one makes room.
        assert request(server, "/metrics").status == 200
        assert idle[0].recv(1) == b""
        assert all(_still_open(sock) for sock in idle[1:])
        # A request that arrived on the oldest is answered, not closed for room.
        idle[1].sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert request(server, "/api/status").status == 200
        assert idle[1].recv(12) == b"HTTP/1.1 200"
        # Another address's connections are not touched.
        assert all(_still_open(sock) for sock in others)
        assert len([r for r in caplog.records if "closing the oldest" in r.getMessage()]) == 1
    finally:
        for sock in [*others, *idle]:
            sock.close()


def test_a_client_trickling_its_request_is_cut_off_at_its_deadline_and_others_are_served(
    service: ManagerService, serve: Callable[..., StatusServer], quick_deadline: float
) -> None:
    server = serve()
    with connect(server) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        closed = False
        while not closed and time.monotonic() - started < 10:
            try:
                slow.sendall(b"X")  # a byte of a header now and then: never a whole request
                slow.settimeout(0.1)
                closed = slow.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed, "the trickling client was never cut off"
        assert time.monotonic() - started < 5 * quick_deadline + 2
    assert request(server, "/metrics").status == 200


def test_idle_clients_do_not_stop_the_queue_or_other_requests(
    service: ManagerService, serve: Callable[..., StatusServer]
) -> None:
    server = serve()
    stuck = [connect(server) for _ in range(MAX_PER_ADDRESS - 1)]
    for sock in stuck:
        sock.sendall(b"GET /api/dashboard HTTP/1.1\r\n")  # and never the rest
    try:
        submit(service, "j")
        assert service.take("w1", None, 0) != []  # the queue is not held
        assert request(server, "/api/status").status == 200
    finally:
        for sock in stuck:
            sock.close()


def test_an_idle_server_sleeps_without_a_timeout(serve: Callable[..., StatusServer]) -> None:
    server = serve()
    connections = server._listener.connections
    assert connections.end_late() is None  # no connection: nothing to wake up for
    with connect(server):
        wait_for(lambda: connections.end_late() is not None, what="the connection is counted")
    wait_for(lambda: connections.end_late() is None, what="the connection's end is seen")


def test_stop_ends_open_connections(serve: Callable[..., StatusServer]) -> None:
    server = serve()
    sock = connect(server)
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert sock.recv(12) == b"HTTP/1.1 200"  # kept alive after it
    server.stop()
    sock.settimeout(10)
    while sock.recv(65536):  # the rest of the answer, then the end: the server closed it
        pass
    sock.close()
    with pytest.raises(OSError):
        connect(server).close()


def test_answers_go_out_without_waiting_for_acks(serve: Callable[..., StatusServer]) -> None:
    """TCP_NODELAY on each connection, and a buffered writer flushed once per answer: a
    head and body sent apart would wait out the client's delayed ACK (40 ms a request)."""
    server = serve()
    with connect(server) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert sock.recv(12) == b"HTTP/1.1 200"
        [served] = server._listener.connections.socks()
        assert served.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert server_module._Handler.wbufsize > 0


def test_a_client_that_expects_100_continue_hears_it_at_once(
    serve: Callable[..., StatusServer],
) -> None:
    server = serve(token=TOKEN)
    with connect(server) as sock:
        sock.sendall(
            b"POST /api/jobs/x/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: "
            b"Bearer " + TOKEN + b"\r\nContent-Length: 2\r\nExpect: 100-continue"
            b"\r\n\r\n"
        )
        assert sock.recv(25).startswith(b"HTTP/1.1 100 Continue")  # before any body is sent
        sock.sendall(b"{}")
        received = b""
        while b"not pending" not in received:
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        assert b" 409 " in received


def test_a_body_that_never_comes_is_a_408_not_an_error_of_the_server(
    serve: Callable[..., StatusServer],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(server_module, "IO_TIMEOUT", 0.2)
    server = serve(token=TOKEN)
    with caplog.at_level(logging.ERROR, logger="mpsched.http"):
        answer = raw_exchange(
            server,
            b"POST /api/jobs/x/cancel HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + TOKEN + b"\r\nContent-Length: 9\r\n"
            b"\r\n{",
        )
    assert status_of(answer) == 408
    assert not caplog.records
