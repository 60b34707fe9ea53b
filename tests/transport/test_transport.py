"""The wire, in-process: addresses, authkey files, handshake deadlines and limits, accept
back-off, socket modes and TCP_NODELAY. (TLS: test_tls.py.)"""

from __future__ import annotations

import errno
import logging
import os
import pwd
import re
import selectors
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import connection
from pathlib import Path
from typing import Any

import pytest
from processes import wait_for
from servers import (
    KEY,
    InProcessServer,
    read_until_closed,
    sockopt,
    trickle,
    unanswered_address,
)

import mpsched
import mpsched._transport.connect as connect
import mpsched._transport.sockets as transport
from mpsched import AddressError, AuthenticationError
from mpsched._protocol.proxy import ServiceManager
from mpsched._transport.address import format_address, is_loopback, parse_address
from mpsched._transport.authkey import (
    AUTHKEY_ENV,
    child_environment,
    read_authkey,
    scrub_authkey_env,
    write_authkey,
)
from mpsched._transport.connect import client_connection
from mpsched._transport.sockets import SERIALIZER, FastListener, HardenedServer, describe_versions
from mpsched._transport.wire import FastConnection

# ------------------------------------------------------------------------------ addresses


@pytest.mark.parametrize(
    ("text", "address"),
    [
        pytest.param("unix:/run/mpsched.sock", "/run/mpsched.sock", id="unix-scheme"),
        pytest.param("unix:relative.sock", "relative.sock", id="unix-relative"),
        pytest.param("/tmp/m.sock", "/tmp/m.sock", id="bare-path"),
        pytest.param("127.0.0.1:7000", ("127.0.0.1", 7000), id="ipv4"),
        pytest.param("localhost:0", ("localhost", 0), id="hostname-port-0"),
        pytest.param("0.0.0.0:65535", ("0.0.0.0", 65535), id="max-port"),
    ],
)
def test_parse_address(text: str, address: Any) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("unix:", id="unix-without-path"),
        pytest.param("localhost", id="no-port"),
        pytest.param("host:", id="empty-port"),
        pytest.param(":7000", id="empty-host"),
        pytest.param("host:http", id="named-port"),
        pytest.param("host:-1", id="negative-port"),
        pytest.param("host:65536", id="port-too-big"),
        pytest.param("", id="empty"),
        pytest.param("[::1]:7000", id="ipv6"),  # multiprocessing opens TCP sockets as AF_INET
        pytest.param("::1:7000", id="ipv6-unbracketed"),
    ],
)
def test_parse_address_refuses(text: str) -> None:
    with pytest.raises(AddressError, match="unix") as caught:
        parse_address(text)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("text", ["unix:/run/m.sock", "127.0.0.1:7000", "example.org:1"])
def test_format_address_round_trips(text: str) -> None:
    assert format_address(parse_address(text)) == text


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        pytest.param("/run/mpsched.sock", True, id="unix"),
        pytest.param(("127.0.0.1", 7000), True, id="127.0.0.1"),
        pytest.param(("127.8.9.10", 7000), True, id="127/8"),
        pytest.param(("::1", 7000), True, id="ipv6-loopback"),
        pytest.param(("localhost", 7000), True, id="localhost"),
        pytest.param(("0.0.0.0", 7000), False, id="any-ipv4"),
        pytest.param(("::", 7000), False, id="any-ipv6"),
        pytest.param(("10.0.0.5", 7000), False, id="private"),
        pytest.param(("example.org", 7000), False, id="hostname"),
    ],
)
def test_is_loopback(address: Any, loopback: bool) -> None:
    assert is_loopback(address) is loopback


# ------------------------------------------------------------------------------ authkeys


@pytest.fixture
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTHKEY_ENV, raising=False)


def _key_file(tmp_path: Path, content: bytes, mode: int) -> Path:
    path = tmp_path / "authkey"
    path.write_bytes(content)
    path.chmod(mode)
    return path


def test_write_authkey_makes_a_0600_file_read_authkey_accepts(
    tmp_path: Path, no_env_key: None
) -> None:
    path = tmp_path / "authkey"
    key = write_authkey(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) == 64 and bytes.fromhex(key.decode())
    assert read_authkey(path) == key
    assert write_authkey(tmp_path / "other") != key


def test_write_authkey_never_overwrites(tmp_path: Path) -> None:
    path = _key_file(tmp_path, b"mine\n", 0o600)
    with pytest.raises(FileExistsError):
        write_authkey(path)
    assert path.read_bytes() == b"mine\n"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602], ids=oct)
def test_read_authkey_refuses_a_file_others_can_use(tmp_path: Path, mode: int) -> None:
    path = _key_file(tmp_path, b"secret\n", mode)
    with pytest.raises(AuthenticationError, match=f"mode {mode:o}.*chmod 600"):
        read_authkey(path)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o700], ids=oct)
def test_read_authkey_strips_and_prefers_the_file(
    tmp_path: Path, mode: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(AUTHKEY_ENV, "from-env")
    assert read_authkey(_key_file(tmp_path, b"  secret\n", mode)) == b"secret"


def test_read_authkey_refuses_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(AuthenticationError, match="empty"):
        read_authkey(_key_file(tmp_path, b"\n", 0o600))
    with pytest.raises(AuthenticationError, match="cannot read"):
        read_authkey(tmp_path / "missing")


def test_read_authkey_falls_back_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTHKEY_ENV, " from-env\n")
    assert read_authkey(None) == b"from-env"
    monkeypatch.setenv(AUTHKEY_ENV, "  ")
    assert read_authkey(None) is None
    monkeypatch.delenv(AUTHKEY_ENV)
    assert read_authkey(None) is None


def test_read_authkey_refuses_another_users_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _key_file(tmp_path, b"secret\n", 0o600)
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # we are someone else now
    with pytest.raises(
        AuthenticationError, match=rf"{re.escape(str(path))} belongs to .*uid {owner}\)?, not to"
    ):
        read_authkey(path)


def test_read_authkey_names_an_owner_without_a_user_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _key_file(tmp_path, b"secret\n", 0o600)
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)

    def no_such_user(uid: int) -> Any:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_such_user)
    with pytest.raises(
        AuthenticationError, match=f"belongs to uid {owner}, not to uid {owner + 1} who runs"
    ):
        read_authkey(path)


def test_child_environment_drops_the_key_only(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {AUTHKEY_ENV: "secret", "PATH": "/bin", "HOME": "/root"}
    assert child_environment(env) == {"PATH": "/bin", "HOME": "/root"}
    assert env[AUTHKEY_ENV] == "secret"  # a copy: the caller's mapping is untouched
    monkeypatch.setenv(AUTHKEY_ENV, "secret")
    monkeypatch.setenv("MPSCHED_TEST_OTHER", "kept")
    clean = child_environment()
    assert AUTHKEY_ENV not in clean and clean["MPSCHED_TEST_OTHER"] == "kept"
    assert os.environ[AUTHKEY_ENV] == "secret"


def test_scrub_authkey_env_keeps_the_key_from_child_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(AUTHKEY_ENV, "secret")
    env = {AUTHKEY_ENV: "secret", "PATH": "/bin"}
    scrub_authkey_env(env)
    assert env == {"PATH": "/bin"}
    scrub_authkey_env()
    assert AUTHKEY_ENV not in os.environ
    show = f"import os; print(os.environ.get({AUTHKEY_ENV!r}))"
    child = subprocess.run(
        [sys.executable, "-c", show], capture_output=True, text=True, check=True, timeout=60
    )
    assert child.stdout.strip() == "None"
    scrub_authkey_env()  # nothing left to remove: fine


def test_describe_versions() -> None:
    import cloudpickle

    python, cp = describe_versions()
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert cp == cloudpickle.__version__


# ------------------------------------------------------------------------------ sockets


def _rcvtimeo(conn: Any) -> float:
    seconds, micros = struct.unpack(
        "ll", sockopt(conn, socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.calcsize("ll"))
    )
    return float(seconds + micros / 1e6)


def _address(kind: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    if kind == "tcp":
        return ("127.0.0.1", 0)
    return str(tmp_path_factory.mktemp("sock") / "m.sock")


@pytest.fixture(params=["tcp", "unix"])
def server(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[InProcessServer]:
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 0.5)
    running = InProcessServer(_address(request.param, tmp_path_factory)).start()
    yield running
    running.stop()


def _connect(server: InProcessServer, key: bytes = KEY) -> Any:
    manager = ServiceManager(address=server.address, authkey=key, serializer=SERIALIZER)
    manager.connect()
    return manager


def test_client_connection_sets_nodelay_and_clears_the_handshake_timeout(
    server: InProcessServer,
) -> None:
    conn = client_connection(server.address, KEY)
    try:
        if isinstance(server.address, tuple):
            assert sockopt(conn, socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert _rcvtimeo(conn) == 0.0  # long polls must not time out after the handshake
    finally:
        conn.close()


def test_server_side_sets_nodelay(server: InProcessServer) -> None:
    _connect(server)  # one request: "dummy"
    if isinstance(server.address, tuple):
        assert server.server.nodelay and all(server.server.nodelay)
    else:
        assert server.server.nodelay == []


def test_wrong_key_is_a_clear_error_and_the_server_keeps_serving(server: InProcessServer) -> None:
    with pytest.raises(AuthenticationError, match="wrong authkey") as caught:
        _connect(server, b"wrong")
    assert format_address(server.address) in str(caught.value)
    _connect(server)


def test_silent_connections_cost_no_thread_and_are_dropped_at_the_deadline(
    server: InProcessServer,
) -> None:
    family = socket.AF_INET if isinstance(server.address, tuple) else socket.AF_UNIX
    threads_before = threading.active_count()
    silent = []
    try:
        for _ in range(20):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.connect(server.address)
            silent.append(sock)
        for sock in silent:
            _handshaking(sock)  # each one is in its handshake: it has our challenge...
        assert threading.active_count() <= threads_before  # ...and no thread of its own
        assert server.server.handshakes.in_handshake() == 20
        _connect(server)  # served meanwhile
        for sock in silent:  # the server closed each one at its deadline
            assert read_until_closed(sock, timeout=30) == b""
        wait_for(
            lambda: server.server.handshakes.in_handshake() == 0, 10, "the handshake slots freed"
        )
        assert server.live_handlers() == 0
    finally:
        for sock in silent:
            sock.close()


def test_client_handshake_times_out_against_a_silent_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        t0 = time.monotonic()
        with pytest.raises(OSError):
            client_connection(listener.getsockname(), KEY)
        assert time.monotonic() - t0 < 5


def test_a_connect_that_gets_no_answer_times_out_as_an_unreachable_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connect, "CONNECT_TIMEOUT", 1.0)
    with unanswered_address() as address:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError) as raw:
            client_connection(address, KEY)
        assert raw.value.errno == errno.ETIMEDOUT
        with pytest.raises(mpsched.ManagerUnreachableError) as caught:
            mpsched.connect(address, authkey=KEY)
        # Two connects of 1 s each (the kernel alone would retry for about two minutes).
        assert time.monotonic() - t0 < 10
    assert str(caught.value) == (
        f"no manager answers at {address[0]}:{address[1]}: cannot "
        f"reach the host (timed out connecting after 1 s)"
    )


# A frame whose length (250) is one the challenge functions accept (at most 256 bytes),
# sent so slowly that only a deadline on the whole handshake ends it (0.1 s a byte: 25 s).
TRICKLE = struct.pack("!i", 250) + b"#CHALLENGE#" + b"x" * 239


def test_a_peer_trickling_its_answer_is_dropped_at_the_handshake_deadline(
    server: InProcessServer, threads: list[threading.Thread]
) -> None:
    # Each byte arrives well within the 0.5 s handshake timeout: a per-read timeout would
    # keep the connection for the whole 25 s the trickle lasts.
    family = socket.AF_INET if isinstance(server.address, tuple) else socket.AF_UNIX
    stop = threading.Event()
    with socket.socket(family) as peer:
        peer.connect(server.address)
        try:
            t0 = time.monotonic()
            _in_thread(threads, trickle, peer, TRICKLE, 0.1, stop)
            received = read_until_closed(peer, timeout=60)
            elapsed = time.monotonic() - t0
        finally:
            stop.set()
    assert b"#CHALLENGE#" in received
    assert elapsed < 5  # 0.5 s deadline, plus generous slack for a busy machine


def test_the_client_handshake_deadline_covers_a_trickling_server(
    monkeypatch: pytest.MonkeyPatch, threads: list[threading.Thread]
) -> None:
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 0.5)
    stop = threading.Event()

    def serve_slowly(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        with conn:
            trickle(conn, TRICKLE, 0.1, stop)

    with socket.create_server(("127.0.0.1", 0)) as listener:
        _in_thread(threads, serve_slowly, listener)
        t0 = time.monotonic()
        try:
            with pytest.raises(TimeoutError, match=r"did not finish the handshake within 0\.5 s"):
                client_connection(listener.getsockname(), KEY)
            assert time.monotonic() - t0 < 5
        finally:
            stop.set()


def _handshaking(sock: socket.socket) -> None:
    """Wait until the server sent this raw connection its challenge."""
    sock.settimeout(30)
    data = b""
    while b"#CHALLENGE#" not in data:
        chunk = sock.recv(4096)
        assert chunk, "closed before the challenge"
        data += chunk


def _closed_for_room(sock: socket.socket) -> str:
    """What a raw connection that had its challenge was told when the server closed it to
    make room for a newer one."""
    data = read_until_closed(sock, timeout=30)
    (size,) = struct.unpack_from("!i", data)
    assert len(data) == 4 + size and data[4:].startswith(b"#REFUSED#"), data
    return data[4 + len(b"#REFUSED#") :].decode()


def test_a_connection_beyond_max_handshakes_closes_the_oldest_one_and_is_served(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(transport, "MAX_HANDSHAKES", 3)
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 60.0)  # silent ones stay
    caplog.set_level(logging.INFO, logger="mpsched.transport")
    running = InProcessServer(("127.0.0.1", 0)).start()
    peers: list[socket.socket] = []
    try:
        for _ in range(3):
            peers.append(socket.create_connection(running.address))
            _handshaking(peers[-1])
        # Each newcomer is served; each takes the slot of the oldest silent one, which a
        # new silent one then takes again.
        for oldest in range(3):
            _connect(running)
            assert _closed_for_room(peers[oldest]) == (
                "its handshake was closed to make room: 3 newer connections are in their handshake"
            )
            peers.append(socket.create_connection(running.address))
            _handshaking(peers[-1])
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert [w.getMessage() for w in warnings] == [
            "3 connections are in their handshake, the cap; closing the oldest for each new one"
        ]
        for peer in peers:
            peer.close()  # their handshakes end at EOF, freeing the slots
        wait_for(
            lambda: running.server.handshakes.in_handshake() == 0, 30, "the handshake slots freed"
        )
        assert "handshakes are below their cap again; closed 3 meanwhile" in caplog.text
    finally:
        for peer in peers:
            peer.close()
        running.stop()


def _silent_from(source: str, address: Any, count: int) -> list[socket.socket]:
    """``count`` connections from ``source`` that each got their challenge, and say nothing."""
    peers = []
    try:
        for _ in range(count):
            peers.append(socket.create_connection(address, source_address=(source, 0)))
            _handshaking(peers[-1])
    except BaseException:
        for peer in peers:
            peer.close()
        raise
    return peers


def _served_from(source: str, address: Any) -> Any:
    """The whole client handshake from ``source``, then one request: its reply."""
    sock = socket.create_connection(address, source_address=(source, 0))
    with FastConnection(sock) as conn:
        conn.set_deadline(30)
        connection.answer_challenge(conn, KEY)  # type: ignore[arg-type]
        connection.deliver_challenge(conn, KEY)  # type: ignore[arg-type]
        conn.send((None, "dummy", (), {}))
        return conn.recv()


def test_a_host_over_its_handshake_cap_closes_its_own_oldest_and_is_served(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(transport, "MAX_HANDSHAKES_PER_ADDRESS", 3)
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 60.0)  # silent ones stay
    caplog.set_level(logging.INFO, logger="mpsched.transport")
    running = InProcessServer(("127.0.0.1", 0)).start()
    peers: list[socket.socket] = []
    try:
        others = _silent_from("127.0.0.2", running.address, 3)
        peers += others
        mine = _silent_from("127.0.0.1", running.address, 3)
        peers += mine
        # A client behind the strangers' address gets in, in the slot of their oldest.
        _connect(running)
        assert _closed_for_room(mine[0]) == (
            "its handshake was closed to make room: 3 newer ones from 127.0.0.1 are pending "
            "(at most 3 from one address)"
        )
        # Another host's handshakes are not touched.
        wait_for(
            lambda: running.server.handshakes.in_handshake() == 5, 30, "the client's handshake over"
        )
        for other in others:
            other.setblocking(False)
            with pytest.raises(BlockingIOError):
                other.recv(1)  # open, nothing more said
        assert _served_from("127.0.0.3", running.address) == ("#RETURN", None)
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert [w.getMessage() for w in warnings] == [
            "3 handshakes from 127.0.0.1 are pending, its cap; closing the oldest of them "
            "for each new one"
        ]
        for peer in peers:
            peer.close()
        wait_for(
            lambda: running.server.handshakes.in_handshake() == 0, 30, "the handshake slots freed"
        )
        assert re.search(
            r"handshakes from 127\.0\.0\.1 are below their cap again; closed "
            r"\d+ of them meanwhile to make room",
            caplog.text,
        )
    finally:
        for peer in peers:
            peer.close()
        running.stop()


def test_a_handshake_closed_each_time_is_tried_again_then_the_manager_is_busy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A listener that sends a challenge, then closes: as a manager making room does.
    monkeypatch.setattr(connect, "CONNECT_TIMEOUT", 1.0)
    listener = socket.create_server(("127.0.0.1", 0))
    tries: list[float] = []
    stop = threading.Event()

    def close_each() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            tries.append(time.monotonic())
            with sock:
                sock.sendall(struct.pack("!i", 31) + b"#CHALLENGE#" + b"x" * 20)

    closer = threading.Thread(target=close_each, daemon=True)
    closer.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(
            mpsched.ManagerBusyError,
            match=(
                r"^the manager at 127\.0\.0\.1:\d+ is busy: it closed \d+ connection\(s\) "
                r"during their handshake in 1 s \(the last: it closed the connection after "
                r"its challenge\); try again later$"
            ),
        ):
            client_connection(listener.getsockname(), KEY)
        assert time.monotonic() - t0 < 1.0 + connect.BUSY_BACKOFF[1] + 5
        assert len(tries) >= 4  # 0.02, 0.04, 0.08, 0.16, 0.32 s apart
    finally:
        stop.set()
        closer.join(10)
        listener.close()


@pytest.mark.parametrize(
    ("answer", "reply", "logged"),
    [
        pytest.param(
            struct.pack("!i", 16) + b"x" * 16,
            struct.pack("!i", 9) + b"#FAILURE#",
            "wrong authkey",
            id="wrong-digest",
        ),
        pytest.param(struct.pack("!i", 1000), b"", "bad message length 1000", id="too-long"),
        pytest.param(struct.pack("!i", -1), b"", "bad message length -1", id="64-bit-length"),
        pytest.param(
            struct.pack("!i", 2) + b"ab" + b"more",
            b"",
            "it sent more than its answer",
            id="more-than-an-answer",
        ),
    ],
)
def test_a_wrong_answer_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    answer: bytes,
    reply: bytes,
    logged: str,
) -> None:
    monkeypatch.setattr(connect, "HANDSHAKE_TIMEOUT", 60.0)  # not at the deadline
    caplog.set_level(logging.WARNING, logger="mpsched.transport")
    running = InProcessServer(("127.0.0.1", 0)).start()
    try:
        with socket.create_connection(running.address) as peer:
            _handshaking(peer)
            peer.sendall(answer)
            assert read_until_closed(peer, timeout=30) == reply
        wait_for(lambda: running.server.handshakes.in_handshake() == 0, 30, "slot freed")
        assert re.search(rf"refused a connection from 127\.0\.0\.1:\d+: .*{logged}", caplog.text)
        assert running.handlers == []  # no thread for any of it
    finally:
        running.stop()


def test_a_peer_that_proved_its_key_then_stalls_is_dropped_at_the_deadline(
    server: InProcessServer,
) -> None:
    # Its serving thread reads the peer's own challenge within what is left of the 0.5 s.
    family = socket.AF_INET if isinstance(server.address, tuple) else socket.AF_UNIX
    sock = socket.socket(family)
    sock.connect(server.address)
    with FastConnection(sock) as conn:
        conn.set_deadline(30)
        t0 = time.monotonic()
        connection.answer_challenge(conn, KEY)  # type: ignore[arg-type]
        with pytest.raises(EOFError):
            conn.recv_bytes()
        assert time.monotonic() - t0 < 5
    wait_for(lambda: server.live_handlers() == 0, 30, "its serving thread ended")
    assert len(server.handlers) == 1


@pytest.mark.parametrize("sends", [b"", b"\x00\x00"], ids=["nothing", "half-a-header"])
def test_a_bare_connect_and_close_is_logged_quietly_with_its_reason(
    server: InProcessServer, caplog: pytest.LogCaptureFixture, sends: bytes
) -> None:
    caplog.set_level(logging.DEBUG, logger="mpsched.transport")
    family = socket.AF_INET if isinstance(server.address, tuple) else socket.AF_UNIX
    with socket.socket(family) as sock:
        sock.connect(server.address)
        _handshaking(sock)
        sock.sendall(sends)
    wait_for(lambda: server.server.handshakes.in_handshake() == 0, 30, "the close seen")
    [record] = [r for r in caplog.records if r.name == "mpsched.transport"]
    assert record.levelno == (logging.INFO if sends else logging.DEBUG)
    where = "from 127.0.0.1:" if family == socket.AF_INET else "on the Unix socket"
    when = "during" if sends else "before"
    assert re.fullmatch(
        rf"a connection {where}\d* closed {when} its handshake", record.getMessage()
    )


class _FlakyAccept:
    """Stands in for listener.accept: raises the scripted errors (None: really accepts)."""

    def __init__(self, accept: Any, script: list[int | None]) -> None:
        self.accept = accept
        self.script = script

    def __call__(self) -> Any:
        while self.script:
            error = self.script.pop(0)
            if error is None:
                return self.accept()
            raise OSError(error, os.strerror(error))
        return self.accept()


def test_a_burst_of_connections_waits_in_the_listen_backlog() -> None:
    # managers.Server asks for a backlog of 16: past it, the kernel drops a connect's SYN
    # while nobody accepts, and the connect tries again a second or more later.
    listener = FastListener(("127.0.0.1", 0), backlog=16)
    selector = selectors.DefaultSelector()
    burst = []
    try:
        for _ in range(100):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(listener.address)
            selector.register(sock, selectors.EVENT_WRITE)
            burst.append(sock)
        connected = 0
        deadline = time.monotonic() + 30
        while connected < len(burst) and time.monotonic() < deadline:
            for key, _ in selector.select(1.0):
                selector.unregister(key.fileobj)
                assert (
                    key.fileobj.getsockopt(  # type: ignore[union-attr]
                        socket.SOL_SOCKET, socket.SO_ERROR
                    )
                    == 0
                )
                connected += 1
        assert connected == len(burst)  # every one established, none accepted yet
    finally:
        selector.close()
        for sock in burst:
            sock.close()
        listener.close()


def test_accept_out_of_descriptors_backs_off_then_resumes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mpsched.transport")
    running = InProcessServer(("127.0.0.1", 0))
    waits: list[float] = []
    monkeypatch.setattr(running.server, "_sleep", waits.append)
    listener = running.server.listener
    script: list[int | None] = [
        errno.ECONNABORTED,
        *[errno.EMFILE] * 6,
        None,
        errno.ENFILE,
        errno.ENFILE,
        None,
    ]
    monkeypatch.setattr(listener, "accept_socket", _FlakyAccept(listener.accept_socket, script))
    running.start()
    try:
        _connect(running)  # served after six EMFILE
        _connect(running)  # and after two ENFILE
    finally:
        running.stop()
    # ECONNABORTED is one connection's problem: retry at once. Out of descriptors: wait,
    # doubling up to 1 s; a success starts over.
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 0.1, 0.2]
    assert caplog.text.count("accept() failed") == 2
    assert caplog.text.count("accept() works again") == 2


def test_a_connection_without_a_thread_is_closed_and_the_server_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    running = InProcessServer(("127.0.0.1", 0))
    start_handler = running.server._start_handler
    failures = [RuntimeError("can't start new thread")]

    def flaky(conn: FastConnection, peer: Any) -> threading.Thread:
        if failures:
            raise failures.pop()
        return start_handler(conn, peer)

    monkeypatch.setattr(running.server, "_start_handler", flaky)
    running.start()
    try:
        # Proven (welcome received), then closed instead of answering our challenge.
        with pytest.raises(ConnectionResetError, match="closed the connection during"):
            client_connection(running.address, KEY)
        assert "cannot serve a connection: can't start new thread" in caplog.text
        _connect(running)
        assert running.server.handshakes.in_handshake() == 0
    finally:
        running.stop()


@pytest.fixture
def umask() -> Iterator[int]:
    """A umask that lets everyone connect to a new socket, as many systems' default does."""
    before = os.umask(0o022)
    yield 0o022
    os.umask(before)


def test_a_unix_socket_only_its_owner_can_connect_to(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "m.sock"
    server = HardenedServer(
        ServiceManager._registry,  # type: ignore[attr-defined]
        str(path),
        KEY,
        SERIALIZER,
    )
    try:
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        assert os.umask(umask) == umask  # put back as it was
    finally:
        server.listener.close()


def test_on_disconnect_runs_in_the_connections_thread_when_it_ends(server: InProcessServer) -> None:
    ended: list[threading.Thread] = []
    called = threading.Event()  # set by the hook, waited on by the test

    def hook() -> None:
        ended.append(threading.current_thread())
        called.set()

    server.server.on_disconnect = hook
    with pytest.raises(AuthenticationError):
        _connect(server, b"wrong")  # never authenticated: no call
    conn = client_connection(server.address, KEY)
    conn.send((None, "accept_connection", ("test",), {}))
    assert conn.recv() == ("#RETURN", None)  # now served by serve_client() until hang-up
    assert not called.is_set()
    conn.close()
    assert called.wait(30)
    assert len(ended) == 1 and ended[0] in server.handlers
    for handler in server.handlers:
        handler.join(10)
    assert len(ended) == 1


def test_a_failing_on_disconnect_is_logged(
    server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[threading.Thread] = []  # the connection's thread, which logs the failure

    def hook() -> None:
        ran.append(threading.current_thread())
        raise RuntimeError("boom")

    server.server.on_disconnect = hook
    _connect(server)
    # Not server.handlers: the accepter records a thread after starting it, and this one
    # may be done with the handshake (and _connect may return) before it is on the list.
    deadline = time.monotonic() + 10
    while not ran:
        assert time.monotonic() < deadline, "on_disconnect never ran"
        time.sleep(0.001)
    ran[0].join(10)
    assert "on_disconnect failed" in caplog.text and "boom" in caplog.text


# ------------------------------------------------------------------------ FastConnection


@pytest.fixture
def pair() -> Iterator[tuple[FastConnection, connection.Connection]]:
    """A FastConnection and a plain multiprocessing Connection on its other end."""
    left, right = connection.Pipe(duplex=True)  # a socketpair on Linux
    fast = FastConnection(left)
    yield fast, right
    fast.close()
    right.close()


@pytest.fixture
def threads() -> Iterator[list[threading.Thread]]:
    started: list[threading.Thread] = []
    yield started
    for thread in started:
        thread.join(10)
        assert not thread.is_alive()


def _in_thread(threads: list[threading.Thread], target: Any, *args: Any) -> None:
    thread = threading.Thread(target=target, args=args, daemon=True)
    threads.append(thread)
    thread.start()


# Around the 64 KiB read size: a message that fits one read with its header, one that
# is a byte too long for it, and ones far larger than the socket buffer.
SIZES = [0, 1, 100, 65532, 65533, 65536, 300_000, 3_000_000]


@pytest.mark.parametrize("size", SIZES)
def test_fast_connection_speaks_multiprocessing_framing_both_ways(
    pair: tuple[FastConnection, connection.Connection], threads: list[threading.Thread], size: int
) -> None:
    fast, plain = pair
    data = os.urandom(size)
    _in_thread(threads, plain.send_bytes, data)
    assert fast.recv_bytes() == data
    _in_thread(threads, fast.send_bytes, data)
    assert plain.recv_bytes() == data
    _in_thread(threads, fast.send, {"data": data})
    assert plain.recv() == {"data": data}
    _in_thread(threads, plain.send, ("reply", data))
    assert fast.recv() == ("reply", data)


def test_fast_connection_keeps_bytes_read_past_a_message(
    pair: tuple[FastConnection, connection.Connection],
) -> None:
    fast, plain = pair
    for i in range(3):  # all three arrive before the first read
        plain.send(i)
    assert [fast.recv(), fast.poll(), fast.recv(), fast.recv(), fast.poll()] == [
        0,
        True,
        1,
        2,
        False,
    ]


class _ScriptedSocket:
    """Hands out the given chunks as they would arrive: a read returns at most one chunk
    (or its first ``size`` bytes; the rest stays for the next read); then EOF."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    def recv(self, size: int) -> bytes:
        if not self.chunks:
            return b""
        chunk = self.chunks.pop(0)
        if len(chunk) > size:
            self.chunks.insert(0, chunk[size:])
        return chunk[:size]

    def recv_into(self, view: memoryview) -> int:
        chunk = self.recv(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        self.chunks = []


def _scripted(pair: tuple[FastConnection, connection.Connection], *chunks: bytes) -> FastConnection:
    fast = pair[0]
    fast._sock.close()
    fast._sock = _ScriptedSocket(*chunks)  # type: ignore[assignment]
    return fast


def test_fast_connection_reassembles_headers_and_bodies_split_across_reads(
    pair: tuple[FastConnection, connection.Connection],
) -> None:
    fast = _scripted(
        pair,
        b"\x00\x00",
        b"\x00\x05he",
        b"llo\x00\x00\x00\x03ab",
        b"c\xff\xff\xff\xff\x00\x00",
        b"\x00\x00\x00\x00\x00\x02",
        b"xy",
    )
    assert [fast.recv_bytes(), fast.recv_bytes(), fast.recv_bytes()] == [b"hello", b"abc", b"xy"]


def test_fast_connection_refuses_a_message_longer_than_maxlength(
    pair: tuple[FastConnection, connection.Connection],
) -> None:
    fast, plain = pair
    plain.send_bytes(b"x" * 300)
    with pytest.raises(OSError, match="bad message length 300"):
        fast.recv_bytes(256)
    assert fast.closed


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param((), id="before-a-message"),
        pytest.param((b"\x00\x00",), id="in-the-header"),
        pytest.param((b"\x00\x00\x00\x05he",), id="in-a-short-body"),
        pytest.param((b"\x00\x01\x00\x00" + b"x" * 100,), id="in-a-long-body"),
    ],
)
def test_fast_connection_raises_eof_when_the_peer_closes(
    pair: tuple[FastConnection, connection.Connection], chunks: tuple[bytes, ...]
) -> None:
    fast = _scripted(pair, *chunks)
    with pytest.raises(EOFError):
        fast.recv_bytes()


def test_fast_connection_sees_a_real_peer_close(
    pair: tuple[FastConnection, connection.Connection],
) -> None:
    fast, plain = pair
    plain.send(1)
    plain.close()
    assert fast.recv() == 1
    with pytest.raises(EOFError):
        fast.recv()


@pytest.fixture
def default_socket_timeout() -> Iterator[None]:
    """A program that sets a default timeout for its own sockets."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(0.01)
    yield
    socket.setdefaulttimeout(before)


@pytest.mark.usefixtures("default_socket_timeout")
def test_fast_connection_blocks_whatever_the_default_socket_timeout() -> None:
    # A long poll to the manager must still wait as long as it asks to, as
    # multiprocessing's Connection (plain reads on the descriptor) does.
    left, right = connection.Pipe(duplex=True)
    with FastConnection(left) as fast:
        assert fast._sock.gettimeout() is None
    right.close()
