"""Connections: the status server's open connections, their caps and their deadlines.

A connection is *waiting* (for its next request: the accepting thread holds it in its
selector, no thread of its own) or *served* (a whole request head has arrived: a thread
answers it). The caps bound descriptors, MAX_CONNECTIONS in all and MAX_PER_ADDRESS from
one IP address: a new connection that finds one reached closes the oldest waiting
connection of its address, else the oldest waiting of all (an idle kept-alive one, or one
whose request is unfinished). A request that has arrived is never closed for room; only
when every connection is served is a new one turned away. Each connection has a deadline,
REQUEST_TIME from when it was accepted or last answered, past which it is shut down.
Bookkeeping only, no HTTP: mpsched._manager.http.intake and .server drive it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

log = logging.getLogger("mpsched.http")

MAX_CONNECTIONS = 128  # open at once (each holds a descriptor; a served one a thread too)
MAX_PER_ADDRESS = 32  # ... from one IP address
REQUEST_TIME = 10.0  # seconds a connection may take per request, from the previous answer


@dataclass(eq=False)
class Connection:
    """One open connection of the status server."""

    sock: socket.socket  # as accepted, then its TLS wrapper (which owns the descriptor)
    host: str  # the peer's IP address
    port: int
    deadline: float = 0.0  # time.monotonic() past which it is shut down
    head: bytearray = field(default_factory=bytearray)  # read, not yet parsed
    handshaking: bool = False  # its TLS handshake is not over
    served: bool = False  # a thread answers its request (else it waits for one)
    ended: bool = False  # shut down at its deadline or at stop; on its way out

    def shut_down(self) -> None:
        """End its reads and writes, whichever thread is in them (its owner closes it)."""
        with contextlib.suppress(OSError):
            # The plain socket's: an SSLSocket's own would drop its TLS state under the
            # thread using it.
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)


class Connections:
    """The open connections of one status server. Thread-safe."""

    def __init__(self) -> None:
        # Guards _waiting, _served and _capped. The accepting thread adds, reaps and closes
        # waiting connections; serving threads move theirs back to waiting or remove them.
        # end_all() waits on _ended until none is left; notified as each one goes.
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)
        self._waiting: OrderedDict[Connection, None] = OrderedDict()  # oldest first
        self._served: set[Connection] = set()
        self._capped = 0  # closed for room since half the slots were free
        self._turned_away = 0  # ... and turned away, every open one being answered

    def _below_caps_locked(self) -> bool:
        """Whether the open connections, in all and from each address, fill half their caps
        at most: a flood is over."""
        every = [*self._waiting, *self._served]
        if len(every) > MAX_CONNECTIONS // 2:
            return False
        return max(Counter(c.host for c in every).values(), default=0) <= MAX_PER_ADDRESS // 2

    def _hosts_locked(self, host: str) -> int:
        return sum(1 for c in self._waiting if c.host == host) + sum(
            1 for c in self._served if c.host == host
        )

    def make_room(self, host: str) -> tuple[bool, Connection | None]:
        """Whether one more connection from ``host`` may open, and the waiting connection
        to close first for it (None: none needs to). It may not when a cap is reached
        and every connection under it is served."""
        with self._lock:
            mine = self._hosts_locked(host)
            if mine >= MAX_PER_ADDRESS:
                oldest = next((c for c in self._waiting if c.host == host), None)
            elif len(self._waiting) + len(self._served) >= MAX_CONNECTIONS:
                oldest = next(iter(self._waiting), None)
            else:
                return True, None
            if oldest is None:
                self._turned_away += 1
                if self._turned_away == 1:
                    log.warning(
                        "status server: turning connections from %s away: each of "
                        "the %d open is being answered",
                        host,
                        len(self._waiting) + len(self._served),
                    )
                return False, None
            self._capped += 1
            if self._capped == 1:  # one warning per episode, not one per connection
                log.warning(
                    "status server: %d connections open from %s, %d in all (at most "
                    "%d from one address, %d in all); closing the oldest waiting one "
                    "for each new one",
                    mine,
                    host,
                    len(self._waiting) + len(self._served),
                    MAX_PER_ADDRESS,
                    MAX_CONNECTIONS,
                )
            return True, oldest

    def opened(self, connection: Connection) -> None:
        """Count a new connection, waiting for its first request (REQUEST_TIME from now)."""
        with self._lock:
            connection.deadline = time.monotonic() + REQUEST_TIME
            self._waiting[connection] = None

    def serving(self, connection: Connection) -> None:
        """A whole request head arrived: a thread answers it (it is not closed for room)."""
        with self._lock:
            self._waiting.pop(connection, None)
            self._served.add(connection)
            connection.served = True

    def answered(self, connection: Connection) -> None:
        """A request was answered and the connection is kept: the next one has REQUEST_TIME
        from now."""
        with self._lock:
            if not connection.ended:
                connection.deadline = time.monotonic() + REQUEST_TIME

    def waiting(self, connection: Connection) -> None:
        """An answered connection waits for its next request again."""
        with self._lock:
            self._served.discard(connection)
            connection.served = False
            self._waiting[connection] = None

    def remove(self, connection: Connection) -> None:
        """The connection has ended (its socket is closed by the caller)."""
        with self._lock:
            self._waiting.pop(connection, None)
            self._served.discard(connection)
            if not self._waiting and not self._served:
                self._ended.notify_all()
            if (self._capped or self._turned_away) and self._below_caps_locked():
                log.info(
                    "status server: below the caps again; closed %d waiting "
                    "connection(s) and turned %d away meanwhile",
                    self._capped,
                    self._turned_away,
                )
                self._capped = self._turned_away = 0

    def end_late(self) -> float | None:
        """Shut down the connections past their deadline (their reads and writes return,
        and the owner closes them); the seconds until the next deadline, None for none."""
        now = time.monotonic()
        with self._lock:
            every = [*self._waiting, *self._served]
            late = [c for c in every if not c.ended and c.deadline <= now]
            for connection in late:
                connection.ended = True
            ahead = [c.deadline - now for c in every if not c.ended]
        for connection in late:
            connection.shut_down()
        return min(ahead, default=None)

    def socks(self) -> list[socket.socket]:
        """The sockets the open connections run over."""
        with self._lock:
            return [c.sock for c in [*self._waiting, *self._served]]

    def end_all(self, timeout: float) -> None:
        """Shut down every open connection and wait up to ``timeout`` for them to end."""
        with self._lock:
            every = [*self._waiting, *self._served]
            for connection in every:
                connection.ended = True
        for connection in every:
            connection.shut_down()
        with self._lock:
            if not self._ended.wait_for(lambda: not self._waiting and not self._served, timeout):
                log.warning(
                    "status server: %d connection(s) still open after %.0f s",
                    len(self._waiting) + len(self._served),
                    timeout,
                )
