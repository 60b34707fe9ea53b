"""An in-process HardenedServer for the transport and TLS tests."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

from processes import wait_for

from mpsched._protocol.proxy import ServiceManager
from mpsched._transport.sockets import SERIALIZER, HardenedServer
from mpsched._transport.wire import FastConnection

KEY = b"k" * 32


def sockopt(conn: Any, level: int, option: int, size: int = 0) -> Any:
    """A socket option of a connection (anything with a fileno)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        return sock.getsockopt(level, option, size) if size else sock.getsockopt(level, option)
    finally:
        sock.close()


class RecordingServer(HardenedServer):
    """A HardenedServer that notes each connection's TCP_NODELAY and the thread serving it."""

    nodelay: list[int]
    handlers: list[threading.Thread]
    stop_event: threading.Event

    def _serve_proven(self, conn: FastConnection, peer: Any) -> None:
        # Noted by the thread itself, before it serves anything: noted by the thread that
        # started it, it could have served the whole connection and ended first.
        self.handlers.append(threading.current_thread())
        super()._serve_proven(conn, peer)

    def _dispatch(self, conn: FastConnection, request: Any) -> None:
        if isinstance(self.address, tuple):
            self.nodelay.append(sockopt(conn, socket.IPPROTO_TCP, socket.TCP_NODELAY))
        super()._dispatch(conn, request)


class InProcessServer:
    """A HardenedServer whose accepter runs in a thread here, as in run_manager.

    ``start()`` starts the accepter; ``stop()`` stops it and waits for every connection's
    thread (a test must have closed its connections by then).
    """

    def __init__(self, address: Any, key: bytes = KEY) -> None:
        self.server = RecordingServer(
            ServiceManager._registry,  # type: ignore[attr-defined]
            address,
            key,
            SERIALIZER,
        )
        self.server.nodelay = []
        self.server.handlers = []
        self.server.stop_event = threading.Event()  # serve_forever() would make it
        self.address: Any = self.server.address  # a (host, port) or a unix path
        self.handlers = self.server.handlers
        self._accepter = threading.Thread(target=self.server.accepter, daemon=True)

    def start(self) -> InProcessServer:
        """Start the accepter; return once its handshake thread runs too."""
        self._accepter.start()
        wait_for(self.server.handshakes.running, 30, "the handshake thread started")
        return self

    def live_handlers(self) -> int:
        return sum(t.is_alive() for t in self.handlers)

    def stop(self) -> None:
        self.server.stop_event.set()
        if self._accepter.is_alive():
            family = socket.AF_INET if isinstance(self.address, tuple) else socket.AF_UNIX
            with contextlib.suppress(OSError), socket.socket(family) as wake:
                wake.connect(self.address)  # unblocks accept()
            self._accepter.join(10)
        self.server.listener.close()
        assert not self._accepter.is_alive()
        for handler in self.handlers:
            handler.join(10)
            assert not handler.is_alive(), "a connection was left open"


def trickle(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    """Send ``data`` a byte at a time, one every ``every`` seconds, until told to stop."""
    for byte in data:
        if stop.wait(every):
            return
        try:
            sock.sendall(bytes([byte]))
        except OSError:  # the other end hung up: what the tests wait for
            return


def read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(4096):
            data += chunk
    return data


@contextlib.contextmanager
def unanswered_address() -> Iterator[tuple[str, int]]:
    """A loopback TCP address whose SYNs go unanswered, as a host behind a firewall that
    drops them: a listener that never accepts, its accept queue (one place) already full.
    Linux drops a SYN to a full accept queue, and the connect retries it for minutes."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        filler.connect(address)
        yield address
