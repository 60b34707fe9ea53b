"""FastConnection: multiprocessing's message framing over a socket, optionally TLS."""

from __future__ import annotations

import os
import pickle
import socket
import ssl
import struct
import time
from multiprocessing import connection
from typing import Any

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

    During a handshake, :meth:`set_deadline` bounds the total time of every read and write
    (a per-call timeout would let a peer trickle a byte per period forever), and
    :meth:`start_tls` moves the connection onto TLS.

    Not thread-safe: like ``Connection``, one thread uses it at a time (manager proxies
    keep one connection per thread).
    """

    def __init__(self, conn: connection.Connection | socket.socket) -> None:
        """Take over ``conn``: a ``Connection`` (closed here) or a connected socket."""
        if isinstance(conn, socket.socket):
            self._sock = conn
        else:
            try:
                self._sock = socket.socket(fileno=os.dup(conn.fileno()))
            finally:
                conn.close()
        # Blocking without a timeout, whatever socket.setdefaulttimeout() says: a long
        # poll must wait as long as it asks to.
        self._sock.setblocking(True)
        if self._sock.family in (socket.AF_INET, socket.AF_INET6):
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._rest = b""  # bytes received beyond the last message
        self._deadline: float | None = None  # time.monotonic() by which I/O must be done
        self._tls = False

    def set_deadline(self, seconds: float | None) -> None:
        """Make every read and write from now on fail with TimeoutError once ``seconds``
        have passed (None: block as long as it takes, again)."""
        if seconds is None:
            self._deadline = None
            self._sock.settimeout(None)
        else:
            self._deadline = time.monotonic() + seconds

    def _arm(self) -> None:
        """Give the next socket call what is left of the deadline."""
        assert self._deadline is not None
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the handshake deadline passed")
        self._sock.settimeout(left)

    def start_tls(self, context: ssl.SSLContext, *, server_side: bool,
                  server_hostname: str | None = None) -> None:
        """Run the TLS handshake (within the deadline, if one is set); from then on every
        message travels encrypted.

        Raises:
            ssl.SSLError: the handshake failed (e.g. a certificate did not verify).
            TimeoutError: it did not finish before the deadline.
        """
        assert not self._rest, "TLS must start before any message"
        self._sock = context.wrap_socket(self._sock, server_side=server_side,
                                         server_hostname=server_hostname,
                                         do_handshake_on_connect=False)
        self._tls = True
        if self._deadline is not None:
            self._arm()  # the ssl module holds its timeout as a deadline over the handshake
        self._sock.do_handshake()

    def send(self, obj: Any) -> None:
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def recv(self) -> Any:
        return pickle.loads(self.recv_bytes())

    def send_bytes(self, data: bytes) -> None:
        size = len(data)
        header = _SHORT.pack(size) if size <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(size)
        if self._deadline is not None:
            self._arm()  # sendall() spends one timeout on all its sends
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
            if self._deadline is not None:
                self._arm()
            got = self._sock.recv_into(view[have:])
            if not got:
                raise EOFError
            have += got
        return body

    def _read(self) -> bytes:
        if self._deadline is not None:
            self._arm()
        chunk = self._sock.recv(_READ)
        if not chunk:
            raise EOFError
        return chunk

    def poll(self, timeout: float | None = 0.0) -> bool:
        if self._rest:
            return True
        if self._tls and self._sock.pending():  # type: ignore[attr-defined]
            return True  # decrypted already: select() cannot see it
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
