"""The client's end of a manager connection: connect, TLS, and the key handshake, within
deadlines, with every failure said as what it was.

- a client's TCP connect gives up after CONNECT_TIMEOUT, not after the kernel's minutes of
  SYN retries to a host that drops them;
- TLS (if :func:`mpsched._transport.tls.set_tls` set it up) and the HMAC challenge both ways
  finish within HANDSHAKE_TIMEOUT, the server's deadline too;
- a manager that closes the connection during its handshake (it made room for newer
  ones, or it stops; it says why with ``#REFUSED#`` where it can) is tried again, after
  BUSY_BACKOFF, until CONNECT_TIMEOUT has passed since the first try; then that is a
  ManagerBusyError, not a failed handshake.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
from multiprocessing import AuthenticationError as _StdAuthenticationError
from multiprocessing import connection
from typing import Any, NoReturn

from mpsched._errors import AuthenticationError, ManagerBusyError, TlsError
from mpsched._transport.address import format_address
from mpsched._transport.handshake import MAX_MESSAGE, refusal
from mpsched._transport.tls import ClientTls, client_tls
from mpsched._transport.wire import FastConnection

log = logging.getLogger("mpsched.transport")

HANDSHAKE_TIMEOUT = 5.0  # seconds for the whole handshake of one connection
# Seconds a client's TCP connect may wait for an answer (without it, a connect to a host
# that drops it retries its SYN for about two minutes); also how long a client tries again
# a manager that closes its connections during their handshake.
CONNECT_TIMEOUT = 10.0
# Seconds before the first try again of a handshake the manager closed, doubling up to
# the second value.
BUSY_BACKOFF = (0.02, 0.5)


class _Dropped(Exception):
    """The manager closed the connection before it welcomed us: it is there, and busy."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def client_connection(address: Any, authkey: bytes | None = None) -> FastConnection:
    """Connect (within CONNECT_TIMEOUT on TCP), then start TLS on TCP if
    :func:`mpsched._transport.tls.set_tls` set it up, and authenticate, all within
    HANDSHAKE_TIMEOUT after the connection is established. A manager that closes the
    connection during its handshake is tried again, after 0.02 s doubling to 0.5 s, for
    CONNECT_TIMEOUT since the first try.

    Raises:
        AuthenticationError: the manager rejected our key, or we rejected its.
        TlsError: TLS failed (the manager's certificate did not verify, it does not speak
            TLS, or it wants a client certificate we did not give).
        ManagerBusyError: the manager closed every try during its handshake (it made room
            for newer connections, or it stops), saying why where it could.
        TimeoutError: no answer to a TCP connect within CONNECT_TIMEOUT (errno
            ETIMEDOUT), or the handshake did not finish in time.
        ConnectionError: the manager closed the connection after it welcomed us, or
            before it said anything.
        OSError: nothing listens there.
    """
    give_up = time.monotonic() + CONNECT_TIMEOUT
    backoff = BUSY_BACKOFF[0]
    tries = 0
    while True:
        try:
            return _connection(address, authkey)
        except _Dropped as exc:
            tries += 1
            if time.monotonic() + backoff > give_up:
                raise ManagerBusyError(
                    format_address(address),
                    (
                        f"it closed {tries} connection(s) during their handshake in "
                        f"{CONNECT_TIMEOUT:g} s (the last: {exc.reason})"
                    ),
                ) from None
            if tries == 1:
                log.info(
                    "the manager at %s closed a connection during its handshake (%s); "
                    "trying again for up to %g s",
                    format_address(address),
                    exc.reason,
                    CONNECT_TIMEOUT,
                )
        time.sleep(backoff)
        backoff = min(backoff * 2, BUSY_BACKOFF[1])


def _connection(address: Any, authkey: bytes | None) -> FastConnection:
    """One try of :func:`client_connection`.

    Raises:
        _Dropped: the manager closed it before it welcomed us; the rest as
            :func:`client_connection`.
    """
    family = getattr(socket, connection.address_type(address))  # type: ignore[attr-defined]
    tls = client_tls() if family == socket.AF_INET else None
    conn = FastConnection(_connected(address, family))
    try:
        conn.set_deadline(HANDSHAKE_TIMEOUT)
        _handshake(conn, address, authkey, tls)
        conn.set_deadline(None)
    except BaseException as exc:
        conn.close()
        _raise_client_error(
            exc,
            f"the mpsched manager at {format_address(address)}",
            tls,
            tcp=family == socket.AF_INET,
        )
    return conn


def _connected(address: Any, family: int) -> socket.socket:
    """A socket connected to ``address`` (within CONNECT_TIMEOUT on TCP).

    Raises:
        TimeoutError: as :func:`client_connection`; OSError: nothing listens there.
    """
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # A Unix socket's connect with a timeout would fail at once (EAGAIN) while the
        # manager's backlog is full, where a blocking one waits for its turn.
        if family == socket.AF_INET:
            sock.settimeout(CONNECT_TIMEOUT)  # FastConnection makes it blocking again
        sock.connect(address)
    except TimeoutError as exc:
        sock.close()
        if exc.errno is not None:  # the kernel's own ETIMEDOUT
            raise
        raise TimeoutError(
            errno.ETIMEDOUT, f"timed out connecting after {CONNECT_TIMEOUT:g} s"
        ) from None
    except BaseException:
        sock.close()
        raise
    return sock


def _handshake(
    conn: FastConnection, address: Any, authkey: bytes | None, tls: ClientTls | None
) -> None:
    """TLS (with ``tls``), then the key's challenges both ways (with ``authkey``).

    Raises:
        _Dropped: the manager closed the connection before it welcomed us: during TLS, in
            place of its challenge or its welcome (saying why), or after its challenge.
    """
    if tls is not None:
        try:
            conn.start_tls(tls.context, server_side=False, server_hostname=address[0])
        except (EOFError, ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            raise _Dropped("it closed the connection during the TLS handshake") from None
    if authkey is None:
        return
    first = conn.recv_bytes(MAX_MESSAGE)
    reason = refusal(first)
    if reason is not None:
        raise _Dropped(reason)
    try:
        connection.answer_challenge(as_connection(_Replay(conn, first)), authkey)
    except (EOFError, ConnectionError):
        raise _Dropped("it closed the connection after its challenge") from None
    connection.deliver_challenge(as_connection(conn), authkey)


def as_connection(conn: FastConnection | _Replay) -> Any:
    """``conn`` for multiprocessing's challenge functions (typed for Connection, they call
    only send_bytes and recv_bytes)."""
    return conn


class _Replay:
    """``conn`` for answer_challenge(), once we have read its first message ourselves (to
    see whether it is a refusal); a refusal in place of the welcome raises _Dropped."""

    def __init__(self, conn: FastConnection, first: bytes | bytearray) -> None:
        self._conn = conn
        self._first: bytes | bytearray | None = first

    def recv_bytes(self, maxlength: int | None = None) -> bytes | bytearray:
        first, self._first = self._first, None
        if first is not None:
            return first
        message = self._conn.recv_bytes(maxlength)
        reason = refusal(message)
        if reason is not None:
            raise _Dropped(reason)
        return message

    def send_bytes(self, data: bytes) -> None:
        self._conn.send_bytes(data)


def _raise_client_error(
    exc: BaseException, where: str, tls: ClientTls | None, *, tcp: bool
) -> NoReturn:
    """Raise ``exc`` as the error that says what went wrong in a client's handshake."""
    if isinstance(exc, _Dropped):  # the manager is there: the caller tries again
        raise exc from None
    # Only TCP can carry TLS: a Unix socket's manager never asks for it.
    hint = " (does it require TLS? give its CA with --tls-ca)" if tcp and not tls else ""
    if isinstance(exc, _StdAuthenticationError):
        raise AuthenticationError(
            f"authentication with {where} failed ({exc}): wrong authkey?"
        ) from None
    if isinstance(exc, ssl.SSLCertVerificationError):
        raise TlsError(
            f"TLS: the certificate of {where} did not verify against "
            f"{_ca_name(tls)}: {exc.verify_message}"
        ) from None
    if isinstance(exc, ssl.SSLError):
        raise TlsError(
            f"TLS with {where} failed ({exc.reason or exc}): does it serve TLS, "
            f"and does it want a client certificate (--tls-cert, --tls-key)?"
        ) from None
    if isinstance(exc, TimeoutError):
        raise TimeoutError(
            f"{where} did not finish the handshake within {HANDSHAKE_TIMEOUT:g} s{hint}"
        ) from None
    if isinstance(exc, (EOFError, ConnectionError)):
        raise ConnectionResetError(
            f"{where} closed the connection during the handshake{hint}"
        ) from None
    raise exc


def _ca_name(tls: ClientTls | None) -> str:
    ca = None if tls is None else tls.config.ca
    return "the system CAs" if ca is None else f"the CA in {ca}"
