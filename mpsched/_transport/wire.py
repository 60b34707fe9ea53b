"""FastConnection: multiprocessing's message framing over a socket, optionally TLS."""

from __future__ import annotations

import os
import pickle
import select
import socket
import ssl
import struct
import time
from multiprocessing import connection
from typing import Any

_SHORT = struct.Struct("!i")  # multiprocessing's framing: a signed 32-bit length,
_LONG = struct.Struct("!Q")  # or -1 and then a 64-bit one
_READ = 65536  # bytes asked of the kernel per read
# A message with out-of-band buffers starts with this (a pickle starts with 0x80): a zero
# byte and the buffer count, then each buffer's length; then the pickle, then the buffers.
_BUFFERS = struct.Struct("!BI")
_BUFFER = struct.Struct("!Q")


class FastConnection:
    """A manager connection: the C pickler, and one system call per small message.

    Speaks multiprocessing's framing, so either end may be a plain ``Connection``. Two
    differences make it cheaper per message (the manager handles a few per job):
    messages are pickled with the C pickler (``Connection`` uses ForkingPickler, which
    copies its reducer table per message; manager messages never carry fds or sockets),
    and a read asks for up to 64 KiB, so a small message arrives in one system call
    where ``Connection`` makes two (length, then body) and assembles them in a BytesIO.
    Bytes read past the end of a message are kept for the next one.

    Large payloads cross without a copy on either side: a ``pickle.PickleBuffer`` in a
    message (mpsched._protocol.codec wraps job and result payloads in one) is sent from its own
    memory after the pickle, and received straight into a ``bytearray`` of its size, which
    :meth:`recv` hands to the unpickler (a read-only ``PickleBuffer`` comes back as a
    read-only ``memoryview`` of that ``bytearray``). Only a FastConnection reads such a
    message; the other messages are multiprocessing's.

    During a handshake, :meth:`set_deadline` bounds the total time of every read and write
    (a per-call timeout would let a peer trickle a byte per period forever), and
    :meth:`start_tls` moves the connection onto TLS.

    Not thread-safe: like ``Connection``, one thread uses it at a time (manager proxies
    keep one connection per thread).
    """

    def __init__(self, conn: connection.Connection | socket.socket) -> None:
        """Take over ``conn``: a ``Connection`` (closed here) or a connected socket (an
        ``ssl.SSLSocket`` whose TLS handshake is done, too)."""
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
        # A reader blocked in recv() on a Unix socket is woken each time its peer takes in
        # data this end sent (the kernel wakes the socket's whole wait queue when room
        # frees up), and goes back to sleep: a wake-up for nothing after every message.
        # One that waits in poll() for POLLIN is woken only by data. Where a wake-up is
        # dear (a virtual CPU gone idle: ~10-20 us) that is most of a message's cost.
        self._readable: select.poll | None = None
        if self._sock.family == socket.AF_UNIX:
            self._readable = select.poll()
            self._readable.register(self._sock, select.POLLIN)
        self._rest = b""  # bytes received beyond the last message
        self._deadline: float | None = None  # time.monotonic() by which I/O must be done
        self._tls = isinstance(self._sock, ssl.SSLSocket)  # on TLS already, or by start_tls

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

    def start_tls(
        self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        """Run the TLS handshake (within the deadline, if one is set); from then on every
        message travels encrypted.

        Raises:
            ssl.SSLError: the handshake failed (e.g. a certificate did not verify).
            TimeoutError: it did not finish before the deadline.
        """
        assert not self._rest, "TLS must start before any message"
        self._sock = context.wrap_socket(
            self._sock,
            server_side=server_side,
            server_hostname=server_hostname,
            do_handshake_on_connect=False,
        )
        self._tls = True
        self._readable = None  # decrypted data may wait in the ssl object, unseen by poll()
        if self._deadline is not None:
            self._arm()  # the ssl module holds its timeout as a deadline over the handshake
        self._sock.do_handshake()

    def send(self, obj: Any) -> None:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=buffers.append)
        if buffers:
            self._send_with_buffers(data, [buffer.raw() for buffer in buffers])
        else:
            self.send_bytes(data)

    def _send_with_buffers(self, data: bytes, raws: list[memoryview]) -> None:
        table = [_BUFFERS.pack(0, len(raws)), *(_BUFFER.pack(raw.nbytes) for raw in raws)]
        size = sum(map(len, table)) + len(data) + sum(raw.nbytes for raw in raws)
        if self._deadline is not None:
            self._arm()
        self._sock.sendall(b"".join([_header(size), *table, data]))
        for raw in raws:
            self._sock.sendall(raw)

    def recv(self) -> Any:
        data = self._rest
        while len(data) < 5:
            data += self._read()
        size: int = _SHORT.unpack_from(data)[0]
        end = 4 + size
        if size > 0 and len(data) >= end and data[4] != 0:  # a whole pickle at hand
            self._rest = data[end:]
            return pickle.loads(data[4:end])
        self._rest = data
        size = self._length()
        self._fill(1)
        if self._rest[0] != 0:
            return pickle.loads(self._body(size))
        _, count = _BUFFERS.unpack(self._body(_BUFFERS.size))
        lengths = [length for (length,) in _BUFFER.iter_unpack(self._body(count * _BUFFER.size))]
        left = size - _BUFFERS.size - count * _BUFFER.size - sum(lengths)
        if left <= 0:
            self.close()
            raise OSError(f"bad message: {count} buffers do not fit its length {size}")
        pickled = self._body(left)
        buffers = []
        for length in lengths:
            buffer = bytearray(length)
            self._read_into(memoryview(buffer))
            buffers.append(buffer)
        return pickle.loads(pickled, buffers=buffers)

    def send_bytes(self, data: bytes) -> None:
        size = len(data)
        if self._deadline is not None:
            self._arm()  # sendall() spends one timeout on all its sends
        if size <= _READ:
            self._sock.sendall(_header(size) + data)
        else:  # no copy of a big message just to prepend its length
            self._sock.sendall(_header(size))
            self._sock.sendall(data)

    def recv_bytes(self, maxlength: int | None = None) -> bytes | bytearray:
        size = self._length()
        if maxlength is not None and size > maxlength:
            self.close()
            raise OSError(f"bad message length {size}")
        return self._body(size)

    def _length(self) -> int:
        """Read a message's length."""
        self._fill(4)
        size: int = _SHORT.unpack_from(self._rest)[0]
        start = 4
        if size == -1:
            self._fill(12)
            size = _LONG.unpack_from(self._rest, 4)[0]
            start = 12
        if size < 0:
            self.close()
            raise OSError(f"bad message length {size}")
        self._rest = self._rest[start:]
        return int(size)

    def _fill(self, size: int) -> None:
        """Read until at least ``size`` bytes are at hand."""
        while len(self._rest) < size:
            self._rest += self._read()

    def _body(self, size: int) -> bytes | bytearray:
        """The next ``size`` bytes."""
        data = self._rest
        if len(data) >= size:
            self._rest = data[size:]
            return data[:size]
        # Longer than what arrived: read the rest straight into its buffer, which is
        # returned as it is (no copy of a big message into bytes).
        body = bytearray(size)
        self._read_into(memoryview(body))
        return body

    def _read_into(self, view: memoryview) -> None:
        """Fill ``view`` with the next bytes: those at hand, then from the socket."""
        have = min(len(self._rest), view.nbytes)
        view[:have] = self._rest[:have]
        self._rest = self._rest[have:]
        while have < view.nbytes:
            if self._deadline is not None:
                self._arm()
            got = self._sock.recv_into(view[have:])
            if not got:
                raise EOFError
            have += got

    def _read(self) -> bytes:
        if self._deadline is not None:
            self._arm()
        elif self._readable is not None:
            self._readable.poll()  # see __init__; it returns at once if data is here
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

    def __del__(self) -> None:
        # As multiprocessing's Connection does: a connection no one closed (a proxy's, of a
        # thread that ended or of a proxy collected) closes its socket when it is collected.
        sock = getattr(self, "_sock", None)
        if sock is not None:
            sock.close()

    def __enter__(self) -> FastConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _header(size: int) -> bytes:
    """multiprocessing's length prefix of a ``size``-byte message."""
    return _SHORT.pack(size) if size <= 0x7FFFFFFF else _SHORT.pack(-1) + _LONG.pack(size)
