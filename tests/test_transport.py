"""The wire, in-process: addresses, authkey files, handshake timeouts and TCP_NODELAY."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import connection
from pathlib import Path
from typing import Any

import pytest

import mpsched._transport as transport
from mpsched import AuthenticationError
from mpsched._protocol import ServiceManager
from mpsched._transport import (
    AUTHKEY_ENV,
    SERIALIZER,
    AddressError,
    FastConnection,
    HardenedServer,
    client_connection,
    describe_versions,
    format_address,
    is_loopback,
    parse_address,
    private_runtime_dir,
    read_authkey,
    write_authkey,
)

KEY = b"k" * 32


# ------------------------------------------------------------------------------ addresses


@pytest.mark.parametrize(("text", "address"), [
    pytest.param("unix:/run/mpsched.sock", "/run/mpsched.sock", id="unix-scheme"),
    pytest.param("unix:relative.sock", "relative.sock", id="unix-relative"),
    pytest.param("/tmp/m.sock", "/tmp/m.sock", id="bare-path"),
    pytest.param("127.0.0.1:7000", ("127.0.0.1", 7000), id="ipv4"),
    pytest.param("localhost:0", ("localhost", 0), id="hostname-port-0"),
    pytest.param("0.0.0.0:65535", ("0.0.0.0", 65535), id="max-port"),
])
def test_parse_address(text: str, address: Any) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", [
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
])
def test_parse_address_refuses(text: str) -> None:
    with pytest.raises(AddressError, match="unix") as caught:
        parse_address(text)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("text", ["unix:/run/m.sock", "127.0.0.1:7000", "example.org:1"])
def test_format_address_round_trips(text: str) -> None:
    assert format_address(parse_address(text)) == text


@pytest.mark.parametrize(("address", "loopback"), [
    pytest.param("/run/mpsched.sock", True, id="unix"),
    pytest.param(("127.0.0.1", 7000), True, id="127.0.0.1"),
    pytest.param(("127.8.9.10", 7000), True, id="127/8"),
    pytest.param(("::1", 7000), True, id="ipv6-loopback"),
    pytest.param(("localhost", 7000), True, id="localhost"),
    pytest.param(("0.0.0.0", 7000), False, id="any-ipv4"),
    pytest.param(("::", 7000), False, id="any-ipv6"),
    pytest.param(("10.0.0.5", 7000), False, id="private"),
    pytest.param(("example.org", 7000), False, id="hostname"),
])
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


def test_write_authkey_makes_a_0600_file_read_authkey_accepts(tmp_path: Path,
                                                              no_env_key: None) -> None:
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
def test_read_authkey_strips_and_prefers_the_file(tmp_path: Path, mode: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_private_runtime_dir_is_fresh_and_private(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    first, second = private_runtime_dir(), private_runtime_dir()
    assert first != second and first.parent == second.parent == tmp_path
    assert stat.S_IMODE(first.stat().st_mode) == 0o700


def test_describe_versions() -> None:
    import cloudpickle

    python, cp = describe_versions()
    assert python == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert cp == cloudpickle.__version__


# ------------------------------------------------------------------------------ sockets


def _sockopt(conn: connection.Connection, level: int, option: int, size: int = 0) -> Any:
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        return sock.getsockopt(level, option, size) if size else sock.getsockopt(level, option)
    finally:
        sock.close()


def _rcvtimeo(conn: connection.Connection) -> float:
    seconds, micros = struct.unpack("ll", _sockopt(conn, socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                                                   struct.calcsize("ll")))
    return float(seconds + micros / 1e6)


class _RecordingServer(HardenedServer):
    """A HardenedServer that notes the socket options of each connection it serves."""

    nodelay: list[int]

    def _dispatch(self, conn: connection.Connection, request: Any) -> None:
        if isinstance(self.address, tuple):
            self.nodelay.append(_sockopt(conn, socket.IPPROTO_TCP, socket.TCP_NODELAY))
        super()._dispatch(conn, request)


class InProcessServer:
    """A HardenedServer with our own accept loop, which (unlike Server.accepter) stops."""

    def __init__(self, address: Any) -> None:
        self.server = _RecordingServer(ServiceManager._registry,  # type: ignore[attr-defined]
                                       address, KEY, SERIALIZER)
        self.server.nodelay = []
        self.server.stop_event = threading.Event()  # type: ignore[attr-defined]
        self.address = self.server.address
        self._stopping = False
        self.handlers: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self.server.listener.accept()  # type: ignore[attr-defined]
            except OSError:
                if self._stopping:
                    return
                continue
            if self._stopping:
                conn.close()
                return
            handler = threading.Thread(target=self.server.handle_request, args=(conn,),
                                       daemon=True)
            self.handlers.append(handler)
            handler.start()

    def live_handlers(self) -> int:
        return sum(t.is_alive() for t in self.handlers)

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            connection.Client(self.address).close()  # unblocks accept()
        self._accepter.join(10)
        self.server.listener.close()  # type: ignore[attr-defined]
        assert not self._accepter.is_alive()


@pytest.fixture(params=["tcp", "unix"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessServer]:
    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT", 0.5)
    if request.param == "tcp":
        address: Any = ("127.0.0.1", 0)
    else:
        address = str(tmp_path_factory.mktemp("sock") / "m.sock")
    running = InProcessServer(address)
    yield running
    running.stop()


def _connect(server: InProcessServer, key: bytes = KEY) -> Any:
    manager = ServiceManager(address=server.address, authkey=key, serializer=SERIALIZER)
    manager.connect()
    return manager


def test_client_connection_sets_nodelay_and_clears_the_handshake_timeout(
        server: InProcessServer) -> None:
    conn = client_connection(server.address, KEY)
    try:
        if isinstance(server.address, tuple):
            assert _sockopt(conn, socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert _rcvtimeo(conn) == 0.0  # long polls must not time out after the handshake
    finally:
        conn.close()


def test_server_side_sets_nodelay(server: InProcessServer) -> None:
    _connect(server)  # one request: "dummy"
    if isinstance(server.address, tuple):
        assert server.server.nodelay and all(server.server.nodelay)
    else:
        assert server.server.nodelay == []


def test_wrong_key_is_a_clear_error_and_the_server_keeps_serving(
        server: InProcessServer) -> None:
    with pytest.raises(AuthenticationError, match="wrong authkey") as caught:
        _connect(server, b"wrong")
    assert format_address(server.address) in str(caught.value)
    _connect(server)


def test_silent_connections_are_dropped_after_the_handshake_timeout(
        server: InProcessServer) -> None:
    family = socket.AF_INET if isinstance(server.address, tuple) else socket.AF_UNIX
    silent = []
    try:
        for _ in range(20):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.connect(server.address)
            silent.append(sock)
        _connect(server)  # served meanwhile
        deadline = time.monotonic() + 10
        while server.live_handlers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.live_handlers() == 0
        assert len(server.handlers) >= 21
        for sock in silent:  # the server closed each one after sending its challenge
            sock.settimeout(5)
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
            assert b"#CHALLENGE#" in data
    finally:
        for sock in silent:
            sock.close()


def test_client_handshake_times_out_against_a_silent_server(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        t0 = time.monotonic()
        with pytest.raises(OSError):
            client_connection(listener.getsockname(), KEY)
        assert time.monotonic() - t0 < 5


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
        pair: tuple[FastConnection, connection.Connection], threads: list[threading.Thread],
        size: int) -> None:
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
        pair: tuple[FastConnection, connection.Connection]) -> None:
    fast, plain = pair
    for i in range(3):  # all three arrive before the first read
        plain.send(i)
    assert [fast.recv(), fast.poll(), fast.recv(), fast.recv(), fast.poll()] == \
        [0, True, 1, 2, False]


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
        view[:len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        self.chunks = []


def _scripted(pair: tuple[FastConnection, connection.Connection],
              *chunks: bytes) -> FastConnection:
    fast = pair[0]
    fast._sock.close()
    fast._sock = _ScriptedSocket(*chunks)  # type: ignore[assignment]
    return fast


def test_fast_connection_reassembles_headers_and_bodies_split_across_reads(
        pair: tuple[FastConnection, connection.Connection]) -> None:
    fast = _scripted(pair, b"\x00\x00", b"\x00\x05he", b"llo\x00\x00\x00\x03ab",
                     b"c\xff\xff\xff\xff\x00\x00", b"\x00\x00\x00\x00\x00\x02", b"xy")
    assert [fast.recv_bytes(), fast.recv_bytes(), fast.recv_bytes()] == [b"hello", b"abc",
                                                                        b"xy"]


def test_fast_connection_refuses_a_message_longer_than_maxlength(
        pair: tuple[FastConnection, connection.Connection]) -> None:
    fast, plain = pair
    plain.send_bytes(b"x" * 300)
    with pytest.raises(OSError, match="bad message length 300"):
        fast.recv_bytes(256)
    assert fast.closed


@pytest.mark.parametrize("chunks", [
    pytest.param((), id="before-a-message"),
    pytest.param((b"\x00\x00",), id="in-the-header"),
    pytest.param((b"\x00\x00\x00\x05he",), id="in-a-short-body"),
    pytest.param((b"\x00\x01\x00\x00" + b"x" * 100,), id="in-a-long-body"),
])
def test_fast_connection_raises_eof_when_the_peer_closes(
        pair: tuple[FastConnection, connection.Connection], chunks: tuple[bytes, ...]) -> None:
    fast = _scripted(pair, *chunks)
    with pytest.raises(EOFError):
        fast.recv_bytes()


def test_fast_connection_sees_a_real_peer_close(
        pair: tuple[FastConnection, connection.Connection]) -> None:
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
