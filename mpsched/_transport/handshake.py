"""One connection's handshake, server side, a step at a time without blocking.

:class:`PendingHandshake` is driven by :class:`mpsched._transport.handshake_loop.HandshakeLoop`
whenever its socket is ready: the TLS handshake (if the listener serves TLS), then our
challenge and the peer's answer. Once the answer is right the peer has proven it holds
the key, and a serving thread takes over (it answers the peer's challenge in turn and
reads the first request). A connection turned away (the server stops) is sent
``#REFUSED#`` and the reason where it expects the challenge; one closed to make room for
newer ones is sent it where it expects ``#WELCOME#`` (over TLS, once TLS is up)::

    accept ─ [TLS] ─┬─ #CHALLENGE# ─▶ ◀─ answer ─┬─ #WELCOME# ─▶ ─ a serving thread
                    │                            └─ #REFUSED# reason ─▶ ─ close (room)
                    └─ #REFUSED# reason ─▶ ─ close (stopping)

Challenges and answers are multiprocessing's (``deliver_challenge`` of this Python,
split into its steps), so any multiprocessing client of a supported Python connects.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import logging
import os
import selectors
import socket
import ssl
import struct
import time
from collections.abc import Callable
from multiprocessing import AuthenticationError, connection
from typing import Any

log = logging.getLogger("mpsched.transport")

CHALLENGE = b"#CHALLENGE#"  # multiprocessing's handshake messages
WELCOME = b"#WELCOME#"
FAILURE = b"#FAILURE#"
REFUSED = b"#REFUSED#"  # ours: sent instead of the challenge, followed by the reason
MAX_MESSAGE = 256  # bytes a handshake message may have (multiprocessing's own limit)

_SHORT = struct.Struct("!i")  # multiprocessing's framing: a signed 32-bit length
READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
# Python 3.12 names the digest in the challenge ("{sha256}...") and checks answers with
# this; before, the challenge is bare random bytes and the answer their HMAC-MD5.
_VERIFY: Callable[[bytes, bytes, bytes], None] | None = getattr(
    connection, "_verify_challenge", None
)
_MESSAGE_LENGTH: int = getattr(connection, "MESSAGE_LENGTH", 20)


def frame(message: bytes) -> bytes:
    """``message`` with multiprocessing's length prefix (handshake messages are short)."""
    return _SHORT.pack(len(message)) + message


def refusal(message: bytes | bytearray) -> str | None:
    """The reason a ``#REFUSED#`` message gives; None for any other message."""
    if not message.startswith(REFUSED):
        return None
    text = bytes(message[len(REFUSED) :]).decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)


def tell(sock: socket.socket, reason: str) -> None:
    """Send a refusal without waiting (a new connection's send buffer is empty)."""
    try:
        sock.setblocking(False)
        sock.send(frame(REFUSED + reason.encode()))
    except OSError:
        pass  # gone already, or full: it sees the close


def _challenge() -> bytes:
    """What follows ``#CHALLENGE#``: as this Python's deliver_challenge() makes it."""
    random = os.urandom(_MESSAGE_LENGTH)
    return b"{sha256}" + random if _VERIFY is not None else random


def _verify(authkey: bytes, message: bytes, answer: bytes) -> None:
    """Raises AuthenticationError unless ``answer`` is the HMAC of ``message``."""
    if _VERIFY is not None:
        _VERIFY(authkey, message, answer)
    elif not hmac.compare_digest(hmac.new(authkey, message, "md5").digest(), answer):
        raise AuthenticationError("digest received was wrong")


def log_failure(peer: Any, exc: BaseException, *, heard: bool) -> None:
    """Log why a connection's handshake ended early: a bare connect-and-close (the peer
    sent nothing: not ``heard``) at DEBUG, a hang-up halfway at INFO, a refusal (wrong key,
    TLS failure, deadline, bad bytes) at WARNING. ``peer`` as accept() gave it."""
    if isinstance(peer, tuple):
        who = f" from {peer[0]}:{peer[1]}"
    else:  # Unix peers have no address
        who = " on the Unix socket" if peer is not None else ""
    if isinstance(exc, (EOFError, ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        if heard:
            log.info("a connection%s closed during its handshake", who)
        else:
            log.debug("a connection%s closed before its handshake", who)
        return
    if isinstance(exc, TimeoutError):
        reason = "the handshake deadline passed"
    elif isinstance(exc, AuthenticationError):
        reason = f"wrong authkey ({exc})"
    elif isinstance(exc, ssl.SSLError):
        reason = f"TLS failed ({exc.reason or exc})"
    else:
        reason = str(exc) or type(exc).__name__
    log.warning("refused a connection%s: %s", who, reason)


class Stage(enum.Enum):
    HELLO = enum.auto()  # TLS: waiting for the peer's first bytes before wrapping
    TLS = enum.auto()  # the TLS handshake runs
    ANSWER = enum.auto()  # our challenge is out: waiting for the answer
    PROVEN = enum.auto()  # the answer was right: #WELCOME# goes out, then a thread serves


class PendingHandshake:
    """One connection in its handshake; :meth:`advance` it whenever ``events`` are ready
    on ``fd``. Used by one thread at a time."""

    def __init__(
        self, sock: socket.socket, peer: Any, timeout: float, *, tls: ssl.SSLContext | None
    ) -> None:
        sock.setblocking(False)
        if sock.family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock  # an ssl.SSLSocket once TLS starts
        self.fd = sock.fileno()  # the same after TLS wraps the socket
        self.peer = peer
        self.host: str | None = peer[0] if isinstance(peer, tuple) else None
        self.deadline = time.monotonic() + timeout
        self.events = READ  # what it waits for
        self.heard = False  # the peer sent something
        self._tls = tls
        self._inbox = b""
        self._outbox = b""
        self._message = b""  # the challenge we sent
        self.stage = Stage.HELLO
        if tls is None:
            self._greet()

    def advance(self, authkey: bytes) -> bool:
        """Do what the socket allows now, without blocking. True once the peer has proven
        it holds the key (``stage`` is PROVEN: hand it over).

        Raises:
            AuthenticationError: the wrong answer (the peer was sent #FAILURE#).
            ssl.SSLError: the TLS handshake failed.
            EOFError, OSError: the peer hung up, or sent what no handshake has.
        """
        if self.stage is Stage.HELLO and not self._hello():
            return False
        if self.stage is Stage.TLS:
            if not self._tls_step():
                return False
            self._greet()
        if not self._flush():
            return False
        answer = self._answer()
        if answer is None:
            return False
        try:
            _verify(authkey, self._message, answer)
        except AuthenticationError:
            self._outbox = frame(FAILURE)
            self._flush()  # at most this once: the peer may learn its key was wrong
            raise
        self.stage = Stage.PROVEN
        self._outbox = frame(WELCOME)
        return self._flush()

    def _hello(self) -> bool:
        """TLS: wrap the socket once the peer has sent something (an idle peer costs no
        TLS state; one that closes at once made a bare connect, not a TLS failure)."""
        try:
            first = self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        if not first:
            raise EOFError
        self.heard = True
        assert self._tls is not None
        self.sock = self._tls.wrap_socket(
            self.sock, server_side=True, do_handshake_on_connect=False
        )
        self.stage = Stage.TLS
        return True

    def _tls_step(self) -> bool:
        assert isinstance(self.sock, ssl.SSLSocket)
        try:
            self.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.events = READ
            return False
        except ssl.SSLWantWriteError:
            self.events = WRITE
            return False
        return True

    def _greet(self) -> None:
        self.stage = Stage.ANSWER
        self._message = _challenge()
        self._outbox = frame(CHALLENGE + self._message)

    def tell_closed(self, reason: str) -> None:
        """Before the server closes this connection to make room: tell the peer why, if it
        has its challenge (it reads the reason instead of ``#WELCOME#``), without waiting."""
        if self.stage is not Stage.ANSWER or self._outbox:
            return  # in its TLS handshake, or it has not seen its challenge yet
        # Suppressed: gone, or its buffer is full (then it sees the close).
        with contextlib.suppress(OSError):
            self.sock.send(frame(REFUSED + reason.encode()))

    def _flush(self) -> bool:
        """Send what is queued; False while some is left."""
        while self._outbox:
            try:
                sent = self.sock.send(self._outbox)
            except (BlockingIOError, ssl.SSLWantWriteError):
                self.events = WRITE
                return False
            except ssl.SSLWantReadError:
                self.events = READ
                return False
            self._outbox = self._outbox[sent:]
        self.events = READ
        return True

    def _answer(self) -> bytes | None:
        """The peer's answer once all of it is here (None: not yet)."""
        while len(self._inbox) <= _SHORT.size + MAX_MESSAGE:  # more: refused below
            try:
                chunk = self.sock.recv(4096)
            except (BlockingIOError, ssl.SSLWantReadError):
                break
            except ssl.SSLWantWriteError:
                self.events = WRITE
                return None
            if not chunk:
                raise EOFError
            self.heard = True
            self._inbox += chunk
        if len(self._inbox) < _SHORT.size:
            return None
        size: int = _SHORT.unpack_from(self._inbox)[0]
        if not 0 <= size <= MAX_MESSAGE:
            raise OSError(f"bad message length {size}")
        end = _SHORT.size + size
        if len(self._inbox) < end:
            return None
        if len(self._inbox) > end:  # an honest peer waits for our welcome
            raise OSError("it sent more than its answer to the challenge")
        return self._inbox[_SHORT.size : end]
