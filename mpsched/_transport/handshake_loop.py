"""The thread that drives every handshake of a server, and the caps on them.

A server's accepting thread hands each new connection to :meth:`HandshakeLoop.admit`;
one loop thread waits for all the admitted ones with a selector and advances each
(:class:`mpsched._transport.handshake.PendingHandshake`) as its bytes arrive, so idle or slow peers
cost a descriptor each, not a thread. A connection whose peer proved it holds the key goes
to ``on_proven`` (the server starts its serving thread); one that closes, fails or misses
its deadline is closed here, its reason logged.

:class:`HandshakeSlots` caps the connections in their handshake, in all and per TCP peer
address, so that one host cannot take every slot. A connection over a cap is told why:
at once without TLS (a client speaks only after our first message); over TLS the reason
needs a TLS handshake first, so it goes through the loop too, a few per address at a time
(more are closed without a word).
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpsched._transport.handshake import READ, PendingHandshake, Stage, log_failure, tell
from mpsched._transport.wire import FastConnection

log = logging.getLogger("mpsched.transport")


@dataclass(frozen=True)
class Limits:
    """How many connections may be in their handshake at once."""

    total: int  # from all peers together (each holds a descriptor)
    per_address: int  # from one TCP peer address (Unix peers have none)
    refusals_per_address: int  # TLS only: refused ones of one address being told why


class HandshakeSlots:
    """Counts the connections in their handshake; decides which new ones may join.

    A cap's refusals are logged once when it is reached, and summed up when half its
    slots are free again (a peer that retakes each freed slot makes one warning, not two
    per slot). Not thread-safe: its owner calls it under its own lock.
    """

    def __init__(self) -> None:
        self.total = 0  # admitted (or being told why) and not finished
        self._by_host: Counter[str] = Counter()  # of those, admitted ones per address
        self._telling: Counter[str] = Counter()  # of those, TLS refusals per address
        self._refused_by_host: dict[str, int] = {}  # addresses at their cap: refused since
        self._refused_total = 0  # refused since the total cap was last reached
        # As of the last admission.
        self._limits = Limits(total=1, per_address=1, refusals_per_address=0)

    def refusal_locked(self, host: str | None, limits: Limits) -> str:
        """Why a connection from ``host`` is refused now ("": it is not)."""
        self._limits = limits
        if self.total >= limits.total:
            self._refused_total += 1
            if self._refused_total == 1:
                log.warning("%d connections are in their handshake; refusing new ones "
                            "until some finish", limits.total)
            return f"{limits.total} connections are in their handshake; try again soon"
        if host is not None and self._by_host[host] >= limits.per_address:
            refused = self._refused_by_host.get(host, 0) + 1
            self._refused_by_host[host] = refused
            if refused == 1:
                log.warning("%d handshakes from %s are pending; refusing its new "
                            "connections until some finish", limits.per_address, host)
            return (f"too many handshakes from {host} are pending (at most "
                    f"{limits.per_address} from one address); try again once they finish")
        return ""

    def may_tell_locked(self, host: str | None) -> bool:
        """Whether a connection just refused may take a slot to be told why over TLS."""
        return (host is not None and self.total < self._limits.total
                and self._telling[host] < self._limits.refusals_per_address)

    def take_locked(self, host: str | None, *, telling: bool) -> None:
        self.total += 1
        if host is not None:
            (self._telling if telling else self._by_host)[host] += 1

    def release_locked(self, host: str | None, *, telling: bool) -> None:
        self.total -= 1
        if host is not None:
            counter = self._telling if telling else self._by_host
            counter[host] -= 1
            if counter[host] <= 0:
                del counter[host]
            if (host in self._refused_by_host
                    and self._by_host[host] <= self._limits.per_address // 2):
                log.warning("accepting connections from %s again; refused %d meanwhile",
                            host, self._refused_by_host.pop(host))
        if self._refused_total and self.total <= self._limits.total // 2:
            log.warning("accepting connections again; closed %d meanwhile",
                        self._refused_total)
            self._refused_total = 0


class HandshakeLoop:
    """Drives the handshakes of a server's new connections in one thread.

    ``admit`` (from the accepting thread) takes each new connection; ``on_proven`` is
    called in the loop's thread with each connection whose peer proved it holds the key
    (blocking again, its deadline what is left of its ``timeout``). ``stop`` closes the
    connections still in their handshake and ends the thread.
    """

    def __init__(self, authkey: bytes, tls: ssl.SSLContext | None,
                 on_proven: Callable[[FastConnection, Any], None]) -> None:
        self._authkey = authkey
        self._tls = tls
        self._on_proven = on_proven
        # Guards _slots, _arrivals and _stopping: the accepting thread admits connections,
        # the loop takes them in and frees their slots. Nobody waits on it.
        self._lock = threading.Lock()
        self._slots = HandshakeSlots()
        self._arrivals: list[PendingHandshake] = []  # admitted, not yet taken in
        self._stopping = False
        # The rest is the loop thread's own (made at start, so an unstarted one holds none).
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_reader: socket.socket | None = None  # a byte from the accepting thread:
        self._wake_writer: socket.socket | None = None  # look at _arrivals and _stopping
        self._pending: dict[int, PendingHandshake] = {}  # by fd
        self._deadlines: list[tuple[float, int, PendingHandshake]] = []  # a heap
        self._order = itertools.count()  # ties in _deadlines

    def start(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_writer.setblocking(False)
        self._selector.register(self._wake_reader, READ)
        self._thread = threading.Thread(target=self._run, name="mpsched-handshakes",
                                        daemon=True)
        self._thread.start()

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def in_handshake(self) -> int:
        """Connections admitted (or being told why not) whose handshake is not over."""
        with self._lock:
            return self._slots.total

    def admit(self, sock: socket.socket, peer: Any, timeout: float, limits: Limits) -> None:
        """Take a new connection (``peer`` as accept() gave it) into the loop, or turn it
        away: told why where it can be, then closed."""
        host = peer[0] if isinstance(peer, tuple) else None
        with self._lock:
            reason = ("the manager is stopping" if self._stopping
                      else self._slots.refusal_locked(host, limits))
            told_here = bool(reason) and self._tls is not None
            if not reason or (told_here and not self._stopping
                              and self._slots.may_tell_locked(host)):
                self._slots.take_locked(host, telling=bool(reason))
                self._arrivals.append(PendingHandshake(sock, peer, timeout, tls=self._tls,
                                                       refused=reason))
                self._wake_locked()
                return
        if not told_here:
            tell(sock, reason)
        sock.close()

    def _wake_locked(self) -> None:
        assert self._wake_writer is not None, "admit() before start()"
        with contextlib.suppress(BlockingIOError):  # full: the loop has wake-ups to read
            self._wake_writer.send(b"!")

    def stop(self) -> None:
        """Close every connection still in its handshake; wait for the loop to end."""
        with self._lock:
            self._stopping = True
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
        finally:
            self._close_all()

    def _take_arrivals(self) -> bool:
        """Start the handshakes of the connections admitted since; False: stop."""
        assert self._selector is not None
        with self._lock:
            if self._stopping:
                return False
            arrivals, self._arrivals = self._arrivals, []
        for pending in arrivals:
            self._pending[pending.fd] = pending
            heapq.heappush(self._deadlines, (pending.deadline, next(self._order), pending))
            self._selector.register(pending.fd, pending.events, pending)
            self._advance(pending)
        return True

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
        if pending.stage is Stage.PROVEN:
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
        del self._pending[pending.fd]
        with self._lock:
            self._slots.release_locked(pending.host, telling=bool(pending.refused))
        if pending.stage is not Stage.PROVEN:
            pending.sock.close()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, _, pending = heapq.heappop(self._deadlines)
            if self._pending.get(pending.fd) is pending:
                log_failure(pending.peer, TimeoutError(), heard=pending.heard)
                self._finish(pending)

    def _drain_wake(self) -> None:
        assert self._wake_reader is not None
        with contextlib.suppress(BlockingIOError):
            while self._wake_reader.recv(4096):
                pass

    def _close_all(self) -> None:
        assert self._selector is not None
        for pending in list(self._pending.values()):
            self._finish(pending)
        with self._lock:
            arrivals, self._arrivals = self._arrivals, []
            for pending in arrivals:
                self._slots.release_locked(pending.host, telling=bool(pending.refused))
            self._selector.close()
            assert self._wake_reader is not None and self._wake_writer is not None
            self._wake_reader.close()
            self._wake_writer.close()
        for pending in arrivals:
            pending.sock.close()
