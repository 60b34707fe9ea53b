"""The thread that drives every handshake of a server, and the room for them.

A server's accepting thread hands each new connection to :meth:`HandshakeLoop.admit`;
one loop thread waits for all the admitted ones with a selector and advances each
(:class:`mpsched._transport.handshake.PendingHandshake`) as its bytes arrive, so idle or slow peers
cost a descriptor each, not a thread. A connection whose peer proved it holds the key goes
to ``on_proven`` (the server starts its serving thread); one that closes, fails or misses
its deadline is closed here, its reason logged.

The caps bound the descriptors that handshakes hold, in all and per TCP peer address;
they never turn a new connection away. :class:`HandshakeSlots` keeps the handshakes in
the order they came: a new one that finds its address's slots taken closes the oldest
handshake of that address, and one that finds every slot taken closes the oldest of all.
The peer closed is told why where it can be. A peer has a cap's worth of newer arrivals
to prove its key, so idle strangers behind its address (same host, NAT, a proxy) cannot
keep it out; one closed anyway tries again (mpsched's clients do, with back-off:
mpsched._transport.connect).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from mpsched._transport.handshake import READ, PendingHandshake, Stage, log_failure, tell
from mpsched._transport.wire import FastConnection

log = logging.getLogger("mpsched.transport")

# Connections the accepting thread may hand over before the loop has taken them in: past
# it, the accepting thread waits, and the kernel's listen backlog holds the next ones.
ARRIVALS_AHEAD = 64


@dataclass(frozen=True)
class Limits:
    """How many connections may be in their handshake at once (each holds a descriptor)."""

    total: int  # from all peers together
    per_address: int  # from one TCP peer address (Unix peers have none)


class HandshakeSlots:
    """The connections in their handshake, oldest first, in all and per TCP peer address;
    which one to close to make room for a new one.

    Closing for room is logged once when a cap is reached, and summed up when half its
    slots are free again (a flood that goes on makes one warning, not one per connection).
    The loop thread's own: not thread-safe.
    """

    def __init__(self) -> None:
        self._all: OrderedDict[int, PendingHandshake] = OrderedDict()  # by fd
        self._by_host: dict[str, OrderedDict[int, PendingHandshake]] = {}
        self._closed_by_host: dict[str, int] = {}  # addresses at their cap: closed since
        self._closed_total = 0  # closed since the total cap was last reached
        self._limits = Limits(total=1, per_address=1)  # as of the last room made

    def __len__(self) -> int:
        return len(self._all)

    def __iter__(self) -> Iterator[PendingHandshake]:
        return iter(list(self._all.values()))

    def get(self, fd: int) -> PendingHandshake | None:
        return self._all.get(fd)

    def add(self, pending: PendingHandshake) -> None:
        self._all[pending.fd] = pending
        if pending.host is not None:
            self._by_host.setdefault(pending.host, OrderedDict())[pending.fd] = pending

    def remove(self, pending: PendingHandshake) -> None:
        del self._all[pending.fd]
        host = pending.host
        if host is not None:
            mine = self._by_host[host]
            del mine[pending.fd]
            if not mine:
                del self._by_host[host]
            if host in self._closed_by_host and len(mine) <= self._limits.per_address // 2:
                log.info(
                    "handshakes from %s are below their cap again; closed %d of them "
                    "meanwhile to make room",
                    host,
                    self._closed_by_host.pop(host),
                )
        if self._closed_total and len(self._all) <= self._limits.total // 2:
            log.info(
                "handshakes are below their cap again; closed %d meanwhile to make room",
                self._closed_total,
            )
            self._closed_total = 0

    def oldest_to_close(
        self, host: str | None, limits: Limits
    ) -> tuple[PendingHandshake, str] | None:
        """The handshake to close so that one more from ``host`` fits, and what its peer is
        told; None when it fits."""
        self._limits = limits
        mine = self._by_host.get(host) if host is not None else None
        if host is not None and mine is not None and len(mine) >= limits.per_address:
            closed = self._closed_by_host.get(host, 0) + 1
            self._closed_by_host[host] = closed
            if closed == 1:
                log.warning(
                    "%d handshakes from %s are pending, its cap; closing the "
                    "oldest of them for each new one",
                    limits.per_address,
                    host,
                )
            return next(iter(mine.values())), (
                f"its handshake was closed to make room: {limits.per_address} newer ones "
                f"from {host} are pending (at most {limits.per_address} from one address)"
            )
        if len(self._all) >= limits.total:
            self._closed_total += 1
            if self._closed_total == 1:
                log.warning(
                    "%d connections are in their handshake, the cap; closing the "
                    "oldest for each new one",
                    limits.total,
                )
            return next(iter(self._all.values())), (
                f"its handshake was closed to make room: {limits.total} newer connections "
                f"are in their handshake"
            )
        return None


class HandshakeLoop:
    """Drives the handshakes of a server's new connections in one thread.

    ``admit`` (from the accepting thread) takes each new connection; ``on_proven`` is
    called in the loop's thread with each connection whose peer proved it holds the key
    (blocking again, its deadline what is left of its ``timeout``). ``stop`` closes the
    connections still in their handshake and ends the thread.
    """

    def __init__(
        self,
        authkey: bytes,
        tls: ssl.SSLContext | None,
        on_proven: Callable[[FastConnection, Any], None],
    ) -> None:
        self._authkey = authkey
        self._tls = tls
        self._on_proven = on_proven
        # Guards _arrivals, _limits, _open and _stopping: the accepting thread admits
        # connections, the loop takes them in and closes them.
        self._lock = threading.Lock()
        # The accepting thread waits here while ARRIVALS_AHEAD arrivals are not taken in
        # yet; the loop notifies it as it takes them, and stop() as it stops.
        self._taken = threading.Condition(self._lock)
        self._arrivals: list[PendingHandshake] = []  # admitted, not yet taken in
        self._limits = Limits(total=1, per_address=1)  # as of the last admission
        self._open = 0  # admitted and not finished
        self._stopping = False
        # The rest is the loop thread's own (made at start, so an unstarted one holds none).
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_reader: socket.socket | None = None  # a byte from the accepting thread:
        self._wake_writer: socket.socket | None = None  # look at _arrivals and _stopping
        self._slots = HandshakeSlots()  # taken in, not finished
        self._deadlines: list[tuple[float, int, PendingHandshake]] = []  # a heap
        self._order = itertools.count()  # ties in _deadlines

    def start(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, READ)
        self._thread = threading.Thread(target=self._run, name="mpsched-handshakes", daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def in_handshake(self) -> int:
        """Connections admitted whose handshake is not over."""
        with self._lock:
            return self._open

    def admit(self, sock: socket.socket, peer: Any, timeout: float, limits: Limits) -> None:
        """Take a new connection (``peer`` as accept() gave it) into the loop; a stopping
        server tells it so (where it can) and closes it. Waits while the loop is
        ARRIVALS_AHEAD connections behind."""
        with self._lock:
            while len(self._arrivals) >= ARRIVALS_AHEAD and not self._stopping:
                self._taken.wait()
            if not self._stopping:
                self._open += 1
                self._limits = limits
                self._arrivals.append(PendingHandshake(sock, peer, timeout, tls=self._tls))
                self._wake_locked()
                return
        if self._tls is None:  # over TLS, saying why needs a handshake first
            tell(sock, "the manager is stopping")
        sock.close()

    def _wake_locked(self) -> None:
        assert self._wake_writer is not None, "admit() before start()"
        with contextlib.suppress(BlockingIOError):  # full: the loop has wake-ups to read
            self._wake_writer.send(b"!")

    def stop(self) -> None:
        """Close every connection still in its handshake; wait for the loop to end."""
        with self._lock:
            self._stopping = True
            self._taken.notify_all()
            if self._thread is not None:
                self._wake_locked()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        assert self._selector is not None
        try:
            while self._take_arrivals():
                timeout = None
                if self._deadlines:
                    timeout = max(0.0, self._deadlines[0][0] - time.monotonic())
                for key, _ in self._selector.select(timeout):
                    if key.fileobj is self._wake_reader:
                        self._drain_wake()
                    else:
                        self._advance(key.data)
                self._expire()
        except Exception:
            log.exception("the handshake thread failed: no more connections are served")
            with self._lock:
                self._stopping = True  # admit() closes new ones from now on
                self._taken.notify_all()
        finally:
            self._close_all()

    def _take_arrivals(self) -> bool:
        """Start the handshakes of the connections admitted since, each closing the oldest
        handshake if it needs the room; False: stop."""
        assert self._selector is not None
        with self._lock:
            if self._stopping:
                return False
            arrivals, self._arrivals = self._arrivals, []
            limits = self._limits
            self._taken.notify_all()
        for pending in arrivals:
            while (oldest := self._slots.oldest_to_close(pending.host, limits)) is not None:
                self._close_for_room(*oldest)
            self._slots.add(pending)
            heapq.heappush(self._deadlines, (pending.deadline, next(self._order), pending))
            self._selector.register(pending.fd, pending.events, pending)
            self._advance(pending)
        return True

    def _close_for_room(self, pending: PendingHandshake, reason: str) -> None:
        log.debug("closed a handshake from %s to make room", pending.host or "a Unix peer")
        pending.tell_closed(reason)
        self._finish(pending)

    def _advance(self, pending: PendingHandshake) -> None:
        assert self._selector is not None
        before = pending.events
        try:
            finished = pending.advance(self._authkey)
        except Exception as exc:  # whatever a peer sends, this connection is over
            log_failure(pending.peer, exc, heard=pending.heard)
            self._finish(pending)
            return
        if not finished:
            if pending.events != before:
                self._selector.modify(pending.fd, pending.events, pending)
            return
        self._finish(pending)
        self._hand_over(pending)

    def _hand_over(self, pending: PendingHandshake) -> None:
        try:
            conn = FastConnection(pending.sock)  # blocking again
        except OSError as exc:  # the peer is gone already
            pending.sock.close()
            log_failure(pending.peer, exc, heard=True)
            return
        conn.set_deadline(max(0.0, pending.deadline - time.monotonic()))
        try:
            self._on_proven(conn, pending.peer)
        except Exception:
            log.exception("cannot serve a connection")
            conn.close()

    def _finish(self, pending: PendingHandshake) -> None:
        """Forget ``pending`` and free its slot; close it unless a thread takes it over."""
        assert self._selector is not None
        self._selector.unregister(pending.fd)
        self._slots.remove(pending)
        with self._lock:
            self._open -= 1
        if pending.stage is not Stage.PROVEN:
            pending.sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, pending = heapq.heappop(self._deadlines)
            if self._slots.get(pending.fd) is pending:
                log_failure(pending.peer, TimeoutError(), heard=pending.heard)
                self._finish(pending)

    def _drain_wake(self) -> None:
        assert self._wake_reader is not None
        with contextlib.suppress(BlockingIOError):
            while self._wake_reader.recv(4096):
                pass

    def _close_all(self) -> None:
        assert self._selector is not None
        for pending in self._slots:
            self._finish(pending)
        with self._lock:
            arrivals, self._arrivals = self._arrivals, []
            self._open -= len(arrivals)
            self._selector.close()
            assert self._wake_reader is not None and self._wake_writer is not None
            self._wake_reader.close()
            self._wake_writer.close()
        for pending in arrivals:
            pending.sock.close()
