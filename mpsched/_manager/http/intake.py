"""The status server's accepting thread: it accepts connections, runs their TLS handshakes
and reads their requests' heads, none of it blocking, so a waiting connection costs a
descriptor and no thread::

    accept ─▶ [TLS handshake] ─▶ read the head ─▶ whole: on_request (a thread answers)
                                    ▲                                │ kept alive
                                    └───────── give_back ◀───────────┘

A connection past a cap closes the oldest waiting one (mpsched._manager.http.connections),
but only after the thread has read what the oldest one sent: a request that has arrived
is answered, never closed for room. The thread sleeps until a connection or bytes come,
the next deadline, or stop(): an idle server never wakes up.
"""

from __future__ import annotations

import contextlib
import logging
import re
import selectors
import socket
import ssl
import threading
from collections.abc import Callable

from mpsched._manager.http.connections import Connection, Connections

log = logging.getLogger("mpsched.http")

MAX_HEAD = 16 * 1024  # bytes of a request line and headers
ACCEPT_BATCH = 32  # connections accepted in a row before the waiting ones are read again
_END_OF_HEAD = re.compile(rb"\n\r?\n")
_TOO_MANY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
)
READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE


def whole_head(head: bytes | bytearray) -> bool:
    """Whether ``head`` holds a request's whole line and headers (or more than it may)."""
    return len(head) > MAX_HEAD or _END_OF_HEAD.search(head) is not None


class Intake:
    """Accepts the connections of ``listener`` and reads their requests' heads in the
    thread that runs :meth:`run`; ``on_request`` is called there with each connection
    whose head has arrived (``head`` holds it), which a thread then answers."""

    def __init__(
        self,
        listener: socket.socket,
        connections: Connections,
        tls: ssl.SSLContext | None,
        on_request: Callable[[Connection], None],
    ) -> None:
        self._listener = listener
        self._connections = connections
        self._tls = tls
        self._on_request = on_request
        # Guards _returned and _stopping: serving threads give connections back, stop()
        # stops; both then write to _waker, which wakes the thread. Nobody waits on it.
        self._lock = threading.Lock()
        self._returned: list[Connection] = []  # answered and kept: to wait again
        self._stopping = False
        self._wake, self._waker = socket.socketpair()
        self._wake.setblocking(False)
        self._waker.setblocking(False)
        self._selector = selectors.DefaultSelector()  # the thread's own, from here on

    def give_back(self, connection: Connection) -> None:
        """From a serving thread: ``connection`` was answered and waits for its next
        request (closed at once if the server stops)."""
        with self._lock:
            if not self._stopping:
                self._returned.append(connection)
                self._wake_locked()
                return
        self._connections.remove(connection)
        connection.sock.close()

    def stop(self) -> None:
        """Make :meth:`run` return (it closes the waiting connections)."""
        with self._lock:
            self._stopping = True
            self._wake_locked()

    def _wake_locked(self) -> None:
        with contextlib.suppress(OSError):  # full: the thread has wake-ups to read; closed
            self._waker.send(b"x")

    def run(self) -> None:
        """The accepting thread, until stop()."""
        self._listener.setblocking(False)
        self._selector.register(self._listener, READ)
        self._selector.register(self._wake, READ)
        try:
            while not self._stopped():
                ready = self._selector.select(self._connections.end_late())
                accept = False
                for key, _ in ready:  # the waiting ones first: what arrived is answered
                    if key.fileobj is self._listener:
                        accept = True
                    elif key.fileobj is self._wake:
                        with contextlib.suppress(OSError):
                            self._wake.recv(4096)
                    else:
                        self._step(key.data)
                self._take_back()
                if accept:
                    self._accept_some()
        except Exception:
            log.exception(
                "status server: the accepting thread failed; no more requests are answered"
            )
        finally:
            self._close_all()

    def _stopped(self) -> bool:
        with self._lock:
            return self._stopping

    def _accept_some(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # that connection's problem, or no descriptor left
                log.debug("status server: accept() failed: %s", exc)
                return
            self._open(sock, str(peer[0]), int(peer[1]))

    def _open(self, sock: socket.socket, host: str, port: int) -> None:
        """Wait for a new connection's first request, once there is room for it."""
        while True:
            may, oldest = self._connections.make_room(host)
            if oldest is None:
                break
            self._step(oldest)  # what it sent may be a whole request: then it is answered
            if not oldest.served and oldest.sock.fileno() != -1:  # not closed by it either
                log.debug(
                    "status server: closed a waiting connection from %s for room", oldest.host
                )
                self._close(oldest)
        if not may:
            if self._tls is None:  # over TLS there is no way to say why without a handshake
                with contextlib.suppress(OSError):
                    sock.setblocking(False)
                    sock.send(_TOO_MANY)
            sock.close()
            return
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(sock=sock, host=host, port=port)
        if self._tls is not None:
            connection.sock = self._tls.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
            connection.handshaking = True
        self._connections.opened(connection)
        self._selector.register(connection.sock, READ, connection)

    def _step(self, connection: Connection) -> None:
        """Advance a waiting connection as far as its socket allows: its TLS handshake,
        then reading its next request's head; hand it over once the head is whole."""
        if connection.handshaking and not self._handshake(connection):
            return
        if connection.served:
            return
        while len(connection.head) <= MAX_HEAD:
            try:
                chunk = connection.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except Exception:  # reset, a TLS error, shut down under us: it is over
                self._close(connection)
                return
            if not chunk:
                self._close(connection)
                return
            connection.head += chunk
        if whole_head(connection.head):
            self._selector.unregister(connection.sock)
            self._connections.serving(connection)
            self._on_request(connection)

    def _handshake(self, connection: Connection) -> bool:
        """A step of a connection's TLS handshake; True once it is over."""
        assert isinstance(connection.sock, ssl.SSLSocket)
        try:
            connection.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(connection.sock, READ, connection)
            return False
        except ssl.SSLWantWriteError:
            self._selector.modify(connection.sock, WRITE, connection)
            return False
        except Exception as exc:  # a failed handshake, a reset: it is over
            log.debug("status server: TLS with %s failed: %s", connection.host, exc)
            self._close(connection)
            return False
        connection.handshaking = False
        self._selector.modify(connection.sock, READ, connection)
        return True

    def _take_back(self) -> None:
        with self._lock:
            returned, self._returned = self._returned, []
        for connection in returned:
            if connection.ended:
                self._connections.remove(connection)
                connection.sock.close()
                continue
            self._connections.waiting(connection)
            connection.sock.setblocking(False)
            self._selector.register(connection.sock, READ, connection)
            self._step(connection)  # TLS may hold decrypted bytes the selector cannot see

    def _close(self, connection: Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        self._connections.remove(connection)
        connection.sock.close()

    def _close_all(self) -> None:
        with self._lock:
            self._stopping = True
            returned, self._returned = self._returned, []
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, Connection):
                self._close(key.data)
        for connection in returned:
            self._connections.remove(connection)
            connection.sock.close()
        self._selector.close()
        with self._lock:
            self._wake.close()
            self._waker.close()
