"""Connections: the status server's open connections, their caps and their deadlines.

The accepting thread admits a connection, or turns it away (MAX_CONNECTIONS in all,
MAX_PER_ADDRESS from one IP address, with one warning per episode), and shuts down those
past their deadline (REQUEST_TIME from when each was accepted or last answered). A
connection's own thread swaps in its TLS socket, moves its deadline on each answer, and
leaves. Bookkeeping only, no HTTP: mpsched._manager.http.server drives it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from dataclasses import dataclass

log = logging.getLogger("mpsched.http")

MAX_CONNECTIONS = 32
MAX_PER_ADDRESS = 8
REQUEST_TIME = 10.0  # seconds a connection may take per request, from the previous answer


@dataclass
class _Connection:
    sock: socket.socket  # what to shut down: the accepted socket, or its TLS wrapper
    host: str  # the peer's IP address
    deadline: float  # time.monotonic() past which the accepting thread ends it
    ended: bool = False  # shut down by the accepting thread; its thread is on its way out


class Connections:
    """The open connections of one status server, by their accepted socket. Thread-safe."""

    def __init__(self) -> None:
        # Guards _open and _capped. The accepting thread adds and reaps connections; a
        # connection's thread swaps in its TLS socket, moves its deadline and removes itself
        # at its end. end_all() waits on _ended until _open is empty; notified as each ends.
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._open: dict[socket.socket, _Connection] = {}
        self._capped = False  # a cap turned connections away since half the slots were free

    # -------------------------------------------------- the accepting thread's side

    def admit(self, sock: socket.socket, host: str) -> bool:
        """Count ``sock``, from ``host``, as open; False if a cap turns it away."""
        with self._lock:
            mine = sum(1 for c in self._open.values() if c.host == host)
            if len(self._open) < MAX_CONNECTIONS and mine < MAX_PER_ADDRESS:
                self._open[sock] = _Connection(sock=sock, host=host,
                                               deadline=time.monotonic() + REQUEST_TIME)
                return True
            if not self._capped:  # one warning per episode, not one per connection
                self._capped = True
                log.warning("status server: refusing connections (%d open from %s, %d in "
                            "all; at most %d from one address, %d in all)", mine, host,
                            len(self._open), MAX_PER_ADDRESS, MAX_CONNECTIONS)
        return False

    def end_late(self) -> float | None:
        """End the connections past their deadline (shut down, their threads' reads and
        writes return); the seconds until the next deadline, None for none."""
        now = time.monotonic()
        with self._lock:
            late = [c for c in self._open.values() if not c.ended and c.deadline <= now]
            for connection in late:
                connection.ended = True
            ahead = [c.deadline - now for c in self._open.values() if not c.ended]
        for connection in late:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)
        return min(ahead, default=None)

    def remove(self, raw: socket.socket) -> socket.socket | None:
        """``raw``'s connection has ended; returns the socket it ran over (its TLS socket,
        which the caller closes, or ``raw``), None if it was not counted."""
        with self._lock:
            connection = self._open.pop(raw, None)
            if not self._open:
                self._ended.notify_all()
            if self._capped and len(self._open) <= MAX_CONNECTIONS // 2:
                self._capped = False
                log.info("status server: accepting connections again")
        return None if connection is None else connection.sock

    def socks(self) -> list[socket.socket]:
        """The sockets the open connections run over."""
        with self._lock:
            return [c.sock for c in self._open.values()]

    def end_all(self, timeout: float) -> None:
        """End every open connection and wait up to ``timeout`` for their threads."""
        for sock in self.socks():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with self._lock:
            if not self._ended.wait_for(lambda: not self._open, timeout):
                log.warning("status server: %d connection(s) still open after %.0f s",
                            len(self._open), timeout)

    # -------------------------------------------------- a connection's thread's side

    def wrapped(self, raw: socket.socket, sock: socket.socket) -> None:
        """``raw``'s connection now runs over ``sock`` (TLS)."""
        with self._lock:
            if raw in self._open:
                self._open[raw].sock = sock

    def answered(self, raw: socket.socket) -> None:
        """A request was answered: the next one has REQUEST_TIME from now."""
        with self._lock:
            if raw in self._open:
                self._open[raw].deadline = time.monotonic() + REQUEST_TIME
