"""The wire: addresses, authkeys, and hardened ``multiprocessing.connection`` sockets.

Everything between clients, workers and the manager travels over multiprocessing's
authenticated connections carrying pickles, so whoever holds the authkey can run code on
every worker. This module makes the defaults safe:

- a handshake (HMAC challenge both ways) must finish within HANDSHAKE_TIMEOUT, or the
  manager drops the socket: silent connections cannot pin manager threads;
- TCP sockets set TCP_NODELAY on both ends (small request/reply messages otherwise wait
  for delayed ACKs, ~40 ms a new connection here);
- authkeys come from a 0600 file or the MPSCHED_AUTHKEY environment variable, never argv;
- a non-loopback TCP address needs an explicit authkey.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import pickle
import secrets
import socket
import stat
import struct
import sys
import tempfile
import traceback
from multiprocessing import AuthenticationError as _StdAuthenticationError
from multiprocessing import connection, managers
from pathlib import Path
from typing import Any

from mpsched._errors import AuthenticationError, MpschedError

log = logging.getLogger("mpsched.transport")

HANDSHAKE_TIMEOUT = 5.0
AUTHKEY_ENV = "MPSCHED_AUTHKEY"
SERIALIZER = "mpsched"  # our entry in multiprocessing.managers.listener_client

Address = str | tuple[str, int]


class AddressError(MpschedError, ValueError):
    """An address string that is neither ``unix:PATH`` nor ``HOST:PORT``."""


def parse_address(text: str) -> Address:
    """``unix:/path`` (or a path with a slash) -> str; ``host:port`` -> (host, port).

    Raises:
        AddressError: anything else.
    """
    if text.startswith("unix:"):
        path = text[len("unix:"):]
        if not path:
            raise AddressError("unix: needs a path, as in unix:/run/mpsched.sock")
        return path
    if "/" in text:
        return text
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise AddressError(f"bad address {text!r}: use HOST:PORT or unix:PATH")
    host = host.strip("[]")
    if ":" in host:
        # multiprocessing.connection opens every TCP socket as AF_INET.
        raise AddressError(f"bad address {text!r}: IPv6 is not supported; use an IPv4 "
                           f"address, a host name or unix:PATH")
    return (host, int(port))


def format_address(address: Any) -> str:
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return f"unix:{address}"


def is_loopback(address: Address) -> bool:
    """True for Unix sockets and TCP addresses that only this machine can reach."""
    if isinstance(address, str):
        return True
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_authkey(path: str | os.PathLike[str] | None) -> bytes | None:
    """The key in ``path`` (which must not be readable by group or others), else the
    MPSCHED_AUTHKEY environment variable, else None.

    Raises:
        AuthenticationError: the file is readable by others, empty, or unreadable.
    """
    if path is not None:
        try:
            mode = os.stat(path).st_mode
            key = Path(path).read_bytes().strip()
        except OSError as exc:
            raise AuthenticationError(f"cannot read authkey file {path}: {exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthenticationError(
                f"authkey file {path} is readable by others (mode {stat.S_IMODE(mode):o}); "
                f"chmod 600 it")
        if not key:
            raise AuthenticationError(f"authkey file {path} is empty")
        return key
    env = os.environ.get(AUTHKEY_ENV, "").strip()
    return env.encode() if env else None


def write_authkey(path: Path) -> bytes:
    """Create ``path`` with mode 0600 holding a fresh random key; return the key."""
    key = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key + b"\n")
    return key


def private_runtime_dir() -> Path:
    """A fresh directory only this user can enter, under $XDG_RUNTIME_DIR or the tmp dir."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix="mpsched-", dir=base))


def _tune(conn: connection.Connection, timeout: float) -> None:
    """Set (0: clear) a kernel read/write timeout on the socket; TCP_NODELAY on TCP."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        seconds = int(timeout)
        timeval = struct.pack("ll", seconds, int((timeout - seconds) * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()


def client_connection(address: Any, authkey: bytes | None = None) -> Any:
    """Connect and authenticate within HANDSHAKE_TIMEOUT.

    Raises:
        AuthenticationError: the manager rejected our key, or we rejected its.
        OSError: nothing listens there, or the handshake timed out.
    """
    conn = connection.Client(address)
    try:
        _tune(conn, HANDSHAKE_TIMEOUT)
        if authkey is not None:
            connection.answer_challenge(conn, authkey)
            connection.deliver_challenge(conn, authkey)
        _tune(conn, 0)
    except _StdAuthenticationError as exc:
        conn.close()
        raise AuthenticationError(
            f"authentication with the mpsched manager at {format_address(address)} failed "
            f"({exc}): wrong authkey?") from None
    except BaseException:
        conn.close()
        raise
    return FastConnection(conn)


_SHORT = struct.Struct("!i")  # multiprocessing's framing: a signed 32-bit length,
_LONG = struct.Struct("!Q")  # or -1 and then a 64-bit one
_READ = 65536  # bytes asked of the kernel per read


class FastConnection:
    """A manager connection: the C pickler, and one system call per small message.

    Speaks multiprocessing's framing, so either end may be a plain ``Connection``. Two
    differences make it cheaper per message (the manager handles a few per job):
    messages are pickled with the C pickler (``Connection`` uses ForkingPickler, which
    copies its reducer table per message; manager messages never carry fds or sockets),
    and a read asks for up to 64 KiB, so a small message arrives in one system call
    where ``Connection`` makes two (length, then body) and assembles them in a BytesIO.
    Bytes read past the end of a message are kept for the next one.

    Not thread-safe: like ``Connection``, one thread uses it at a time (manager proxies
    keep one connection per thread).
    """

    def __init__(self, conn: connection.Connection) -> None:
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        conn.close()
        # Blocking without a timeout, whatever socket.setdefaulttimeout() says: a long
        # poll must wait as long as it asks to.
        self._sock.setblocking(True)
        self._rest = b""  # bytes received beyond the last message

    def send(self, obj: Any) -> None:
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        return pickle.loads(self.recv_bytes())

    def send_bytes(self, data: bytes) -> None:
        size = len(data)
        header = _SHORT.pack(size) if size <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(size)
        if size <= _READ:
            self._sock.sendall(header + data)
        else:  # no copy of a big message just to prepend its length
            self._sock.sendall(header)
            self._sock.sendall(data)

    def recv_bytes(self, maxlength: int | None = None) -> bytes | bytearray:
        data = self._rest
        while len(data) < 4:
            data += self._read()
        size: int = _SHORT.unpack_from(data)[0]
        start = 4
        if size == -1:
            while len(data) < 12:
                data += self._read()
            size = _LONG.unpack_from(data, 4)[0]
            start = 12
        if size < 0 or (maxlength is not None and size > maxlength):
            self.close()
            raise OSError(f"bad message length {size}")
        end = start + size
        if len(data) >= end:
            self._rest = data[end:]
            return data[start:end]
        # A message longer than what arrived: read the rest straight into its buffer,
        # which is returned as it is (no copy of a big payload into bytes).
        self._rest = b""
        body = bytearray(size)
        have = len(data) - start
        body[:have] = data[start:]
        view = memoryview(body)
        while have < size:
            got = self._sock.recv_into(view[have:])
            if not got:
                raise EOFError
            have += got
        return body

    def _read(self) -> bytes:
        chunk = self._sock.recv(_READ)
        if not chunk:
            raise EOFError
        return chunk

    def poll(self, timeout: float | None = 0.0) -> bool:
        if self._rest:
            return True
        return bool(connection.wait([self._sock], timeout))

    def fileno(self) -> int:
        return self._sock.fileno()

    @property
    def closed(self) -> bool:
        return self._sock.fileno() < 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> FastConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FastListener(connection.Listener):
    """A Listener whose accepted connections are :class:`FastConnection` s."""

    def accept(self) -> Any:
        return FastConnection(super().accept())


class HardenedServer(managers.Server):
    """A manager Server whose handshakes time out and whose TCP sockets set NODELAY."""

    def handle_request(self, conn: connection.Connection) -> None:
        try:
            try:
                _tune(conn, HANDSHAKE_TIMEOUT)
                authkey: bytes = self.authkey  # type: ignore[attr-defined]
                connection.deliver_challenge(conn, authkey)
                connection.answer_challenge(conn, authkey)
                request = conn.recv()
                _tune(conn, 0)
            except (_StdAuthenticationError, OSError, EOFError) as exc:
                log.warning("refused a connection: %s", exc or type(exc).__name__)
                return
            self._dispatch(conn, request)
        except SystemExit:  # serve_client() exits this way when its client hangs up
            pass
        finally:
            conn.close()

    def _dispatch(self, conn: connection.Connection, request: Any) -> None:
        try:
            _, name, args, kwds = request
            if name not in self.public:
                raise ValueError(f"{name!r} is not a server method")
            reply = ("#RETURN", getattr(self, name)(conn, *args, **kwds))
        except Exception:
            reply = ("#TRACEBACK", traceback.format_exc())
        with contextlib.suppress(Exception):
            conn.send(reply)


# The serializer name selects our client function in every process that imports this.
managers.listener_client[SERIALIZER] = (  # type: ignore[attr-defined]
    FastListener, client_connection)


def host_name() -> str:
    return socket.gethostname()


def describe_versions() -> tuple[str, str]:
    """This process's Python minor version and cloudpickle version."""
    import cloudpickle

    return f"{sys.version_info.major}.{sys.version_info.minor}", str(cloudpickle.__version__)
