"""The server's end: hardened ``multiprocessing.managers`` sockets.

Everything between clients, workers and the manager travels over multiprocessing's
authenticated connections carrying pickles, so whoever holds the authkey can run code on
every worker. After the handshake the traffic is plaintext pickles, readable by anyone on
the network path, unless TLS is on (:mod:`mpsched._transport.tls`, TCP only). The
transport makes the defaults safe; here, the listener and the server:

- the whole handshake (TLS if on, the HMAC challenge both ways, the first request) must
  finish within HANDSHAKE_TIMEOUT (one deadline for both ends, in
  :mod:`mpsched._transport.connect`), or the socket is dropped;
- a connection costs no thread until its peer has proven it holds the key: one thread
  waits for all the others with a selector (:mod:`mpsched._transport.handshake_loop`), so
  slow or silent peers cannot pin manager threads;
- at most MAX_HANDSHAKES connections are in their handshake at once, and at most
  MAX_HANDSHAKES_PER_ADDRESS from one TCP peer address: these caps bound descriptors and
  never turn a new connection away; it closes the oldest handshake of its address (or of
  all) instead, whose peer is told why and tries again (mpsched._transport.connect);
- accept() out of file descriptors backs off instead of spinning;
- a Unix socket is created mode 0600: other users cannot connect;
- TCP sockets set TCP_NODELAY on both ends (small request/reply messages otherwise wait
  for delayed ACKs, ~40 ms a new connection here).

Elsewhere: the client's end, with its own deadlines (:mod:`mpsched._transport.connect`);
authkeys, from a 0600 file of this user or the MPSCHED_AUTHKEY environment variable, never
argv, and kept from child processes (:mod:`mpsched._transport.authkey`); a non-loopback TCP
address needs an explicit authkey (``serve``, :mod:`mpsched._cli.serve`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import connection, managers
from typing import Any

from mpsched._transport import connect
from mpsched._transport.handshake import log_failure
from mpsched._transport.handshake_loop import HandshakeLoop, Limits
from mpsched._transport.tls import current_tls
from mpsched._transport.wire import FastConnection

log = logging.getLogger("mpsched.transport")

# Connections a server lets sit in their handshake at once: each holds a descriptor (no
# thread), so all of them together stay well within the usual limit of 1024. A new one
# past it closes the oldest.
MAX_HANDSHAKES = 512
# ... from one TCP peer address: a new one past it closes the oldest of its address, so
# one host's flood churns its own slots and leaves other hosts' handshakes alone. A peer
# behind a flooding address has this many newer arrivals to prove its key (at the few
# thousand a second a flood reaches here, tens of milliseconds).
MAX_HANDSHAKES_PER_ADDRESS = 128
LISTEN_BACKLOG = 512  # connections the kernel holds for accept() (capped by somaxconn)
ACCEPT_BACKOFF = (0.1, 1.0)  # first and longest wait after accept() ran out of descriptors
SERIALIZER = "mpsched"  # our entry in multiprocessing.managers.listener_client

# accept() errors that persist until some other connection closes: retrying at once spins.
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


# Held while we swap the process umask to bind a Unix socket, so two binds never restore
# each other's value. (Other threads' files made meanwhile get 0600: stricter, not looser.)
_umask_lock = threading.Lock()


class FastListener(connection.Listener):
    """A Listener whose accepted connections are :class:`FastConnection` s.

    A Unix socket is created mode 0600 (connecting needs write permission: only this user
    may). A TCP listener created while :func:`mpsched._transport.tls.set_tls` is in force
    serves TLS: ``tls_context`` is its context (None: no TLS); the server wraps each
    connection in it.
    """

    def __init__(
        self,
        address: Any = None,
        family: str | None = None,
        backlog: int = 1,
        authkey: bytes | None = None,
    ) -> None:
        # managers.Server asks for 16: a burst of connections (a pool of workers starting,
        # peers turned away and retrying) would overflow it, and a connect() whose SYN is
        # dropped waits a second or more to try again.
        backlog = max(backlog, LISTEN_BACKLOG)
        if family is None:
            family = (
                connection.address_type(address)  # type: ignore[attr-defined]
                if address
                else connection.default_family  # type: ignore[attr-defined]
            )
        tls = current_tls() if family == "AF_INET" else None
        self.tls_context = None if tls is None else tls.server_context()
        self.closed = False
        if family != "AF_UNIX":
            super().__init__(address, family, backlog, authkey)
            return
        # bind() creates the file with the umask applied: no moment where it is open to all.
        with _umask_lock:
            before = os.umask(0o177)
            try:
                super().__init__(address, family, backlog, authkey)
            finally:
                os.umask(before)

    def accept(self) -> FastConnection:  # type: ignore[override]  # a Connection look-alike
        return FastConnection(self.accept_socket()[0])

    def accept_socket(self) -> tuple[socket.socket, Any]:
        """The next connection's socket, and its peer's address (``(host, port)`` over
        TCP, ``""`` on a Unix socket)."""
        conn = super().accept()
        try:
            sock = socket.socket(fileno=os.dup(conn.fileno()))
        finally:
            conn.close()
        return sock, self.last_accepted

    def close(self) -> None:
        self.closed = True
        super().close()


class HardenedServer(managers.Server):
    """A ``multiprocessing.managers.Server`` with bounded, deadline-limited handshakes,
    optionally over TLS. Create it with ``serializer=SERIALIZER`` (its listener is then a
    :class:`FastListener`).

    Its accepter (run it in a thread, as ``run_manager`` does) stops when ``stop_event``
    is set or the listener is closed. It hands each new connection to a handshake thread
    (:class:`mpsched._transport.handshake_loop.HandshakeLoop`), which drives every handshake
    without a thread of its own; a connection gets its serving thread once its peer has proven it
    holds the key. ``on_disconnect``, if set, is called (with no arguments) in a
    connection's own server thread once an authenticated connection's serving ends,
    whatever the reason (client hung up, error, stop): the manager learns from its
    thread-locals whose connection closed. One-shot connections (``create``, ``decref``,
    ...) count too. An exception from it is logged.
    """

    listener: FastListener
    authkey: bytes
    on_disconnect: Callable[[], None] | None = None
    _sleep = staticmethod(time.sleep)  # tests observe accept back-off through it

    def __init__(self, registry: Any, address: Any, authkey: bytes, serializer: str) -> None:
        super().__init__(registry, address, authkey, serializer)
        self.handshakes = HandshakeLoop(self.authkey, self.listener.tls_context, self._on_proven)

    def accepter(self) -> None:
        """Accept connections and hand each to the handshake thread, until ``stop_event``
        is set or the listener is closed; then close those still in their handshake.
        A connection that arrives while MAX_HANDSHAKES others are in their handshake, or
        MAX_HANDSHAKES_PER_ADDRESS others from its address, closes the oldest of them."""
        self.handshakes.start()
        try:
            while (accepted := self._next_connection()) is not None:
                sock, peer = accepted
                self.handshakes.admit(
                    sock,
                    peer,
                    connect.HANDSHAKE_TIMEOUT,
                    Limits(total=MAX_HANDSHAKES, per_address=MAX_HANDSHAKES_PER_ADDRESS),
                )
        finally:
            self.handshakes.stop()

    def _next_connection(self) -> tuple[socket.socket, Any] | None:
        """The next connection and its peer; None once stopping. While accept() lacks
        descriptors (or memory), wait between tries: retrying at once would spin until
        some close."""
        backoff = 0.0
        while not self._stopping():
            try:
                sock, peer = self.listener.accept_socket()
            except OSError as exc:
                if self.listener.closed:
                    return None
                if exc.errno in _OUT_OF_RESOURCES:  # others: that one connection's problem
                    if not backoff:
                        log.warning(
                            "accept() failed (%s); retrying after %g s, then "
                            "less often, until it works",
                            exc,
                            ACCEPT_BACKOFF[0],
                        )
                    backoff = min(backoff * 2, ACCEPT_BACKOFF[1]) or ACCEPT_BACKOFF[0]
                    self._sleep(backoff)
                continue
            if backoff:
                log.warning("accept() works again")
            if self._stopping():
                sock.close()
                return None
            return sock, peer
        return None

    def _on_proven(self, conn: FastConnection, peer: Any) -> None:
        """In the handshake thread: serve ``conn`` in a thread of its own."""
        try:
            self._start_handler(conn, peer)
        except RuntimeError as exc:  # no thread to be had: refuse this one, go on
            log.error("cannot serve a connection: %s", exc)
            conn.close()

    def _start_handler(self, conn: FastConnection, peer: Any) -> threading.Thread:
        thread = threading.Thread(
            target=self._serve_proven, args=(conn, peer), name="mpsched-connection", daemon=True
        )
        thread.start()
        return thread

    def _stopping(self) -> bool:
        # stop_event is made by serve_forever(), or by whoever runs the accepter instead.
        event: threading.Event | None = getattr(self, "stop_event", None)
        return event is not None and event.is_set()

    def handle_request(self, conn: Any) -> None:
        """Serve one connection, its whole handshake in this thread (not counted against
        MAX_HANDSHAKES: the accepter never calls this)."""
        if not isinstance(conn, FastConnection):
            conn = FastConnection(conn)
        try:
            conn.set_deadline(connect.HANDSHAKE_TIMEOUT)
            context = self.listener.tls_context
            if context is not None:
                conn.start_tls(context, server_side=True)
            connection.deliver_challenge(connect.as_connection(conn), self.authkey)
        except Exception as exc:  # whatever a peer sends, this connection is over
            log_failure(None, exc, heard=True)
            conn.close()
            return
        self._serve_proven(conn, None)

    def _serve_proven(self, conn: FastConnection, peer: Any) -> None:
        """Serve a connection whose peer has proven it holds the key: prove that we do
        too, read its first request (within what is left of the deadline), serve it."""
        try:
            try:
                connection.answer_challenge(connect.as_connection(conn), self.authkey)
                request = conn.recv()
                conn.set_deadline(None)
            except Exception as exc:  # whatever a peer sends, this connection is over
                log_failure(peer, exc, heard=True)
                return
            self._serve_authenticated(conn, request)
        finally:
            conn.close()

    def _serve_authenticated(self, conn: FastConnection, request: Any) -> None:
        try:
            self._dispatch(conn, request)
        except SystemExit:  # serve_client() exits this way when its client hangs up
            pass
        finally:
            conn.close()  # first: the peer sees the hang-up whatever the hook does
            self._disconnected()

    def decref(self, c: Any, ident: str) -> None:
        """Keep each served object for the life of the server: a manager serves one,
        made once, and a decref may come from a proxy of an earlier manager at this
        address, collected after a restart, whose object had the same id (by chance)."""

    def _disconnected(self) -> None:
        if self.on_disconnect is not None:
            try:
                self.on_disconnect()
            except Exception:
                log.exception("on_disconnect failed")

    def _dispatch(self, conn: FastConnection, request: Any) -> None:
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
    FastListener,
    connect.client_connection,
)


def host_name() -> str:
    return socket.gethostname()


def describe_versions() -> tuple[str, str]:
    """This process's Python minor version and cloudpickle version."""
    import cloudpickle

    return f"{sys.version_info.major}.{sys.version_info.minor}", str(cloudpickle.__version__)
